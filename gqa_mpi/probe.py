"""``mpirun -n 2 python -m gqa_mpi.probe``: the entry point of :mod:`gqa_mpi.tools.probe`."""
from gqa_mpi.tools.probe import main

if __name__ == "__main__":
    raise SystemExit(main())
