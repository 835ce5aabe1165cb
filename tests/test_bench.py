"""The benchmark runs (on a tiny size); its timings are never asserted."""
import json
import subprocess
import sys

import pytest

from gqa_mpi.core.schedules import SCHEDULES
from gqa_mpi.tools import overlap, paths


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


def test_paths_times_every_path_the_cpu_has_and_leaves_the_default_chosen(tmp_path, capsys):
    pytest.importorskip("gqa_mpi._fused", reason="the fused kernel was not built")
    from gqa_mpi import _fused
    from gqa_mpi.tools import bench as tool
    before, asking = _fused.isa(), _fused.asking()
    out = tmp_path / "paths.json"
    assert tool.main(["paths", "--quick", "--generic", "--heads", "3", "--asking", "twice,none",
                      "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["paths"]
    have = paths.available(paths.PATHS + ("generic",))
    assert have[0] == "auto" and "generic" in have
    assert {(r["kv_dtype"], r["G"]) for r in rows} == {
        (t, g) for t in ("float32", "float16") for g in (1, 4)}
    for r in rows:
        assert r["auto"] in ("avx512", "avx2", "generic")
        assert r["auto_over_auto"] == 1.0
        assert all(r[f"{p}_s"] > 0 for p in have + ["auto_x3", "auto_twice", "auto_none"])
    assert "avx2/auto" in capsys.readouterr().out or have == ["auto", "generic"]
    assert (_fused.isa(), _fused.asking()) == (before, asking)
    with pytest.raises(SystemExit) as e:
        tool.main(["paths", "--heads", "0"])
    assert e.value.code == 2 and "--heads: 1 to 64" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        tool.main(["paths", "--asking", "twice,often"])
    assert e.value.code == 2 and "--asking: often is not one of" in capsys.readouterr().err


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
