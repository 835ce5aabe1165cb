"""Real launches of ``mpirun -n N python -m gqa_mpi`` checked from outside.

The inputs are written by the test and the expected output is the test's own float64
reference, so nothing here trusts the code under test.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import gqa_mpi
from gqa_mpi.app.record import RunRecord
from gqa_mpi.step import sweeps
from whole_reference import attention_reference

from util import launch, random_inputs, read_json, write_inputs

pytestmark = pytest.mark.launch   # every test here starts processes


def test_default_run_reports_and_passes(tmp_path):
    """The run record of a plain run (the README's 16-rank quick start is run by
    tests/test_docs.py)."""
    out = tmp_path / "run.json"
    proc = launch(4, ["--seq-len", 20000, "--json", out])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any("C=1 cubes x P=4 PEs = 4 ranks" in s for s in lines)
    assert any(s.startswith("reduce    chain") and "3 hops" in s for s in lines)
    assert any("PASSED" in s for s in lines)
    raw = read_json(out)
    assert raw["units"]["timings"] == "s" and raw["version"] == gqa_mpi.__version__
    assert raw["mpi_library"] and raw["created"].endswith("Z")
    assert "Infinity" not in out.read_text() and "NaN" not in out.read_text()
    rec = RunRecord.load(out)
    assert rec.check.passed and rec.check.max_rel_err < 1e-5
    for phase in ("local_attention", "reduce", "step", "total"):
        assert set(rec.timings()[phase]) == {"min", "median", "max"}
    assert rec.messages == 3 * 3 and len(rec.ranks) == 4
    assert rec.hosts == [rec.ranks[0].host]
    assert (rec.config.cubes, rec.config.pes) == (1, 4)
    want = ["numpy"] if sweeps.FUSED_ERROR else ["fused"]
    assert rec.kernels == want and rec.config.kernel == "auto"
    assert RunRecord.from_json(rec.to_json()) == rec


@pytest.mark.parametrize("C,P", [(1, 1), (1, 6), (3, 5)])   # every grid: tests/test_mpi.py
def test_file_inputs_against_reference(tmp_path, C, P):
    rng = np.random.default_rng(C * 10 + P)
    S = 53 * C * P + 7                      # not a multiple of the rank count
    q, k, v = random_inputs(rng, S=S, h_q=8, h_kv=2, d=16, T_q=3, B=2,
                            dtype=np.float16 if P % 2 else np.float32)
    d = write_inputs(tmp_path / "in", q, k, v)
    o, rec = tmp_path / "o.npy", tmp_path / "run.json"
    proc = launch(C * P, ["--cubes", C, "--pes", P, "--inputs", d, "--head-dim", 16,
                          "--tile", 32, "--causal", "--output", o, "--json", rec])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a float16 cache stays float16 on the ranks unless --kv-dtype says otherwise
    assert read_json(rec)["config"]["kv_dtype"] == ("float16" if P % 2 else "float32")
    got = np.load(o)
    assert got.shape == q.shape and got.dtype == np.float32
    ref = attention_reference(q, k, v, h_kv=2, causal=True)
    np.testing.assert_allclose(got, ref, atol=2e-6 * np.abs(ref).max())


def test_same_seed_same_output_at_any_rank_count(tmp_path):
    args = ["--seq-len", 3001, "--heads-q", 8, "--heads-kv", 4, "--head-dim", 32,
            "--queries", 2, "--seed", 11, "--tile", 128]
    outs = []
    for n in (1, 16):
        o = tmp_path / f"o{n}.npy"
        proc = launch(n, args + ["--output", o])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs.append(np.load(o))
    for other in outs[1:]:
        np.testing.assert_allclose(other, outs[0], rtol=0, atol=1e-6)


def test_mismatched_flag_and_file(tmp_path):
    q, k, v = random_inputs(np.random.default_rng(0), S=10, h_q=4, h_kv=2, d=8)
    d = write_inputs(tmp_path / "in", q, k, v)
    proc = launch(2, ["--inputs", d, "--head-dim", 8, "--seq-len", 11], timeout=60)
    assert proc.returncode == 2
    assert "--seq-len 11 does not match the inputs, which have seq-len 10" in proc.stderr


def test_without_mpirun_runs_one_rank_and_says_so():
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi", "--seq-len", "2000"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "one MPI rank, so C = P = 1" in proc.stdout
    assert "C=1 cubes x P=1 PEs = 1 ranks" in proc.stdout


def test_help_printed_once():
    proc = launch(4, ["--help"], timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.count("usage:") == 1 and "intra_W" in proc.stdout


def test_output_replaces_old_file_whole(tmp_path):
    o = tmp_path / "o.npy"
    o.write_bytes(b"old")
    proc = launch(2, ["--seq-len", 100, "--output", o])
    assert proc.returncode == 0
    assert np.load(o).shape == (1, 32 * 128)
    assert os.listdir(tmp_path) == ["o.npy"]          # no temporary file left behind
