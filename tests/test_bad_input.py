"""Hostile input (flags, files, values): one clean line and the same exit code on every
rank, never a traceback or a hang."""
import os

import numpy as np
import pytest

import util
from util import launch, write_inputs


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
    **{f"source {' '.join(a)}": (["--kernel-source", "builtin:corrected", *a],
                                 f"cannot honour {' '.join(a)} (")
       for a in (["--reduce", "tree"], ["--wire", "fp16"], ["--tile", "512"],
                 ["--kernel", "numpy"], ["--kv-dtype", "float32"])},
    "retired --kernel-faithful": (["--kernel-faithful"], "run the kernel itself"),
    "predict without a source": (["--predict", "example-npu"], "give --kernel-source FILE"),
    "no such profile": (["--kernel-source", "builtin:corrected", "--predict", "tpu-v9"],
                        "shipped profiles: example-npu"),
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
    "cache too big": (["--seq-len", 4 * 10 ** 7, "--max-memory", "20G"], "more ranks"),
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


@pytest.mark.launch
@pytest.mark.parametrize("args,env,words", [
    (["--seed", -1], {}, "--seed must be"),
    (["--seq-len", 10 ** 10], {}, "needs about"),
    (["--seq-len", 100], {"GQA_MPI_FAULT": "raise:0"}, "GQA_MPI_FAULT='raise:0' is not"),
    (["--output", "/dev/null", "--seq-len", 100], {}, "is a character device"),
    (["--kernel-source", "builtin:corrected", "--reduce", "tree"], {},
     "cannot honour --reduce tree"),
])
def test_every_rank_leaves_with_the_same_code(args, env, words):
    """Real launches: a refusal is one line from rank 0 and exit 2 from all ranks."""
    proc = launch(4, args, timeout=60, env=env)
    util.assert_refused(proc.returncode, proc.stdout, proc.stderr, words)


@pytest.mark.launch
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


@pytest.mark.launch
def test_nonfinite_allowed_on_request(tmp_path):
    d = str(tmp_path / "in")
    os.makedirs(d)
    _nonfinite("v", np.inf, (5, 5))(d)
    proc = launch(2, ["--inputs", d, "--head-dim", 16, "--allow-nonfinite"], timeout=60)
    assert proc.returncode == 1 and "FAILED" in proc.stdout      # ran; inf is not a pass
