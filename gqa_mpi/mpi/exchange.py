"""Executing a reduction schedule (:mod:`gqa_mpi.core.schedules`) on MPI.

Tensor data travels with the buffer methods (``Send``/``Recv``, ``Reduce``,
``Allgather``, ``Alltoallv``, ``Gatherv``), never pickled. :func:`execute` returns the
merged partial (the total at the root) and this rank's
:class:`~gqa_mpi.core.schedules.Traffic`: messages and bytes it sent (a collective
counts once, with the bytes this rank put in), and what the wire lost.
"""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..core.attention import Partial, merge
from ..core.grid import Grid
from ..core.partition import token_range
from ..core.schedules import Schedule, Step, Traffic
from ..core.trace import Recorder
from ..core.wires import TAGS, Loss, Wire, as_message, pack, unpack
from . import watchdog


def execute(comm: MPI.Comm, partial: Partial, schedule: Schedule, grid: Grid, wire: Wire,
            recorder: Optional[Recorder] = None) -> Tuple[Partial, Traffic]:
    """Run this rank's steps of ``schedule`` on ``partial``; return the merged partial
    and this rank's traffic. ``recorder`` traces each step and each message."""
    rec = recorder or Recorder(comm.rank)
    steps = schedule.steps(grid, comm.rank)
    collective = {"reduce": _reduce, "allgather": _allgather, "alltoall": _alltoall}
    if steps and steps[0].op in collective:
        with rec.span(steps[0].op, "chain"), watchdog.waiting(f"all ranks ({steps[0].op})"):
            return collective[steps[0].op](comm, partial, wire, steps[0].peer)
    if schedule.chunks:
        return _pipelined(comm, partial, steps, wire, schedule.chunks, rec)
    return _point_to_point(comm, partial, steps, wire, rec)


