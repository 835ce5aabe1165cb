"""Communicators and neighbours: one rank is one (cube, PE); nothing else lives here.

The geometry (places, direction names, short last rows) is
:class:`gqa_mpi.step.grid.Grid`'s; this module builds the design card's communicators
for it and resolves a direction name to ``(communicator, rank)`` in one place,
:meth:`Topology.link`:

``comm``
    One Cartesian communicator over ``(cube, pe)``, ``reorder=False`` so its ranks are
    the world's. Schedules whose peers are not grid neighbours (the tree, the
    collectives) use it.
``cube``
    The PEs of this cube, cut from ``comm`` with ``Sub``; rank = pe. Its topology is a
    2-D Cartesian ``rows x cols`` when every row is full (also a single row of fewer
    than ``cols`` PEs), and ``Shift`` gives ``intra_E/W/N/S``. A short last row cannot
    be said by a Cartesian grid, so there it is a distributed graph holding each PE's
    real neighbours, each edge weighted by its direction (:data:`WEIGHTS`): the
    topology's own neighbour lists say who sits where.
``inter``
    This PE index across all cubes, cut from ``comm`` with ``Sub``: 1-D Cartesian,
    rank = cube; ``Shift`` gives ``W`` and ``E``.

Every communicator is named (``MPI_Comm_set_name``), so a profiling interposer or a
trace sees on which one each message travelled.

Worked example, 2 cubes of 6 PEs (rows 0: PEs 0-3, row 1: PEs 4-5): rank 9 is cube 1,
PE 3; ``cube`` is a graph (row 1 is short); ``intra_W`` = (cube, 2), ``intra_S`` none,
``W`` = (inter, 0), i.e. world rank 3.
"""
from __future__ import annotations

from typing import Dict, NamedTuple

from mpi4py import MPI

from ..step.grid import DIRECTIONS, Grid

WEIGHTS = {"intra_E": 1, "intra_W": 2, "intra_S": 3, "intra_N": 4}
"""Edge weight of each intra-cube direction in the distributed-graph topology."""


class Link(NamedTuple):
    """Where a direction leads: the communicator to send on and the rank in it."""

    comm: MPI.Comm
    rank: int

    @property
    def exists(self) -> bool:
        return self.rank != MPI.PROC_NULL


def _cube_topology(line: MPI.Cartcomm, grid: Grid) -> MPI.Comm:
    """A cube's communicator with the PE grid as its topology (see the module doc)."""
    rows, cols = grid.rows_used, grid.cols_used
    if rows * cols == grid.pes:
        return line.Create_cart([rows, cols], periods=[False, False], reorder=False)
    place = grid.place(line.rank)           # a short last row: the real neighbours
    pe = line.rank
    edges = [(grid.neighbour(place.cube * grid.pes + pe, d), WEIGHTS[d]) for d in WEIGHTS]
    edges = [(other % grid.pes, w) for other, w in edges if other is not None]
    ranks, weights = [r for r, _ in edges], [w for _, w in edges]
    return line.Create_dist_graph_adjacent(ranks, ranks, sourceweights=weights,
                                           destweights=weights, reorder=False)


def _intra_links(cube: MPI.Comm) -> Dict[str, int]:
    """``intra_*`` direction -> rank in ``cube``, read off the cube's topology."""
    if cube.Get_topology() == MPI.CART:
        south_north = cube.Shift(0, 1)                     # (source, dest) = (N, S)
        west_east = cube.Shift(1, 1)
        return {"intra_N": south_north[0], "intra_S": south_north[1],
                "intra_W": west_east[0], "intra_E": west_east[1]}
    out = dict.fromkeys(WEIGHTS, MPI.PROC_NULL)
    _, dests, (_, weights) = cube.Get_dist_neighbors()
    by_weight = {w: d for d, w in WEIGHTS.items()}
    for rank, w in zip(dests, weights):
        out[by_weight[w]] = rank
    return out


class Topology:
    """This rank's place among C cubes of P PEs, its communicators and neighbours.

    Attributes
    ----------
    comm : MPI.Cartcomm
        Dims ``(C, P)``, ranks equal to the world's.
    cube : MPI.Cartcomm or MPI.Distgraphcomm
        The PEs of this cube, rank = pe (see the module doc for its topology).
    inter : MPI.Cartcomm
        This PE index across cubes, rank = cube.
    place : Place
        ``(cube, pe, row, col)`` of this rank.
    """

    def __init__(self, comm: MPI.Comm, grid: Grid):
        self.grid = grid
        self.comm = comm.Create_cart([grid.cubes, grid.pes], periods=[False, False],
                                     reorder=False)
        line = self.comm.Sub([False, True])
        try:
            self.cube = _cube_topology(line, grid)
        finally:
            line.Free()
        self.inter = self.comm.Sub([True, False])
        self.place = grid.place(self.comm.rank)
        self.comm.Set_name("gqa_mpi.world")
        self.cube.Set_name("gqa_mpi.cube")
        self.inter.Set_name("gqa_mpi.inter")
        west, east = self.inter.Shift(0, 1)
        self._links: Dict[str, Link] = {"E": Link(self.inter, east),
                                        "W": Link(self.inter, west)}
        for direction, rank in _intra_links(self.cube).items():
            self._links[direction] = Link(self.cube, rank)

    def link(self, direction: str) -> Link:
        """``(communicator, rank)`` of the neighbour in ``direction`` (SPEC's names);
        the rank is ``MPI.PROC_NULL`` where there is none."""
        try:
            return self._links[direction]
        except KeyError:
            raise ValueError(f"not a direction: {direction!r} (one of "
                             f"{', '.join(DIRECTIONS)})") from None

    def world_rank(self, direction: str) -> int:
        """The neighbour in ``direction`` as a rank of ``comm`` (PROC_NULL if none)."""
        link = self.link(direction)
        if not link.exists:
            return MPI.PROC_NULL
        theirs, ours = link.comm.Get_group(), self.comm.Get_group()
        try:
            return theirs.Translate_ranks([link.rank], ours)[0]
        finally:
            theirs.Free()
            ours.Free()

    @property
    def neighbours(self) -> Dict[str, int]:
        """Every direction -> the neighbour's rank in ``comm`` (PROC_NULL if none), as
        the sub-communicators resolve it (tests hold it against SPEC's index rules)."""
        return {d: self.world_rank(d) for d in DIRECTIONS}

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def is_root(self) -> bool:
        return self.comm.rank == 0

    def free(self) -> None:
        for c in (self.cube, self.inter, self.comm):
            c.Free()
