"""The streamed check: its partials, merge and float16 rounding against the plain
in-memory references, its chunk plan, and its memory, which does not grow with S_kv."""
import numpy as np
import pytest

from gqa_mpi.config import loop
from gqa_mpi.config.config import Config
from gqa_mpi.config.inputs import load_rows
from gqa_mpi.check.kernel_model import (kernel_partial, kernel_rows,
                                       kernel_token_range, kernel_units)
from gqa_mpi.check.reference import (float16_values, reference_finish, reference_merge,
                                    reference_partial)
from util import spec_kernel_model
from whole_reference import attention_reference


def fold(parts):
    acc = None
    for p in parts:
        acc = p if acc is None else reference_merge(acc, p)
    return reference_finish(acc)


def streamed(q, k, v, chunk, dtype=np.float64, **kw):
    S = k.shape[1]
    return fold(reference_partial(q, k[:, a:a + chunk], v[:, a:a + chunk], first=a,
                                  cache_len=S, dtype=dtype, **kw) for a in range(0, S, chunk))


PROBLEMS = [  # B, T_q, h_q, h_kv, d, S, causal, scale
    (1, 1, 8, 2, 16, 1000, False, None),
    (2, 3, 4, 2, 8, 777, True, None),
    (1, 4, 6, 3, 5, 50, True, 0.7),
    (3, 2, 4, 4, 4, 33, False, 30.0),
    (1, 7, 2, 1, 3, 5, True, None),     # causal: the first queries see no key of most chunks
]


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_merged_chunks_equal_the_plain_reference(problem, chunk):
    B, T, hq, hkv, d, S, causal, scale = problem
    rng = np.random.default_rng(S + chunk)
    q = rng.standard_normal((B, T, hq * d))
    k, v = (rng.standard_normal((B, S, hkv * d)) for _ in range(2))
    kw = dict(h_kv=hkv, causal=causal, scale=scale)
    want = attention_reference(q, k, v, **kw)
    np.testing.assert_allclose(streamed(q, k, v, chunk, **kw), want, rtol=0, atol=1e-13)
    control = streamed(q, k, v, chunk, dtype=np.float32, **kw)
    assert control.dtype == np.float32
    np.testing.assert_allclose(control, want, rtol=0, atol=5e-6 * max(1, np.abs(want).max()))


def test_merged_chunks_keep_nan_and_inf_honest():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 8))
    k, v = (rng.standard_normal((1, 40, 8)) for _ in range(2))
    for bad, where in ((np.nan, (0, 13, 3)), (np.inf, (0, 30, 0))):
        kb = k.copy()
        kb[where] = bad
        want = attention_reference(q, kb, v, h_kv=1)
        got = streamed(q, kb, v, 8, h_kv=1)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()
    big = attention_reference(q * 1e200, k, v, h_kv=1)     # overflowing scores: NaN
    assert np.isnan(streamed(q * 1e200, k, v, 8, h_kv=1)).any() == np.isnan(big).any()


