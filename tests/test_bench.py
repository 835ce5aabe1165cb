"""The benchmark runs (on a tiny size); its timings are never asserted."""
import json
import subprocess
import sys

import pytest

from gqa_mpi.step.schedules import SCHEDULES

pytestmark = pytest.mark.launch   # every test here starts processes


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
    assert all(r["fused_over_limit"] > 0 and r["read_way"] for r in rec["local"])
    assert "bench: local: S_local 1024, float32 K/V" in proc.stderr   # a line a piece
    assert "bench: reduce: 2 rank(s)" in proc.stderr and " -m gqa_mpi --seq-len" in proc.stderr
    assert all("error" not in r for r in rec["reduction"])
    assert {r["reduce"] for r in rec["reduction"]} == set(SCHEDULES.names())
    proc, rec = bench(tmp_path, "step", "--quick")
    assert "step/limit" in proc.stdout and all("error" not in r for r in rec["step"])
    assert {(r["kv_dtype"], r["reduce"]) for r in rec["step"]} == {
        (t, s) for t in ("float32", "float16") for s in ("chain", "allgather")}
    proc, rec = bench(tmp_path, "--quick", "source", "builtin:corrected")
    assert "tl/numpy" in proc.stdout and all("error" not in r for r in rec["source"])
    proc, rec = bench(tmp_path, "predict", "builtin:corrected", "--profile", "example-npu",
                      "--quick")
    assert "predicted/measured" in proc.stdout and all("error" not in r for r in rec["predict"])


def test_a_bad_list_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi.bench", "step", "--reduce", "ring"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no schedule 'ring'" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi.bench", "paths"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'paths'" in proc.stderr, proc.stderr


def test_a_reader_that_leaves_early_ends_the_output_quietly():
    """``bench ... | head``: the tables stop where the reader went away, with the exit
    of a command killed by SIGPIPE and no traceback."""
    import signal
    from gqa_mpi.exits import SIGNAL
    script = ("from gqa_mpi.exits import quiet_when_the_reader_leaves as q\n"
              "main = q(lambda: [print('row', i) for i in range(10 ** 6)] and 0)\n"
              "raise SystemExit(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == SIGNAL + signal.SIGPIPE
    assert "Traceback" not in err and "BrokenPipe" not in err, err
