"""Scaling studies: real launches, resumable after a kill, a timeout per run, plots."""
import csv
import os
import signal
import subprocess
import sys
import time

import pytest

STUDY = [sys.executable, "-m", "gqa_mpi.study"]
TINY = ["--heads-q", "4", "--heads-kv", "2", "--head-dim", "8", "--seq-len", "4000",
        "--repeats", "2", "--timeout", "120"]


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_strong_study_killed_and_resumed(tmp_path):
    out = tmp_path / "s.csv"
    cmd = STUDY + ["run", "--kind", "strong", "--ranks", "1,2,4", "--out", str(out), *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or len(rows(out)) < 2):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)               # the study and every rank under it
    proc.wait()
    kept = rows(out)
    assert 2 <= len(kept) < 6 and all(r["status"] == "ok" for r in kept)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{len(kept)} already in" in again.stderr
    final = rows(out)
    assert final[:len(kept)] == kept                  # nothing lost, nothing redone
    done = {(r["ranks"], r["repeat"]) for r in final if r["status"] == "ok"}
    assert done == {(n, k) for n in ("1", "2", "4") for k in ("0", "1")}
    assert len(final) == 6
    for r in final:
        assert float(r["step_max"]) > 0 and r["passed"] == "True"
    assert "eff" in again.stdout


def test_hung_launch_is_timed_out(tmp_path):
    out = tmp_path / "t.csv"
    hang = f"{sys.executable} -c 'import time; time.sleep(60)'"
    t0 = time.monotonic()
    proc = subprocess.run(STUDY + ["run", "--kind", "tile", "--ranks", "1", "--tiles", "64",
                                   "--repeats", "1", "--timeout", "2", "--launcher", hang,
                                   "--out", str(out)], capture_output=True, text=True,
                          timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    (row,) = rows(out)
    assert row["status"] == "timeout" and "after 2 s" in row["error"]


def test_config_file_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    cfg = tmp_path / "study.json"
    cfg.write_text('{"kind": "weak", "ranks": "1,2", "tokens-per-rank": 500, "repeats": 1, '
                   '"heads-q": 4, "heads-kv": 2, "head-dim": 8}')
    out = tmp_path / "w.csv"
    proc = subprocess.run(STUDY + ["run", "--config", str(cfg), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [r["seq_len"] for r in rows(out)] == ["500", "1000"]
    plot = subprocess.run(STUDY + ["plot", str(out), "--out-dir", str(tmp_path / "png")],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    names = sorted(os.listdir(tmp_path / "png"))
    assert names == sorted(f"weak_{k}.png" for k in ("time", "efficiency", "breakdown",
                                                      "throughput"))
    for name in names:
        assert (tmp_path / "png" / name).read_bytes()[:4] == b"\x89PNG"


def test_bad_config_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('kind = "strong"\nrankz = "1,2"\n')
    proc = subprocess.run(STUDY + ["run", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "unknown key(s) rankz" in proc.stderr
