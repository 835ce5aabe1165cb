"""Was this process started by a launcher of the MPI library mpi4py loads?

A launcher of one MPI starting programs linked to another goes wrong in one of two ways:

- MPICH's ``mpiexec`` (or the ``mpich`` wheel's) starting an mpi4py that loaded Open MPI:
  every process initialises as a singleton, sees a world of one and runs the whole
  problem on its own (seen: 16 copies of a 1M-token run, ended by the OOM killer);
- Open MPI's ``mpirun`` starting an mpi4py that loaded MPICH: every process fails
  inside ``MPI_Init`` with MPICH's error stack.

Launchers leave their variables in each process's environment (:data:`LAUNCHERS`), so
the first case is caught right after ``MPI_Init`` (N processes launched, a world of
one) and the second before it: mpi4py is imported with ``rc.initialize = False`` and
:func:`initialize` runs the checks, then ``MPI_Init``. Each is one line, from the
process the launcher numbered 0, and exit code 2.

Only the command line imports this module (it changes how mpi4py initialises); the
library initialises MPI on first use if nobody has.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Mapping, NamedTuple, Optional

import mpi4py

mpi4py.rc.initialize = False      # MPI_Init is ours to call, after the check below
mpi4py.rc.finalize = True

from mpi4py import MPI  # noqa: E402


class Launch(NamedTuple):
    """What the launcher's variables say: who started us, how many, and which MPI."""

    launcher: str
    size: int
    rank: int
    family: Optional[str]
    """'mpich' or 'openmpi' where the launcher belongs to one, else None (srun)."""
    variable: str


LAUNCHERS = (
    ("Open MPI's mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "openmpi"),
    ("MPICH's mpiexec (Hydra)", "PMI_SIZE", "PMI_RANK", "mpich"),
    ("SLURM's srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", None),
)
"""(launcher, variable with the process count, variable with this process's number,
the MPI family it belongs to)."""


def launch(env: Mapping[str, str] = os.environ) -> Optional[Launch]:
    """The launcher that started this process, from its variables; None if none did."""
    for name, size, rank, family in LAUNCHERS:
        if env.get(size, "").isdigit():
            r = env.get(rank, "0")
            return Launch(name, int(env[size]), int(r) if r.isdigit() else 0, family, size)
    return None


def family(version: str) -> Optional[str]:
    """'openmpi', 'mpich' (MPICH and its derivatives) or None, from the library's
    version string."""
    v = version.lower()
    if "open mpi" in v:
        return "openmpi"
    if any(x in v for x in ("mpich", "intel(r) mpi", "mvapich", "cray mpich")):
        return "mpich"
    return None


def library() -> str:
    """The first line of the MPI library's version (callable before ``MPI_Init``)."""
    first = MPI.Get_library_version().strip().splitlines()[0]
    return " ".join(first.split(",")[0].split())      # "Open MPI v4.1.4", "MPICH Version: 5.0.2"


FIX = {"openmpi": "Open MPI's own mpirun (e.g. /usr/bin/mpirun)",
       "mpich": "MPICH's mpiexec (pip install mpich puts one beside python)"}


def before_init(got: Optional[Launch], lib: str) -> Optional[str]:
    """Why ``MPI_Init`` would fail outright: Open MPI's launcher, MPICH's library."""
    if got is not None and got.family == "openmpi" and family(lib) == "mpich" \
            and got.size > 1:
        return (f"started by {got.launcher} ({got.variable}={got.size}), but mpi4py loaded "
                f"{lib}, which that launcher cannot start (every process would fail in "
                f"MPI_Init); launch with {FIX['mpich']}, or make mpi4py load Open MPI "
                f"(MPI4PY_MPIABI=openmpi, or pip uninstall mpich)")
    return None


def after_init(got: Optional[Launch], lib: str, world: int) -> Optional[str]:
    """Why a world of one is wrong: the launcher started N processes."""
    if got is None or got.size <= 1 or world != 1:
        return None
    head = (f"started as one of {got.size} processes by {got.launcher} "
            f"({got.variable}={got.size}), but MPI ({lib}) sees a world of 1, so each "
            f"process would run the whole problem alone")
    if got.family is None:        # srun: its PMI plugin must match the library
        return (f"{head}; give srun the PMI of that library: srun --mpi=pmi2 for MPICH, "
                f"--mpi=pmix for Open MPI (srun --mpi=list shows what the site has)")
    fix = FIX.get(family(lib) or "", "the launcher of the MPI that mpi4py loaded")
    return (f"{head}: the launcher belongs to another MPI; launch with {fix}, or make "
            f"mpi4py load the launcher's MPI (MPI4PY_MPIABI={got.family})")


def speaks(got: Optional[Launch]) -> bool:
    """Whether this process prints a launch error (the one numbered 0)."""
    return got is None or got.rank == 0


def initialize() -> Optional[str]:
    """Check the launch, initialise MPI, check again; the error line if it is wrong
    (MPI is then initialised only where it could be)."""
    if MPI.Is_initialized():
        return None
    got, lib = launch(), library()
    why = before_init(got, lib)
    if why:
        return why
    with warnings.catch_warnings():       # mpi4py's own hint, said better below
        warnings.filterwarnings("ignore", "suspicious MPI execution environment")
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return after_init(got, lib, MPI.COMM_WORLD.size)


def refuse(why: str) -> None:
    """Print ``why`` from the process numbered 0. Under Open MPI's launcher, which ends
    the job on the first failed process and may drop what the others printed, the
    others wait a moment so that the line is forwarded first."""
    got = launch()
    if speaks(got):
        print(f"gqa_mpi: error: {why}", file=sys.stderr, flush=True)
    elif got is not None and got.family == "openmpi":
        time.sleep(1.0)
