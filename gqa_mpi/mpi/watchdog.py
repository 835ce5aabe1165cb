"""``--timeout``: a per-rank watchdog that ends the whole job, naming who is stuck.

Armed as soon as the command line is read and never disarmed, so it covers start-up
(a rank stopped before the first collective), the run, and shut-down (``MPI_Finalize``
under a stopped launcher). Each rank keeps what it is doing (:func:`phase`) and, while
it blocks on others, whom it waits for (:func:`waiting`). When time is up:

- a rank that is not waiting is the stuck one: it says so and aborts the job at once;
- a rank that waits gives the stuck rank a moment to name itself, then names what it
  has been waiting for: the chain neighbour it receives from or sends to, or, at a
  :func:`rendezvous`, the ranks that have not arrived (rank 0 keeps count). So a rank
  that is stopped or dead, and cannot speak, is still named.

If ``MPI_Abort`` itself cannot complete (the launcher is stopped), the process exits
on its own a few seconds later. Exit code 3.

In process (:mod:`gqa_mpi.mpi.inprocess`) every rank is a thread with its own phase
and wait; one timer serves them all, and when it is up every rank's line is printed
at once before the ranks are aborted.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Dict, Optional

from ..exits import Exit

GRACE = 2.0
"""Seconds a waiting rank leaves the stuck rank to name itself (a quarter of the
timeout when that is shorter)."""

_ranks: Dict[int, dict] = {}
"""What each rank of this process does: one entry, or one per thread in process."""
_timer = dict(seconds=None, timer=None)


def _mine() -> dict:
    """This rank's entry: its phase, whom it waits for, its communicator."""
    me = threading.get_ident()
    if me not in _ranks:
        _ranks[me] = dict(phase="start-up", waiting=None, comm=None)
    return _ranks[me]


def phase(name: str) -> None:
    """Record what this rank is doing now (cheap; used with or without a watchdog)."""
    _mine()["phase"] = name


@contextmanager
def waiting(what: str):
    """Mark a block in which this rank waits for ``what`` (e.g. 'rank 6 (intra_E)')."""
    mine = _mine()
    before = mine["waiting"]
    mine["waiting"] = what
    try:
        yield
    finally:
        mine["waiting"] = before


ARRIVE, GO = 901, 902
"""Tags of :func:`rendezvous`."""


def rendezvous(comm, label: str) -> None:
    """A barrier in which rank 0 knows who has not arrived yet, and says so on timeout.

    Every rank tells rank 0 it has reached ``label``; rank 0 polls until all have,
    then lets them go. A stopped or dead rank is so named by rank 0, where a plain
    barrier could only say "all ranks".
    """
    if comm.size == 1:
        return
    token = bytearray(1)
    mine = _mine()
    if comm.rank == 0:
        reqs = {r: comm.Irecv(bytearray(1), source=r, tag=ARRIVE) for r in range(1, comm.size)}
        with waiting(f"all ranks to reach {label}"):
            while reqs:
                for r in [r for r, q in reqs.items() if q.Test()]:
                    del reqs[r]
                if reqs:
                    missing = sorted(reqs)
                    shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
                    mine["waiting"] = f"rank(s) {shown} to reach {label}"
                    time.sleep(0.0005)
        for r in range(1, comm.size):
            comm.Send(token, dest=r, tag=GO)
    else:
        with waiting(f"rank 0 to see every rank reach {label}"):
            comm.Send(token, dest=0, tag=ARRIVE)
            comm.Recv(token, source=0, tag=GO)


def arm(comm, seconds: float) -> None:
    """Start the watchdog (once a process); it ends the job after ``seconds``."""
    _mine()["comm"] = comm
    if _timer["timer"] is not None:
        return
    timer = threading.Timer(seconds, _expire)
    timer.daemon = True
    _timer.update(seconds=seconds, timer=timer)
    timer.start()


def forget() -> None:
    """This thread plays no rank any more (an in-process rank that returned)."""
    disarm()
    _ranks.pop(threading.get_ident(), None)


def disarm() -> None:
    """This rank is done with the watchdog (a library call returned); the timer stops
    once no rank of this process is armed."""
    _mine()["comm"] = None
    if _timer["timer"] is not None and all(r["comm"] is None for r in list(_ranks.values())):
        _timer["timer"].cancel()
        _timer["timer"] = None


def _last_words(rank: dict, seconds: float) -> str:
    waited = rank["waiting"]
    comm = rank["comm"]
    if waited is not None:
        what = (f"has waited {seconds:g} s for {waited} during {rank['phase']}, "
                f"which did not come")
    else:
        what = f"is stuck in {rank['phase']} after {seconds:g} s"
    return f"gqa_mpi: rank {comm.rank} {what} (--timeout); aborting all {comm.size} ranks\n"


def _expire() -> None:
    seconds = _timer["seconds"]
    _timer["timer"] = None
    ranks = sorted((r for r in list(_ranks.values()) if r["comm"] is not None),
                   key=lambda r: r["comm"].rank)
    if not ranks:
        return
    if len(ranks) > 1 or getattr(ranks[0]["comm"], "in_process", False):
        # the ranks are threads of this process: each says what it does, all at once
        sys.stderr.write("".join(_last_words(r, seconds) for r in ranks))
        sys.stderr.flush()
        ranks[0]["comm"].Abort(Exit.TIMEOUT)
        return
    mine = ranks[0]
    comm, waited = mine["comm"], mine["waiting"]
    if waited is not None:
        # The stuck rank, if it can, names itself and ends the job first. Otherwise
        # every waiting rank says whom it waits for, so the chain of waits leads to
        # the stuck one; ranks that wait only for rank 0's go-ahead speak last, in
        # case rank 0 itself is the one stopped.
        grace = min(GRACE, 0.25 * seconds)
        time.sleep(2 * grace if waited.startswith("rank 0 to see") else grace)
    sys.stderr.write(_last_words(mine, seconds))
    sys.stderr.flush()
    # let the launcher pass the line on (MPI_Abort can end its forwarding before it
    # drained the pipe), and a waiting rank let the other waiting ranks speak too
    time.sleep(max(SPOKEN, min(1.0, 0.25 * seconds)) if waited is not None else SPOKEN)
    fallback = threading.Timer(5.0, lambda: os._exit(Exit.TIMEOUT))
    fallback.daemon = True
    fallback.start()
    comm.Abort(Exit.TIMEOUT)


SPOKEN = 0.3
"""Seconds a rank leaves the launcher to forward its last words before it ends the
job: MPI_Abort can kill the launcher's forwarding before it has drained the pipe."""


def say_and_abort(comm, text: str, code: int) -> None:
    """Write ``text`` to stderr, give the launcher time to pass it on, end every rank."""
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()
    time.sleep(SPOKEN)
    comm.Abort(code)


def early_timeout(argv) -> Optional[float]:
    """The ``--timeout`` value of ``argv`` if it is a valid one, before full parsing."""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(args):
        value = None
        if a == "--timeout" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--timeout="):
            value = a.split("=", 1)[1]
        if value is not None:
            try:
                t = float(value)
            except ValueError:
                return None
            return t if 0 < t < float("inf") else None
    return None
