"""The accelerator's time of a kernel, predicted from its ``tl`` calls (``--predict``).
No MPI here.

Every PE's calls, in program order, are replayed through SPEC.md's cost model with a
:class:`~gqa_mpi.dsl.profile.Profile`'s numbers. Each PE has one clock, 0 at the start;
nothing on a PE overlaps:

=============================  =========================================================
call                           advances the PE's clock ``t`` by
=============================  =========================================================
``load``, ``store`` of B bytes ``call_s + mem_latency_s + B / mem_bytes_per_s`` (memory)
``dot`` (M,K) x (K,N)          ``call_s + 2*M*K*N / dot_flops_per_s`` (dot)
``max``, ``sum``               ``call_s + operand elements / vector_elems_per_s`` (vector)
any other op making a tensor   ``call_s + result elements / vector_elems_per_s`` (vector)
``send`` of B bytes on link L  ``t = max(t + call_s, free(L)) + B / bytes_per_s(L)``, then
                               ``free(L) = t``; it arrives at ``t + latency_s(L)`` (send)
``recv``                       ``t = max(t + call_s, arrival)``: ``call_s`` (send), the
                               rest the PE's wait (wait)
=============================  =========================================================

A link is one ordered pair of neighbours, first in, first out. The predicted step is
the largest final clock; the critical path runs back from the PE that finished last
through each ``recv`` that waited, to the PE and the call its message came from.

A recorded call is ``(call, kind, amount, direction, line, dtype)``: ``kind`` one of
:data:`KINDS`, ``amount`` its bytes, flops or elements, ``direction`` a message's,
``dtype`` the one its rate is looked up by (a dot's first operand's, a reduction's
operand's, every other vector call's result's; the last may be left out).

Two extensions of the model, each off unless its profile field is there (SPEC's
*Extensions of the model*): **rates by dtype** (``dot_flops_per_s`` or
``vector_elems_per_s`` a table with a ``default``) and **a cube's shared memory**
(``[cube] mem_bytes_per_s = B_c``: in a step, the ``n`` PEs of a cube that make at
least one load or store each move at ``min(mem_bytes_per_s, B_c / n)``).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..step.grid import Grid
from .profile import Profile

KINDS = ("mem", "dot", "vec", "send", "recv")
BUCKETS = {"mem": "memory_s", "dot": "dot_s", "vec": "vector_s"}
"""The split a PE's own calls go to (send and recv are the replay's, below)."""

Call = Tuple[str, str, float, Optional[str], Optional[int]]


@dataclass
class PE:
    """One PE's replay: its clock, its split, and what each of its calls did."""

    rank: int
    t: float = 0.0
    split: Dict[str, float] = field(default_factory=lambda: dict(
        memory_s=0.0, dot_s=0.0, vector_s=0.0, send_s=0.0, wait_s=0.0))
    spans: List[Tuple[float, float]] = field(default_factory=list)
    """``(start, end)`` of each call replayed so far."""
    recvs: List[Tuple[int, "Message", float]] = field(default_factory=list)
    """``(call index, message, wait)`` of each ``recv``."""


@dataclass
class Message:
    src: int
    index: int
    """The index of its ``send`` among the sender's calls."""
    sent: float
    arrival: float


@dataclass
class Prediction:
    """What the replay of one step gives."""

    pes: List[PE]
    calls: Dict[int, List[Call]]
    profile: Profile

    @property
    def step_s(self) -> float:
        return max(pe.t for pe in self.pes)

    @property
    def last(self) -> PE:
        return max(self.pes, key=lambda pe: (pe.t, -pe.rank))

    def critical_path(self) -> List[Dict]:
        """Back from the last PE through each ``recv`` that waited: the hops, first
        hop first, each with the sender, its call and line, when the message left and
        arrived, and how long the receiver waited for it."""
        by_rank = {pe.rank: pe for pe in self.pes}
        hops: List[Dict] = []
        pe, before = self.last, len(self.calls[self.last.rank])
        while True:
            waited = [(i, m, w) for i, m, w in pe.recvs if i < before and w > 0]
            if not waited:
                break
            i, m, wait = waited[-1]
            _, _, nbytes, direction, line = self.calls[m.src][m.index][:5]
            hops.append(dict(from_rank=m.src, to_rank=pe.rank, direction=direction,
                             bytes=int(nbytes), call="send", line=line,
                             recv_line=self.calls[pe.rank][i][4], sent_s=m.sent,
                             arrived_s=m.arrival, waited_s=wait))
            pe, before = by_rank[m.src], m.index
        return hops[::-1]

    def to_json(self, scratch_peak: float) -> Dict:
        """SPEC's ``predicted`` object (one step's)."""
        return dict(profile=self.profile.name, step_s=self.step_s, last_pe=self.last.rank,
                    fits_scratch=bool(scratch_peak <= self.profile.scratch_bytes),
                    scratch_peak_bytes=scratch_peak, scratch_bytes=self.profile.scratch_bytes,
                    pes=[dict(rank=pe.rank, finish_s=pe.t, **pe.split) for pe in self.pes],
                    critical_path=self.critical_path())


def cost(profile: Profile, kind: str, amount: float, dtype: Optional[str] = None,
         mem_bytes_per_s: Optional[float] = None) -> float:
    """What a call of ``kind`` and ``amount`` costs on its PE (not send/recv): a vector
    or dot call at its ``dtype``'s rate; a load or store at ``mem_bytes_per_s`` (its
    cube's fair share), by default the PE's own."""
    if kind == "mem":
        rate = profile.mem_bytes_per_s if mem_bytes_per_s is None else mem_bytes_per_s
        return profile.call_s + profile.mem_latency_s + amount / rate
    if kind == "dot":
        return profile.call_s + amount / profile.rate("dot_flops_per_s", dtype)
    return profile.call_s + amount / profile.rate("vector_elems_per_s", dtype)


