"""The benchmark runs (on a tiny size); its timings are never asserted."""
import json
import subprocess
import sys

from gqa_mpi.core.schedules import SCHEDULES
from gqa_mpi.tools import overlap


def bench(tmp_path, *args):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi.bench", *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def test_bench_quick_runs(tmp_path):
    proc, rec = bench(tmp_path, "--quick")                # the default suite
    assert "fused/limit" in proc.stdout and "reduce/local" in proc.stdout
    assert {r["tile"] for r in rec["local"]} == {256, 1024}
    assert {r["kv_dtype"] for r in rec["local"]} == {"float32", "float16"}
    assert "cached ms" in proc.stdout
    assert all(r["fused_cached_s"] > 0 for r in rec["local"] if r["S_local"] >= 384)
    assert "paired" in proc.stdout
    assert all(r["fused_paired_over_limit"] > 0 for r in rec["local"])
    assert all("error" not in r for r in rec["reduction"])
    assert {r["reduce"] for r in rec["reduction"]} == set(SCHEDULES.names())
    proc, rec = bench(tmp_path, "step", "--quick")
    assert "step/limit" in proc.stdout and all("error" not in r for r in rec["step"])
    assert {(r["kv_dtype"], r["reduce"]) for r in rec["step"]} == {
        (t, s) for t in ("float32", "float16") for s in ("chain", "allgather")}
    proc, rec = bench(tmp_path, "overlap", "--quick")
    assert "stream/max" in proc.stdout
    assert {(r["kv_dtype"], r["G"]) for r in rec["overlap"]} == {
        (t, g) for t in ("float32", "float16") for g in (1, 8)}
    assert all(r["loops_s"] > 0 and r["stream_ahead"] in overlap.AHEAD for r in rec["overlap"])
    proc, rec = bench(tmp_path, "--quick", "source", "builtin:corrected")
    assert "tl/numpy" in proc.stdout and all("error" not in r for r in rec["source"])
    proc, rec = bench(tmp_path, "predict", "builtin:corrected", "--profile", "example-npu",
                      "--quick")
    assert "predicted/measured" in proc.stdout and all("error" not in r for r in rec["predict"])


def test_a_bad_list_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi.bench", "step", "--reduce", "ring"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no schedule 'ring'" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi.bench", "overlap", "--groups", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "G of 1, 2, 4, 8 or 16, not 3" in proc.stderr, proc.stderr
