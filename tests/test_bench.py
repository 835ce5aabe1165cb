"""The benchmark runs (on a tiny size); its timings are never asserted."""
import json
import subprocess
import sys

from gqa_mpi.core.schedules import SCHEDULES


def test_bench_quick_runs(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi.bench", "--quick", "--json", str(out),
                           "--kernel-source", "builtin:corrected"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fused/limit" in proc.stdout and "reduce/local" in proc.stdout
    rec = json.loads(out.read_text())
    assert {r["tile"] for r in rec["local"]} == {256, 1024}
    assert {r["kv_dtype"] for r in rec["local"]} == {"float32", "float16"}
    assert all("error" not in r for r in rec["reduction"])
    assert {r["reduce"] for r in rec["reduction"]} == set(SCHEDULES.names())
    assert "step/limit" in proc.stdout and all("error" not in r for r in rec["step"])
    assert {(r["kv_dtype"], r["reduce"]) for r in rec["step"]} == {
        (t, s) for t in ("float32", "float16") for s in ("chain", "allgather")}
    assert "tl/numpy" in proc.stdout and all("error" not in r for r in rec["source"])
