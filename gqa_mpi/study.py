"""``python -m gqa_mpi.study``: the entry point of :mod:`gqa_mpi.tools.study`."""
from gqa_mpi.tools.study.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
