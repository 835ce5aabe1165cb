"""Tools around the run: ``launcher`` (mpirun command lines), ``study`` (scaling
studies, ``python -m gqa_mpi.study``), ``bench`` and ``reads`` (``python -m
gqa_mpi.bench`` and its read limit) and ``probe`` (``python -m gqa_mpi.probe``, the
``host`` profile)."""
