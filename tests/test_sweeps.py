"""The fused C kernel against the NumPy sweep and the float64 reference, no MPI.

Every shape runs on the default (the installed module) and, compiled here from the same
C files, on every instruction set this CPU has (portable C, AVX2, AVX-512), with
float32 and float16 resident K/V, so the path CI's CPU does not pick is exercised too.
"""
import numpy as np
import pytest

import fused_paths
from gqa_mpi.step import sweeps
from gqa_mpi.step.attention import causal_limits, finalize, fold_queries, unfold_output
from whole_reference import attention_reference

fused = pytest.importorskip("gqa_mpi._fused", reason="the fused kernel was not built")
PATHS = fused_paths.cpu_paths()


@pytest.fixture(scope="session")
def paths_lib(tmp_path_factory):
    return fused_paths.build(str(tmp_path_factory.mktemp("paths")))


@pytest.fixture(params=["default"] + [pytest.param(p, marks=pytest.mark.launch) for p in PATHS])
def isa(request, monkeypatch):
    """The path the sweep runs on: the module's default, or one compiled here (compiling
    starts the compiler: those are ``launch`` tests)."""
    if request.param != "default":
        path = fused_paths.Path(request.getfixturevalue("paths_lib"), request.param)
        monkeypatch.setattr(sweeps, "_fused", path)
    return request.param


def run(kernel, q, k, v, *, h_kv, d, tile, dtype, scale=None, causal=False, start=0,
        S_kv=None, per_tile=False):
    """One slice through ``kernel``; O in the layout of ``q`` and the partial."""
    B, T_q, width = q.shape
    S = k.shape[1]
    G = width // d // h_kv
    scale = 1 / np.sqrt(d) if scale is None else scale
    limit = causal_limits(S_kv if S_kv else S, T_q, G) if causal else None
    kr, vr = sweeps.make_resident(kernel, lambda n, i, j: {"k": k, "v": v}[n][:, i:j], S,
                                   B, h_kv, d, dtype)
    ticks = []
    p = kernel.sweep(fold_queries(q, h_kv, d), kr, vr, scale=scale, tile=tile, start=start,
                     causal_limit=limit,
                     on_tile=(lambda *a: ticks.append(a)) if per_tile else None)
    if per_tile:
        assert len(ticks) == -(-S // tile)
    return unfold_output(finalize(p), T_q), p


SHAPES = [  # S, h_q, h_kv, d, T_q, B, tile, causal
    (5000, 32, 8, 128, 1, 1, 1024, False),   # the default problem's GQA, a remainder tile
    (4096, 64, 8, 128, 1, 1, 1024, False),   # G = 8
    (1000, 8, 8, 64, 1, 1, 256, False),      # G = 1
    (1000, 8, 2, 64, 3, 2, 100, True),       # T_q > 1, causal, batch, tile not a multiple of 16
    (37, 4, 4, 8, 2, 1, 7, True),            # tiny head, tiny tiles
    (300, 12, 1, 24, 1, 1, 64, False),       # d not a multiple of the vector width
    (999, 64, 4, 16, 5, 1, 33, True),        # 80 rows per KV head: several row blocks
    (17, 6, 2, 4, 1, 1, 1, False),           # one-token tiles
    (2000, 3, 1, 130, 7, 1, 500, True),      # 21 rows, odd d
    (700, 16, 4, 80, 1, 1, 256, False),      # d = 80: P @ V's wide chunks, then single vectors
    (600, 6, 3, 104, 1, 1, 200, False),      # G = 2, d = 104: no wide chunk on AVX-512, a scalar tail
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-hq{}-hkv{}-d{}-T{}-B{}-t{}-{}".format(*s))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fused_matches_reference_and_numpy(isa, shape, dtype):
    S, h_q, h_kv, d, T_q, B, tile, causal = shape
    rng = np.random.default_rng(S + d)
    q = rng.standard_normal((B, T_q, h_q * d)).astype(np.float32)
    k, v = (rng.standard_normal((B, S, h_kv * d)).astype(np.float32) for _ in "kv")
    held = [x.astype(dtype) for x in (k, v)]
    ref = attention_reference(q, *held, h_kv=h_kv, causal=causal)
    out, _ = run(sweeps.FusedSweep, q, k, v, h_kv=h_kv, d=d, tile=tile, dtype=dtype,
                 causal=causal)
    base, _ = run(sweeps.NumpySweep, q, k, v, h_kv=h_kv, d=d, tile=tile, dtype=dtype,
                  causal=causal)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 3e-6 * scale
    assert np.abs(out - base).max() <= 3e-6 * scale


@pytest.mark.launch
@pytest.mark.parametrize("G, dtype", [(g, t) for g in (1, 2, 3, 4, 8, 12) for t in ("float32", "float16")])
def test_the_default_runs_the_best_path_and_avx2_where_memory_binds(paths_lib, G, dtype):
    """The module names the best path the CPU has; with AVX-512 and AVX2 both, a call
    whose groups of rows ask for each line twice (1 to 3 flops per byte of K and V:
    float32 2 to 7 rows, float16 1 to 3) runs the AVX2 loops: the same results, bit for
    bit, as that path compiled here."""
    best = PATHS[-1]
    assert fused.isa() == best
    fpb = 2 * min(8, 2 ** int(np.log2(G))) // np.dtype(dtype).itemsize
    runs = "avx2" if best == "avx512" and 1 <= fpb < 4 else best
    assert fused.isa(G, dtype == "float16") == sweeps.isa(G, dtype) == runs
    rng = np.random.default_rng(G)
    q = rng.standard_normal((1, 1, 2 * G * 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 700, 2 * 64)).astype(np.float32) for _ in "kv")
    got, _ = run(sweeps.FusedSweep, q, k, v, h_kv=2, d=64, tile=256, dtype=dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweeps, "_fused", fused_paths.Path(paths_lib, runs))
        want, _ = run(sweeps.FusedSweep, q, k, v, h_kv=2, d=64, tile=256, dtype=dtype)
    np.testing.assert_array_equal(got, want)


def test_a_tile_far_longer_than_the_slice_allocates_nothing_for_it():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 4 * 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 300, 2 * 16)).astype(np.float32) for _ in "kv")
    out, _ = run(sweeps.FusedSweep, q, k, v, h_kv=2, d=16, tile=10 ** 15, dtype="float32")
    base, _ = run(sweeps.NumpySweep, q, k, v, h_kv=2, d=16, tile=300, dtype="float32")
    np.testing.assert_allclose(out, base, rtol=1e-5, atol=1e-6)


