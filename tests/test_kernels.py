"""The fused C kernel against the NumPy sweep and the float64 reference, no MPI.

Every shape runs on every instruction set this CPU has (portable C, AVX2, AVX-512),
with float32 and float16 resident K/V, so the path CI's CPU does not pick is
exercised too.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from gqa_mpi.core import kernels
from gqa_mpi.core.attention import causal_limits, finalize, fold_queries, unfold_output
from whole_reference import attention_reference

fused = pytest.importorskip("gqa_mpi._fused", reason="the fused kernel was not built")


def available_isas():
    found = []
    for want in ("generic", "avx2", "avx512"):
        got = fused.use(want)
        if got not in found:
            found.append(got)
    fused.use("auto")  # back to the default
    return found


ISAS = available_isas()


@pytest.fixture(params=ISAS)
def isa(request):
    assert fused.use(request.param) == request.param
    yield request.param
    fused.use("auto")


def run(kernel, q, k, v, *, h_kv, d, tile, dtype, scale=None, causal=False, start=0,
        S_kv=None, per_tile=False):
    """One slice through ``kernel``; O in the layout of ``q`` and the partial."""
    B, T_q, width = q.shape
    S = k.shape[1]
    G = width // d // h_kv
    scale = 1 / np.sqrt(d) if scale is None else scale
    limit = causal_limits(S_kv if S_kv else S, T_q, G) if causal else None
    kr, vr = kernels.make_resident(kernel, lambda n, i, j: {"k": k, "v": v}[n][:, i:j], S,
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
    out, _ = run(kernels.FusedKernel, q, k, v, h_kv=h_kv, d=d, tile=tile, dtype=dtype,
                 causal=causal)
    base, _ = run(kernels.NumpyKernel, q, k, v, h_kv=h_kv, d=d, tile=tile, dtype=dtype,
                  causal=causal)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 3e-6 * scale
    assert np.abs(out - base).max() <= 3e-6 * scale


@pytest.mark.parametrize("G, dtype", [(g, t) for g in (1, 2, 3, 4, 8, 12) for t in ("float32", "float16")])
def test_auto_runs_the_best_path_or_on_a_zen4_its_table(G, dtype):
    """'auto' (the default) runs the best path; on a Zen 4 ('avx512+avx2') calls of 1 or
    2 rows of float16 per KV head or 4 of float32 run the AVX2 loops, the rest AVX-512:
    the same results, bit for bit, as the path pinned."""
    rng = np.random.default_rng(G)
    q = rng.standard_normal((1, 1, 2 * G * 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 700, 2 * 64)).astype(np.float32) for _ in "kv")

    def on(name):
        got = fused.use(name)
        out, _ = run(kernels.FusedKernel, q, k, v, h_kv=2, d=64, tile=256, dtype=dtype)
        return got, out

    try:
        best = ISAS[-1]
        name, auto = on("auto")
        assert name in (best, "avx512+avx2")
        if name == best:
            assert fused.runs(G, dtype == "float16") == best
            return
        assert best == "avx512"
        avx2 = G == 4 if dtype == "float32" else G <= 2
        assert fused.runs(G, dtype == "float16") == ("avx2" if avx2 else "avx512")
        np.testing.assert_array_equal(auto, on("avx2" if avx2 else "avx512")[1])
    finally:
        fused.use("auto")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_asking_changes_how_lines_are_asked_for_and_never_the_results(isa, dtype):
    """'once' asks for every line once; 'twice' (AMD's cores) twice in groups with fewer
    flops per byte than the path's AGAIN_FPB and at least TWICE_FPB; 'none' (Intel's
    cores) as 'twice', but none below NOASK_FPB (AVX-512: 4, 4 and 1, AVX2: 2, 4 and 0,
    portable C: 0, 8 and 0, in flops per byte, 2 G / element size, rounded down);
    'none32' (an Emerald Rapids) as 'twice', but none in the float32 groups below
    NOASK_FPB / 2. The sweep's results are the same bit for bit."""
    rng = np.random.default_rng(11)
    k, v = (rng.standard_normal((1, 2000, 2 * 64)).astype(np.float32) for _ in "kv")
    noask, again, least = {"avx512": (4, 4, 1), "avx2": (2, 4, 0), "generic": (0, 8, 0)}[isa]
    es = np.dtype(dtype).itemsize
    try:
        for G in (1, 2, 4, 8):
            q = rng.standard_normal((1, 1, 2 * G * 64)).astype(np.float32)
            fpb = 2 * G // es
            twice = 2 if least <= fpb < again else 1
            want = {"once": 1, "twice": twice, "none": 0 if fpb < noask else twice,
                    "none32": 0 if es == 4 and fpb < noask // 2 else twice}
            outs = []
            for how in ("once", "twice", "none", "none32", "auto"):
                assert fused.asking(how) == how
                if how in want:
                    assert kernels.asks(G, dtype) == want[how], (how, G)
                    assert kernels.asking() == how
                outs.append(run(kernels.FusedKernel, q, k, v, h_kv=2, d=64, tile=512,
                                dtype=dtype)[0])
            for out in outs[1:]:
                np.testing.assert_array_equal(out, outs[0])
    finally:
        fused.asking("auto")
    with pytest.raises(ValueError, match="unknown asking"):
        fused.asking("intel")


def cpuinfo():
    """The first CPU's fields in /proc/cpuinfo, read independently of the kernel's cpuid;
    empty where there is none or it names no x86 vendor."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return {}
    field = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    return field if "vendor_id" in field else {}


def test_the_default_asking_follows_the_cpu_that_proc_cpuinfo_names():
    """'auto' takes 'twice' on AMD's cores, 'none32' on an Emerald Rapids (Intel family 6,
    model 207) and 'none' elsewhere: read independently here from /proc/cpuinfo."""
    field = cpuinfo()
    if not field:
        pytest.skip("/proc/cpuinfo names no x86 vendor")
    vendor, family, model = field["vendor_id"], field["cpu family"], field["model"]
    want = ("twice" if vendor == "AuthenticAMD" else
            "none32" if (vendor, family, model) == ("GenuineIntel", "6", "207") else "none")
    assert fused.asking() == "auto"
    assert kernels.asking() == want


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_eight_rows_at_two_vectors_of_tokens_give_the_same_results(isa, dtype):
    """wide8 (Intel's cores) has AVX-512's groups of 8 rows take two vectors of tokens per
    step of the scores: each score is the same sum in the same order, so the sweep's
    results are the same bit for bit, with a causal mask and blocks of an odd number of
    vectors; and it is Intel's default, read independently from /proc/cpuinfo."""
    rng = np.random.default_rng(12)
    k, v = (rng.standard_normal((1, 1000, 2 * 64)).astype(np.float32) for _ in "kv")
    try:
        for G in (8, 9, 16):
            q = rng.standard_normal((1, 3, 2 * G * 64)).astype(np.float32)
            kw = dict(h_kv=2, d=64, tile=384, dtype=dtype, causal=True, start=40, S_kv=1043)
            outs = []
            for w in (0, 1):
                assert fused.wide8(w) == w
                outs.append(run(kernels.FusedKernel, q, k, v, **kw)[1])
            for a, b in zip(*outs):
                np.testing.assert_array_equal(a, b)
    finally:
        fused.wide8(-1)
    for bad in (2, -2):
        with pytest.raises(ValueError, match="wide8 takes"):
            fused.wide8(bad)
    field = cpuinfo()
    if field:
        assert fused.wide8() == (field["vendor_id"] == "GenuineIntel")


@pytest.mark.parametrize("pin, value, says", [
    ("GQA_MPI_ISA", "AVX2", "GQA_MPI_ISA=AVX2 is not one of auto, avx512, avx2, generic"),
    ("GQA_MPI_ASKING", "noen",
     "GQA_MPI_ASKING=noen is not one of auto, once, twice, none, none32"),
    ("GQA_MPI_ASKING", "twice", None)])
def test_a_pin_that_is_not_one_fails_the_import_with_one_line(pin, value, says):
    """A benchmark's pin with a typo is never timed as the pin it meant: the fused kernel
    does not load, and the reason is what gqa_mpi prints beside the NumPy sweep."""
    code = ("from gqa_mpi.core import kernels\n"
            "print(kernels.FUSED_ERROR or kernels._fused.asking())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, **{pin: value}))
    assert out.returncode == 0, out.stderr
    assert (says or value) in out.stdout, out.stdout


def test_a_tile_far_longer_than_the_slice_allocates_nothing_for_it():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 4 * 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 300, 2 * 16)).astype(np.float32) for _ in "kv")
    out, _ = run(kernels.FusedKernel, q, k, v, h_kv=2, d=16, tile=10 ** 15, dtype="float32")
    base, _ = run(kernels.NumpyKernel, q, k, v, h_kv=2, d=16, tile=300, dtype="float32")
    np.testing.assert_allclose(out, base, rtol=1e-5, atol=1e-6)


