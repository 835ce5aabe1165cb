"""Every PE a thread of one process (``--in-process``, :func:`gqa_mpi.in_process`), with
no MPI.

:func:`run` starts one thread per rank, each calling ``fn(comm)`` with its
:class:`~.comm.Comm`, a stand-in for the part of mpi4py's communicator that gqa_mpi
uses, so the rest of the package runs unchanged on it and gives the results of an MPI
run of the same grid, O bit for bit. No MPI is initialised: there is no launcher, and
a debugger (``breakpoint()`` in a kernel) stops the thread that hits it.

============  ==========================================================
world         what the ranks share: mailboxes, the abort, requests, statuses
comm          the communicator: point to point, and those cut from it
collectives   its collective calls, each in rank order
============  ==========================================================

Once a rank has called ``Abort``, every rank's next call raises :class:`Aborted` (a
``SystemExit`` with the code); :func:`run` raises it and :func:`main` returns its code.
"""
from __future__ import annotations

import operator
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List

import mpi4py

if "mpi4py.MPI" not in sys.modules:     # its constants only: threads need no MPI_Init
    mpi4py.rc.initialize = False          # (whoever needs MPI later initialises it, as
    mpi4py.rc.finalize = True             # collective.world() does)
from mpi4py import MPI  # noqa: E402

from ...exits import SIGNAL  # noqa: E402
from .. import watchdog  # noqa: E402
from .collectives import Op  # noqa: E402
from .comm import Comm  # noqa: E402
from .world import Aborted, Status, World  # noqa: E402

__all__ = ["Aborted", "Comm", "LIBRARY", "MPI", "job", "main", "owns", "run",
           "status_for", "user_op"]

LIBRARY = "in-process (a thread per PE, no MPI)"
"""What the record says in place of the MPI library's version."""
GRACE = 2.0
"""Seconds :func:`run` leaves the ranks to see an abort before it returns without them."""


def owns(comm) -> bool:
    """Whether ``comm`` is one of this package's (no MPI behind it)."""
    return getattr(comm, "in_process", False)


def job(comm):
    """What ``Abort`` ends the whole job on: ``MPI.COMM_WORLD`` (MPICH's launcher has
    reported the other ranks' SIGKILL, exit 9, after an abort on another
    communicator), or an in-process rank's own communicator."""
    return comm if owns(comm) else MPI.COMM_WORLD


def status_for(comm):
    """A status ``comm.Iprobe`` and ``comm.Recv`` fill in."""
    return Status() if owns(comm) else MPI.Status()


def user_op(comm, fn: Callable):
    """``fn(inbuf, inoutbuf, datatype)`` as a commutative reduction on ``comm``."""
    return Op(fn) if owns(comm) else MPI.Op.Create(fn, commute=True)


def run(size: int, fn: Callable[..., Any], *args) -> List[Any]:
    """``fn(comm, *args)`` on ``size`` threads, each rank of one in-process world;
    each rank's return value, in rank order.

    An exception on one rank ends the others (they see an abort at their next call)
    and is raised here (the lowest rank's, where several raised); an ``Abort`` raises
    :class:`Aborted` with its code. Ctrl-C aborts every rank with exit code 130.
    """
    try:
        n = None if isinstance(size, bool) else operator.index(size)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"in_process takes a number of ranks >= 1, got {size!r}")
    size = n
    world = World()
    results: List[Any] = [None] * size
    errors: Dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        world.threads.add(threading.get_ident())     # its Abort raises in it alone
        try:
            results[rank] = fn(Comm(world, "world", range(size), rank), *args)
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            errors[rank] = e
            try:
                world.abort(1)
            except Aborted:
                pass
        finally:
            watchdog.forget()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True,
                                name=f"gqa_mpi rank {r}") for r in range(size)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive() and world.aborted is None:
                t.join(0.1)
    except KeyboardInterrupt as e:         # Ctrl-C, or SIGTERM under main()
        signum = getattr(e, "signum", signal.SIGINT)
        sys.stderr.write(f"gqa_mpi: interrupted by {signal.Signals(signum).name}; "
                         f"every rank stops at its next message\n")
        world.abort(SIGNAL + signum)
    end = time.monotonic() + GRACE
    for t in threads:          # after an abort, a rank busy in Python is left behind
        t.join(max(0.0, end - time.monotonic()) if world.aborted is not None else None)
    if errors:
        raise errors[min(errors)]
    if world.aborted is not None:
        raise Aborted(world.aborted)
    return results


class _Terminated(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def main(size: int, fn: Callable[..., int], *args) -> int:
    """The command line on threads: ``fn(comm, *args)`` of each rank returns its exit
    code; rank 0's, or the abort's. SIGTERM stops the ranks as Ctrl-C does."""
    def terminate(signum, frame):
        raise _Terminated(signum)
    try:
        old = signal.signal(signal.SIGTERM, terminate)
    except ValueError:            # not the main thread: leave the signal alone
        old = None
    try:
        return run(size, fn, *args)[0]
    except Aborted as e:
        return e.code
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
