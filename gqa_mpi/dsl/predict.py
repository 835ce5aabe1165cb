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

Three extensions of the model, each off unless its profile field is there (SPEC's
*Extensions of the model*): **rates by dtype** (``dot_flops_per_s`` or
``vector_elems_per_s`` a table with a ``default``), **a cube's shared memory**
(``[cube] mem_bytes_per_s = B_c``: in a step, the ``n`` PEs of a cube that make at
least one load or store each move at ``min(mem_bytes_per_s, B_c / n)``) and **engines
that overlap** (``[pe] overlap = true``: :class:`Engines`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..step.grid import Grid
from .profile import Profile

KINDS = ("mem", "dot", "vec", "send", "recv")
BUCKETS = {"mem": "memory_s", "dot": "dot_s", "vec": "vector_s"}
"""The split a PE's own calls go to (send and recv are the replay's, below)."""
ENGINES = {"mem": "dma", "dot": "matrix", "vec": "vector"}
"""With overlap: the engine each kind of call runs on (sends and recvs take none)."""


class Call(NamedTuple):
    """One recorded call that has a cost."""

    name: str
    kind: str
    """One of :data:`KINDS`."""
    amount: float
    """Its bytes (mem, send, recv), flops (dot) or elements (vec)."""
    direction: Optional[str] = None
    line: Optional[int] = None
    dtype: Optional[str] = None
    """The dtype its rate is looked up by: a dot's first operand's, a reduction's
    operand's, every other vector call's result's."""
    reads: Tuple[int, ...] = ()
    """The tensors it reads, in operand order, each by its cell (a view shares its
    base's); for ``copy_to`` the last is ``dst``'s."""
    writes: Optional[int] = None
    """The cell of the tensor it makes (for ``copy_to``, ``dst``'s new one)."""


@dataclass
class Message:
    src: int
    index: int
    """The index of its ``send`` among the sender's calls."""
    sent: float
    arrival: float


@dataclass
class PE:
    """One PE's replay, one clock (nothing overlaps): its finish, its split, and what
    each of its calls did."""

    rank: int
    profile: Profile
    mem_rate: float
    t: float = 0.0
    split: Dict[str, float] = field(default_factory=lambda: dict(
        memory_s=0.0, dot_s=0.0, vector_s=0.0, send_s=0.0, wait_s=0.0))
    spans: List[Tuple[float, float]] = field(default_factory=list)
    """``(start, end)`` of each call replayed so far."""
    recvs: List[Tuple[int, Message, float]] = field(default_factory=list)
    """``(call index, message, wait)`` of each ``recv``."""

    @property
    def finish(self) -> float:
        return self.t

    def compute(self, i: int, call: Call) -> None:
        start = self.t
        self.t += cost(self.profile, call.kind, call.amount, call.dtype, self.mem_rate)
        self.split[BUCKETS[call.kind]] += self.t - start
        self.spans.append((start, self.t))

    def send(self, i: int, call: Call, bytes_per_s: float, free: float,
             link_last: Optional[int]) -> float:
        """Replay a send on a link free from ``free`` (after its send ``link_last``);
        when the link is free again."""
        start = self.t
        self.t = max(self.t + self.profile.call_s, free) + call.amount / bytes_per_s
        self.split["send_s"] += self.t - start
        self.spans.append((start, self.t))
        return self.t

    def recv(self, i: int, call: Call, m: Message) -> None:
        start, ready = self.t, self.t + self.profile.call_s
        self.t = max(ready, m.arrival)
        wait = max(0.0, m.arrival - ready)
        self.split["send_s"] += self.profile.call_s
        self.split["wait_s"] += wait
        self.recvs.append((i, m, wait))
        self.spans.append((start, self.t))


@dataclass
class Engines(PE):
    """One PE's replay with engines that overlap (SPEC's ``[pe] overlap = true``): a
    sequencer issues each call ``call_s`` after the one before; a call starts on its
    engine (``dma``, ``matrix``, ``vector``) at the latest of its issue, the engine's
    previous call's end and the ready time of each tensor it reads (``copy_to`` also
    after every earlier call that read or wrote ``dst``), and takes its cost less
    ``call_s``. A send takes no engine: it starts at the latest of its issue, its
    tensor's ready time and its link's free time. A recv's result is ready at the later
    of its issue and its message's arrival; the sequencer does not wait for it."""

    issued: int = 0
    link_s: float = 0.0
    """Its links' busy time (its sends'; ``send_s`` also has its recvs' ``call_s``)."""
    engine_of: List[str] = field(default_factory=list)
    """The engine (or ``link``) each call ran on."""
    why: List[Tuple[str, object]] = field(default_factory=list)
    """What set each call's start: ``("message", Message)``, ``("read", call index)``,
    ``("engine", call index)`` (for a send, the link's previous send) or ``("issue",
    None)``."""
    free: Dict[str, Tuple[float, Optional[int]]] = field(default_factory=dict)
    """Each engine's end of its last call, and that call."""
    ready: Dict[int, Tuple[float, int]] = field(default_factory=dict)
    """Each cell's ready time, and the call that wrote it (a cell no call here wrote is
    ready at 0)."""
    touched: Dict[int, Tuple[float, int]] = field(default_factory=dict)
    """Each cell's latest end of a call that read or wrote it, and that call."""

    @property
    def finish(self) -> float:
        return max([self.issued * self.profile.call_s] + [end for _, end in self.spans])

    def _issue(self) -> float:
        self.issued += 1
        return self.issued * self.profile.call_s

    def _start(self, issue: float, reads: Sequence[int], engine: Tuple[float, Optional[int]],
               after: Sequence[Tuple[float, int]] = ()) -> float:
        """The latest of the reads' ready times, ``after``, the engine's end and the
        issue; what set it is noted in that order of precedence."""
        ways = [(self.ready[c][0], ("read", self.ready[c][1])) for c in reads
                if c in self.ready] + [(t, ("read", j)) for t, j in after]
        if engine[1] is not None:
            ways.append((engine[0], ("engine", engine[1])))
        ways.append((issue, ("issue", None)))
        start = max(t for t, _ in ways)
        self.why.append(next(why for t, why in ways if t == start))
        return start

    def _end(self, i: int, start: float, end: float, reads: Sequence[int],
             writes: Optional[int], engine: str) -> None:
        self.spans.append((start, end))
        self.engine_of.append(engine)
        for c in reads:
            if end >= self.touched.get(c, (0.0, -1))[0]:
                self.touched[c] = (end, i)
        if writes is not None:
            self.ready[writes] = self.touched[writes] = (end, i)

    def compute(self, i: int, call: Call) -> None:
        issue = self._issue()
        engine = ENGINES[call.kind]
        reads, after = call.reads, ()
        if call.name == "copy_to" and reads:
            reads, dst = reads[:-1], reads[-1]
            after = [self.touched[dst]] if dst in self.touched else []
        start = self._start(issue, reads, self.free.get(engine, (0.0, None)), after)
        end = start + cost(self.profile, call.kind, call.amount, call.dtype,
                           self.mem_rate) - self.profile.call_s
        self.free[engine] = (end, i)
        self.split[BUCKETS[call.kind]] += end - start
        self._end(i, start, end, reads, call.writes, engine)

    def send(self, i: int, call: Call, bytes_per_s: float, free: float,
             link_last: Optional[int]) -> float:
        start = self._start(self._issue(), call.reads, (free, link_last))
        sent = start + call.amount / bytes_per_s
        self.split["send_s"] += sent - start
        self.link_s += sent - start
        self._end(i, start, sent, call.reads, None, "link")
        return sent

    def recv(self, i: int, call: Call, m: Message) -> None:
        issue = self._issue()
        ready = max(issue, m.arrival)
        self.why.append(("message", m) if m.arrival >= issue else ("issue", None))
        self.split["send_s"] += self.profile.call_s
        self.split["wait_s"] += ready - issue
        self.recvs.append((i, m, ready - issue))
        self._end(i, issue, ready, (), call.writes, "link")

    @property
    def busy(self) -> Dict[str, float]:
        """Each engine's busy time, and the links'."""
        return dict({e: self.split[BUCKETS[k]] for k, e in ENGINES.items()}, link=self.link_s)

    @property
    def bound(self) -> str:
        """The busiest of the PE's three engines (``dma``, ``matrix``, ``vector``)."""
        return max(ENGINES.values(), key=lambda e: self.busy[e])


@dataclass
class Prediction:
    """What the replay of one step gives."""

    pes: List[PE]
    calls: Dict[int, List[Call]]
    profile: Profile

    @property
    def step_s(self) -> float:
        return max(pe.finish for pe in self.pes)

    @property
    def last(self) -> PE:
        return max(self.pes, key=lambda pe: (pe.finish, -pe.rank))

    def critical_path(self) -> List[Dict]:
        """The messages on the critical path, first hop first, each with the sender, its
        call and line, when the message left and arrived, and how long the receiver
        waited for it."""
        by_rank = {pe.rank: pe for pe in self.pes}
        hops: List[Dict] = []

        def hop(pe: PE, i: int, m: Message, wait: float) -> None:
            sent = self.calls[m.src][m.index]
            hops.append(dict(from_rank=m.src, to_rank=pe.rank, direction=sent.direction,
                             bytes=int(sent.amount), call="send", line=sent.line,
                             recv_line=self.calls[pe.rank][i].line, sent_s=m.sent,
                             arrived_s=m.arrival, waited_s=wait))
        pe = self.last
        if isinstance(pe, Engines):
            # back from the call that ended last through whatever set each start
            ends = [(end, i) for i, (_, end) in enumerate(pe.spans)]
            i = max(ends)[1] if ends else None
            while i is not None:
                what, ref = pe.why[i]
                if what == "message":
                    hop(pe, i, ref, pe.spans[i][1] - pe.spans[i][0])
                    pe, i = by_rank[ref.src], ref.index
                else:
                    i = ref
            return hops[::-1]
        # one clock: back through each recv that waited
        before = len(self.calls[pe.rank])
        while True:
            waited = [(i, m, w) for i, m, w in pe.recvs if i < before and w > 0]
            if not waited:
                break
            i, m, wait = waited[-1]
            hop(pe, i, m, wait)
            pe, before = by_rank[m.src], m.index
        return hops[::-1]

    def to_json(self, scratch_peak: float) -> Dict:
        """SPEC's ``predicted`` object (one step's); with overlap, each PE's engines'
        busy times and the busiest (``bound``)."""
        def entry(pe: PE) -> Dict:
            out = dict(rank=pe.rank, finish_s=pe.finish, **pe.split)
            if isinstance(pe, Engines):
                out.update(bound=pe.bound, busy_s=dict(pe.busy))
            return out
        return dict(profile=self.profile.name, step_s=self.step_s, last_pe=self.last.rank,
                    overlap=self.profile.overlap,
                    fits_scratch=bool(scratch_peak <= self.profile.scratch_bytes),
                    scratch_peak_bytes=scratch_peak, scratch_bytes=self.profile.scratch_bytes,
                    pes=[entry(pe) for pe in self.pes],
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


def replay(calls: Dict[int, Sequence[Sequence]], grid: Grid, profile: Profile) -> Prediction:
    """Replay every PE's calls of one step (``calls[rank]``, in program order: each a
    :class:`Call` or a tuple of its fields)."""
    calls = {rank: [Call(*c) for c in mine] for rank, mine in calls.items()}
    mem_rate = memory_rates(calls, grid, profile)
    kind = Engines if profile.overlap else PE
    pes = [kind(rank, profile, mem_rate[rank]) for rank in sorted(calls)]
    free: Dict[Tuple[int, int], Tuple[float, Optional[int]]] = {}
    queues: Dict[Tuple[int, int], deque] = {}
    at = {pe.rank: 0 for pe in pes}
    todo = list(pes)
    while todo:
        progressed = False
        for pe in todo:
            mine = calls[pe.rank]
            while at[pe.rank] < len(mine):
                i = at[pe.rank]
                call = mine[i]
                if call.kind in ("send", "recv"):
                    other = grid.neighbour(pe.rank, call.direction)
                    key = (pe.rank, other) if call.kind == "send" else (other, pe.rank)
                    if call.kind == "send":
                        link = profile.link(call.direction)
                        sent = pe.send(i, call, link.bytes_per_s, *free.get(key, (0.0, None)))
                        free[key] = (sent, i)
                        queues.setdefault(key, deque()).append(
                            Message(pe.rank, i, sent, sent + link.latency_s))
                    elif not queues.get(key):
                        break                  # its message is not replayed yet
                    else:
                        pe.recv(i, call, queues[key].popleft())
                else:
                    pe.compute(i, call)
                at[pe.rank] += 1
                progressed = True
        todo = [pe for pe in todo if at[pe.rank] < len(calls[pe.rank])]
        if todo and not progressed:
            stuck = ", ".join(f"rank {pe.rank} at call {at[pe.rank]}" for pe in todo[:4])
            raise ValueError(f"the replay cannot go on: {stuck} wait for messages that "
                             f"were never sent")
    return Prediction(pes, calls, profile)


TRACKS = ("dma", "matrix", "vector", "link")
"""With overlap, a PE's predicted track is one per engine (sends and recvs on ``link``)."""


def trace_events(prediction: Prediction, pid: int = 10 ** 6) -> List[Dict]:
    """The predicted timeline as Chrome trace events: one process beside the measured
    ones, one track per PE (with overlap, one per engine of each PE), a span per call
    and an arrow per message."""
    events = [dict(name="process_name", ph="M", pid=pid,
                   args=dict(name=f"predicted on {prediction.profile.name}"))]

    def tid(pe: PE, i: Optional[int] = None) -> int:
        if not isinstance(pe, Engines):
            return pe.rank
        return pe.rank * len(TRACKS) + TRACKS.index(pe.engine_of[i] if i is not None
                                                    else "link")
    by_rank = {pe.rank: pe for pe in prediction.pes}
    for pe in prediction.pes:
        for track in (TRACKS if isinstance(pe, Engines) else (None,)):
            events.append(dict(name="thread_name", ph="M", pid=pid,
                               tid=pe.rank if track is None else
                               pe.rank * len(TRACKS) + TRACKS.index(track),
                               args=dict(name=f"rank {pe.rank}" + (f" {track}" if track
                                                                   else ""))))
        for i, (call, (t0, t1)) in enumerate(zip(prediction.calls[pe.rank], pe.spans)):
            args = dict(line=call.line, amount=call.amount)
            if call.direction:
                args["dir"] = call.direction
            events.append(dict(name=f"tl.{call.name}", cat="predicted", ph="X", pid=pid,
                               tid=tid(pe, i), ts=t0 * 1e6, dur=(t1 - t0) * 1e6, args=args))
    flow = pid          # ids apart from the measured arrows' (which count from 0)
    for pe in prediction.pes:
        for _, m, _ in pe.recvs:
            flow += 1
            events.append(dict(name="message", cat="predicted", ph="s", id=flow, pid=pid,
                               tid=tid(by_rank[m.src], m.index), ts=m.sent * 1e6))
            events.append(dict(name="message", cat="predicted", ph="f", bp="e", id=flow,
                               pid=pid, tid=tid(pe), ts=m.arrival * 1e6))
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
