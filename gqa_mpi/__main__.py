"""``mpirun -n 16 python -m gqa_mpi``: see ``python -m gqa_mpi --help``."""
from gqa_mpi.app.cli import main

raise SystemExit(main())