class _Link:
    """Sends and receives of one rank, counted and traced."""

    def __init__(self, comm: MPI.Comm, rec: Recorder):
        self.comm, self.rec = comm, rec
        self.messages = self.bytes = 0
        self.loss = Loss()

    def send(self, step: Step, name: str, buf: np.ndarray) -> None:
        t0 = time.perf_counter()
        with watchdog.waiting(f"rank {step.peer} ({step.dir}) to take {name}"):
            self.comm.Send(as_message(buf), dest=step.peer, tag=TAGS[name])
        self.messages, self.bytes = self.messages + 1, self.bytes + buf.nbytes
        self.rec.message("send", step.dir, step.peer, name, buf.nbytes, t0, time.perf_counter())

    def recv(self, step: Step, name: str, buf: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        with watchdog.waiting(f"rank {step.peer} ({step.dir}, {name})"):
            self.comm.Recv(as_message(buf), source=step.peer, tag=TAGS[name])
        self.rec.message("recv", step.dir, step.peer, name, buf.nbytes, t0, time.perf_counter())
        return buf

    def traffic(self) -> Traffic:
        return Traffic(self.messages, self.bytes, self.loss)


def _point_to_point(comm, partial: Partial, steps: List[Step], wire: Wire,
                    rec: Recorder) -> Tuple[Partial, Traffic]:
    link = _Link(comm, rec)
    for i, step in enumerate(steps):
        with rec.span(f"{step.op} {step.dir}", "chain", step=i, peer=step.peer):
            if step.op == "recv":
                bufs = [(name, link.recv(step, name, buf)) for name, buf in wire.buffers(partial)]
                partial = merge(partial, wire.decode(bufs, partial))
            else:
                bufs, lost = wire.encode(partial)
                link.loss = link.loss + lost
                for name, buf in bufs:
                    link.send(step, name, buf)
    return partial, link.traffic()


def _pipelined(comm, partial: Partial, steps: List[Step], wire: Wire, chunks: int,
               rec: Recorder) -> Tuple[Partial, Traffic]:
    """A schedule whose ranks receive, then send once, run with O in ``chunks`` pieces.

    First the statistics: ``m`` and ``l`` of every child, merged, go up at once. Then
    piece by piece: each child's piece of O, put on the merged scale and added, goes up
    before the next piece is received, so the levels of the tree work at the same time.
    """
    link = _Link(comm, rec)
    recvs = [s for s in steps if s.op == "recv"]
    send = next((s for s in steps if s.op == "send"), None)
    ms, ls = [partial.m], [partial.l]
    with rec.span("statistics", "chain"):
        for step in recvs:
            ms.append(wire.uncast(0, link.recv(step, "m", wire.empty(0, partial.m.shape))))
            ls.append(wire.uncast(1, link.recv(step, "l", wire.empty(1, partial.l.shape))))
        m = np.maximum.reduce(ms)
        shift = np.where(np.isneginf(m), np.float32(0), m)
        with np.errstate(invalid="ignore"):        # NaN m (overflowed scores) stays NaN
            scales = [np.exp(mi - shift) for mi in ms]
        l = sum(li * e for li, e in zip(ls, scales))
        if send is not None:
            bufs, lost = wire.encode(Partial(m, l, np.zeros(0, np.float32)))
            link.loss = link.loss + lost
            for name, buf in bufs[:2]:
                link.send(send, name, buf)
    d = partial.O.shape[-1]
    rows = partial.O.reshape(-1, d)
    out = np.empty_like(rows)
    pieces = max(1, min(chunks, len(rows)))
    for c in range(pieces):
        a, b = token_range(len(rows), pieces, c)
        with rec.span(f"piece {c}", "chain", rows=[a, b]):
            acc = rows[a:b] * scales[0].reshape(-1, 1)[a:b]
            for step, e in zip(recvs, scales[1:]):
                got = link.recv(step, "O", wire.empty(2, (b - a, d)))
                acc += wire.uncast(2, got) * e.reshape(-1, 1)[a:b]
            out[a:b] = acc
            if send is not None:
                buf = wire.cast(2, acc)
                with np.errstate(invalid="ignore"):
                    lost = int(np.count_nonzero(np.isinf(wire.uncast(2, buf)) & np.isfinite(acc)))
                link.loss = link.loss + Loss(lost)
                link.send(send, "O", buf)
    return Partial(m, l, out.reshape(partial.O.shape)), link.traffic()


def _reduce(comm, partial: Partial, wire: Wire, root: int) -> Tuple[Partial, Traffic]:
    """MPI.Reduce of the packed partial, with the merge as a user-defined operator."""
    def merge_op(inbuf, inoutbuf, datatype):
        a, b = (np.frombuffer(x, dtype=np.float32) for x in (inbuf, inoutbuf))
        b[:] = pack(merge(unpack(a, partial), unpack(b, partial)))

    send = pack(partial)
    recv = np.empty_like(send) if comm.rank == root else None
    op = MPI.Op.Create(merge_op, commute=True)
    try:
        comm.Reduce(send, recv, op=op, root=root)
    finally:
        op.Free()
    traffic = Traffic(1, send.nbytes)
    return (unpack(recv, partial), traffic) if comm.rank == root else (partial, traffic)


def _allgather(comm, partial: Partial, wire: Wire, root: int) -> Tuple[Partial, Traffic]:
    """All-gather of (m, l); each rank puts its O on the common scale; a SUM of O."""
    ml = np.concatenate([partial.m.ravel(), partial.l.ravel()]).astype(np.float32)
    every = np.empty((comm.size, ml.size), dtype=np.float32)
    comm.Allgather(ml, every)
    ms = every[:, :partial.m.size].reshape((comm.size,) + partial.m.shape)
    ls = every[:, partial.m.size:].reshape((comm.size,) + partial.l.shape)
    m = ms.max(axis=0)
    shift = np.where(np.isneginf(m), np.float32(0), m)
    with np.errstate(invalid="ignore"):
        l = (ls * np.exp(ms - shift)).sum(axis=0)
        mine = np.ascontiguousarray(partial.O * np.exp(partial.m - shift)[..., None],
                                    dtype=np.float32)
    total = np.empty_like(mine) if comm.rank == root else None
    comm.Reduce(mine, total, op=MPI.SUM, root=root)
    traffic = Traffic(2, ml.nbytes + mine.nbytes)
    return (Partial(m, l, total), traffic) if comm.rank == root else (partial, traffic)


def _alltoall(comm, partial: Partial, wire: Wire, root: int) -> Tuple[Partial, Traffic]:
    """Rows split over the ranks, one all-to-all per tensor, a merge, then a gather."""
    n, d = comm.size, partial.O.shape[-1]
    flat = Partial(partial.m.reshape(-1), partial.l.reshape(-1), partial.O.reshape(-1, d))
    bounds = [token_range(len(flat.m), n, r) for r in range(n)]
    counts = [b - a for a, b in bounds]
    mine = counts[comm.rank]
    bufs, loss = wire.encode(flat)
    got = []
    sent = 0
    for i, (name, buf) in enumerate(bufs):
        width = 1 if i < 2 else d
        recv = wire.empty(i, (n, mine * width))
        send_counts = [c * width for c in counts]
        comm.Alltoallv([as_message(buf.reshape(-1)), (send_counts, [a * width for a, _ in bounds])],
                       [as_message(recv.reshape(-1)), ([mine * width] * n, [r * mine * width
                                                                          for r in range(n)])])
        got.append(recv)
        sent += (buf.size - send_counts[comm.rank]) * buf.itemsize
    merged = None
    for r in range(n):                                  # in rank order, as the chain merges
        p = Partial(wire.uncast(0, got[0][r]), wire.uncast(1, got[1][r]),
                    wire.uncast(2, got[2][r]).reshape(mine, d))
        merged = p if merged is None else merge(merged, p)
    piece = pack(merged)
    total = np.empty(len(flat.m) * (d + 2), np.float32) if comm.rank == root else None
    comm.Gatherv(piece, [total, ([c * (d + 2) for c in counts],
                                 [a * (d + 2) for a, _ in bounds])] if total is not None
                 else None, root=root)
    traffic = Traffic(4, sent + piece.nbytes, loss)
    if comm.rank != root:
        return partial, traffic
    out = Partial(np.empty_like(flat.m), np.empty_like(flat.l), np.empty_like(flat.O))
    for r, (a, b) in enumerate(bounds):
        chunk = total[a * (d + 2):b * (d + 2)]
        rows = unpack(chunk, Partial(out.m[a:b], out.l[a:b], out.O[a:b]))
        out.m[a:b], out.l[a:b], out.O[a:b] = rows
    return Partial(out.m.reshape(partial.m.shape), out.l.reshape(partial.l.shape),
                   out.O.reshape(partial.O.shape)), traffic
