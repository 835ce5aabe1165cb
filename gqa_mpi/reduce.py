"""Reduction of the partials to the root: the schedules, and their execution.

Three schedules (``--reduce``): ``chain``, the kernel's own (below, the default);
``tree``, a binomial tree over point-to-point messages (``ceil(log2 n)`` hops); and
``mpi``, one ``MPI.Reduce`` with a user-defined merge operator on the packed partial.

A schedule is this rank's list of :class:`Step` s, run in order: ``recv`` from a
neighbour and merge into the running partial, or ``send`` the running partial on.
The kernel's chain (SPEC.md, "The chain reduction to the root")::

    1. row chain      recv intra_E (if any), merge; send intra_W if col > 0
    2. column bridge  at col 0: recv intra_S (if any), merge; send intra_N if row > 0
    3. inter-cube     at PE 0: recv E (if any), merge; send W if cube > 0

For 2 cubes of 2x4 PEs the partial of rank 15 reaches rank 0 in 5 hops::

    cube 0: 0 <- 1 <- 2 <- 3      cube 1: 8  <- 9  <- 10 <- 11
            ^                             ^
            4 <- 5 <- 6 <- 7              12 <- 13 <- 14 <- 15
    0 <-E- 8
"""
from __future__ import annotations

import time
from typing import Dict, List, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from .attention import Partial, merge
from . import watchdog
from . import wire as wires
from .trace import Recorder


class Step(NamedTuple):
    """One point-to-point action: ``op`` is 'recv' or 'send', ``dir`` a direction name."""

    op: str
    dir: str
    peer: int


def chain_schedule(neighbours: Dict[str, int], cube: int, pe: int, row: int,
                   col: int) -> List[Step]:
    """This rank's steps of the kernel's two-level chain (see the module docstring)."""
    none = MPI.PROC_NULL
    steps: List[Step] = []
    if neighbours["intra_E"] != none:
        steps.append(Step("recv", "intra_E", neighbours["intra_E"]))
    if col > 0:
        steps.append(Step("send", "intra_W", neighbours["intra_W"]))
        return steps
    if neighbours["intra_S"] != none:
        steps.append(Step("recv", "intra_S", neighbours["intra_S"]))
    if row > 0:
        steps.append(Step("send", "intra_N", neighbours["intra_N"]))
        return steps
    if pe == 0:
        if neighbours["E"] != none:
            steps.append(Step("recv", "E", neighbours["E"]))
        if cube > 0:
            steps.append(Step("send", "W", neighbours["W"]))
    return steps


def tree_schedule(rank: int, size: int) -> List[Step]:
    """This rank's steps of a binomial tree rooted at rank 0.

    In round ``k`` (``2**k`` apart) a rank whose lowest set bit is ``2**k`` sends its
    partial to ``rank - 2**k`` and is done; the others receive from ``rank + 2**k``
    if it exists. Depth ``ceil(log2 size)``.
    """
    steps: List[Step] = []
    span = 1
    while span < size:
        if rank & span:
            steps.append(Step("send", "tree", rank - span))
            break
        if rank + span < size:
            steps.append(Step("recv", "tree", rank + span))
        span *= 2
    return steps


def _merge_packed(like: Partial):
    """An ``MPI.Op`` merging two packed float32 partials shaped like ``like``."""
    def merge_op(inbuf, inoutbuf, datatype):
        a, b = (np.frombuffer(x, dtype=np.float32) for x in (inbuf, inoutbuf))
        b[:] = wires.pack(merge(wires.unpack(a, like), wires.unpack(b, like)))

    return MPI.Op.Create(merge_op, commute=True)


def mpi_reduce(comm: MPI.Comm, partial: Partial, traffic: "Traffic",
               recorder: Optional[Recorder] = None) -> Partial:
    """``MPI.Reduce`` of the packed partial with the merge as a user-defined operator.

    MPI picks the message pattern; each rank hands it one packed float32 buffer.
    """
    recorder = recorder or Recorder(comm.rank)
    send = wires.pack(partial)
    recv = np.empty_like(send) if comm.rank == 0 else None
    op = _merge_packed(partial)
    try:
        with recorder.span("MPI_Reduce", "chain"), watchdog.waiting("all ranks (MPI_Reduce)"):
            comm.Reduce(send, recv, op=op, root=0)
    finally:
        op.Free()
    if comm.rank != 0:
        traffic.messages += 1
        traffic.bytes += send.nbytes
        return partial
    return wires.unpack(recv, partial)


class Traffic:
    """Counts of what this rank sent, and what the wire lost on the way."""

    def __init__(self):
        self.messages = 0
        self.bytes = 0
        self.loss = wires.Loss()


def run_schedule(comm: MPI.Comm, partial: Partial, steps: List[Step], wire: str,
                 traffic: Traffic, recorder: Optional[Recorder] = None) -> Partial:
    """Run ``steps`` on ``partial``; return the merged partial (the total at the root).

    Tensor data travels with the buffer methods ``Send``/``Recv``, never pickled.
    ``recorder`` traces each step and each message.
    """
    recorder = recorder or Recorder(comm.rank)
    for i, step in enumerate(steps):
        with recorder.span(f"{step.op} {step.dir}", "chain", step=i, peer=step.peer):
            if step.op == "recv":
                bufs = wires.receive_buffers(partial, wire)
                for name, buf in bufs:
                    t0 = time.perf_counter()
                    with watchdog.waiting(f"rank {step.peer} ({step.dir}, {name})"):
                        comm.Recv(wires.as_message(buf), source=step.peer,
                                  tag=wires.TAGS[name])
                    recorder.message("recv", step.dir, step.peer, name, buf.nbytes, t0,
                                     time.perf_counter())
                partial = merge(partial, wires.decode(bufs, partial))
            else:
                bufs, loss = wires.encode(partial, wire)
                traffic.loss = traffic.loss + loss
                for name, buf in bufs:
                    t0 = time.perf_counter()
                    with watchdog.waiting(f"rank {step.peer} ({step.dir}) to take {name}"):
                        comm.Send(wires.as_message(buf), dest=step.peer,
                                  tag=wires.TAGS[name])
                    traffic.messages += 1
                    traffic.bytes += buf.nbytes
                    recorder.message("send", step.dir, step.peer, name, buf.nbytes, t0,
                                     time.perf_counter())
    return partial
