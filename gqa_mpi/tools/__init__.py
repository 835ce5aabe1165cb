"""Tools around the run: ``launcher`` (mpirun command lines), ``study`` (scaling
studies, ``python -m gqa_mpi.study``) and ``bench`` (``python -m gqa_mpi.bench``)."""
