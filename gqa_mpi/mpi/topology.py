"""Communicators and neighbours: one rank is one (cube, PE); nothing else lives here.

The geometry (places, direction names, short last rows) is
:class:`gqa_mpi.core.grid.Grid`'s; this module builds the communicators for it. One
Cartesian communicator over (cube, pe) with ``reorder=False``, so that its ranks are
the world's; ``intra`` (the PEs of one cube, rank = pe) and ``inter`` (one PE index
across all cubes, rank = cube) are cut from it with ``Sub``. ``E``/``W`` come from
``inter.Shift``. A 2D Cartesian PE grid cannot express a short last row, so the grid
directions are taken along ``intra`` from the geometry, and tests cross-check them
against a full ``(C, rows, cols)`` Cartesian topology.
"""
from __future__ import annotations

from typing import Dict

from mpi4py import MPI

from ..core.grid import DIRECTIONS, Grid


class Topology:
    """This rank's place among C cubes of P PEs, its communicators and neighbours.

    Attributes
    ----------
    comm : MPI.Cartcomm
        Dims ``(C, P)``, ranks equal to the world's; all traffic goes here.
    intra, inter : MPI.Cartcomm
        Sub-communicators: the PEs of this cube, and this PE index across cubes.
    place : Place
        ``(cube, pe, row, col)`` of this rank.
    neighbours : dict
        Direction name -> rank in ``comm``, ``MPI.PROC_NULL`` where there is none.
    """

    def __init__(self, comm: MPI.Comm, grid: Grid):
        self.grid = grid
        self.comm = comm.Create_cart([grid.cubes, grid.pes], periods=[False, False],
                                     reorder=False)
        self.intra = self.comm.Sub([False, True])
        self.inter = self.comm.Sub([True, False])
        self.place = grid.place(self.comm.rank)

        def to_comm(sub: MPI.Comm, rank: int) -> int:
            return MPI.Group.Translate_ranks(sub.Get_group(), [rank], self.comm.Get_group())[0]

        west, east = self.inter.Shift(0, 1)
        self.neighbours: Dict[str, int] = {"E": to_comm(self.inter, east),
                                           "W": to_comm(self.inter, west)}
        for direction in DIRECTIONS[:4]:
            other = grid.neighbour(self.comm.rank, direction)
            self.neighbours[direction] = (MPI.PROC_NULL if other is None
                                          else to_comm(self.intra, other % grid.pes))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def is_root(self) -> bool:
        return self.comm.rank == 0

    def free(self) -> None:
        for c in (self.intra, self.inter, self.comm):
            c.Free()
