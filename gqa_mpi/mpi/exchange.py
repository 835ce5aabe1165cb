"""Executing a reduction schedule (:mod:`gqa_mpi.core.schedules`) on MPI.

Tensor data travels with the buffer methods ``Send``/``Recv``/``Reduce``, never
pickled. A ``reduce`` step hands MPI one packed float32 buffer per rank with the
merge as a user-defined operator. :func:`execute` returns the merged partial (the
total at the root) and this rank's :class:`~gqa_mpi.core.schedules.Traffic`.
"""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..core.attention import Partial, merge
from ..core.schedules import Step, Traffic
from ..core.trace import Recorder
from ..core.wires import TAGS, Loss, Wire, as_message, pack, unpack
from . import watchdog


def _merge_op(like: Partial) -> MPI.Op:
    """An ``MPI.Op`` merging two packed float32 partials shaped like ``like``."""
    def merge_op(inbuf, inoutbuf, datatype):
        a, b = (np.frombuffer(x, dtype=np.float32) for x in (inbuf, inoutbuf))
        b[:] = pack(merge(unpack(a, like), unpack(b, like)))

    return MPI.Op.Create(merge_op, commute=True)


def _reduce(comm: MPI.Comm, partial: Partial, root: int, rec: Recorder
            ) -> Tuple[Partial, Traffic]:
    send = pack(partial)
    recv = np.empty_like(send) if comm.rank == root else None
    op = _merge_op(partial)
    try:
        with rec.span("MPI_Reduce", "chain"), watchdog.waiting("all ranks (MPI_Reduce)"):
            comm.Reduce(send, recv, op=op, root=root)
    finally:
        op.Free()
    if comm.rank != root:
        return partial, Traffic(1, send.nbytes)
    return unpack(recv, partial), Traffic()


def execute(comm: MPI.Comm, partial: Partial, steps: List[Step], wire: Wire,
            recorder: Optional[Recorder] = None) -> Tuple[Partial, Traffic]:
    """Run ``steps`` on ``partial``; return the merged partial and this rank's traffic.

    ``recorder`` traces each step and each message.
    """
    rec = recorder or Recorder(comm.rank)
    messages = nbytes = 0
    loss = Loss()
    for i, step in enumerate(steps):
        if step.op == "reduce":
            partial, t = _reduce(comm, partial, step.peer, rec)
            messages, nbytes = messages + t.messages, nbytes + t.bytes
            continue
        with rec.span(f"{step.op} {step.dir}", "chain", step=i, peer=step.peer):
            if step.op == "recv":
                bufs = wire.buffers(partial)
                for name, buf in bufs:
                    t0 = time.perf_counter()
                    with watchdog.waiting(f"rank {step.peer} ({step.dir}, {name})"):
                        comm.Recv(as_message(buf), source=step.peer, tag=TAGS[name])
                    rec.message("recv", step.dir, step.peer, name, buf.nbytes, t0,
                                time.perf_counter())
                partial = merge(partial, wire.decode(bufs, partial))
            else:
                bufs, lost = wire.encode(partial)
                loss = loss + lost
                for name, buf in bufs:
                    t0 = time.perf_counter()
                    with watchdog.waiting(f"rank {step.peer} ({step.dir}) to take {name}"):
                        comm.Send(as_message(buf), dest=step.peer, tag=TAGS[name])
                    messages, nbytes = messages + 1, nbytes + buf.nbytes
                    rec.message("send", step.dir, step.peer, name, buf.nbytes, t0,
                                time.perf_counter())
    return partial, Traffic(messages, nbytes, loss)
