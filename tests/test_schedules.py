"""Grid geometry and the reduction schedules as data (no MPI)."""
import itertools

import pytest

from gqa_mpi.step.grid import DIRECTIONS, Grid
from gqa_mpi.step.schedules import SCHEDULES
from gqa_mpi.step.wires import WIRES

from util import chain_depth, spec_depth, spec_schedule

SHAPES = [(C, P, cols) for C in (1, 2, 3, 5) for P in range(1, 13) for cols in (1, 2, 4)
          if P <= 2 * cols * 2]


def cartesian_neighbours(C, rows, cols, rank):
    """Neighbours in a full (C, rows, cols) grid, by coordinates (no wrap)."""
    cube, rest = divmod(rank, rows * cols)
    row, col = divmod(rest, cols)
    out = {}
    for d, (dc, dr, dk) in dict(E=(1, 0, 0), W=(-1, 0, 0), intra_S=(0, 1, 0),
                                intra_N=(0, -1, 0), intra_E=(0, 0, 1),
                                intra_W=(0, 0, -1)).items():
        c, r, k = cube + dc, row + dr, col + dk
        inside = 0 <= c < C and 0 <= r < rows and 0 <= k < cols
        out[d] = (c * rows + r) * cols + k if inside else None
    return out


@pytest.mark.parametrize("C,rows,cols", [(1, 1, 1), (2, 2, 4), (3, 1, 5), (2, 4, 2),
                                         (16, 1, 1), (1, 2, 3)])
def test_grid_neighbours_of_full_grids(C, rows, cols):
    grid = Grid(C, rows * cols, cols)
    for rank in range(grid.size):
        assert grid.neighbours(rank) == cartesian_neighbours(C, rows, cols, rank)


@pytest.mark.parametrize("P", [5, 6, 7])
def test_grid_neighbours_of_a_short_last_row(P):
    grid = Grid(2, P, 4)
    for rank in range(grid.size):
        cube, pe = divmod(rank, P)
        nb = grid.neighbours(rank)
        assert set(nb) == set(DIRECTIONS)
        assert nb["intra_E"] == (rank + 1 if pe % 4 < 3 and pe + 1 < P else None)
        assert nb["intra_S"] == (rank + 4 if pe + 4 < P else None)
        assert nb["E"] == (rank + P if cube == 0 else None)
    assert Grid(1, 6, 4).neighbours(3)["intra_S"] is None        # nobody below PE 3


@pytest.mark.parametrize("name", ["chain", "tree", "pipelined-chain"])
@pytest.mark.parametrize("C,P,cols", SHAPES)
def test_point_to_point_schedules_are_trees_rooted_at_0(name, C, P, cols):
    schedule, grid = SCHEDULES.get(name), Grid(C, P, cols)
    sends, recvs = set(), set()
    for r in range(grid.size):
        ops = schedule.steps(grid, r)
        assert "send" not in [s.op for s in ops[:-1]]      # a rank sends last, once
        sends |= {(r, s.peer) for s in ops if s.op == "send"}
        recvs |= {(s.peer, r) for s in ops if s.op == "recv"}
    assert sends == recvs and len(sends) == grid.size - 1
    assert not any(src == 0 for src, _ in sends)
    if name != "tree":      # against a walk of SPEC's chain, not the code's formula
        assert schedule.depth(grid) == chain_depth(grid) == spec_depth(C, P, cols)
    else:
        assert schedule.depth(grid) <= (grid.size - 1).bit_length()


@pytest.mark.parametrize("C,P", [(1, 1), (1, 3), (1, 6), (2, 8), (3, 5), (4, 4), (2, 7)])
def test_chain_is_the_spec_chain(C, P):
    grid = Grid(C, P, 4)
    for r in range(grid.size):
        got = [(s.op, s.dir) for s in SCHEDULES.get("chain").steps(grid, r)]
        assert got == [(op, d) for op, d, t in spec_schedule(r, C, P) if t == "m"]


@pytest.mark.parametrize("C,P,hops", [(1, 1, 0), (2, 8, 5), (2, 6, 4), (3, 5, 5),
                                      (4, 4, 6), (1, 7, 3)])
def test_chain_depth_known_values(C, P, hops):
    """SPEC: (cols-1) + (rows-1) + (C-1) with full rows, 5 for 2 cubes of 2x4 PEs."""
    assert SCHEDULES.get("chain").depth(Grid(C, P, 4)) == spec_depth(C, P) == hops


def test_depths_worked_out_from_the_steps():
    tree = SCHEDULES.get("tree")
    for n in (1, 2, 4, 8, 16, 64):
        assert tree.depth(Grid(n, 1, 1)) == (n - 1).bit_length()
    # 3 ranks: 0 <- 1 and 0 <- 2 arrive together; 45: rank 32's 13-rank subtree is ready
    # after 4 latencies, so rank 0 after 5, not ceil(log2 45) = 6
    assert tree.depth(Grid(3, 1, 1)) == 1 and tree.depth(Grid(45, 1, 1)) == 5
    assert SCHEDULES.get("chain").depth(Grid(2000, 1, 1)) == 1999    # no recursion limit


def test_mpi_reduce_is_one_collective_carrying_the_packed_wire():
    mpi = SCHEDULES.get("mpi")
    assert [s.op for s in mpi.steps(Grid(2, 8, 4), 5)] == ["reduce"]
    assert mpi.steps(Grid(1, 1, 4), 0) == [] and mpi.depth(Grid(2, 8, 4)) is None
    mpi.check_wire(WIRES.get("packed"))
    with pytest.raises(ValueError, match="carries only --wire packed"):
        mpi.check_wire(WIRES.get("fp32"))
    allgather, alltoall = SCHEDULES.get("allgather"), SCHEDULES.get("alltoall")
    assert [w.name for w in WIRES if allgather.accepts(w)] == ["fp32"]
    assert "packed" not in [w.name for w in WIRES if alltoall.accepts(w)]
    assert allgather.depth(Grid(2, 8, 4)) is None and alltoall.steps(Grid(1, 1, 4), 0) == []
    assert "MPI picks the pattern" in mpi.describe(Grid(2, 8, 4))


def test_registry_refuses_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="--reduce must be one of chain, tree, mpi"):
        SCHEDULES.get("ring")
    with pytest.raises(ValueError, match="registered twice"):
        SCHEDULES.register(type(SCHEDULES.get("tree")))
    assert list(itertools.islice(SCHEDULES.names(), 3)) == ["chain", "tree", "mpi"]