def test_per_tile_calls_and_a_slice_in_the_middle_of_a_causal_sequence(isa):
    """The trace path (one call per tile) and a slice that starts at token 3000 of a
    causal 4000-token sequence give what the NumPy sweep gives."""
    rng = np.random.default_rng(5)
    h_kv, d, T_q = 2, 32, 4
    q = rng.standard_normal((1, T_q, 4 * h_kv * d)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1000, h_kv * d)).astype(np.float32) for _ in "kv")
    kw = dict(h_kv=h_kv, d=d, tile=96, dtype="float32", causal=True, start=3000, S_kv=3998)
    _, a = run(sweeps.FusedSweep, q, k, v, per_tile=True, **kw)
    _, b = run(sweeps.NumpySweep, q, k, v, **kw)
    np.testing.assert_array_equal(np.isneginf(a.m), np.isneginf(b.m))
    np.testing.assert_allclose(a.l, b.l, rtol=2e-6)
    np.testing.assert_allclose(a.O, b.O, rtol=2e-5, atol=2e-6 * np.abs(b.O).max())


def test_empty_slice_and_fully_masked_rows_give_the_empty_partial(isa):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 2, 8 * 16)).astype(np.float32)
    empty = np.zeros((1, 0, 2 * 16), np.float32)
    _, p = run(sweeps.FusedSweep, q, empty, empty, h_kv=2, d=16, tile=64, dtype="float32")
    assert np.isneginf(p.m).all() and not p.l.any() and not p.O.any()
    k = rng.standard_normal((1, 50, 2 * 16)).astype(np.float32)
    _, p = run(sweeps.FusedSweep, q, k, k, h_kv=2, d=16, tile=16, dtype="float32",
               causal=True, start=500, S_kv=400)   # every key is in every row's future
    assert np.isneginf(p.m).all() and not p.l.any() and not p.O.any()


@pytest.mark.parametrize("offset", [0.0, -1e5, 80.0])
def test_extreme_scores(isa, offset):
    """Near one-hot softmax, scores far from zero: exp never overflows or underflows
    into NaN, and the answer is the reference's."""
    rng = np.random.default_rng(7)
    d, h_kv = 16, 1
    q = np.ones((1, 1, d), np.float32)
    k = rng.standard_normal((1, 700, d)).astype(np.float32)
    k += np.float32(offset / d)          # every score moves by `offset`
    k[0, 345] += 5                       # one key 5*sqrt(d)=20 above the rest
    v = rng.standard_normal((1, 700, d)).astype(np.float32)
    ref = attention_reference(q, k, v, h_kv=h_kv, scale=1.0)
    out, _ = run(sweeps.FusedSweep, q, k, v, h_kv=h_kv, d=d, tile=128, dtype="float32",
                 scale=1.0)
    base, _ = run(sweeps.NumpySweep, q, k, v, h_kv=h_kv, d=d, tile=128, dtype="float32",
                  scale=1.0)
    assert np.isfinite(out).all()
    assert np.abs(out - base).max() <= 1e-5 * np.abs(base).max() + 1e-6
    if offset == 0.0:
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_nan_in_a_key_propagates(isa):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 1, 4 * 16)).astype(np.float32)
    k = rng.standard_normal((1, 100, 16)).astype(np.float32)
    k[0, 40, 3] = np.nan
    out, _ = run(sweeps.FusedSweep, q, k, k, h_kv=1, d=16, tile=32, dtype="float32")
    assert np.isnan(out).all()