def memory_rates(calls: Dict[int, Sequence[Call]], grid: Grid, profile: Profile
                 ) -> Dict[int, float]:
    """Each PE's memory rate in this step: its own, or with ``[cube] mem_bytes_per_s``
    the lower of it and the cube's share among the cube's PEs that load or store."""
    own = profile.mem_bytes_per_s
    if profile.cube_mem_bytes_per_s is None:
        return {rank: own for rank in calls}
    users: Dict[int, int] = {}
    for rank, mine in calls.items():
        if any(call[1] == "mem" for call in mine):
            cube = grid.place(rank).cube
            users[cube] = users.get(cube, 0) + 1
    return {rank: min(own, profile.cube_mem_bytes_per_s
                      / users.get(grid.place(rank).cube, 1)) for rank in calls}


def replay(calls: Dict[int, Sequence[Call]], grid: Grid, profile: Profile) -> Prediction:
    """Replay every PE's calls of one step (``calls[rank]``, in program order)."""
    pes = [PE(rank) for rank in sorted(calls)]
    free: Dict[Tuple[int, int], float] = {}
    queues: Dict[Tuple[int, int], deque] = {}
    at = {pe.rank: 0 for pe in pes}
    mem_rate = memory_rates(calls, grid, profile)
    todo = [pe for pe in pes]
    while todo:
        progressed = False
        for pe in todo:
            mine = calls[pe.rank]
            while at[pe.rank] < len(mine):
                i = at[pe.rank]
                name, kind, amount, direction = mine[i][:4]
                start = pe.t
                if kind == "send":
                    dst = grid.neighbour(pe.rank, direction)
                    link = profile.link(direction)
                    pe.t = max(pe.t + profile.call_s, free.get((pe.rank, dst), 0.0)) + \
                        amount / link.bytes_per_s
                    free[(pe.rank, dst)] = pe.t
                    queues.setdefault((pe.rank, dst), deque()).append(
                        Message(pe.rank, i, pe.t, pe.t + link.latency_s))
                    pe.split["send_s"] += pe.t - start
                elif kind == "recv":
                    src = grid.neighbour(pe.rank, direction)
                    queue = queues.get((src, pe.rank))
                    if not queue:
                        break                  # its message is not replayed yet
                    m = queue.popleft()
                    ready = pe.t + profile.call_s
                    pe.t = max(ready, m.arrival)
                    pe.split["send_s"] += profile.call_s
                    pe.split["wait_s"] += max(0.0, m.arrival - ready)
                    pe.recvs.append((i, m, max(0.0, m.arrival - ready)))
                else:
                    pe.t += cost(profile, kind, amount, mine[i][5] if len(mine[i]) > 5
                                 else None, mem_rate[pe.rank])
                    pe.split[BUCKETS[kind]] += pe.t - start
                pe.spans.append((start, pe.t))
                at[pe.rank] += 1
                progressed = True
        todo = [pe for pe in todo if at[pe.rank] < len(calls[pe.rank])]
        if todo and not progressed:
            stuck = ", ".join(f"rank {pe.rank} at call {at[pe.rank]}" for pe in todo[:4])
            raise ValueError(f"the replay cannot go on: {stuck} wait for messages that "
                             f"were never sent")
    return Prediction(pes, {r: list(c) for r, c in calls.items()}, profile)


def trace_events(prediction: Prediction, pid: int = 10 ** 6) -> List[Dict]:
    """The predicted timeline as Chrome trace events: one process beside the measured
    ones, one track per PE, a span per call and an arrow per message."""
    events = [dict(name="process_name", ph="M", pid=pid,
                   args=dict(name=f"predicted on {prediction.profile.name}"))]
    for pe in prediction.pes:
        events.append(dict(name="thread_name", ph="M", pid=pid, tid=pe.rank,
                           args=dict(name=f"rank {pe.rank}")))
        for call, (t0, t1) in zip(prediction.calls[pe.rank], pe.spans):
            name, kind, amount, direction, line = call[:5]
            args = dict(line=line, amount=amount)
            if direction:
                args["dir"] = direction
            events.append(dict(name=f"tl.{name}", cat="predicted", ph="X", pid=pid,
                               tid=pe.rank, ts=t0 * 1e6, dur=(t1 - t0) * 1e6, args=args))
    flow = pid          # ids apart from the measured arrows' (which count from 0)
    for pe in prediction.pes:
        for _, m, _ in pe.recvs:
            flow += 1
            events.append(dict(name="message", cat="predicted", ph="s", id=flow, pid=pid,
                               tid=m.src, ts=m.sent * 1e6))
            events.append(dict(name="message", cat="predicted", ph="f", bp="e", id=flow,
                               pid=pid, tid=pe.rank, ts=m.arrival * 1e6))
    return events


def predict_steps(calls: List[List[List[Call]]], grid: Grid, profile: Profile,
                  scratch_peak: float) -> Tuple[Dict, Prediction]:
    """SPEC's ``predicted`` object of a run: ``calls[rank][step]`` replayed step by step
    (each step's clocks start at 0); ``step_s`` and ``pes`` are the last step's and,
    with several steps, ``steps_s`` lists each. Also the last step's replay."""
    steps = [replay({r: mine[s] for r, mine in enumerate(calls)}, grid, profile)
             for s in range(len(calls[0]))]
    out = steps[-1].to_json(scratch_peak)
    if len(steps) > 1:
        out["steps_s"] = [p.step_s for p in steps]
    return out, steps[-1]
