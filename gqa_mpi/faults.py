"""Test-only fault injection, so the suite can prove that failures end the job cleanly.

Set ``GQA_MPI_FAULT=KIND:RANK:POINT`` in the environment of a run: when rank RANK
reaches POINT (``inputs``, ``local_attention``, ``reduce``, ``finalize`` or ``write``,
the middle of writing an output file) it raises an exception (KIND ``raise``), kills
itself with SIGKILL (KIND ``kill``) or stops making progress for good (KIND ``hang``). Unset, this costs one dictionary lookup.
Not for production use.
"""
from __future__ import annotations

import os
import signal
import sys
import time


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
    if kind == "hang":
        while True:
            time.sleep(3600)
    raise RuntimeError(f"injected fault (GQA_MPI_FAULT={spec})")
