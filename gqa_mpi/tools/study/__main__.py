"""``python -m gqa_mpi.tools.study`` (also ``python -m gqa_mpi.study``)."""
from .cli import main

raise SystemExit(main())
