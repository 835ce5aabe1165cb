"""Configuration checks (no MPI)."""
import pytest

from gqa_mpi.config import Config, default_topology


@pytest.mark.parametrize("world,expect", [(1, (1, 1)), (16, (2, 8)), (12, (2, 6)),
                                          (7, (1, 7)), (9, (3, 3)), (11, (11, 1)),
                                          (64, (8, 8))])
def test_default_topology(world, expect):
    assert default_topology(world, None, None) == expect


def test_one_given():
    assert default_topology(16, 4, None) == (4, 4)
    assert default_topology(15, None, 5) == (3, 5)
    with pytest.raises(ValueError, match="does not divide"):
        default_topology(16, 3, None)


@pytest.mark.parametrize("kw,words", [
    (dict(cubes=2, pes=8, world_size=15), "16 ranks, but 15"),
    (dict(pes=9, cubes=1, world_size=9), "does not fit the 2x4"),
    (dict(heads_q=12, heads_kv=8), "not a multiple"),
    (dict(seq_len=0), "--seq-len must be a positive"),
    (dict(tile=-3), "--tile"),
    (dict(grid=(0, 4)), "--grid rows"),
    (dict(softmax_scale=float("inf")), "softmax-scale"),
    (dict(wire="fp8"), "--wire"),
])
def test_bad_config(kw, words):
    base = dict(cubes=1, pes=1, world_size=1)
    base.update(kw)
    with pytest.raises(ValueError, match=words):
        Config(**base)


def test_chain_depth():
    assert Config(cubes=2, pes=8, world_size=16).chain_depth == 5
    # P = 5: PE 3 (row 0, col 3) is 3 hops from PE 0, PE 4 (row 1, col 0) only 1
    assert Config(cubes=3, pes=5, world_size=15).chain_depth == 3 + 2
    assert Config(cubes=1, pes=7, world_size=7).chain_depth == 1 + 2
    assert Config(cubes=1, pes=1, world_size=1).chain_depth == 0
    assert Config(cubes=1, pes=3, world_size=3, grid=(4, 1)).chain_depth == 2
