"""Communicators and neighbours: one rank is one (cube, PE); nothing else lives here.

``rank = cube * P + pe``. PE ``pe`` of a cube sits at ``(row, col) = divmod(pe, cols)``
of its grid (2 rows x 4 columns by default); the last row is short when ``P`` is not
a multiple of ``cols``. Cubes form a 1D row. There is no wrap anywhere.

Worked example, 16 ranks as 2 cubes of 8 PEs on the 2x4 grid::

    cube 0                 cube 1
    r0  r1  r2  r3         r8  r9  r10 r11      row 0
    r4  r5  r6  r7         r12 r13 r14 r15      row 1

Rank 5 is cube 0, PE 5, row 1, col 1: ``intra_W`` = 4, ``intra_E`` = 6,
``intra_N`` = 1, ``intra_S`` = PROC_NULL, ``W`` = PROC_NULL, ``E`` = 13.

Communicators: one Cartesian communicator over (cube, pe) with ``reorder=False`` so
that its ranks are the world's; ``intra`` (the PEs of one cube, rank = pe) and
``inter`` (one PE index across all cubes, rank = cube) are cut from it with ``Sub``.
A 2D Cartesian PE grid cannot express a short last row, so the grid directions are
taken along ``intra`` (rank +-1 within a row, +-cols across rows), and tests
cross-check them against a full ``(C, rows, cols)`` Cartesian topology.
"""
from __future__ import annotations

from typing import Dict, Optional

from mpi4py import MPI

DIRECTIONS = ("intra_E", "intra_W", "intra_S", "intra_N", "E", "W")


def grid_neighbour(pe: int, P: int, cols: int, direction: str) -> Optional[int]:
    """The PE index next to ``pe`` in ``direction`` inside one cube, or None."""
    row, col = divmod(pe, cols)
    if direction == "intra_E":
        other = pe + 1 if col + 1 < cols else None
    elif direction == "intra_W":
        other = pe - 1 if col > 0 else None
    elif direction == "intra_S":
        other = pe + cols
    elif direction == "intra_N":
        other = pe - cols if row > 0 else None
    else:
        raise ValueError(f"not an intra-cube direction: {direction!r}")
    return other if other is not None and 0 <= other < P else None


class Topology:
    """This rank's place among C cubes of P PEs, its communicators and neighbours.

    Attributes
    ----------
    comm : MPI.Cartcomm
        Dims ``(C, P)``, ranks equal to the world's; all traffic goes here.
    intra, inter : MPI.Cartcomm
        Sub-communicators: the PEs of this cube, and this PE index across cubes.
    cube, pe, row, col : int
        This rank's place.
    neighbours : dict
        Direction name (:data:`DIRECTIONS`) -> rank in ``comm``, ``MPI.PROC_NULL``
        where there is none.
    """

    def __init__(self, comm: MPI.Comm, cubes: int, pes: int, cols: int):
        self.cubes, self.pes, self.cols = cubes, pes, cols
        self.comm = comm.Create_cart([cubes, pes], periods=[False, False], reorder=False)
        self.intra = self.comm.Sub([False, True])
        self.inter = self.comm.Sub([True, False])
        self.cube, self.pe = self.comm.Get_coords(self.comm.rank)
        self.row, self.col = divmod(self.pe, cols)

        def to_comm(sub: MPI.Comm, rank: int) -> int:
            return MPI.Group.Translate_ranks(sub.Get_group(), [rank], self.comm.Get_group())[0]

        west, east = self.inter.Shift(0, 1)
        self.neighbours: Dict[str, int] = {"E": to_comm(self.inter, east),
                                           "W": to_comm(self.inter, west)}
        for direction in DIRECTIONS[:4]:
            other = grid_neighbour(self.pe, pes, cols, direction)
            self.neighbours[direction] = (MPI.PROC_NULL if other is None
                                          else to_comm(self.intra, other))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def is_root(self) -> bool:
        return self.comm.rank == 0

    def describe(self) -> str:
        """``cube 1 / PE 5 (row 1, col 1)``."""
        return f"cube {self.cube} / PE {self.pe} (row {self.row}, col {self.col})"

    def free(self) -> None:
        for c in (self.intra, self.inter, self.comm):
            c.Free()