def test_float16_values_round_like_numpy():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h32 = halves.astype(np.float32)
    h32 = h32[np.isfinite(h32)]
    ordered = np.unique(h32)
    mid = (ordered[:-1].astype(np.float64) + ordered[1:]) / 2     # the ties
    x = np.concatenate([h32, mid.astype(np.float32),
                        np.nextafter(mid.astype(np.float32), np.float32(np.inf)),
                        np.nextafter(mid.astype(np.float32), np.float32(-np.inf)),
                        np.float32([65504, 65519.99, 65520, 1e6, -1e6, np.inf, -np.inf,
                                    np.nan, 2 ** -14, 2 ** -15, 2 ** -25, 2 ** -26, 0, -0.0]),
                        np.random.default_rng(0).standard_normal(100000).astype(np.float32)
                        * np.float32(3.0) ** np.arange(-20, 20).repeat(2500)[:100000]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    got = float16_values(x)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]


@pytest.mark.parametrize("T,hkv,G,d,S,N,tile,tiles", [
    (1, 1, 8, 16, 1000, 4, 32, 2), (2, 2, 4, 8, 5003, 4, 64, 3),
    (1, 8, 4, 32, 4096 + 5, 16, 128, 1), (1, 1, 2, 4, 9, 3, 1024, 1)])
def test_kernel_units_fold_to_the_kernel_model(T, hkv, G, d, S, N, tile, tiles):
    rng = np.random.default_rng(S)
    q = rng.standard_normal((1, T, hkv * G * d)).astype(np.float32)
    k, v = (rng.standard_normal((1, S, hkv * d)).astype(np.float32) for _ in range(2))
    units = kernel_units(S, N, tile, tiles)
    for r in range(N):      # the units of a rank cover its S_local tokens once, in order
        mine = [(s0, s1) for rr, s0, s1 in units if rr == r]
        assert mine[0][0] == 0 and mine[-1][1] == S // N
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
    parts = []
    for unit in units:
        a, b = kernel_rows(S, N, unit, hkv * d, d)
        lo, hi = kernel_token_range(S, N, unit[0])
        assert lo <= a < b <= hi + 1
        parts.append(kernel_partial(q, k[:, a:b], v[:, a:b], S_kv=S, n_ranks=N, unit=unit,
                                    h_kv=hkv, tile=tile))
    got = fold(parts).ravel()
    want = spec_kernel_model(q, k[0], v[0], h_kv=hkv, n=N, tile=tile).ravel()
    np.testing.assert_allclose(got, want[:got.size], rtol=0, atol=1e-13)


@pytest.mark.parametrize("kw", [dict(seq_len=10), dict(seq_len=1 << 20),
                                dict(seq_len=70000, batch=3, heads_kv=2, heads_q=4),
                                dict(seq_len=5003, kernel_source="k.py", heads_kv=1,
                                     check_against="kernel-model", heads_q=8, cubes=1,
                                     pes=4)])
def test_the_plan_reads_every_token_once_in_bounded_chunks(kw):
    from gqa_mpi.check.streamed import CHUNK_BYTES, plan, plan_size
    cfg = Config(**kw)
    cfg = cfg.placed(cfg.pes or 1)
    width = cfg.heads_kv * cfg.head_dim
    assert plan_size(cfg, cfg.seq_len) == len(plan(cfg, cfg.seq_len))
    exact = [t.rows for t in plan(cfg, cfg.seq_len) if t.unit is None]
    assert exact[0][0] == 0 and exact[-1][1] == cfg.seq_len
    assert all(a[1] == b[0] for a, b in zip(exact, exact[1:]))
    for task in plan(cfg, cfg.seq_len):
        a, b = task.rows
        assert 2 * cfg.B * (b - a) * width * 4 <= CHUNK_BYTES + 2 * cfg.B * width * 4


def test_the_check_memory_does_not_grow_with_the_cache():
    from gqa_mpi.app.sizing import check_bytes, rank_bytes
    for root in (False, True):
        sizes = {check_bytes(Config(seq_len=s), root) for s in (10 ** 3, 10 ** 6, 10 ** 9)}
        assert len(sizes) == 1 and sizes.pop() < 256 << 20
        added = {rank_bytes(Config(seq_len=s), 1000, root)
                 - rank_bytes(Config(seq_len=s, check=False), 1000, root)
                 for s in (10 ** 3, 10 ** 9)}
        assert len(added) == 1


SUITE_PROBLEMS = [   # problems of the MPI suite and the command-line tests
    dict(seq_len=1000, heads_q=4, heads_kv=2, head_dim=16),
    dict(seq_len=777, heads_q=4, heads_kv=2, head_dim=16, causal=True, queries=3),
    dict(seq_len=5000, heads_q=8, heads_kv=2, head_dim=64, batch=2),
    dict(seq_len=9000, heads_q=32, heads_kv=8, head_dim=128, kv_dtype="float16"),
    dict(seq_len=3000, heads_q=4, heads_kv=1, head_dim=32, softmax_scale=2.0, queries=2),
    dict(seq_len=5003, heads_q=8, heads_kv=1, head_dim=128, kernel_source="k.py",
         check_against="kernel-model"),
    dict(seq_len=3001, heads_q=8, heads_kv=2, head_dim=16, kernel_source="k.py"),
    dict(seq_len=3001, heads_q=8, heads_kv=2, head_dim=16, kernel_source="k.py",
         kv_dtype="bfloat16"),
    dict(seq_len=3001, heads_q=8, heads_kv=2, head_dim=16, kernel_source="k.py",
         kv_dtype="float8_e4m3"),
]


@pytest.mark.parametrize("kw", SUITE_PROBLEMS)
def test_the_streamed_check_matches_the_in_memory_one(kw, monkeypatch):
    """The largest difference of the streamed references from the plain in-memory
    ones (what the check computed before it streamed), normwise."""
    from mpi4py import MPI
    from gqa_mpi.app.check import references
    if not MPI.Is_initialized():      # importing the command line defers MPI_Init
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    from gqa_mpi.check import streamed
    cfg = Config(**kw).placed(4)
    q, k, v = load_rows(None, cfg.seed, cfg.B, cfg.queries, loop.final_len(cfg),
                        cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim)
    k, v = (np.asarray(x)[:, :cfg.seq_len] for x in (k, v))     # the cache at step 0
    # chunks and pieces far smaller than the cache, so that many are merged
    monkeypatch.setattr(streamed, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(streamed, "SUB_BYTES", 1 << 18)
    got = references(MPI.COMM_SELF, cfg, q, cfg.seq_len, n_tokens=loop.final_len(cfg))
    if cfg.kv_dtype != "float32":            # the values the ranks' memory holds
        from gqa_mpi.step.dtypes import MEMORY
        k, v = (x.astype(MEMORY[cfg.kv_dtype]).astype(np.float64) for x in (k, v))
    if cfg.check_against == "kernel-model":
        pairs = [(got["model"], spec_kernel_model(q, k[0], v[0], h_kv=cfg.heads_kv,
                                                  n=cfg.n_ranks, tile=cfg.tile)),
                 (got["exact"], attention_reference(q, k, v, h_kv=cfg.heads_kv,
                                                    scale=cfg.scale))]
    else:
        kw = dict(h_kv=cfg.heads_kv, scale=cfg.scale, causal=cfg.causal)
        pairs = [(got["ref"], attention_reference(q, k, v, **kw)),
                 (got["control"], attention_reference(q, k, v, dtype=np.float32, **kw))]
    for new, old in pairs:
        old = old.reshape(new.shape)
        err = np.abs(new - old).max() / np.abs(old).max()
        assert err < (1e-12 if new.dtype == np.float64 else 1e-5), err
