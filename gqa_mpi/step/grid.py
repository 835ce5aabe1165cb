"""Where a rank sits among C cubes of P PEs, and who its neighbours are. No MPI here.

``rank = cube * P + pe``. PE ``pe`` of a cube sits at ``(row, col) = divmod(pe, cols)``
of its grid (2 rows x 4 columns by default); the last row is short when ``P`` is not
a multiple of ``cols``. Cubes form a 1D row. There is no wrap anywhere.

Worked example, 16 ranks as 2 cubes of 8 PEs on the 2x4 grid::

    cube 0                 cube 1
    r0  r1  r2  r3         r8  r9  r10 r11      row 0
    r4  r5  r6  r7         r12 r13 r14 r15      row 1

Rank 5 is cube 0, PE 5, row 1, col 1: ``intra_W`` = 4, ``intra_E`` = 6,
``intra_N`` = 1, ``intra_S`` = none, ``W`` = none, ``E`` = 13.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional

DIRECTIONS = ("intra_E", "intra_W", "intra_S", "intra_N", "E", "W")
"""SPEC.md's direction names: within a cube's row or column, and between cubes."""


class Place(NamedTuple):
    cube: int
    pe: int
    row: int
    col: int

    def describe(self) -> str:
        """``cube 1 / PE 5 (row 1, col 1)``."""
        return f"cube {self.cube} / PE {self.pe} (row {self.row}, col {self.col})"


class Grid(NamedTuple):
    """C cubes of P PEs each, laid out ``cols`` to a row."""

    cubes: int
    pes: int
    cols: int

    @property
    def size(self) -> int:
        return self.cubes * self.pes

    @property
    def rows_used(self) -> int:
        return -(-self.pes // self.cols)

    @property
    def cols_used(self) -> int:
        return min(self.cols, self.pes)

    def place(self, rank: int) -> Place:
        cube, pe = divmod(rank, self.pes)
        return Place(cube, pe, *divmod(pe, self.cols))

    def neighbour(self, rank: int, direction: str) -> Optional[int]:
        """The rank next to ``rank`` in ``direction``, or None at an edge."""
        cube, pe, row, col = self.place(rank)
        if direction in ("E", "W"):
            other = cube + (1 if direction == "E" else -1)
            return other * self.pes + pe if 0 <= other < self.cubes else None
        if direction == "intra_E":
            other = pe + 1 if col + 1 < self.cols else None
        elif direction == "intra_W":
            other = pe - 1 if col > 0 else None
        elif direction == "intra_S":
            other = pe + self.cols
        elif direction == "intra_N":
            other = pe - self.cols if row > 0 else None
        else:
            raise ValueError(f"not a direction: {direction!r}")
        return cube * self.pes + other if other is not None and 0 <= other < self.pes else None

    def neighbours(self, rank: int) -> Dict[str, Optional[int]]:
        return {d: self.neighbour(rank, d) for d in DIRECTIONS}
