"""The kernel DSL: a kernel's own file run with gqa_mpi's ``tl``, and its predicted time.
NumPy only, never MPI (``tl.send``/``tl.recv`` reach MPI through :mod:`gqa_mpi.mpi`).

============  ==================================================================
tl            ``tl`` on NumPy: memory, one method per call, and the monitor beside
              them (scratch, non-finite values, lines, the calls for the replay)
kernel_file   a kernel's own file: found, loaded once, its signature checked
profile       hardware profiles (TOML): read and checked
predict       the replay of every PE's calls through SPEC's cost model
============  ==================================================================
"""
