"""Scaling studies: real launches, resumable after a kill, a timeout per run, plots."""
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from util import leftovers, marker, wait_until

STUDY = [sys.executable, "-m", "gqa_mpi.study"]
TINY = ["--heads-q", "4", "--heads-kv", "2", "--head-dim", "8", "--seq-len", "4000",
        "--repeats", "2", "--timeout", "120"]


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.launch
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


@pytest.mark.launch
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


@pytest.mark.launch
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
    assert all(float(r["ranks_per_core"]) > 0 for r in rows(out))    # a column of its own
    plot = subprocess.run(STUDY + ["plot", str(out), "--out-dir", str(tmp_path / "png")],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    names = sorted(os.listdir(tmp_path / "png"))
    assert names == sorted(f"w_weak_{k}.png" for k in ("time", "efficiency", "breakdown",
                                                        "throughput"))
    for name in names:
        assert (tmp_path / "png" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.launch
def test_bad_config_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('kind = "strong"\nrankz = "1,2"\n')
    proc = subprocess.run(STUDY + ["run", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "unknown key(s) rankz" in proc.stderr


# ---------------------------------------------------------------- kills and damage

MARK = marker(6_000_000)
HANG = dict(os.environ, GQA_MPI_FAULT="hang:0:local_attention", PYTHONUNBUFFERED="1")


def marked_left():
    return leftovers(MARK)


def hanging_study(out):
    cmd = STUDY + ["run", "--kind", "strong", "--ranks", "2", "--repeats", "1",
                   "--seq-len", "1000", "--heads-q", "4", "--heads-kv", "2",
                   "--head-dim", "8", "--out", str(out), "--", "--seed", MARK]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=HANG)
    wait_until(lambda: len(marked_left()) >= 3, 60, "the launch never started")
    return proc


@pytest.mark.launch
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_launch_records_nothing_and_resumes(tmp_path, sig):
    out = tmp_path / "s.csv"
    proc = hanging_study(out)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "interrupted by" in err and "run the same command to resume" in err
    assert "Traceback" not in err
    wait_until(lambda: not marked_left(), 15, f"ranks left running: {marked_left()}")
    assert not out.exists()                               # nothing half-done recorded
    assert os.listdir(tmp_path) == []                     # no temp record left


@pytest.mark.launch
def test_kill_9_of_the_study_takes_its_launch_along(tmp_path):
    proc = hanging_study(tmp_path / "s.csv")
    proc.kill()
    proc.communicate(timeout=30)
    wait_until(lambda: not marked_left(), 20, f"ranks outlived the study: {marked_left()}")


def quick_study(out, repeats, **kw):
    return subprocess.run(STUDY + ["run", "--kind", "strong", "--ranks", "1",
                                   "--repeats", str(repeats), "--seq-len", "500",
                                   "--heads-q", "4", "--heads-kv", "2", "--head-dim", "8",
                                   "--out", str(out)], capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.mark.launch
def test_a_cut_last_line_is_repaired_and_no_row_is_lost_or_glued(tmp_path):
    out = tmp_path / "s.csv"
    assert quick_study(out, 2).returncode == 0
    whole = out.read_text()
    first_two = rows(out)
    with open(out, "a") as f:                            # a kill in the middle of a row
        f.write(whole.splitlines()[-1][:40])
    again = quick_study(out, 3)
    assert again.returncode == 0, again.stderr
    assert "dropped a last line cut short" in again.stderr
    final = rows(out)
    assert final[:2] == first_two and len(final) == 3
    assert all(len(line.split(",")) >= 40 for line in out.read_text().splitlines())


@pytest.mark.launch
def test_garbage_rows_are_skipped_and_kept(tmp_path):
    out = tmp_path / "s.csv"
    assert quick_study(out, 1).returncode == 0
    text = out.read_text().splitlines()
    out.write_text("\n".join([text[0], "garbage,row", text[1]]) + "\n")
    again = quick_study(out, 2)
    assert again.returncode == 0, again.stderr
    assert "skipped 1 damaged row(s) (line(s) 2)" in again.stderr
    assert "garbage,row" in out.read_text()               # never deleted
    assert "1 already in" in again.stderr


@pytest.mark.launch
def test_a_damaged_header_is_refused_not_rerun(tmp_path):
    out = tmp_path / "s.csv"
    out.write_text("run_id,repeat,whatever\nx,0,1\n")
    before = out.read_text()
    proc = quick_study(out, 1)
    assert proc.returncode == 2 and "the header is not a gqa_mpi study's" in proc.stderr
    assert out.read_text() == before


@pytest.mark.parametrize("args,words", [
    (["--ranks", "0"], "at least 1"),
    (["--ranks", "two"], "expected rank counts"),
    (["--ranks", "1,-4"], "at least 1"),
    (["--repeats", "0"], "must be positive"),
    (["--out", "/tmp"], "is a directory"),
    (["--out", "/nonexistent/s.csv"], "does not exist"),
    (["--out", "/dev/null"], "character device"),
    (["--launcher", "no-such-launcher -n {n}"], "is not a command found on PATH"),
    (["--kind", "numerics", "--reduces", "mpi", "--wires", "fp32"], "no schedule of"),
    (["--kind", "reduce", "--wire", "fp32"], "--reduce mpi carries only --wire packed"),
    (["--kind", "tile", "--tiles", "64,x"], "not a list of tile values"),
    (["--heads-q", "5"], "--heads-q 5 is not a multiple"),
])
def test_bad_study_arguments_are_one_line(capsys, args, words):
    from gqa_mpi import study
    code = study.main(["run", *args])
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_summary_of_a_missing_file_is_one_line(capsys, tmp_path):
    from gqa_mpi import study
    assert study.main(["summary", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert "no such results file" in err and len(err.strip().splitlines()) == 1


@pytest.mark.launch
def test_numerics_study_and_its_plot(tmp_path):
    out = tmp_path / "num.csv"
    proc = subprocess.run(STUDY + ["run", "--kind", "numerics", "--ranks", "3", *TINY,
                                   "--repeats", "1", "--reduces", "chain,allgather",
                                   "--wires", "fp32,bf16", "--steps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = {(r["reduce_schedule"], r["wire"]): r for r in rows(out)}
    assert set(got) == {("chain", "fp32"), ("chain", "bf16"), ("allgather", "fp32")}
    assert all(r["steps"] == "2" and r["status"] == "ok" for r in got.values())
    assert float(got["chain", "fp32"]["max_rel_err"]) < 2e-6
    assert 1e-4 < float(got["chain", "bf16"]["max_rel_err"]) < 2e-2
    assert float(got["chain", "bf16"]["err_p50"]) < float(got["chain", "bf16"]["err_p99"])
    assert "max_rel_err" in proc.stdout                     # the error table
    blocked = subprocess.run(                    # without the study extra: one line
        [sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
         "from gqa_mpi.tools.study import cli; sys.exit(cli.main(['plot', sys.argv[1]]))",
         str(out)], capture_output=True, text=True, timeout=120)
    assert blocked.returncode != 0 and blocked.stderr.count("\n") == 1
    assert "matplotlib is missing" in blocked.stderr
    pytest.importorskip("matplotlib")
    plot = subprocess.run(STUDY + ["plot", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "num_numerics_error.png").stat().st_size > 10000


def test_the_key_is_every_option_that_can_change_a_result():
    """Two points that differ in any result-changing option are different runs, and a
    new Config field is in the key without being listed (issue: --kernel numpy then
    --kernel fused printed "0 to go")."""
    from dataclasses import fields, replace
    from gqa_mpi.config.config import Config
    from gqa_mpi.tools.study.plan import POINT_KEYS, Point
    base = Config(seq_len=4000)
    changed = dict(kernel="numpy", kv_dtype="float16", placement="round-robin", causal=True,
                   seed=5, softmax_scale=0.5, tile=256, wire="packed", reduce="mpi",
                   steps=2, check=False)
    ids = {Point("strong", 4, base).run_id}
    for name, value in changed.items():
        ids.add(Point("strong", 4, replace(base, **{name: value})).run_id)
    assert len(ids) == len(changed) + 1
    source = Config(seq_len=4000, kernel_source="k.py")
    modelled = replace(source, check_against="kernel-model")
    assert len(ids | {Point("strong", 4, c).run_id for c in (source, modelled)}) == len(ids) + 2
    shown = {f.name for f in fields(Config)} - {"output", "json", "trace", "trace_tiles",
                                                "quiet", "max_memory", "timeout", "reduce"}
    assert shown <= set(POINT_KEYS) and "reduce_schedule" in POINT_KEYS


def test_an_older_study_is_read_as_what_it_is(tmp_path):
    from gqa_mpi.tools.study.results import OLDER, read_results
    old = OLDER["before the full key"]
    path = tmp_path / "old.csv"
    row = {c: "" for c in old}
    row.update(run_id="x", repeat="0", status="ok", study="strong", ranks="2", steps="1",
               seq_len="2000", step_max="0.001")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old)
        w.writeheader()
        w.writerow(row)
    got = read_results(str(path))
    assert len(got) == 1 and got[0]["kernel"] == "" and got[0]["ranks"] == "2"
    from gqa_mpi.tools.study.plan import StudyError
    with pytest.raises(StudyError, match="older gqa_mpi"):
        read_results(str(path), repair=True)


def test_config_file_extra_and_numerics_wire_are_honoured(tmp_path):
    from gqa_mpi.tools.study.cli import settings
    cfg = tmp_path / "s.json"
    cfg.write_text('{"extra": "--no-check", "kind": "numerics"}')
    args, base = settings(dict(config=str(cfg), extra=[], wire="bf16", out=str(tmp_path / "o.csv")))
    assert args.extra == ["--no-check"] and args.wires == "bf16"


@pytest.mark.parametrize("damage", [dict(ranks="two"), dict(step_max="0"),
                                    dict(seq_len="1e400"), dict(step_max="nan"),
                                    dict(run_id="x\x00\x00"), dict(host="h\x00")])
def test_damaged_cells_are_damaged_rows_not_tracebacks(tmp_path, damage):
    from gqa_mpi.tools.study.results import COLUMNS, read_results
    path = tmp_path / "d.csv"
    row = {c: "" for c in COLUMNS}
    row.update(run_id="x", repeat="0", status="ok", study="strong", ranks="2",
               seq_len="2000", step_max="0.001", steps="1")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerow(row)
        w.writerow(dict(row, **damage))
    assert len(read_results(str(path))) == 1               # the damaged row is skipped


@pytest.mark.parametrize("content,words", [
    (b"\x00\x01\x02binary", "header is not a gqa_mpi study's"),
    (None, "not a regular file"),
])
@pytest.mark.parametrize("command", ["summary", "plot"])
def test_summary_and_plot_of_bad_files_are_one_line(tmp_path, capsys, content, words, command):
    from gqa_mpi.tools.study import cli
    path = tmp_path / "r.csv"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert cli.main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert cli.main([command, str(tmp_path / "nosuch.csv")]) == 2
    assert "no such results file" in capsys.readouterr().err


@pytest.mark.parametrize("text,words", [("[1, 2]", "top level must be a table"),
                                        ('{"timeout": true}', "--timeout must be positive"),
                                        ('{"placement": 7}', "--placement must be")])
def test_bad_config_files_are_one_line(tmp_path, capsys, text, words):
    from gqa_mpi.tools.study import cli
    path = tmp_path / "c.json"
    path.write_text(text)
    assert cli.main(["run", "--config", str(path), "--out", str(tmp_path / "o.csv")]) == 2
    assert words in capsys.readouterr().err


def test_a_numerics_study_without_its_check_is_refused(tmp_path, capsys):
    from gqa_mpi.tools.study import cli
    assert cli.main(["run", "--kind", "numerics", "--out", str(tmp_path / "n.csv"),
                     "--", "--no-check"]) == 2
    assert "drop --no-check" in capsys.readouterr().err


@pytest.mark.launch
def test_a_study_of_the_prediction_keeps_it_beside_the_measured_step_and_plots_it(tmp_path):
    out = tmp_path / "p.csv"
    proc = subprocess.run(STUDY + ["run", "--kind", "strong", "--ranks", "1,2", "--repeats", "1",
                                   "--seq-len", "2048", "--heads-q", "8", "--heads-kv", "1",
                                   "--head-dim", "16", "--kernel-source", "builtin:tree",
                                   "--predict", "example-npu", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = rows(out)
    assert all(float(r["predicted_step_s"]) > 0 and r["predict"] == "example-npu" for r in got)
    assert "predicted us" in proc.stdout
    pytest.importorskip("matplotlib")
    plotted = subprocess.run(STUDY + ["plot", str(out), "--out-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert plotted.returncode == 0 and (tmp_path / "p_strong_predicted.png").exists()


@pytest.mark.launch
@pytest.mark.parametrize("cores, want", [("2", "1,2"), ("12", "1,2,4,8"), ("64", "1,2,4,8,16")])
def test_the_local_study_takes_one_rank_per_core_by_default(tmp_path, cores, want):
    """launch/local.sh's rank counts stop at the machine's cores (its header says one
    rank per core); RANKS still overrides them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    (bin_dir / "python").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = Path(__file__).resolve().parent.parent / "launch" / "local.sh"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("RANKS", None)
    subprocess.run(["bash", str(script), str(tmp_path / "out")], env=env, check=True,
                   timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    runs = [c for c in calls if " run " in f" {c} "]
    assert len(runs) == 2 and all(f"--ranks {want} " in c for c in runs), calls
    env["RANKS"] = "1,32"
    (tmp_path / "calls").unlink()
    subprocess.run(["bash", str(script), str(tmp_path / "out")], env=env, check=True,
                   timeout=60)
    assert "--ranks 1,32 " in (tmp_path / "calls").read_text()


def test_the_progress_in_a_log_is_whole_lines_and_on_a_terminal_one_bar():
    import io
    from gqa_mpi.tools.study.runner import Progress
    log = io.StringIO()
    p = Progress(3, 0, stream=log)
    p.show("ranks=1")
    p.step()
    p.show("done")
    p.end()
    assert "\r" not in log.getvalue() and log.getvalue().count("\n") == 2
    assert log.getvalue().splitlines()[1].startswith("[########........") and "done" in log.getvalue()

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    tty = Terminal()
    p = Progress(3, 0, stream=tty)
    p.show("ranks=1")
    p.end()
    assert tty.getvalue().startswith("\r[") and tty.getvalue().endswith("\n")


def test_every_study_the_docs_show_still_reads():
    """The CSVs under docs/study were written by earlier gqa_mpis: each is read (and so
    summarised and plotted) as what it is, not refused as damaged."""
    from gqa_mpi.tools.study.results import medians, read_results
    csvs = sorted((Path(__file__).resolve().parent.parent / "docs" / "study").glob("*.csv"))
    assert len(csvs) >= 5
    for path in csvs:
        assert medians(read_results(str(path))), path


def test_plots_say_where_they_ran_and_keep_their_axes_honest(tmp_path):
    """Every plot names its hosts, ranks per core and gqa_mpi's commit; the step's
    repeats give error bars (fastest and slowest); a docs study plots as it is."""
    pytest.importorskip("matplotlib")
    from gqa_mpi.tools.study import plots
    from gqa_mpi.tools.study.results import medians, read_results
    docs = Path(__file__).resolve().parent.parent / "docs" / "study"
    pts = medians(read_results(str(docs / "strong.csv")))
    assert all(p["step_lo"] <= p["step"] <= p["step_hi"] for p in pts)
    assert plots._footer(pts, 0.0) == ("host vm; ranks per core not recorded; "
                                       "commit not recorded")
    mine = [dict(host="a,b", commit="0.2.0 abc1234", ranks=16, ranks_per_core=8.0),
            dict(host="a", commit="0.2.0 abc1234", ranks=2, ranks_per_core=1.0)]
    assert plots._footer(mine, 8.0) == ("host a, b (2 cores); up to 8 ranks per core; "
                                        "gqa_mpi 0.2.0 abc1234")
    written = plots.plot(str(docs / "strong.csv"), str(tmp_path))
    assert len(written) == 4 and all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in written)
