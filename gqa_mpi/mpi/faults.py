"""Test-only fault injection, so the suite can prove that failures end the job cleanly.

Set ``GQA_MPI_FAULT=KIND:RANK:POINT`` in the environment of a run: when rank RANK
reaches POINT (``start``, before the configuration is agreed; ``inputs``,
``local_attention``, ``reduce``, ``finalize``; or ``write``, the middle of writing an
output file) it raises an exception (KIND ``raise``), kills itself with SIGKILL
(KIND ``kill``), stops making progress for good (KIND ``hang``) or freezes with
SIGSTOP (KIND ``stop``). Unset, this costs one dictionary lookup.
Not for production use.
"""
from __future__ import annotations

import os
import signal
import sys
import time


KINDS = ("raise", "kill", "hang", "stop")
POINTS = ("start", "inputs", "local_attention", "reduce", "finalize", "write")


def check() -> None:
    """Raise ValueError (one line) if ``GQA_MPI_FAULT`` is set but malformed."""
    spec = os.environ.get("GQA_MPI_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    if (len(parts) != 3 or parts[0] not in KINDS or not parts[1].isdigit()
            or parts[2] not in POINTS):
        raise ValueError(f"GQA_MPI_FAULT={spec!r} is not KIND:RANK:POINT with KIND one of "
                         f"{', '.join(KINDS)} and POINT one of {', '.join(POINTS)}")


def inject(point: str, rank: int) -> None:
    spec = os.environ.get("GQA_MPI_FAULT")
    if not spec:
        return
    kind, where, at = spec.split(":")
    if at != point or int(where) != rank:
        return
    sys.stderr.write(f"gqa_mpi: rank {rank}: injecting fault {kind} at {point}, "
                     f"t={time.time():.3f}\n")
    sys.stderr.flush()
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":  # SIGSTOP: alive but frozen, its own watchdog cannot run
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "hang":
        while True:
            time.sleep(3600)
    raise RuntimeError(f"injected fault (GQA_MPI_FAULT={spec})")
