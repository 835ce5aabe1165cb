"""``tl.send``/``tl.recv`` on MPI, and the watch that turns a kernel's deadlock into a
report instead of a hang.

A direction resolves through :meth:`gqa_mpi.mpi.topology.Topology.link`, so the
kernel's ``intra_*`` messages travel on its cube's communicator and ``E``/``W`` on the
inter-cube one. Sends are non-blocking (a PE's send does not wait for its neighbour's
receive, as on the hardware's links); a receive polls for the next message from its
direction, checks its byte count, then takes it.

The watch (:class:`Watch`) runs on a duplicate of the ``(C, P)`` communicator. A rank
that has waited in ``tl.recv`` for a while tells rank 0 so, every
:data:`HEARTBEAT` seconds, with its direction, line and message counts; a rank whose
kernel returned says so once. Rank 0, whenever it waits itself, reads these: when every
rank is waiting or done and nothing has changed for :data:`STABLE` seconds, no message
can arrive any more, and it reports the deadlock (each waiting PE, its direction and
line) and ends the job with exit code 5. When every rank is done it releases them; if
some message was sent and never received, that is reported the same way.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..step.grid import DIRECTIONS
from ..dsl.tl import KernelFault
from ..step.trace import Recorder
from ..exits import Exit
from . import watchdog
from .inprocess import job, status_for
from .topology import Topology

TAG_DATA = 77
STATE, GO, FAULT, LEAVE = 1, 2, 3, 4
HEARTBEAT = 0.25
"""Seconds between the reports of a waiting rank (and before its first)."""
STABLE = 1.0
"""Seconds rank 0 sees everyone waiting, unchanged, before it calls it a deadlock."""
COLLECT = 0.3
"""Seconds rank 0 gathers the faults of other ranks after the first, for one report."""
GRACE = 2.0
"""Seconds a faulting rank leaves rank 0 to report for it; then it reports itself."""


class KernelExit(RuntimeError):
    """The kernel faulted on every rank and rank 0 has reported it: every rank leaves,
    through ``MPI_Finalize`` (exit code 5 on the command line), not ``MPI_Abort``."""


class Watch:
    """The deadlock watch of one rank (see the module doc)."""

    def __init__(self, topo: Topology, source: str, preamble: Optional[List[str]] = None):
        self.preamble = preamble or []
        """Lines that say what ran (the problem, the topology), above rank 0's report."""
        self.comm = topo.comm.Dup()
        self.comm.Set_name("gqa_mpi.watch")
        self.topo, self.source = topo, source
        self.sent = self.received = 0
        self.table: Dict[int, Tuple] = {}
        self._last_beat = 0.0
        self._since: Optional[float] = None
        self._signature = None
        self._outbox: List = []
        self._faults: List[Tuple[int, tuple, str]] = []

    def fault(self, key: tuple, text: str) -> None:
        """This rank's kernel faulted: one report for the job (never returns).

        ``key`` says which faults are the same (call and line). Rank 0 gathers the
        faults that follow within :data:`COLLECT` and prints each kind once, with the
        ranks that hit it; another rank hands its fault to rank 0 and reports it
        itself only if rank 0 has not ended the job within :data:`GRACE` (it computes
        and does not look). Where every rank faulted, rank 0 has heard from them all:
        it tells them to leave, and every rank raises :class:`KernelExit`."""
        if self.comm.rank == 0:
            self._faults.append((0, key, text))
            self._report_faults()
        req = self.comm.isend((key, text), dest=0, tag=FAULT)
        end = time.monotonic() + GRACE
        while time.monotonic() < end:
            if self.comm.Iprobe(source=0, tag=LEAVE):
                self.comm.recv(source=0, tag=LEAVE)
                req.Wait()
                raise KernelExit("the kernel faulted on every rank (reported by rank 0)")
            time.sleep(0.005)
        watchdog.say_and_abort(job(self.topo.comm), text, Exit.FAULT)

    def _read_faults(self) -> None:
        status = status_for(self.comm)
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=FAULT, status=status):
            src = status.Get_source()
            key, text = self.comm.recv(source=src, tag=FAULT)
            self._faults.append((src, key, text))

    def _report_faults(self) -> None:
        """Rank 0: gather, print each kind of fault once with its ranks, end the job."""
        end = time.monotonic() + COLLECT
        while time.monotonic() < end:
            self._read_faults()
            time.sleep(0.005)
        kinds: Dict[tuple, List[Tuple[int, str]]] = {}
        for rank, key, text in sorted(self._faults):
            kinds.setdefault(key, []).append((rank, text))
        lines = list(self.preamble)
        for hits in kinds.values():
            lines.append(hits[0][1])
            if len(hits) > 1:
                others = [str(r) for r, _ in hits[1:]]
                shown = ", ".join(others[:16]) + (" ..." if len(others) > 16 else "")
                lines.append(f"  the same fault on {len(others)} more rank(s): {shown}")
        if {rank for rank, _, _ in self._faults} != set(range(self.comm.size)):
            watchdog.say_and_abort(job(self.topo.comm), "\n".join(lines), Exit.FAULT)
        sys.stderr.write("\n".join(lines) + "\n")     # every rank is here: no abort
        sys.stderr.flush()
        for rank in range(1, self.comm.size):
            self.comm.send(None, dest=rank, tag=LEAVE)
        raise KernelExit("the kernel faulted on every rank (reported above)")

    def _tell(self, state: Tuple) -> None:
        if self.comm.rank == 0:
            self.table[0] = state + (time.monotonic(),)
        else:
            self._outbox.append(self.comm.isend(state, dest=0, tag=STATE))
            self._outbox = [r for r in self._outbox if not r.Test()]

    def waiting(self, direction: str, line: Callable[[], Optional[int]],
                started: float) -> None:
        """Called while this rank polls for a message; reports and, on rank 0, judges.
        ``line()`` gives the kernel's line of the receive (looked up for a report)."""
        now = time.monotonic()
        if now - started >= HEARTBEAT and now - self._last_beat >= HEARTBEAT:
            self._last_beat = now
            self._tell(("wait", direction, line(), self.sent, self.received))
        if self.comm.rank == 0:
            self._judge()

    def done(self, pending) -> None:
        """This rank's kernel returned: say so, then wait for rank 0's release while the
        sends ``pending`` (MPI requests) complete."""
        self._tell(("done", None, None, self.sent, self.received))
        with watchdog.waiting("the other ranks' kernels to return"):
            self._release(pending)
        self.comm.Free()

    def _release(self, pending) -> None:
        if self.comm.rank == 0:
            while not self._judge(final=True):
                pending = [r for r in pending if not r.Test()]
                time.sleep(0.001)
            for r in range(1, self.comm.size):
                self.comm.send(None, dest=r, tag=GO)
        else:
            go = self.comm.irecv(source=0, tag=GO)
            while not go.test()[0]:
                pending = [r for r in pending if not r.Test()]
                time.sleep(0.001)
        for request in pending + self._outbox:
            request.Wait()

    def _judge(self, final: bool = False) -> bool:
        """Rank 0: read the reports; True when every rank is done and every message
        was received. Ends the job on a deadlock."""
        self._read_faults()
        if self._faults:
            self._report_faults()
        status = status_for(self.comm)
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=STATE, status=status):
            src = status.Get_source()
            self.table[src] = self.comm.recv(source=src, tag=STATE) + (time.monotonic(),)
        now = time.monotonic()
        if len(self.table) < self.comm.size:
            return False
        states = [self.table[r] for r in range(self.comm.size)]
        if any(s[0] == "wait" and now - s[5] > 3 * HEARTBEAT for s in states):
            return False                         # someone stopped waiting: it runs
        sent, received = sum(s[3] for s in states), sum(s[4] for s in states)
        if all(s[0] == "done" for s in states) and sent == received:
            return True
        signature = tuple(s[:5] for s in states)
        if signature != self._signature:
            self._signature, self._since = signature, now
            return False
        if now - self._since < STABLE:
            return False
        self._deadlock(states, sent - received)
        return False

    def _deadlock(self, states, in_flight: int) -> None:
        grid = self.topo.grid
        waiting = [(r, s) for r, s in enumerate(states) if s[0] == "wait"]
        if waiting:
            head = (f"kernel deadlock: every PE still running waits in tl.recv and no "
                    f"message can arrive ({len(waiting)} waiting, "
                    f"{len(states) - len(waiting)} returned)")
        else:
            head = (f"every PE returned, but {in_flight} message(s) sent with tl.send were "
                    f"never received: a recv is missing on the other side")
        lines = [f"gqa_mpi: error: {head}"]
        for r, s in waiting:
            p = grid.place(r)
            lines.append(f"  rank {r} (cube {p.cube}, PE {p.pe}) waits in "
                         f"tl.recv(dir={s[1]!r}) at {self.source}:{s[2]}")
        if waiting and in_flight:
            lines.append(f"  {in_flight} message(s) were sent and not received, from a "
                         f"direction nobody waits on")
        watchdog.say_and_abort(job(self.topo.comm), "\n".join(lines), Exit.FAULT)   # see source


