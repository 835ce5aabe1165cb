"""Executing a reduction schedule (:mod:`gqa_mpi.step.schedules`) on MPI.

Tensor data travels with the buffer methods (``Send``/``Recv``, ``Reduce``,
``Allgather``, ``Alltoallv``, ``Gatherv``), never pickled. A step whose ``dir`` is one
of SPEC's directions travels on that direction's communicator
(:meth:`gqa_mpi.mpi.topology.Topology.link`: the cube's for ``intra_*``, the
inter-cube one for ``E``/``W``); any other step (the tree's) on the ``(C, P)``
communicator. :func:`execute` returns the merged partial (the total at the root) and
this rank's :class:`~gqa_mpi.step.schedules.Traffic`: messages and bytes it sent (a
collective counts once, with the bytes this rank put in), and what the wire lost.

A collective schedule (``Collective.op``) runs the executor registered here under its
``op`` with :func:`collective`; adding one is its class and one such function.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..step.attention import Partial, merge, rescale
from ..step.grid import DIRECTIONS
from ..step.partition import token_range
from ..step.schedules import Schedule, Step, Traffic
from ..step.trace import Recorder
from ..step.wires import TAGS, Loss, Wire, as_message, pack, unpack
from . import watchdog
from .inprocess import user_op
from .topology import Topology

Executor = Callable[[MPI.Comm, Partial, Wire, int], Tuple[Partial, Traffic]]
EXECUTORS: Dict[str, Executor] = {}


def collective(op: str):
    """Register ``fn(comm, partial, wire, root) -> (partial, traffic)`` as the executor
    of collective schedules whose ``op`` is ``op``."""
    def register(fn: Executor) -> Executor:
        EXECUTORS[op] = fn
        return fn
    return register


def execute(topo: Topology, partial: Partial, schedule: Schedule, wire: Wire,
            recorder: Optional[Recorder] = None) -> Tuple[Partial, Traffic]:
    """Run this rank's steps of ``schedule`` on ``partial``; return the merged partial
    and this rank's traffic. ``recorder`` traces each step and each message."""
    rec = recorder or Recorder(topo.rank)
    steps = schedule.steps(topo.grid, topo.rank)
    if steps and steps[0].op not in ("send", "recv"):
        with rec.span(steps[0].op, "chain"), watchdog.waiting(f"all ranks ({steps[0].op})"):
            return EXECUTORS[steps[0].op](topo.comm, partial, wire, steps[0].peer)
    if schedule.chunks:
        return _pipelined(topo, partial, steps, wire, schedule.chunks, rec)
    return _point_to_point(topo, partial, steps, wire, rec)


class _Link:
    """Sends and receives of one rank on the communicator each step's direction names,
    counted and traced."""

    def __init__(self, topo: Topology, rec: Recorder):
        self.topo, self.rec = topo, rec
        self.messages = self.bytes = 0
        self.loss = Loss()

    def _route(self, step: Step) -> Tuple[MPI.Comm, int]:
        if step.dir in DIRECTIONS:
            return self.topo.link(step.dir)
        return self.topo.comm, step.peer

    def send(self, step: Step, name: str, buf: np.ndarray) -> None:
        comm, rank = self._route(step)
        t0 = time.perf_counter()
        with watchdog.waiting(f"rank {step.peer} ({step.dir}) to take {name}"):
            comm.Send(as_message(buf), dest=rank, tag=TAGS[name])
        self.messages, self.bytes = self.messages + 1, self.bytes + buf.nbytes
        self.rec.message("send", step.dir, step.peer, name, buf.nbytes, t0,
                         time.perf_counter(), comm.Get_name())

    def recv(self, step: Step, name: str, buf: np.ndarray) -> np.ndarray:
        comm, rank = self._route(step)
        t0 = time.perf_counter()
        with watchdog.waiting(f"rank {step.peer} ({step.dir}, {name})"):
            comm.Recv(as_message(buf), source=rank, tag=TAGS[name])
        self.rec.message("recv", step.dir, step.peer, name, buf.nbytes, t0,
                         time.perf_counter(), comm.Get_name())
        return buf

    def send_all(self, step: Step, bufs) -> None:
        for name, buf in bufs:
            self.send(step, name, buf)

    def recv_all(self, step: Step, bufs):
        return [(name, self.recv(step, name, buf)) for name, buf in bufs]

    def traffic(self) -> Traffic:
        return Traffic(self.messages, self.bytes, self.loss)


def _point_to_point(topo: Topology, partial: Partial, steps: List[Step], wire: Wire,
                    rec: Recorder) -> Tuple[Partial, Traffic]:
    link = _Link(topo, rec)
    for i, step in enumerate(steps):
        with rec.span(f"{step.op} {step.dir}", "chain", step=i, peer=step.peer):
            if step.op == "recv":
                bufs = link.recv_all(step, wire.buffers(partial))
                partial = merge(partial, wire.decode(bufs, partial))
            else:
                bufs, lost = wire.encode(partial)
                link.loss = link.loss + lost
                link.send_all(step, bufs)
    return partial, link.traffic()