def test_per_tile_calls_and_a_slice_in_the_middle_of_a_causal_sequence(isa):
    """The trace path (one call per tile) and a slice that starts at token 3000 of a
    causal 4000-token sequence give what the NumPy sweep gives."""
    rng = np.random.default_rng(5)
    h_kv, d, T_q = 2, 32, 4
    q = rng.standard_normal((1, T_q, 4 * h_kv * d)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1000, h_kv * d)).astype(np.float32) for _ in "kv")
    kw = dict(h_kv=h_kv, d=d, tile=96, dtype="float32", causal=True, start=3000, S_kv=3998)
    _, a = run(kernels.FusedKernel, q, k, v, per_tile=True, **kw)
    _, b = run(kernels.NumpyKernel, q, k, v, **kw)
    np.testing.assert_array_equal(np.isneginf(a.m), np.isneginf(b.m))
    np.testing.assert_allclose(a.l, b.l, rtol=2e-6)
    np.testing.assert_allclose(a.O, b.O, rtol=2e-5, atol=2e-6 * np.abs(b.O).max())


def test_empty_slice_and_fully_masked_rows_give_the_empty_partial(isa):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 2, 8 * 16)).astype(np.float32)
    empty = np.zeros((1, 0, 2 * 16), np.float32)
    _, p = run(kernels.FusedKernel, q, empty, empty, h_kv=2, d=16, tile=64, dtype="float32")
    assert np.isneginf(p.m).all() and not p.l.any() and not p.O.any()
    k = rng.standard_normal((1, 50, 2 * 16)).astype(np.float32)
    _, p = run(kernels.FusedKernel, q, k, k, h_kv=2, d=16, tile=16, dtype="float32",
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
    out, _ = run(kernels.FusedKernel, q, k, v, h_kv=h_kv, d=d, tile=128, dtype="float32",
                 scale=1.0)
    base, _ = run(kernels.NumpyKernel, q, k, v, h_kv=h_kv, d=d, tile=128, dtype="float32",
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
    out, _ = run(kernels.FusedKernel, q, k, k, h_kv=1, d=16, tile=32, dtype="float32")
    assert np.isnan(out).all()


def test_error_stays_near_float32_rounding_at_256k_tokens(isa):
    """Per-tile partial sums: at 256K tokens the fused result is as close to float64
    as the NumPy sweep's."""
    rng = np.random.default_rng(9)
    S, d = 262144, 64
    q = rng.standard_normal((1, 1, 2 * d)).astype(np.float32)
    k, v = (rng.standard_normal((1, S, d)).astype(np.float32) for _ in "kv")
    ref = attention_reference(q, k, v, h_kv=1)
    out, _ = run(kernels.FusedKernel, q, k, v, h_kv=1, d=d, tile=1024, dtype="float32")
    assert np.abs(out - ref).max() <= 2e-6 * np.abs(ref).max()


def test_resident_float16_halves_the_bytes():
    rows = np.ones((1, 1000, 64), np.float32)
    src = lambda n, i, j: rows[:, i:j]  # noqa: E731
    for kernel in (kernels.FusedKernel, kernels.NumpyKernel):
        k32, v32 = kernels.make_resident(kernel, src, 1000, 1, 2, 32, np.float32)
        k16, v16 = kernels.make_resident(kernel, src, 1000, 1, 2, 32, np.float16)
        assert k16.nbytes * 2 == k32.nbytes and v16.nbytes * 2 == v32.nbytes


def test_sweep_refuses_mismatched_arrays_instead_of_reading_out_of_bounds():
    q = np.zeros((1, 1, 4, 16), np.float32)
    k = kernels.key_blocks(10, 1, 1, 16, np.float32)
    v = np.zeros((1, 1, 10, 16), np.float32)
    m, l, O = np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4, 16), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        fused.sweep(q, k, np.zeros((1, 1, 40, 16), np.float32), m, l, O, 0, 40, 16, None)
    with pytest.raises(ValueError, match="float16"):
        fused.sweep(q, k, v.astype(np.float16), m, l, O, 0, 10, 16, None)
    with pytest.raises(ValueError, match="lo <= hi"):
        fused.sweep(q, k, v, m, l, O, 0, 11, 16, None)
    with pytest.raises(ValueError, match="unknown instruction set"):
        fused.use("sse9")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("G", [1, 2, 5])
def test_heads_swept_together_give_each_heads_result_bit_for_bit(isa, dtype, G):
    """Several KV heads at once (block by block in turn, sweep's `heads`) is the same
    arithmetic per head as one at a time: 7 heads in 1, 2, 3, 4 and 7 at
    once (a remainder each time), causal, over several tiles."""
    B, h_kv, d, S = 1, 7, 48, 700
    rng = np.random.default_rng(G)
    q = (rng.standard_normal((B, h_kv, G, d)) * 0.3).astype(np.float32)
    k = kernels.key_blocks(S, B, h_kv, d, dtype)
    kernels.put_key_blocks(k, rng.standard_normal((B, S, h_kv * d)).astype(dtype), 0)
    v = kernels.aligned((B, h_kv, S, d), dtype)
    kernels.put_rows(v, rng.standard_normal((B, S, h_kv * d)).astype(dtype), 0)
    row_hi = np.array([S - 50 + 7 * r for r in range(G)], np.int64)

    def sweep(heads):
        m = np.full((B, h_kv, G), -np.inf, np.float32)
        l, O = np.zeros((B, h_kv, G), np.float32), np.zeros((B, h_kv, G, d), np.float32)
        fused.sweep(q, k, v, m, l, O, 0, S, 256, row_hi, 0, heads)
        return m, l, O

    one = sweep(1)
    for heads in (0, 2, 3, 4, 7):
        for got, want in zip(sweep(heads), one):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="heads"):
        sweep(-1)


