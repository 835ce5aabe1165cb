"""``python -m gqa_mpi.bench``: the entry point of :mod:`gqa_mpi.tools.bench`."""
from gqa_mpi.tools.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
