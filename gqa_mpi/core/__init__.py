"""The arithmetic and the data of the emulation: NumPy only, never MPI.

===============  ===============================================================
attention        the math of one PE: partials, merge, the NumPy tile sweep
kernels          the local kernels (NumPy sweep, fused C) and their layouts
reference        exact float64 GQA attention, the check's yardstick, whole or a
                 chunk at a time with its own merge
streamed         the streamed check's chunks and their partials, from the inputs
progress         progress lines of a long run
kernel_model     the reference kernel's own reads and its float64 model (a check
                 reference of source runs)
kernel_file      a kernel's own file: found, loaded once, its signature checked
loop             the decode loop's arithmetic: the growing cache, placements
dtypes           the float dtypes, named once
partition        which tokens each rank holds
grid             cubes and PE grids: places, neighbours, chain depth
schedules        how partials reach the root, as data (registry)
wires            what a hop carries and what carrying loses (registry)
inputs           generated or .npy inputs, independent of the rank count
trace            per-rank timings and the Chrome trace-event timeline
registry         the small registry the schedules and wires live in
config           Config: every option of a run, declared once and checked
tl               the kernel DSL's tl on NumPy (--kernel-source): memory, one method per
                 call, and the monitor beside them (scratch, non-finite, lines)
===============  ===============================================================
"""