class MpiLink:
    """The ``link`` of a :class:`gqa_mpi.dsl.tl.Backend`: one PE's sends and receives."""

    def __init__(self, topo: Topology, watch: Watch, recorder: Optional[Recorder] = None):
        self.topo, self.watch, self.rec = topo, watch, recorder
        self.pending: List = []

    def _link(self, call: str, direction: str, line: Callable[[], Optional[int]]):
        if direction not in DIRECTIONS:
            raise KernelFault(call, f"tl.{call}(dir={direction!r}): not a direction (one of "
                                    f"{', '.join(DIRECTIONS)})", line())
        link = self.topo.link(direction)
        if not link.exists:
            place = self.topo.place
            what = ("the hardware would wait here forever" if call == "recv"
                    else "the message would go nowhere")
            raise KernelFault(call, f"tl.{call}(dir={direction!r}): PE {place.pe} of cube "
                                    f"{place.cube} (row {place.row}, col {place.col}) has no "
                                    f"neighbour {direction}; {what}", line())
        return link

    def send(self, direction: str, a: np.ndarray, line: Callable[[], Optional[int]]) -> None:
        """Send ``a`` (the backend's own copy, never written again) without waiting."""
        link = self._link("send", direction, line)
        t0 = time.perf_counter()
        buf = a.view(np.uint8).ravel()
        self.pending.append(link.comm.Isend(buf, dest=link.rank, tag=TAG_DATA))
        self.pending = [r for r in self.pending if not r.Test()]
        self.watch.sent += 1
        if self.rec is not None:
            self.rec.message("send", direction, self.topo.world_rank(direction), "tl",
                             buf.nbytes, t0, time.perf_counter(), link.comm.Get_name())

    def recv(self, direction: str, nbytes: int, line: Callable[[], Optional[int]],
             what: str) -> bytes:
        link = self._link("recv", direction, line)
        t0 = time.perf_counter()
        status = status_for(link.comm)
        started, pause = time.monotonic(), 0.0
        peer = self.topo.world_rank(direction)
        # waiting, not stuck: --timeout names the rank this one waits for
        with watchdog.waiting(f"rank {peer}'s message (tl.recv(dir={direction!r}))"):
            while not link.comm.Iprobe(source=link.rank, tag=TAG_DATA, status=status):
                self.pending = [r for r in self.pending if not r.Test()]
                self.watch.waiting(direction, line, started)
                pause = min(0.001, pause + 0.00005)
                time.sleep(pause)
        count = status.Get_count(MPI.BYTE)
        if count != nbytes:
            raise KernelFault("recv", f"tl.recv(dir={direction!r}) expects {nbytes} bytes "
                                      f"({what}), but the message sent has {count} bytes",
                              line())
        buf = bytearray(count)
        link.comm.Recv(buf, source=link.rank, tag=TAG_DATA)
        self.watch.received += 1
        if self.rec is not None:
            self.rec.message("recv", direction, self.topo.world_rank(direction), "tl",
                             count, t0, time.perf_counter(), link.comm.Get_name())
        return bytes(buf)

    def finish(self) -> None:
        """The kernel returned: wait for the others (and the deadlock watch)."""
        self.watch.done(self.pending)
        self.pending = []
