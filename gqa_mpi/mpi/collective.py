"""What the ranks do together outside the step itself, with plain arguments: agree on
what they were given (every rank raises the same error, so all leave together), move a
value to or from the root, fold the check's shares on the root, add up what the ranks
of one host need, and wait for the root without spinning.

Every function here is called by every rank of ``comm``; each waits under the
watchdog (:mod:`gqa_mpi.mpi.watchdog`), so a rank that never comes is named.
"""
from __future__ import annotations

import socket
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..config import inputs
from . import inprocess, watchdog

FOLD_TAG = 0x6368
"""Tag of the check's shares sent to the root."""


def world() -> MPI.Comm:
    """``MPI.COMM_WORLD``, MPI initialised first where nothing has yet (the library's
    callers; the command line initialises it through :mod:`gqa_mpi.mpi.launch_check`)."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI.COMM_WORLD


def host_name(comm) -> str:
    """The name of this rank's host."""
    return socket.gethostname() if inprocess.owns(comm) else MPI.Get_processor_name()


def library_version(comm) -> str:
    """The first line of the MPI library's own version string (what runs the ranks)."""
    if inprocess.owns(comm):
        return inprocess.LIBRARY
    return MPI.Get_library_version().strip().splitlines()[0].strip()


def everyone(comm: MPI.Comm, mine: Any, what: str = "every rank") -> List[Any]:
    """Every rank's ``mine``, in rank order, on every rank."""
    with watchdog.waiting(what):
        return comm.allgather(mine)


def first_error(comm: MPI.Comm, error: Optional[str],
                what: str = "every rank") -> Optional[str]:
    """The first rank's error (None where no rank has one), on every rank."""
    return next((e for e in everyone(comm, error, what) if e), None)


def agree(comm: MPI.Comm, error: Optional[str]) -> None:
    """Raise the first rank's error on every rank, so that all leave together."""
    error = first_error(comm, error, f"all {comm.size} ranks to make the same library call")
    if error:
        raise ValueError(error)


def fingerprint(q: np.ndarray):
    """Q as the ranks compare it: shape, dtype and a checksum of its bytes."""
    q = np.ascontiguousarray(q)
    return (q.shape, str(q.dtype), zlib.crc32(q.view(np.uint8).reshape(-1)))


def agree_on(comm: MPI.Comm, mine: Dict) -> None:
    """Raise the same ValueError on every rank unless every rank passed the same
    ``mine`` (the configuration, Q, the dtype and width of K and V), naming the first
    rank that differs from rank 0 and what differs."""
    every = everyone(comm, mine, f"all {comm.size} ranks to make the same library call")
    for rank, theirs in enumerate(every):
        if theirs == every[0]:
            continue
        keys = sorted(k for k in mine if theirs[k] != every[0][k])
        if "config" in keys:
            a, b = every[0]["config"], theirs["config"]
            what = ", ".join(f"{f}={b[f]!r} where rank 0 has {a[f]!r}"
                             for f in sorted(a) if a[f] != b.get(f))
        elif "q" in keys:
            what = (f"a different q (shape {theirs['q'][0]}, checksum {theirs['q'][2]:#x}; "
                    f"rank 0: shape {every[0]['q'][0]}, checksum {every[0]['q'][2]:#x})")
        else:
            what = f"k, v of dtype {theirs['kv'][0]} where rank 0 has {every[0]['kv'][0]}"
        raise ValueError(f"the ranks disagree: rank {rank} passed {what}; every rank must "
                         f"pass the same options, the same q and K/V of one dtype")


def from_root(comm: MPI.Comm, value: Any, what: str = "rank 0") -> Any:
    """The root's ``value`` on every rank (the others pass anything)."""
    with watchdog.waiting(what):
        return comm.bcast(value if comm.rank == 0 else None, root=0)


def root_decides(comm: MPI.Comm, decide: Callable[[], Any], what: str) -> Any:
    """``decide()``, called on the root alone (input only it reads), on every rank."""
    return from_root(comm, decide() if comm.rank == 0 else None, what)


def to_root(comm: MPI.Comm, mine: Any, what: str = "every rank") -> Optional[List[Any]]:
    """Every rank's ``mine`` in rank order on the root; None elsewhere."""
    with watchdog.waiting(what):
        return comm.gather(mine, root=0)


def fold_to_root(comm: MPI.Comm, mine: np.ndarray,
                 fold: Callable[[np.ndarray], None]) -> bool:
    """The root calls ``fold(theirs)`` with every other rank's buffer (float64, shaped
    like ``mine``), in rank order, one buffer at a time; the others send theirs.
    Returns whether this rank is the root."""
    buf = np.ascontiguousarray(mine, dtype=np.float64)
    if comm.rank != 0:
        with watchdog.waiting("rank 0 (the check's partials)"):
            comm.Send(buf, dest=0, tag=FOLD_TAG)
        return False
    theirs = np.empty_like(buf)
    for source in range(1, comm.size):
        with watchdog.waiting(f"rank {source} (its part of the check)"):
            comm.Recv(theirs, source=source, tag=FOLD_TAG)
        fold(theirs)
    return True


def per_host(comm: MPI.Comm, mine: int) -> Optional[Tuple[str, int, int]]:
    """``(host, ranks, total)`` of the ranks on this rank's host, on the first rank of
    each host; None on the others. Hosts are told apart by name:
    ``Split_type(COMM_TYPE_SHARED)`` crashes Open MPI 4.1 over the tcp transport alone
    (seen with two network namespaces of one host)."""
    names = everyone(comm, host_name(comm), "every rank (host names)")
    node = comm.Split(names.index(names[comm.rank]), comm.rank)
    try:
        total = node.allreduce(mine)
        return (names[comm.rank], node.size, total) if node.rank == 0 else None
    finally:
        node.Free()


def wait_for_root(comm: MPI.Comm) -> None:
    """Hold every rank until the root is done, sleeping rather than busy-polling.

    MPI ranks spin while they wait; on an oversubscribed machine the spinning ranks
    would steal the cores the root needs for its float64 check.
    """
    req = comm.Ibarrier()
    if comm.rank == 0:
        req.Wait()
    while not req.Test():
        time.sleep(0.005)


def refuse_nonfinite(comm: MPI.Comm, tensors) -> None:
    """Raise the same InputError on every rank if any rank's inputs hold NaN or inf."""
    mine = None
    for name, array, offset in tensors:
        mine = mine or inputs.first_nonfinite(name, array, offset)
    found = first_error(comm, mine, "all ranks (input check)")
    if found:
        raise inputs.InputError(f"{found} (pass --allow-nonfinite to accept it)")


def abort(comm: MPI.Comm, code: int) -> None:
    """End every rank of the job with ``code``."""
    comm.Abort(code)