def test_wrap_rereads_the_first_tokens_as_a_repeated_slice_would(isa):
    """The bench's in-cache timing: with wrap, the blocks read the first `wrap` tokens
    again and again, the same arithmetic as a slice that repeats them."""
    S, W, d = 1024, 256, 128
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 3, d)).astype(np.float32)
    for dtype in (np.float32, np.float16):
        rows = rng.standard_normal((2, 1, S, 2 * d)).astype(np.float32)
        repeated = np.concatenate([rows[:, :, :W]] * (S // W), axis=2)
        def resident(r):
            rows_of = lambda n, i, j: r["kv".index(n)][:, i:j]  # noqa: E731
            return kernels.make_resident(kernels.FusedKernel, rows_of, S, 1, 2, d, dtype)
        k, v = resident(rows)
        kr, vr = resident(repeated)
        got = kernels.FusedKernel.sweep(q, k, v, scale=0.1, tile=512, wrap=W)
        want = kernels.FusedKernel.sweep(q, kr, vr, scale=0.1, tile=512)
        assert np.array_equal(got.O, want.O) and np.array_equal(got.l, want.l)
    m, l, O = (np.zeros(s, np.float32) for s in ((1, 2, 3), (1, 2, 3), (1, 2, 3, d)))
    for lo, wrap in ((0, 100), (128, 256), (0, S - 64)):
        with pytest.raises(ValueError, match="wrap must be 0, or a multiple of 128"):
            fused.sweep(q, k, v, m, l, O, lo, S, 512, None, wrap)
    with pytest.raises(ValueError, match="on_tile"):
        kernels.FusedKernel.sweep(q, k, v, scale=0.1, wrap=W, on_tile=lambda *a: None)


def test_auto_falls_back_to_numpy_with_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "_fused", None)
    monkeypatch.setattr(kernels, "FUSED_ERROR", "gqa_mpi._fused is not available (test)")
    kernel, note = kernels.select("auto")
    assert kernel is kernels.NumpyKernel and "using the NumPy sweep" in note
    assert "\n" not in note
    with pytest.raises(ValueError, match="--kernel fused: .*--kernel numpy"):
        kernels.select("fused")
    assert kernels.select("numpy") == (kernels.NumpyKernel, None)


def test_kernel_fused_that_cannot_load_is_a_usage_error(monkeypatch, capsys):
    from gqa_mpi.app import cli
    monkeypatch.setattr(kernels, "_fused", None)
    monkeypatch.setattr(kernels, "FUSED_ERROR", "gqa_mpi._fused is not available (test)")
    assert cli.main(["--kernel", "fused", "--seq-len", "64"]) == 2
    err = capsys.readouterr().err
    assert "--kernel fused: gqa_mpi._fused is not available" in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["--seq-len", "64", "--heads-q", "4", "--heads-kv", "2",
                     "--head-dim", "8"]) == 0
    out = capsys.readouterr().out
    assert "kernel    numpy; K/V resident as float32; NOTE fused kernel unavailable" in out


