"""The math of one PE (no MPI) against the float64 reference."""
import itertools

import numpy as np
import pytest

from gqa_mpi.step.attention import (empty_partial, finalize, fold_queries, local_attention,
                               merge, unfold_output)
from gqa_mpi.step.partition import token_range
from whole_reference import attention_reference

from util import distributed


SHAPES = [
    # B, T_q, S, h_q, h_kv, d, tile, n_ranks, causal
    (1, 1, 1000, 4, 4, 16, 128, 1, False),     # MHA, tile remainder
    (1, 1, 1000, 8, 2, 16, 100, 3, False),     # GQA G=4, remainders everywhere
    (2, 3, 777, 6, 3, 8, 64, 5, False),        # batch, T_q > 1
    (2, 4, 500, 8, 1, 32, 33, 7, True),        # causal, MQA
    (1, 5, 64, 4, 2, 8, 1024, 16, True),       # tile > slice
    (1, 2, 5, 4, 2, 8, 2, 16, False),          # S_kv < ranks: empty slices
    (1, 8, 6, 2, 1, 4, 4, 4, True),            # causal, T_q > S_kv: rows see nothing
]


@pytest.mark.parametrize("B,T_q,S,h_q,h_kv,d,tile,n_ranks,causal", SHAPES)
def test_matches_reference(B, T_q, S, h_q, h_kv, d, tile, n_ranks, causal):
    rng = np.random.default_rng(S * 31 + tile)
    q = rng.standard_normal((B, T_q, h_q * d))
    k = rng.standard_normal((B, S, h_kv * d))
    v = rng.standard_normal((B, S, h_kv * d))
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    out, _ = distributed(q, k, v, h_kv=h_kv, n_ranks=n_ranks, tile=tile, causal=causal)
    ref = attention_reference(q, k, v, h_kv=h_kv, causal=causal)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5 * max(1, np.abs(ref).max()))


def test_query_head_uses_kv_head_j_over_G():
    """Head j must use KV head j // G: make KV heads distinguishable by V's value."""
    h_q, h_kv, d, S = 8, 2, 4, 10
    q = np.zeros((1, 1, h_q * d), np.float32)
    k = np.zeros((1, S, h_kv * d), np.float32)
    v = np.zeros((1, S, h_kv * d), np.float32)
    for h in range(h_kv):
        v[..., h * d:(h + 1) * d] = h + 1
    out, _ = distributed(q, k, v, h_kv=h_kv, n_ranks=2, tile=4)
    per_head = out.reshape(h_q, d)[:, 0]
    np.testing.assert_array_equal(per_head, np.arange(h_q) // (h_q // h_kv) + 1)


@pytest.mark.parametrize("offset,spread", [(-1e5, 0.0), (-1e5, 1.0), (0.0, 1e4), (3e4, 50.0)])
def test_extreme_scores_finite(offset, spread):
    """Scores near -1e5, or spread over 1e4: no NaN, no inf, still exact."""
    rng = np.random.default_rng(1)
    S, d = 300, 4
    q = np.ones((1, 1, d), np.float32)
    k = np.zeros((1, S, d), np.float32)
    k[0, :, 0] = offset + spread * rng.standard_normal(S)
    k[0, 17, 0] = offset + 5 + (spread * 3 if spread else 0)
    v = rng.standard_normal((1, S, d)).astype(np.float32)
    out, _ = distributed(q, k, v, h_kv=1, n_ranks=4, tile=16, scale=1.0)
    ref = attention_reference(q, k, v, h_kv=1, scale=1.0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=1e-4)


def test_merge_identity_and_far_apart():
    e = empty_partial(1, 1, 2, 3)
    rng = np.random.default_rng(0)
    p = (np.array([[[5.0, -3.0]]], np.float32), np.array([[[2.0, 1.0]]], np.float32),
         rng.standard_normal((1, 1, 2, 3)).astype(np.float32))
    for a, b in ((e, p), (p, e)):
        m = merge(type(e)(*a), type(e)(*b))
        np.testing.assert_array_equal(m.m, p[0])
        np.testing.assert_array_equal(m.l, p[1])
        np.testing.assert_array_equal(m.O, p[2])
    both = merge(e, e)
    assert np.isneginf(both.m).all() and not both.l.any() and not both.O.any()
    # log-sum-exps 200 apart: exp(200) overflows float32 if merged naively
    far = type(e)(np.array([[[200.0, 0.0]]], np.float32), p[1], p[2])
    m = merge(far, type(e)(*p))
    assert np.isfinite(m.l).all() and np.isfinite(m.O).all()
    np.testing.assert_allclose(m.l[0, 0, 0], 2.0 + 2.0 * np.exp(5.0 - 200.0), rtol=1e-6)


def test_finalize_empty_gives_zeros():
    assert not finalize(empty_partial(2, 3, 4, 5)).any()


def test_fold_unfold_roundtrip():
    q = np.arange(2 * 3 * 8 * 4, dtype=np.float32).reshape(2, 3, 32)
    f = fold_queries(q, 2, 4)
    assert f.shape == (2, 2, 4 * 3, 4)
    np.testing.assert_array_equal(unfold_output(f, 3), q)


@pytest.mark.parametrize("S,n", list(itertools.product([0, 1, 5, 16, 17, 1000, 1023], [1, 3, 16, 64])))
def test_token_range_covers_every_token_once(S, n):
    ranges = [token_range(S, n, r) for r in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == S
    for (a0, a1), (b0, b1) in zip(ranges, ranges[1:]):
        assert a1 == b0 and a0 <= a1
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_scratch_does_not_grow_with_slice():
    """Peak extra memory of the sweep depends on the tile, not on S_local."""
    import tracemalloc
    rng = np.random.default_rng(0)
    q = fold_queries(rng.standard_normal((1, 1, 8 * 16)).astype(np.float32), 2, 16)
    peaks = []
    for S in (2048, 16384):
        k = rng.standard_normal((1, 2, S, 16)).astype(np.float32)
        tracemalloc.start()
        local_attention(q, k, k, scale=0.25, tile=256)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0] + 4096, peaks