def _pipelined(topo: Topology, partial: Partial, steps: List[Step], wire: Wire, chunks: int,
               rec: Recorder) -> Tuple[Partial, Traffic]:
    """A schedule whose ranks receive, then send once, run with O in ``chunks`` pieces.

    First the statistics: ``m`` and ``l`` of every child, merged, go up at once (as the
    wire groups them). Then piece by piece: each child's piece of O, put on the merged
    scale and added, goes up before the next piece is received, so the levels of the
    tree work at the same time.
    """
    link = _Link(topo, rec)
    recvs = [s for s in steps if s.op == "recv"]
    send = next((s for s in steps if s.op == "send"), None)
    stats = Partial(partial.m, partial.l, np.zeros(0, np.float32))
    with rec.span("statistics", "chain"):       # stats has no O: m and l travel alone
        got = [wire.decode(link.recv_all(step, wire.buffers(stats)), stats) for step in recvs]
        m, scales = rescale([partial.m] + [g.m for g in got])
        l = sum(li * e for li, e in zip([partial.l] + [g.l for g in got], scales))
        if send is not None:
            bufs, lost = wire.encode(Partial(m, l, stats.O))
            link.loss = link.loss + lost
            link.send_all(send, bufs)
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


@collective("reduce")
def _reduce(comm, partial: Partial, wire: Wire, root: int) -> Tuple[Partial, Traffic]:
    """MPI.Reduce of the packed partial, with the merge as a user-defined operator."""
    def merge_op(inbuf, inoutbuf, datatype):
        a, b = (np.frombuffer(x, dtype=np.float32) for x in (inbuf, inoutbuf))
        b[:] = pack(merge(unpack(a, partial), unpack(b, partial)))

    send = pack(partial)
    recv = np.empty_like(send) if comm.rank == root else None
    op = user_op(comm, merge_op)
    try:
        comm.Reduce(send, recv, op=op, root=root)
    finally:
        op.Free()
    traffic = Traffic(1, send.nbytes)
    return (unpack(recv, partial), traffic) if comm.rank == root else (partial, traffic)


@collective("allgather")
def _allgather(comm, partial: Partial, wire: Wire, root: int) -> Tuple[Partial, Traffic]:
    """All-gather of (m, l); each rank puts its O on the common scale; a SUM of O."""
    ml = np.concatenate([partial.m.ravel(), partial.l.ravel()]).astype(np.float32)
    every = np.empty((comm.size, ml.size), dtype=np.float32)
    comm.Allgather(ml, every)
    ms = every[:, :partial.m.size].reshape((comm.size,) + partial.m.shape)
    ls = every[:, partial.m.size:].reshape((comm.size,) + partial.l.shape)
    m, scales = rescale(ms)
    l = sum(li * e for li, e in zip(ls, scales))
    mine = np.ascontiguousarray(partial.O * scales[comm.rank][..., None], dtype=np.float32)
    total = np.empty_like(mine) if comm.rank == root else None
    comm.Reduce(mine, total, op=MPI.SUM, root=root)
    traffic = Traffic(2, ml.nbytes + mine.nbytes)
    return (Partial(m, l, total), traffic) if comm.rank == root else (partial, traffic)


@collective("alltoall")
def _alltoall(comm, partial: Partial, wire: Wire, root: int) -> Tuple[Partial, Traffic]:
    """Rows (query heads) split over the ranks: one all-to-all per tensor, each rank
    merging every rank's partial of its rows, then a gather of the merged rows; both in
    the wire's formats (:meth:`~gqa_mpi.step.wires.Wire.cast_all`)."""
    n, d = comm.size, partial.O.shape[-1]
    flat = Partial(partial.m.reshape(-1), partial.l.reshape(-1), partial.O.reshape(-1, d))
    bounds = [token_range(len(flat.m), n, r) for r in range(n)]
    counts = [b - a for a, b in bounds]
    mine = counts[comm.rank]
    widths = (1, 1, d)

    def layout(width):              # counts and displacements of every rank's rows
        return [c * width for c in counts], [a * width for a, _ in bounds]

    bufs, loss = wire.cast_all(flat)
    got, sent = [], 0
    for i, (buf, w) in enumerate(zip(bufs, widths)):
        recv = wire.empty(i, n * mine * w)
        comm.Alltoallv([as_message(buf.reshape(-1)), layout(w)],
                       [as_message(recv), ([mine * w] * n, [r * mine * w for r in range(n)])])
        got.append(wire.uncast(i, recv).reshape(n, mine, w))
        sent += (buf.size - counts[comm.rank] * w) * buf.itemsize
    merged = Partial(got[0][0, :, 0], got[1][0, :, 0], got[2][0])
    for r in range(1, n):                           # in rank order, as the chain merges
        merged = merge(merged, Partial(got[0][r, :, 0], got[1][r, :, 0], got[2][r]))
    pieces, lost = wire.cast_all(merged)
    total = []
    for i, (buf, w) in enumerate(zip(pieces, widths)):
        recv = wire.empty(i, len(flat.m) * w) if comm.rank == root else None
        comm.Gatherv(as_message(buf.reshape(-1)),
                     [as_message(recv), layout(w)] if recv is not None else None, root=root)
        total.append(recv)
        sent += buf.nbytes
    traffic = Traffic(6, sent, loss + lost)
    if comm.rank != root:
        return partial, traffic
    return Partial(*(wire.uncast(i, t).reshape(x.shape)
                     for i, (t, x) in enumerate(zip(total, partial)))), traffic