def test_the_streaming_read_touches_every_byte_in_every_order(isa):
    """``_fused.read``: the bench's C read. Its checksum is the sum of each piece's
    64-bit words, so every word of every buffer counts once, in any chunking."""
    a = np.arange(1000, dtype=np.uint64)
    b = np.arange(1, 65, dtype=np.uint64)
    total = int(a.sum() + b.sum())
    assert fused.read([a]) == int(a.sum())
    for ahead in (0, 64, 4096):
        for chunk in (0, 64, 800):
            assert fused.read([a, b], ahead, chunk) == total
            assert fused.read([a, b], ahead, chunk, ahead // 2) == total   # asked twice
    assert fused.read([np.arange(7, dtype=np.uint8)]) == 21     # a tail shorter than a word
    with pytest.raises(ValueError, match="at least 0"):
        fused.read([a], -1)
    with pytest.raises(ValueError, match="again must be at most ahead"):
        fused.read([a], 64, 0, 128)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_overlap_probe_does_the_work_it_says(isa, dtype):
    """``_fused.stream``: the sum it returns is the elements' sum times the sum of the
    FMAs' coefficients (float64 here), so every element read and every FMA counted."""
    x = (np.arange(8192) % 7 - 3).astype(dtype)
    coef = [1 + 1 / 1024, 1 + 2 / 1024]
    for fmas in (0, 1, 2, 4, 8, 16):
        c = 1.0 if fmas == 0 else sum(coef[j % 2] for j in range(fmas))
        want = float(np.abs(x).astype(np.float64).sum())
        got = fused.stream(np.abs(x), fmas, ahead=4096)
        assert got == pytest.approx(want * c, rel=1e-6)
        first = np.abs(x).view(np.uint8)[:1024].view(dtype)   # wrap: these, again and again
        want = float(first.astype(np.float64).sum()) * (x.nbytes // 1024)
        assert fused.stream(np.abs(x), fmas, wrap=1024) == pytest.approx(want * c, rel=1e-6)


def test_the_overlap_probe_refuses_what_it_cannot_time():
    x = np.ones(1024, np.float32)
    for bad, match in [((x[:100], 1), "multiple of 512"), ((x.astype(np.int32), 1), "float32 or"),
                       ((x, 3), "fmas must be"), ((x, 1, 100), "wrap must be"),
                       ((x, 1, 8192), "wrap must be"), ((x, 1, 0, -1), "at least 0")]:
        with pytest.raises(ValueError, match=match):
            fused.stream(*bad)


def test_the_resident_k_and_v_start_on_a_page():
    """Every vector load of the sweep then lies in one cache line (kernels.ALIGN)."""
    rows = np.ones((1, 40, 2 * 8), np.float32)
    for kern in (kernels.FusedKernel, kernels.NumpyKernel):
        k, v = kernels.make_resident(kern, lambda n, i, j: rows[:, i:j], 40, 1, 2, 8,
                                     np.float16, capacity=50)
        k2, v2 = kernels.grow(kern, k, v, 80)
        for a in (k, v, k2, v2):
            assert a.ctypes.data % kernels.ALIGN == 0 and a.flags.c_contiguous
        assert (v2[:, :, :40] == 1).all() and v2.shape == (1, 2, 80, 8)
    z = kernels.aligned((3, 5), np.float32, zero=True)
    assert z.shape == (3, 5) and not z.any() and z.ctypes.data % kernels.ALIGN == 0


def test_the_read_limit_is_the_fastest_way_and_keeps_the_old_one_beside_it():
    from gqa_mpi.tools import reads
    x = np.ones((3, 1000), np.float16)      # 6000 bytes: a float32 view of 1500
    found = reads.ways([x, x])
    assert {"numpy.sum", "numpy.dot", "sgemv"} <= set(found)
    assert any(name.startswith("C ") for name in found)
    assert any(" streams " in name for name in found)
    for fn in found.values():
        fn()
    for arrays in ([x, x], [x], [np.ones(5, np.float32)] * 3):   # every byte once, in order
        cut = reads.pieces(arrays)
        assert 1 <= len(cut) <= reads.STREAMS
        assert np.array_equal(np.concatenate([c.view(np.uint8) for c in cut]),
                              np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays]))
    got = reads.fastest({"numpy.sum": 3.0, "numpy.dot": 2.0, "sgemv": 1.5,
                         "C chunk=64K ahead=4K": 1.0})
    assert got == dict(read_s=1.0, read_way="C chunk=64K ahead=4K", read_old_s=2.0)
    assert reads.short(got["read_way"]) == "C"
