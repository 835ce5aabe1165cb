"""Faults, hostile inputs and numerical extremes: clean failure, nothing lost, no hang."""
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gqa_mpi.app import cli
from gqa_mpi.core.attention import merge
from gqa_mpi.tools.launcher import gqa_command
from gqa_mpi.core.reference import attention_reference

from gqa_mpi.app.record import RunRecord

import util
from util import distributed, launch, random_inputs, read_json, write_inputs

MARK = util.marker(5_000_000)


def leftovers():
    return util.leftovers(MARK)


def assert_no_leftovers(within=10.0, but=()):
    util.assert_no_leftovers(MARK, within, but)


# ---------------------------------------------------------------- faults

def test_leftover_probe_sees_a_live_run():
    proc = subprocess.Popen(gqa_command(2, ["--seq-len", "200000", "--seed", MARK, "--quiet"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftovers()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert_no_leftovers()


@pytest.mark.parametrize("point", ["local_attention", "reduce"])
def test_sigkill_mid_run_ends_the_job(point):
    proc = launch(4, ["--seq-len", 50000, "--seed", MARK, "--quiet"], timeout=60,
                  env={"GQA_MPI_FAULT": f"kill:3:{point}"})
    ended = time.time()
    killed = float(re.search(r"injecting fault kill at \w+, t=([\d.]+)", proc.stderr).group(1))
    assert proc.returncode != 0
    assert ended - killed < 10, f"job outlived the killed rank by {ended - killed:.1f} s"
    assert_no_leftovers()


def test_exception_on_one_rank_aborts_all_and_is_printed_once():
    t0 = time.monotonic()
    proc = launch(8, ["--seq-len", 20000, "--seed", MARK], timeout=60,
                  env={"GQA_MPI_FAULT": "raise:5:reduce"})
    assert proc.returncode == cli.EXIT_CRASH, proc.stderr      # not 1 (failed) or 2 (usage)
    assert time.monotonic() - t0 < 30
    assert proc.stderr.count("RuntimeError: injected fault") == 1, proc.stderr
    assert "gqa_mpi: rank 5: unexpected error, aborting all 8 ranks" in proc.stderr
    assert_no_leftovers()


WATCHDOG_CASES = {  # fault: words naming the stuck rank
    "hang:6:reduce": "rank 6 is stuck in reduce after 2 s",
    "stop:2:local_attention": "for rank 2 (intra_",              # named by a neighbour
    "stop:3:start": "for rank(s) 3 to reach start-up",         # named by rank 0
    "stop:0:start": "for rank 0 to see every rank reach start-up",
}


@pytest.mark.parametrize("fault", sorted(WATCHDOG_CASES))
def test_the_watchdog_ends_the_job_and_names_the_stuck_rank(fault):
    """A rank that hangs names itself; one frozen by SIGSTOP (its watchdog cannot run)
    is named by whoever waits for it, also before the configuration is agreed."""
    t0 = time.monotonic()
    proc = launch(8, ["--seq-len", 2000, "--seed", MARK, "--timeout", 2], timeout=60,
                  env={"GQA_MPI_FAULT": fault})
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 2 + 20
    assert WATCHDOG_CASES[fault] in proc.stderr, proc.stderr
    assert "(--timeout); aborting all 8 ranks" in proc.stderr
    assert_no_leftovers()


def test_the_watchdog_covers_shut_down_under_a_stopped_launcher():
    """Work done, then the launcher is frozen: MPI_Finalize cannot complete, and the
    ranks still leave within the timeout (they do not wait for the launcher forever)."""
    proc = subprocess.Popen(gqa_command(4, ["--seq-len", "2000", "--seed", MARK, "--timeout", "5"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("traffic"):
                break
        os.kill(proc.pid, signal.SIGSTOP)
        assert_no_leftovers(within=20, but={proc.pid})     # every rank is gone
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait()


@pytest.mark.parametrize("kind", ["kill", "raise"])
def test_interrupted_write_keeps_the_old_file(tmp_path, kind):
    o, j = tmp_path / "o.npy", tmp_path / "r.json"
    old = np.arange(12, dtype=np.float32)
    np.save(o, old)
    j.write_text('{"old": true}')
    proc = launch(2, ["--seq-len", 1000, "--output", o, "--json", j], timeout=60,
                  env={"GQA_MPI_FAULT": f"{kind}:0:write"})
    assert proc.returncode != 0
    np.testing.assert_array_equal(np.load(o), old)        # old file, whole
    assert read_json(j) == {"old": True}


# ---------------------------------------------------------------- hostile inputs

def _save(d, **arrays):
    rng = np.random.default_rng(0)
    base = dict(q=rng.standard_normal((2, 64)).astype(np.float32),
                k=rng.standard_normal((40, 32)).astype(np.float32),
                v=rng.standard_normal((40, 32)).astype(np.float32))
    base.update(arrays)
    write_inputs(d, base["q"], base["k"], base["v"])


def _nonfinite(name, value, where):
    def make(d):
        arrays = {}
        rng = np.random.default_rng(0)
        shape = (2, 64) if name == "q" else (40, 32)
        a = rng.standard_normal(shape).astype(np.float32)
        a[where] = value
        arrays[name] = a
        _save(d, **arrays)
    return make


def _header_shape(shape):
    """k.npy with a hand-written header claiming ``shape`` (and 8 bytes of data)."""
    def make(d):
        _save(d)
        header = {"descr": "<f4", "fortran_order": False, "shape": shape}
        with open(os.path.join(d, "k.npy"), "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            f.write(b"\0" * 8)
    return make


def _truncate(d):
    _save(d)
    p = os.path.join(d, "v.npy")
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)


def _garbage(d):
    _save(d)
    with open(os.path.join(d, "k.npy"), "wb") as f:
        f.write(b"\x93NUMPY garbage")


def _missing(d):
    _save(d)
    os.remove(os.path.join(d, "q.npy"))


def _dir_as_file(d):
    _save(d)
    os.remove(os.path.join(d, "k.npy"))
    os.mkdir(os.path.join(d, "k.npy"))


def _pickled(d):
    _save(d)
    np.save(os.path.join(d, "q.npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)


FILE_CASES = {
    "missing q.npy": (_missing, [], "q.npy: no such file"),
    "truncated v.npy": (_truncate, [], "truncated"),
    "garbage k.npy": (_garbage, [], "not a readable .npy"),
    "directory as k.npy": (_dir_as_file, [], "not a regular file"),
    "pickled object array": (_pickled, [], "Python objects"),
    "int32 K": (lambda d: _save(d, k=np.zeros((40, 32), np.int32)), [], "dtype int32"),
    "float64 Q": (lambda d: _save(d, q=np.zeros((2, 64))), [], "dtype float64"),
    "4-D V": (lambda d: _save(d, v=np.zeros((1, 1, 40, 32), np.float32)), [], "shape"),
    "K, V lengths differ": (lambda d: _save(d, v=np.zeros((39, 32), np.float32)), [],
                            "differ in shape"),
    "width not a multiple of d": (lambda d: _save(d, q=np.zeros((2, 60), np.float32)), [],
                                  "not a multiple of --head-dim"),
    "head counts not divisible": (lambda d: _save(d, q=np.zeros((2, 48), np.float32)), [],
                                  "not a multiple of --heads-kv"),
    "--heads-q contradicts q.npy": (_save, ["--heads-q", 8], "--heads-q 8 does not match"),
    "NaN in Q": (_nonfinite("q", np.nan, (1, 3)), [], "q.npy: NaN at batch 0, query 1, column 3"),
    "inf in K": (_nonfinite("k", np.inf, (33, 7)), [], "k.npy: inf at batch 0, token 33, column 7"),
    "NaN in V, last rank": (_nonfinite("v", np.nan, (39, 31)), [], "v.npy: NaN at batch 0, token 39"),
    "-inf in V, first rank": (_nonfinite("v", -np.inf, (0, 0)), [], "v.npy: inf at batch 0, token 0"),
    "shape overflows int64": (_header_shape((2 ** 40 - 1, 2 ** 40 - 1)), [], "truncated"),
    "boolean dimension": (_header_shape((True, 32)), [], "is not a shape"),
    "absurd dimension": (_header_shape((2 ** 62, 32)), [], "is not a shape"),
    "negative dimension": (_header_shape((-4, 32)), [], "is not a shape"),
}

ARG_CASES = {  # run in-process on one rank
    "cubes do not divide": (["--cubes", 3], "does not divide"),
    "C x P != ranks": (["--cubes", 2, "--pes", 2], "but 1 are running"),
    "P beyond grid": (["--cubes", 1, "--pes", 2, "--grid", "1x1"], "does not fit the 1x1"),
    "zero grid": (["--grid", "0x4"], "--grid rows must be a positive integer"),
    "grid syntax": (["--grid", "2by4"], "ROWSxCOLS"),
    "negative seq-len": (["--seq-len", -5], "--seq-len must be a positive"),
    "zero heads": (["--heads-kv", 0], "--heads-kv must be a positive"),
    "heads not divisible": (["--heads-q", 6, "--heads-kv", 4], "not a multiple"),
    "non-integer tile": (["--tile", "1.5"], "invalid int value"),
    "zero tile": (["--tile", 0], "--tile must be a positive"),
    "negative scale": (["--softmax-scale", "-1"], "--softmax-scale must be a positive"),
    "nan scale": (["--softmax-scale", "nan"], "--softmax-scale must be a positive"),
    "unknown wire": (["--wire", "fp8"], "invalid choice"),
    "mpi reduce, f16 wire": (["--reduce", "mpi", "--wire", "kernel"], "carries only --wire packed"),
    "unknown flag": (["--frobnicate"], "unrecognized arguments"),
    "zero timeout": (["--timeout", 0], "--timeout must be a positive"),
    "split wrong length": (["--split", "1,2,3", "--seq-len", 6], "3 token counts for 1 ranks"),
    "split wrong sum": (["--split", "2", "--seq-len", 6], "add up to 2"),
    "negative seed": (["--seed", -1], "--seed must be an integer from 0"),
    "trace tiles without trace": (["--trace-tiles"], "give --trace FILE.json too"),
    "huge seed": (["--seed", 2 ** 64], "--seed must be an integer from 0"),
    "seq-len 1e10": (["--seq-len", 10 ** 10], "needs about"),
    "head-dim 1e9": (["--head-dim", 10 ** 9], "needs about"),
    "batch 1e6": (["--batch", 10 ** 6], "needs about"),
    "queries 1e6": (["--queries", 10 ** 6], "needs about"),
    "heads-q 1e7": (["--heads-q", 10 ** 7, "--heads-kv", 1], "needs about"),
    "max-memory too small": (["--max-memory", "10M"], "--max-memory allows only"),
    "max-memory syntax": (["--max-memory", "lots"], "expected a size"),
    "check too big": (["--seq-len", 4 * 10 ** 7, "--max-memory", "20G"], "--no-check"),
    "split syntax": (["--split", "a,b"], "comma-separated integers"),
    "inputs not a directory": (["--inputs", "/etc/hostname"], "not a directory"),
    "output dir missing": (["--output", "/nonexistent/o.npy"], "does not exist"),
    "output is a directory": (["--output", "/tmp"], "is a directory"),
    "output not writable": (["--output", "/proc/o.npy"], "not writable"),
    "json dir missing": (["--json", "/nonexistent/r.json"], "does not exist"),
    "trace not writable": (["--trace", "/proc/t.json"], "not writable"),
}


@pytest.mark.parametrize("case", sorted(ARG_CASES))
def test_bad_arguments(capsys, case):
    args, words = ARG_CASES[case]
    util.refused(capsys, *args, words=words)


@pytest.mark.parametrize("args,env,words", [
    (["--seed", -1], {}, "--seed must be"),
    (["--seq-len", 10 ** 10], {}, "needs about"),
    (["--seq-len", 100], {"GQA_MPI_FAULT": "raise:0"}, "GQA_MPI_FAULT='raise:0' is not"),
    (["--output", "/dev/null", "--seq-len", 100], {}, "is a character device"),
    (["--kernel-faithful", "--pes", 4, "--cubes", 1, "--seq-len", 3], {}, "SPEC defect 6"),
])
def test_every_rank_leaves_with_the_same_code(args, env, words):
    """Real launches: a refusal is one line from rank 0 and exit 2 from all ranks."""
    proc = launch(4, args, timeout=60, env=env)
    util.assert_refused(proc.returncode, proc.stdout, proc.stderr, words)


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_input_files(tmp_path, capsys, case):
    make, extra, words = FILE_CASES[case]
    d = str(tmp_path / "in")
    os.makedirs(d)
    make(d)
    args = ["--inputs", d, "--head-dim", 16, "--heads-kv", 2, *extra]
    if "rank" in case:       # the check of values runs on each rank's own slice
        proc = launch(2, args, timeout=60)
        util.assert_refused(proc.returncode, proc.stdout, proc.stderr, words)
    else:
        util.refused(capsys, *args, words=words)


def test_nonfinite_allowed_on_request(tmp_path):
    d = str(tmp_path / "in")
    os.makedirs(d)
    _nonfinite("v", np.inf, (5, 5))(d)
    proc = launch(2, ["--inputs", d, "--head-dim", 16, "--allow-nonfinite"], timeout=60)
    assert proc.returncode == 1 and "FAILED" in proc.stdout      # ran; inf is not a pass


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


def test_rows_that_see_no_key_are_zero(tmp_path):
    """Causal with T_q > S_kv: the first queries see nothing; last rank short."""
    rng = np.random.default_rng(2)
    q, k, v = random_inputs(rng, S=5, h_q=2, h_kv=1, d=4, T_q=8)
    o = tmp_path / "o.npy"
    proc = launch(4, ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", 4,
                      "--causal", "--output", o, "--split", "2,2,1,0"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = np.load(o)
    assert np.isfinite(got).all() and not got[:3].any()
    np.testing.assert_allclose(got, attention_reference(q, k, v, h_kv=1, causal=True),
                               atol=1e-6)


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
