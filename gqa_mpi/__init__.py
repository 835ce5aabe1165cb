"""gqa_mpi: an accelerator's long-context GQA decode kernel, emulated on MPI.

Layers, each importing only the ones above it:

- :mod:`gqa_mpi.core`: the arithmetic and the data, NumPy only (no MPI);
- :mod:`gqa_mpi.mpi`: communicators, executing a schedule, the decode step;
- :mod:`gqa_mpi.app`: the config, :func:`decode`, the command line, check, record;
- :mod:`gqa_mpi.tools`: launcher helpers, the scaling study and the bench.

``from gqa_mpi import decode`` runs one distributed decode step on arrays the ranks
hold, and ``Decoder`` a loop of steps and appends on them (see
:mod:`gqa_mpi.app.decode`); importing ``gqa_mpi`` itself loads no MPI.
"""
__version__ = "0.2.0"

__all__ = ["decode", "Decoder", "Config", "RunRecord"]


def __getattr__(name):  # MPI is initialised on first use of the API, not on import
    if name in ("decode", "Decoder"):
        from .app import decode
        return getattr(decode, name)
    if name == "Config":
        from .config.config import Config
        return Config
    if name == "RunRecord":
        from .app.record import RunRecord
        return RunRecord
    raise AttributeError(f"module 'gqa_mpi' has no attribute {name!r}")