def test_error_stays_near_float32_rounding_at_256k_tokens(isa):
    """Per-tile partial sums: at 256K tokens the fused result is as close to float64
    as the NumPy sweep's."""
    rng = np.random.default_rng(9)
    S, d = 262144, 64
    q = rng.standard_normal((1, 1, 2 * d)).astype(np.float32)
    k, v = (rng.standard_normal((1, S, d)).astype(np.float32) for _ in "kv")
    ref = attention_reference(q, k, v, h_kv=1)
    out, _ = run(sweeps.FusedSweep, q, k, v, h_kv=1, d=d, tile=1024, dtype="float32")
    assert np.abs(out - ref).max() <= 2e-6 * np.abs(ref).max()


def test_resident_float16_halves_the_bytes():
    rows = np.ones((1, 1000, 64), np.float32)
    src = lambda n, i, j: rows[:, i:j]  # noqa: E731
    for kernel in (sweeps.FusedSweep, sweeps.NumpySweep):
        k32, v32 = sweeps.make_resident(kernel, src, 1000, 1, 2, 32, np.float32)
        k16, v16 = sweeps.make_resident(kernel, src, 1000, 1, 2, 32, np.float16)
        assert k16.nbytes * 2 == k32.nbytes and v16.nbytes * 2 == v32.nbytes


def test_sweep_refuses_mismatched_arrays_instead_of_reading_out_of_bounds():
    q = np.zeros((1, 1, 4, 16), np.float32)
    k = sweeps.key_blocks(10, 1, 1, 16, np.float32)
    v = np.zeros((1, 1, 10, 16), np.float32)
    m, l, O = np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4, 16), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        fused.sweep(q, k, np.zeros((1, 1, 40, 16), np.float32), m, l, O, 0, 40, 16, None)
    with pytest.raises(ValueError, match="float16"):
        fused.sweep(q, k, v.astype(np.float16), m, l, O, 0, 10, 16, None)
    with pytest.raises(ValueError, match="lo <= hi"):
        fused.sweep(q, k, v, m, l, O, 0, 11, 16, None)
    with pytest.raises(ValueError, match="row_hi"):
        fused.sweep(q, k, v, m, l, O, 0, 10, 16, np.zeros(3, np.int64))
    assert fused.scratch_bytes(4, 16) == 4 * (8 * 128 + 2 * 4 * 16 + 2 * 4)


def test_auto_falls_back_to_numpy_with_one_line(monkeypatch):
    monkeypatch.setattr(sweeps, "_fused", None)
    monkeypatch.setattr(sweeps, "FUSED_ERROR", "gqa_mpi._fused is not available (test)")
    kernel, note = sweeps.select("auto")
    assert kernel is sweeps.NumpySweep and "using the NumPy sweep" in note
    assert "\n" not in note
    with pytest.raises(ValueError, match="--kernel fused: .*--kernel numpy"):
        sweeps.select("fused")
    assert sweeps.select("numpy") == (sweeps.NumpySweep, None)


def test_kernel_fused_that_cannot_load_is_a_usage_error(monkeypatch, capsys):
    from gqa_mpi.app import cli
    monkeypatch.setattr(sweeps, "_fused", None)
    monkeypatch.setattr(sweeps, "FUSED_ERROR", "gqa_mpi._fused is not available (test)")
    assert cli.main(["--kernel", "fused", "--seq-len", "64"]) == 2
    err = capsys.readouterr().err
    assert "--kernel fused: gqa_mpi._fused is not available" in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["--seq-len", "64", "--heads-q", "4", "--heads-kv", "2",
                     "--head-dim", "8"]) == 0
    out = capsys.readouterr().out
    assert "kernel    numpy; K/V resident as float32; NOTE fused kernel unavailable" in out


def test_the_resident_k_and_v_start_on_a_page():
    """Every vector load of the sweep then lies in one cache line (sweeps.ALIGN)."""
    rows = np.ones((1, 40, 2 * 8), np.float32)
    for kern in (sweeps.FusedSweep, sweeps.NumpySweep):
        k, v = sweeps.make_resident(kern, lambda n, i, j: rows[:, i:j], 40, 1, 2, 8,
                                     np.float16, capacity=50)
        k2, v2 = sweeps.grow(kern, k, v, 80)
        for a in (k, v, k2, v2):
            assert a.ctypes.data % sweeps.ALIGN == 0 and a.flags.c_contiguous
        assert (v2[:, :, :40] == 1).all() and v2.shape == (1, 2, 80, 8)
    z = sweeps.aligned((3, 5), np.float32, zero=True)
    assert z.shape == (3, 5) and not z.any() and z.ctypes.data % sweeps.ALIGN == 0


def test_the_read_limit_has_its_numpy_and_blas_ways():
    from gqa_mpi.tools import reads
    x = np.ones((3, 1000), np.float16)      # 6000 bytes: a float32 view of 1500
    found = reads.ways([x, x])
    assert {"numpy.sum", "numpy.dot", "sgemv"} <= set(found)
    for fn in found.values():
        fn()
