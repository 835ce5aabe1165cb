"""Per-rank phase timings and, when asked, a Chrome trace-event timeline. No MPI here.

:class:`Recorder` always keeps the seconds spent per phase; with ``events=True`` it
also keeps one duration event per phase, chain step, tile and message, in the
``{"traceEvents": [...]}`` format that Perfetto and chrome://tracing open.
Timestamps are microseconds since one origin common to all ranks: rank 0's wall clock
at the start, which each rank receives and offsets its own monotonic clock by, so a
message's receive never appears to end before its send began.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Dict, List, Optional


STEP_PHASES = ("local_attention", "reduce", "finalize", "kernel")
"""The phases of one decode step, timed per step (``finalize`` on the root only;
``kernel``, the call of the kernel's own function, in place of the other three in a
``--kernel-source`` run)."""


class Recorder:
    """Timings of one rank, and its trace events if ``events`` is true."""

    def __init__(self, rank: int, events: bool = False, tiles: bool = False):
        self.rank = rank
        self.events: Optional[List[Dict]] = [] if events else None
        self.tiles = events and tiles
        self.timings: Dict[str, float] = {}
        self.last: Dict[str, float] = {}
        """Seconds of each phase the last time it ran (a decode step's own phases)."""
        self.origin = time.perf_counter()
        self.shift = 0.0
        self.seq = 0
        self.paused = False
        """While true, no event is kept (timings still are): a long decode loop traces
        its first steps only, so the trace stays bounded."""

    def start(self, common_wall: Optional[float] = None) -> None:
        """Set this rank's origin; ``common_wall`` (``time.time()`` of rank 0 at the
        start, broadcast) puts every rank's events on one time axis."""
        self.origin = time.perf_counter()
        self.shift = 0.0 if common_wall is None else time.time() - common_wall

    def _ts(self, t: float) -> float:
        return (t - self.origin + self.shift) * 1e6

    def event(self, name: str, cat: str, t0: float, t1: float, args: Dict) -> Dict:
        """A span of ``perf_counter`` seconds ``[t0, t1)`` as a trace event of this rank."""
        return dict(name=name, cat=cat, ph="X", pid=self.rank, tid=0, ts=self._ts(t0),
                    dur=(t1 - t0) * 1e6, args=args)

    def _event(self, name: str, cat: str, t0: float, t1: float, args: Dict) -> None:
        if not self.paused:
            self.events.append(self.event(name, cat, t0, t1, args))

    @contextmanager
    def phase(self, name: str, **args):
        """Time a top-level phase (and trace it)."""
        t0 = time.perf_counter()
        yield
        t1 = time.perf_counter()
        self.last[name] = t1 - t0
        self.timings[name] = self.timings.get(name, 0.0) + t1 - t0
        if self.events is not None:
            self._event(name, "phase", t0, t1, args)

    @contextmanager
    def span(self, name: str, cat: str, **args):
        """Trace a step inside a phase (no timing kept)."""
        t0 = time.perf_counter()
        yield
        if self.events is not None:
            self._event(name, cat, t0, time.perf_counter(), args)

    def span_at(self, name: str, cat: str, t0: float, t1: float, args: Dict) -> None:
        """A span already timed (``perf_counter`` seconds)."""
        if self.events is not None:
            self._event(name, cat, t0, t1, args)

    def counter(self, name: str, value: float) -> None:
        """A sample of a counter track (Perfetto draws it as a graph under the rank)."""
        if self.events is not None and not self.paused:
            self.events.append(dict(name=name, ph="C", pid=self.rank, tid=0,
                                    ts=self._ts(time.perf_counter()),
                                    cat="counter", args={name: value}))

    def tile(self, index: int, start: int, stop: int, t0: float, t1: float) -> None:
        if self.tiles:
            self._event(f"tile {index}", "tile", t0, t1, dict(tokens=[start, stop]))

    def message(self, op: str, direction: str, peer: int, tensor: str, nbytes: int,
                t0: float, t1: float, comm: str = "") -> None:
        """A send or receive of ``tensor`` with ``peer`` (a world rank), on the
        communicator named ``comm``."""
        if self.events is not None:
            self._event(f"{op} {tensor} {'to' if op == 'send' else 'from'} {direction}",
                        "message", t0, t1,
                        dict(op=op, dir=direction, peer=peer, tensor=tensor,
                             bytes=nbytes, seq=self.seq, comm=comm))
            self.seq += 1


def flows(per_rank_events: List[List[Dict]]) -> List[Dict]:
    """Flow arrows from each message's send to its receive, so Perfetto draws the chain.

    MPI delivers the messages of one (sender, receiver, tag) in order, so the k-th send
    of a tensor from rank a to rank b is the k-th receive of it at b from a. An arrow
    leaves at the start of its send and lands at the end of its receive, so on the
    common time axis it never points back in time.
    """
    ends: Dict[tuple, Dict[str, List[Dict]]] = {}
    for rank, events in enumerate(per_rank_events):
        for e in events:
            if e["cat"] != "message":
                continue
            a = e["args"]
            pair = (rank, a["peer"]) if a["op"] == "send" else (a["peer"], rank)
            ends.setdefault(pair + (a["tensor"],), {"send": [], "recv": []})[a["op"]].append(e)
    arrows = []
    for (src, dst, tensor), sides in sorted(ends.items()):
        order = lambda e: e["args"]["seq"]  # noqa: E731
        for s, r in zip(sorted(sides["send"], key=order), sorted(sides["recv"], key=order)):
            n = len(arrows) // 2 + 1
            common = dict(name=f"{tensor} {src}->{dst}", cat="flow", id=n, tid=0)
            arrows.append(dict(common, ph="s", pid=src, ts=s["ts"]))
            # inside the receive's slice, for Perfetto to bind the arrow to it
            arrows.append(dict(common, ph="f", bp="e", pid=dst,
                               ts=r["ts"] + max(r["dur"] - 0.01, 0.0)))
    return arrows


def chrome_trace(per_rank_events: List[List[Dict]], names: List[str]) -> Dict:
    """One trace-event document: a process row per rank, named after its place, and
    an arrow from every send to its receive."""
    meta = []
    for rank, name in enumerate(names):
        meta.append(dict(name="process_name", ph="M", pid=rank, tid=0,
                         args=dict(name=f"rank {rank}: {name}")))
        meta.append(dict(name="process_sort_index", ph="M", pid=rank, tid=0,
                         args=dict(sort_index=rank)))
    events = [e for evs in per_rank_events for e in evs]
    return dict(traceEvents=meta + events + flows(per_rank_events), displayTimeUnit="ms")
