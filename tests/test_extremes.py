"""Numerical extremes and properties: random configurations, far-apart log-sum-exps,
empty ranks, equal scores, and bit-identical repeats."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gqa_mpi.step.attention import merge
from whole_reference import attention_reference
from gqa_mpi.app.record import RunRecord

from util import distributed, launch, random_inputs, write_inputs


# ---------------------------------------------------------------- properties

@settings(max_examples=40, deadline=None, derandomize=True)
@given(B=st.integers(1, 2), T_q=st.integers(1, 4), h_kv=st.integers(1, 3),
       G=st.integers(1, 3), d=st.sampled_from([1, 4, 16]), S=st.integers(1, 300),
       tile=st.integers(1, 64), n=st.integers(1, 9), causal=st.booleans(),
       scale=st.sampled_from([None, 1.0, 3.0]), data=st.data())
def test_random_configurations_match_reference(B, T_q, h_kv, G, d, S, tile, n, causal,
                                               scale, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    q = rng.standard_normal((B, T_q, h_kv * G * d)).astype(np.float32)
    k = rng.standard_normal((B, S, h_kv * d)).astype(np.float32)
    v = rng.standard_normal((B, S, h_kv * d)).astype(np.float32)
    cuts = sorted(data.draw(st.lists(st.integers(0, S), min_size=n - 1, max_size=n - 1)))
    bounds = list(zip([0] + cuts, cuts + [S]))           # random split, empty ranks too
    out, _ = distributed(q, k, v, h_kv=h_kv, n_ranks=n, tile=tile, scale=scale,
                         causal=causal, bounds=bounds)
    ref = attention_reference(q, k, v, h_kv=h_kv, scale=scale, causal=causal)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=1e-5 * max(1.0, np.abs(ref).max()))


# ---------------------------------------------------------------- numerical extremes

def _tree(parts):
    while len(parts) > 1:
        parts = [merge(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def _forward(parts):
    total = parts[0]
    for p in parts[1:]:
        total = merge(total, p)
    return total


def test_chain_reverse_and_tree_agree():
    rng = np.random.default_rng(3)
    q, k, v = random_inputs(rng, S=4000, h_q=8, h_kv=2, d=32, T_q=2, B=1)
    ref = attention_reference(q, k, v, h_kv=2)
    outs = [distributed(q, k, v, h_kv=2, n_ranks=13, tile=64, order=o)[0]
            for o in (None, _forward, _tree)]
    for o in outs:
        np.testing.assert_allclose(o, ref, atol=2e-6 * np.abs(ref).max())
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=0, atol=1e-6 * np.abs(ref).max())


def test_log_sum_exps_more_than_88_apart():
    """Two ranks whose scores differ by 200: exp(200) overflows float32 if merged naively."""
    d = 4
    q = np.ones((1, 1, d), np.float32)
    k = np.zeros((1, 20, d), np.float32)
    k[0, :10, 0] = 200.0
    k[0, 10:, 0] = 0.0
    v = np.arange(20 * d, dtype=np.float32).reshape(1, 20, d)
    out, total = distributed(q, k, v, h_kv=1, n_ranks=2, tile=4, scale=1.0)
    assert np.isfinite(total.l).all() and np.isfinite(out).all()
    np.testing.assert_allclose(out, attention_reference(q, k, v, h_kv=1, scale=1.0),
                               rtol=1e-6)


@pytest.mark.launch
@pytest.mark.parametrize("empty_at", ["first", "last"])   # middle: tests/test_mpi.py
def test_empty_ranks_anywhere_in_the_chain(tmp_path, empty_at):
    rng = np.random.default_rng(9)
    q, k, v = random_inputs(rng, S=60, h_q=4, h_kv=2, d=8, T_q=3)
    split = {"first": "0,0,20,20,20,0,0,0", "middle": "20,0,0,20,0,0,0,20",
             "last": "30,30,0,0,0,0,0,0"}[empty_at]
    o = tmp_path / "o.npy"
    proc = launch(8, ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", 8,
                      "--split", split, "--causal", "--tile", 7, "--output", o])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref = attention_reference(q, k, v, h_kv=2, causal=True)
    np.testing.assert_allclose(np.load(o), ref, atol=1e-6)


@pytest.mark.launch
def test_rows_that_see_no_key_are_zero(tmp_path):
    """Causal with T_q > S_kv: the first queries see nothing; last rank short."""
    rng = np.random.default_rng(2)
    q, k, v = random_inputs(rng, S=5, h_q=2, h_kv=1, d=4, T_q=8)
    o = tmp_path / "o.npy"
    proc = launch(4, ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", 4,
                      "--causal", "--output", o, "--split", "2,2,1,0"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the first 3 queries see no key, and their rows of O are zero" in proc.stdout
    got = np.load(o)
    assert np.isfinite(got).all() and not got[:3].any()
    np.testing.assert_allclose(got, attention_reference(q, k, v, h_kv=1, causal=True),
                               atol=1e-6)


@pytest.mark.launch
def test_scores_near_minus_1e5_through_mpi(tmp_path):
    d = 4
    q = np.ones((1, d), np.float32)
    k = np.full((50, d), -25000.0, np.float32)         # scores -1e5 with scale 1
    k[31] = -25000.0 + 5 / d                           # one key 5 higher
    v = np.random.default_rng(0).standard_normal((50, d)).astype(np.float32)
    o = tmp_path / "o.npy"
    proc = launch(4, ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", d,
                      "--softmax-scale", 1, "--output", o])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = np.load(o)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, attention_reference(q, k, v, h_kv=1, scale=1.0), atol=1e-5)


@pytest.mark.launch
def test_equal_scores_2_17_on_one_rank(tmp_path):
    """l = 2^17 on one rank: exact with fp32; the float16 wire's overflow is reported."""
    S, d = 2 ** 17, 8
    q = np.zeros((1, 4 * d), np.float16)
    k = np.zeros((S, d), np.float16)
    v = np.full((S, d), 4, np.float16)
    args = ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", d,
            "--split", f"0,{S}"]                     # rank 1 holds all and sends to 0
    o, j = tmp_path / "o.npy", tmp_path / "r.json"
    ok = launch(2, args + ["--output", o])
    assert ok.returncode == 0, ok.stderr
    np.testing.assert_array_equal(np.load(o), 4.0)
    bad = launch(2, args + ["--wire", "kernel", "--json", j])
    assert bad.returncode == 1
    assert "float16 wire overflowed" in bad.stdout and "output is invalid" in bad.stdout
    assert RunRecord.load(j).overflow > 0


# ---------------------------------------------------------------- determinism

@pytest.mark.launch
def test_repeated_runs_are_bit_identical(tmp_path):
    outs = []
    for i in range(2):
        o = tmp_path / f"o{i}.npy"
        for reduce in ("chain", "tree"):
            proc = launch(3, ["--seq-len", 5000, "--seed", 3, "--reduce", reduce,
                              "--output", o])
            assert proc.returncode == 0
            outs.append((reduce, o.read_bytes()))
    assert outs[0][1] == outs[2][1] and outs[1][1] == outs[3][1]
