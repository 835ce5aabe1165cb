"""How the partials reach the root, as data: one registry entry per schedule. No MPI.

A schedule gives each rank its list of :class:`Step` s, run in order by
:func:`gqa_mpi.mpi.exchange.execute`: ``recv`` from a peer and merge into the running
partial, ``send`` the running partial on, or ``reduce``, one collective over all ranks
(MPI picks the pattern). Each entry also owns its help text, its depth for a grid and
which wires it can carry. Adding a schedule is one class here (or anywhere) with the
``@SCHEDULES.register`` decorator; the command line, the config check, the report and
the study sweeps all read :data:`SCHEDULES`.

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

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

from .grid import Grid
from .registry import Registry
from .wires import WIRES, Loss, Wire


class Step(NamedTuple):
    """One action of one rank: ``op`` is 'recv', 'send' or a collective's ``op`` over
    all ranks; ``dir`` names the link: a SPEC direction (the message then travels on
    that direction's communicator), or another name ('tree') for a peer that is not a
    grid neighbour; ``peer`` is the other rank (the root for a collective)."""

    op: str
    dir: str
    peer: int


@dataclass
class Traffic:
    """What one rank sent during a reduction, and what the wire lost on the way."""

    messages: int = 0
    bytes: int = 0
    loss: Loss = field(default_factory=Loss)


class Schedule:
    """A reduction schedule; subclasses set ``name`` and ``help`` and give ``steps``."""

    name = ""
    help = ""
    default_wire = "fp32"
    chunks = 0
    """With ``chunks``, O travels in that many pieces so that hops overlap (the
    executor pipelines any schedule whose ranks send once, last)."""

    def accepts(self, wire: Wire) -> bool:
        """Whether it can carry ``wire`` (any wire, unless a subclass says otherwise)."""
        return True

    def steps(self, grid: Grid, rank: int) -> List[Step]:
        raise NotImplementedError

    def depth(self, grid: Grid) -> Optional[int]:
        """Message latencies on the critical path to rank 0; None where MPI decides.

        Worked out from the steps: a rank's partial is ready once every message it
        receives has arrived, and a message arrives one latency after its sender's
        partial is ready (messages wait in order, so receiving them costs nothing more).
        """
        steps = [self.steps(grid, r) for r in range(grid.size)]
        if any(s.op not in ("send", "recv") for ss in steps for s in ss):
            return None
        ready: List[Optional[int]] = [None] * grid.size
        stack = [0]
        while stack:                       # depth-first, without Python's recursion limit
            r = stack[-1]
            waiting = [s.peer for s in steps[r] if s.op == "recv" and ready[s.peer] is None]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            ready[r] = max((ready[s.peer] + 1 for s in steps[r] if s.op == "recv"), default=0)
        return ready[0]

    def describe(self, grid: Grid) -> str:
        """One line for the report: the help, and the depth on this grid."""
        depth = self.depth(grid)
        hops = "MPI picks the pattern" if depth is None else f"{depth} hops on the critical path"
        return f"{self.name} ({self.help}), {hops}"

    def check_wire(self, wire: Wire, asked: Optional[str] = None) -> None:
        """Raise ValueError if it cannot carry ``wire``: ``asked`` is the name given
        with --wire, or None for the default."""
        if self.accepts(wire):
            return
        ok = " or ".join(w.name for w in WIRES if self.accepts(w))
        raise ValueError(f"--reduce {self.name} carries only --wire {ok}, not "
                         f"{asked or wire.name!r} (leave --wire out for "
                         f"{self.default_wire})")


SCHEDULES: Registry[Schedule] = Registry("--reduce")


@SCHEDULES.register
class Chain(Schedule):
    name = "chain"
    help = "the kernel's: row chain, column bridge, inter-cube chain"

    def steps(self, grid: Grid, rank: int) -> List[Step]:
        cube, pe, row, col = grid.place(rank)
        nb = grid.neighbours(rank)
        steps: List[Step] = []
        if nb["intra_E"] is not None:
            steps.append(Step("recv", "intra_E", nb["intra_E"]))
        if col > 0:
            return steps + [Step("send", "intra_W", nb["intra_W"])]
        if nb["intra_S"] is not None:
            steps.append(Step("recv", "intra_S", nb["intra_S"]))
        if row > 0:
            return steps + [Step("send", "intra_N", nb["intra_N"])]
        if nb["E"] is not None:
            steps.append(Step("recv", "E", nb["E"]))
        if cube > 0:
            steps.append(Step("send", "W", nb["W"]))
        return steps


@SCHEDULES.register
class Tree(Schedule):
    """In round ``k`` (``2**k`` apart) a rank whose lowest set bit is ``2**k`` sends its
    partial to ``rank - 2**k`` and is done; the others receive from ``rank + 2**k``
    if it exists. Depth ``ceil(log2 n)`` for a power of two, at most that otherwise."""

    name = "tree"
    help = "binomial tree over point-to-point messages"

    def steps(self, grid: Grid, rank: int) -> List[Step]:
        steps: List[Step] = []
        span = 1
        while span < grid.size:
            if rank & span:
                return steps + [Step("send", "tree", rank - span)]
            if rank + span < grid.size:
                steps.append(Step("recv", "tree", rank + span))
            span *= 2
        return steps


class Collective(Schedule):
    """One collective step over all ranks (none on one rank), run by the executor
    registered under ``op`` in :mod:`gqa_mpi.mpi.exchange`: ``reduce``, one MPI.Reduce
    of the packed partial with the merge as its operator; ``allgather``, an all-gather
    of (m, l), each rank rescaling its own O, then an MPI.Reduce(SUM) of O;
    ``alltoall``, the rows (heads) of the partial split over the ranks, one all-to-all,
    each rank merging its rows, then a gather."""

    op = ""

    def steps(self, grid: Grid, rank: int) -> List[Step]:
        return [Step(self.op, "all", 0)] if grid.size > 1 else []


@SCHEDULES.register
class MpiReduce(Collective):
    name = "mpi"
    help = "MPI.Reduce of one packed buffer, the merge as a user-defined operator"
    op = "reduce"
    default_wire = "packed"

    def accepts(self, wire: Wire) -> bool:
        return wire.name == "packed"


@SCHEDULES.register
class AllGather(Collective):
    """vLLM's decode context parallelism: every rank learns every (m, l), so each can
    put its own O on the common scale exp(m_r - max m); the sum of those is the total."""

    name = "allgather"
    help = "all-gather of (m, l), O rescaled locally, MPI.Reduce(SUM) of O, as vLLM"
    op = "allgather"

    def accepts(self, wire: Wire) -> bool:
        return wire.name == "fp32"            # MPI sums float32; a narrower O cannot add


@SCHEDULES.register
class AllToAll(Collective):
    """TensorRT-LLM Helix: the partial's rows (query heads) are split over the ranks;
    one all-to-all gives each rank every rank's partial of its rows, which it merges,
    and a gather brings the merged rows to rank 0."""

    name = "alltoall"
    help = "heads split over ranks: one all-to-all, each rank merges its heads, a gather, as Helix"
    op = "alltoall"

    def accepts(self, wire: Wire) -> bool:
        return wire.name != "packed"


@SCHEDULES.register
class PipelinedChain(Chain):
    """The kernel's chain with O cut into pieces: a rank forwards piece c while its
    neighbour is still receiving piece c+1, so the hops overlap."""

    name = "pipelined-chain"
    help = "the kernel's chain with O sent in 4 pieces so that hops overlap"
    chunks = 4

    def accepts(self, wire: Wire) -> bool:
        return wire.name != "packed"
