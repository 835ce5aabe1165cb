"""The decode loop through real launches: a growing cache, placements, every step
checked on rank 0 against the float64 reference over the cache as it stands."""
import numpy as np
import pytest

from gqa_mpi.app.record import RunRecord

from util import launch

pytestmark = pytest.mark.launch   # every test here starts processes

SMALL = ["--heads-q", 8, "--heads-kv", 2, "--head-dim", 16, "--tile", 64]


def owners(placement, S, new, n):
    """Which rank takes each new token, from the issue's rules (not the code's)."""
    if placement == "contiguous":
        return [n - 1] * new
    block = 1 if placement == "round-robin" else int(placement.split(":")[1])
    return [(S + j) // block % n for j in range(new)]


@pytest.mark.parametrize("placement,extra", [("contiguous", ["--causal"]),
                                             ("round-robin", []), ("blocks:3", [])])
def test_every_step_is_checked_and_the_cache_grows_by_placement(tmp_path, placement, extra):
    n, S, steps, T_q = 4, 401, 5, 2
    j = tmp_path / "r.json"
    proc = launch(n, [*SMALL, "--seq-len", S, "--steps", steps, "--queries", T_q,
                      "--placement", placement, "--json", j, *extra])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{steps} decode steps" in proc.stdout and "5 of 5 steps checked" in proc.stdout
    rec = RunRecord.load(j)
    assert rec.checked_steps == list(range(steps)) and all(c.passed for c in rec.checks)
    assert all(c.max_rel_err < 2e-6 for c in rec.checks)
    assert all(len(r.steps) == steps for r in rec.ranks)
    assert len(rec.step_latency()) == steps and set(rec.latency()) == {"p50", "p90", "p99", "max"}
    taken = owners(placement, S, (steps - 1) * T_q, n)    # no append after the last step
    initial = [101, 100, 100, 100]
    assert [r.held for r in rec.ranks] == [initial[r] + taken.count(r) for r in range(n)]


def test_the_loop_does_not_depend_on_the_rank_count(tmp_path):
    outs = []
    for n, placement in ((1, "contiguous"), (3, "round-robin")):
        o = tmp_path / f"o{n}.npy"
        proc = launch(n, [*SMALL, "--seq-len", 300, "--steps", 4, "--queries", 3,
                          "--placement", placement, "--check-every", 2, "--output", o])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "2 of 4 steps checked" in proc.stdout
        outs.append(np.load(o))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6 * np.abs(outs[0]).max())
