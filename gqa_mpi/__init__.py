"""gqa_mpi: an accelerator's long-context GQA decode kernel, emulated on MPI.

Rooms, each importing only the ones before it:

- :mod:`gqa_mpi.step`: the arithmetic of one decode step and the local sweeps;
- :mod:`gqa_mpi.dsl`: the kernel DSL's ``tl`` and its cost model;
- :mod:`gqa_mpi.config`: ``Config``, the inputs, the decode loop, the two modes;
- :mod:`gqa_mpi.check`: the float64 references and the verdict (these four: no MPI);
- :mod:`gqa_mpi.mpi`: every MPI call: communicators, schedules, the rank's steps;
- :mod:`gqa_mpi.app`: :func:`decode`, the command line, the check, record, report;
- :mod:`gqa_mpi.tools`: launcher helpers, the scaling study, the bench, the probe.

``from gqa_mpi import decode`` runs one distributed decode step on arrays the ranks
hold, and ``Decoder`` a loop of steps and appends on them (see
:mod:`gqa_mpi.app.decode`); ``in_process(n, fn)`` runs ``fn(comm)`` on n threads of
this process, each a rank, with no MPI (:mod:`gqa_mpi.mpi.inprocess`); importing
``gqa_mpi`` itself loads no MPI.
"""
__version__ = "0.2.0"

__all__ = ["decode", "Decoder", "in_process", "Config", "RunRecord"]


def __getattr__(name):  # MPI is initialised on first use of the API, not on import
    if name in ("decode", "Decoder"):
        from .app import decode
        return getattr(decode, name)
    if name == "in_process":
        from .mpi.inprocess import run
        return run
    if name == "Config":
        from .config.config import Config
        return Config
    if name == "RunRecord":
        from .app.record import RunRecord
        return RunRecord
    raise AttributeError(f"module 'gqa_mpi' has no attribute {name!r}")
