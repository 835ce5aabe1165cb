"""The arithmetic of one decode step: NumPy only, never MPI.

===========  ===================================================================
attention    the math of one PE: partials, merge, the NumPy tile sweep
sweeps       the local sweeps (NumPy reference, fused C) and their resident layouts
schedules    how partials reach the root, as data (registry)
wires        what a hop carries and what carrying loses (registry)
registry     the small registry the schedules and wires live in
grid         cubes and PE grids: places, neighbours, chain depth
partition    which tokens each rank holds
dtypes       the float dtypes, named once
trace        per-rank timings and the Chrome trace-event timeline
===========  ===================================================================
"""
