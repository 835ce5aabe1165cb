"""gqa_mpi: an accelerator's long-context GQA decode kernel, emulated on MPI.

Modules: :mod:`~gqa_mpi.attention` (the math of one PE, no MPI),
:mod:`~gqa_mpi.topology` (communicators and neighbours), :mod:`~gqa_mpi.reduce`
(the chain schedule), :mod:`~gqa_mpi.wire` (hop formats),
:mod:`~gqa_mpi.driver` (one decode step), :mod:`~gqa_mpi.cli` (the command line).
"""
__version__ = "0.1.0"
