"""Generated inputs and .npy checks (no MPI)."""
import os

import numpy as np
import pytest

from gqa_mpi.config import inputs
from gqa_mpi.config.inputs import InputError, inspect_inputs

from util import write_inputs


@pytest.mark.parametrize("start,stop", [(0, 1), (4095, 4097), (100, 9000), (8192, 10000)])
def test_generated_window_equals_whole(start, stop):
    whole = inputs.generate(7, "k", 2, 10000, 8)
    part = inputs.generate(7, "k", 2, 10000, 8, start, stop)
    np.testing.assert_array_equal(part, whole[:, start:stop])


def test_generated_tensors_differ():
    a, b = (inputs.generate(0, n, 1, 100, 8) for n in "kv")
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, inputs.generate(1, "k", 1, 100, 8))


def good(tmp_path, **over):
    rng = np.random.default_rng(0)
    arrays = dict(q=rng.standard_normal((2, 3, 64)).astype(np.float32),
                  k=rng.standard_normal((2, 50, 32)).astype(np.float16),
                  v=rng.standard_normal((2, 50, 32)).astype(np.float16))
    arrays.update(over)
    return write_inputs(tmp_path / "in", arrays["q"], arrays["k"], arrays["v"])


def test_inspect_good(tmp_path):
    assert inspect_inputs(good(tmp_path), 16) == dict(
        batch=2, queries=3, seq_len=50, heads_q=4, heads_kv=2, kv_dtype="float16")


BAD = {
    "object array": (dict(q=np.array([[None, 1]], dtype=object)), "Python objects"),
    "int dtype": (dict(k=np.zeros((2, 50, 32), np.int32)), "dtype int32"),
    "float64": (dict(v=np.zeros((2, 50, 32))), "dtype float64"),
    "1-D": (dict(q=np.zeros(64, np.float32)), r"shape \(64,\)"),
    "k v differ": (dict(v=np.zeros((2, 49, 32), np.float32)), "differ in shape"),
    "batch mismatch": (dict(q=np.zeros((3, 3, 64), np.float32)), "batch"),
    "width": (dict(k=np.zeros((2, 50, 30), np.float32),
                   v=np.zeros((2, 50, 30), np.float32)), "not a multiple"),
    "2-D vs 3-D": (dict(q=np.zeros((3, 64), np.float32)), "must all be 2-D or all 3-D"),
    "empty": (dict(k=np.zeros((2, 0, 32), np.float32), v=np.zeros((2, 0, 32), np.float32)),
              "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_inspect_bad(tmp_path, case):
    over, words = BAD[case]
    with pytest.raises(InputError, match=words):
        inspect_inputs(good(tmp_path, **over), 16)


def test_truncated_and_missing(tmp_path):
    d = good(tmp_path)
    path = os.path.join(d, "k.npy")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(InputError, match="truncated"):
        inspect_inputs(d, 16)
    os.remove(path)
    with pytest.raises(InputError, match="no such file"):
        inspect_inputs(d, 16)
    os.mkdir(path)
    with pytest.raises(InputError, match="not a regular file"):
        inspect_inputs(d, 16)
    with open(os.path.join(d, "q.npy"), "wb") as f:
        f.write(b"not numpy")
    with pytest.raises(InputError, match="not a readable .npy"):
        inspect_inputs(d, 16)
