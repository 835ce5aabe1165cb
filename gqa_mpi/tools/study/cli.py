"""``python -m gqa_mpi.study``: scaling studies, one real launch per point, resumable.

A study is a list of points; each point is one ``mpirun`` (or ``srun``, or your own
launcher) of ``python -m gqa_mpi --json ...``, repeated ``--repeats`` times. Every
finished run is appended to one CSV at once (flushed and synced), so a killed study
keeps every finished run, and the same command run again skips them and continues.
A per-run timeout stops one hung launch from stalling the study.

Kinds of study:

=======  ========================================================================
strong   fixed S_kv (``--seq-len``), ranks from ``--ranks`` (1,2,4,8,16 by default)
weak     fixed tokens per rank (``--tokens-per-rank``), S_kv = that x ranks
tile     one rank count, tile widths from ``--tiles``
wire     one rank count, wire formats from ``--wires``
reduce   one rank count, reduction schedules from ``--reduces``
grid     one rank count, PE grids from ``--grids`` (e.g. 2x4,1x8,4x2)
=======  ========================================================================

The same options can come from a TOML or JSON file (``--config``), keys spelled as
the options (``seq-len`` or ``seq_len``); the command line wins. ``plot`` draws PNGs
from a results CSV (needs matplotlib: ``pip install -e ".[study]"``).
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, Iterable, List, Optional

from .launcher import mpirun_command, plain
from .outputs import Interrupted, check_paths
from .report import PHASES

KINDS = ("strong", "weak", "tile", "wire", "reduce", "grid")
POINT_KEYS = ("study", "ranks", "cubes", "pes", "grid", "seq_len", "tokens_per_rank",
              "heads_q", "heads_kv", "head_dim", "queries", "batch", "tile", "wire",
              "reduce_schedule", "extra")
COLUMNS = (("run_id", "repeat", "status") + POINT_KEYS
           + tuple(f"{p}_{s}" for p in PHASES for s in ("min", "median", "max"))
           + ("messages", "bytes", "peak_rss_max_mib", "max_rel_err", "passed",
              "wall_s", "finished_at", "host", "error"))


# ---------------------------------------------------------------- the plan

def _ints(text) -> List[int]:
    if isinstance(text, (list, tuple)):
        return [int(x) for x in text]
    return [int(x) for x in str(text).split(",") if x.strip()]


def _words(text) -> List[str]:
    if isinstance(text, (list, tuple)):
        return [str(x) for x in text]
    return [x.strip() for x in str(text).split(",") if x.strip()]


def plan(args) -> List[Dict]:
    """The study's points, in run order (without repeats)."""
    base = dict(study=args.kind, heads_q=args.heads_q, heads_kv=args.heads_kv,
                head_dim=args.head_dim, queries=args.queries, batch=args.batch,
                tile=args.tile, wire=args.wire, reduce_schedule=args.reduce,
                grid=args.grid, extra=" ".join(args.extra))
    points = []
    if args.kind in ("strong", "weak"):
        for n in _ints(args.ranks):
            seq = args.seq_len if args.kind == "strong" else args.tokens_per_rank * n
            points.append(dict(base, ranks=n, seq_len=seq))
    else:
        n = _ints(args.ranks)[-1]
        field, values = {"tile": ("tile", _ints(args.tiles)),
                         "wire": ("wire", _words(args.wires)),
                         "reduce": ("reduce_schedule", _words(args.reduces)),
                         "grid": ("grid", _words(args.grids))}[args.kind]
        for value in values:
            points.append(dict(base, ranks=n, seq_len=args.seq_len, **{field: value}))
    for p in points:
        p["tokens_per_rank"] = p["seq_len"] // p["ranks"]
        p["cubes"], p["pes"] = "", ""
    return points


def run_id(point: Dict) -> str:
    """A stable name of a point: what makes two runs the same experiment."""
    keys = ("study", "ranks", "grid", "seq_len", "heads_q", "heads_kv", "head_dim",
            "queries", "batch", "tile", "wire", "reduce_schedule", "extra")
    return "|".join(f"{k}={point[k]}" for k in keys)


def gqa_args(point: Dict, json_path: str) -> List[str]:
    args = ["--seq-len", point["seq_len"], "--heads-q", point["heads_q"],
            "--heads-kv", point["heads_kv"], "--head-dim", point["head_dim"],
            "--queries", point["queries"], "--tile", point["tile"], "--wire", point["wire"],
            "--reduce", point["reduce_schedule"], "--grid", point["grid"],
            "--json", json_path, "--quiet"]
    if point["batch"] > 1:
        args += ["--batch", point["batch"]]
    return [str(a) for a in args] + shlex.split(point["extra"])


def launch_command(launcher: Optional[str], n: int, argv: List[str]) -> List[str]:
    """``mpirun -n N python -m gqa_mpi ...`` or the user's template with ``{n}``."""
    tail = [sys.executable, "-m", "gqa_mpi", *argv]
    if not launcher:
        return mpirun_command(n, tail)
    return shlex.split(launcher.replace("{n}", str(n))) + tail


# ---------------------------------------------------------------- results file

class StudyError(Exception):
    """A study that cannot go on as asked: printed as one line, exit 2."""


STATUSES = ("ok", "check_failed", "failed", "timeout")


def _row_ok(row: Dict) -> bool:
    """A whole row: every column present, a known status, a numeric repeat."""
    if None in row or any(v is None for v in row.values()):
        return False
    return row["status"] in STATUSES and row["repeat"].isdigit() and bool(row["run_id"])


def read_results(path: str, repair: bool = False) -> List[Dict]:
    """The finished runs of a results CSV.

    A damaged header is refused (rather than rerunning everything into a file that
    holds results). A last line cut short by a kill is dropped, and with ``repair`` cut
    off the file, so the next row does not glue onto it; other garbage rows are skipped
    with a warning (their runs are redone), never deleted.
    """
    if not os.path.exists(path):
        return []
    if not os.path.isfile(path):
        raise StudyError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        return []
    lines = data.split(b"\n")
    cut = lines[-1] != b""            # no newline at the end: a row cut by a kill
    text = data.decode("utf-8", errors="replace")
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header != list(COLUMNS):
        raise StudyError(f"{path}: the header is not a gqa_mpi study's (damaged, or another "
                         f"file, or an older version); move it away or choose another --out")
    rows, garbage = [], []
    for n, fields in enumerate(reader, start=2):
        row = dict(zip(COLUMNS, fields)) if len(fields) == len(COLUMNS) else {None: fields}
        if _row_ok(row) and not (cut and n == len(lines)):
            rows.append(row)
        elif not (cut and n == len(lines)):
            garbage.append(n)
    if garbage:
        sys.stderr.write(f"gqa_mpi.study: {path}: skipped {len(garbage)} damaged row(s) "
                         f"(line(s) {', '.join(map(str, garbage[:10]))}); their runs are "
                         f"redone\n")
    if cut and repair:
        keep = len(data) - len(lines[-1])
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        sys.stderr.write(f"gqa_mpi.study: {path}: dropped a last line cut short "
                         f"({len(lines[-1])} bytes); every whole row is kept\n")
    return rows


def append_row(path: str, row: Dict) -> None:
    """Append one run and make it durable before the next run starts."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)
        f.flush()
        os.fsync(f.fileno())


def row_from_record(point: Dict, repeat: int, rec: Dict, wall: float) -> Dict:
    row = dict(point, run_id=run_id(point), repeat=repeat, status="ok", wall_s=wall,
               finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"), host=os.uname().nodename,
               error="")
    row["cubes"], row["pes"] = rec["config"]["cubes"], rec["config"]["pes"]
    for phase in PHASES:
        for stat in ("min", "median", "max"):
            row[f"{phase}_{stat}"] = rec["timings"].get(phase, {}).get(stat, "")
    row["messages"], row["bytes"] = rec["messages"]["count"], rec["messages"]["bytes"]
    row["peak_rss_max_mib"] = rec["memory"]["peak_rss_mib"]["max"]
    check = rec.get("check") or {}
    row["max_rel_err"] = check.get("max_rel_err", "")
    row["passed"] = check.get("passed", "")
    return row


# ---------------------------------------------------------------- running

def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """A one-line progress bar on stderr: runs done, elapsed, time left."""

    def __init__(self, total: int, done: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, done, stream
        self.start, self.new = time.monotonic(), 0

    def show(self, what: str) -> None:
        elapsed = time.monotonic() - self.start
        left = "?" if not self.new else _fmt(elapsed / self.new * (self.total - self.done))
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/"
                          f"{self.total} elapsed {_fmt(elapsed)} left ~{left}  {what[:60]:<60}")
        self.stream.flush()

    def step(self) -> None:
        self.done += 1
        self.new += 1


def _die_with_parent() -> None:
    """In the launch's process: get SIGTERM when the study dies, even by kill -9, so
    that no launch runs on forever without it (Linux; elsewhere a no-op)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _end(proc: subprocess.Popen) -> None:
    """End a launch and every rank under it: SIGTERM, then SIGKILL after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _record_prefix(out: str) -> str:
    """Where the launches of a study write their run records: beside its CSV, hidden."""
    directory, name = os.path.split(os.path.abspath(out))
    return os.path.join(directory, f".{name}.run-")


def run_point(point: Dict, repeat: int, launcher: Optional[str], timeout: float,
              out: str) -> Dict:
    """One launch of one point; a row for the CSV whatever happened."""
    json_path = f"{_record_prefix(out)}{os.getpid()}-{time.time_ns()}.json"
    cmd = launch_command(launcher, point["ranks"], gqa_args(point, json_path))
    row = dict(point, run_id=run_id(point), repeat=repeat,
               finished_at="", host=os.uname().nodename)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(proc)
        return dict(row, status="timeout", wall_s=time.monotonic() - t0,
                    error=f"no result after {timeout:g} s")
    except BaseException:       # SIGTERM/SIGINT to the study: end the launch, record nothing
        _end(proc)
        if os.path.exists(json_path):
            os.unlink(json_path)
        raise
    wall = time.monotonic() - t0
    try:
        if proc.returncode not in (0, 1) or not os.path.exists(json_path):
            last = [s for s in err.splitlines() if s.strip()][-1:] or [f"exit {proc.returncode}"]
            return dict(row, status="failed", wall_s=wall, error=last[0][:300])
        with open(json_path) as f:
            rec = json.load(f)
        out = row_from_record(point, repeat, rec, wall)
        if proc.returncode == 1:
            out.update(status="check_failed")
        return out
    finally:
        if os.path.exists(json_path):
            os.unlink(json_path)


def run_study(args) -> int:
    points = plan(args)
    runs = [(p, r) for p in points for r in range(args.repeats)]
    done = {(r["run_id"], int(r["repeat"])) for r in read_results(args.out, repair=True)
            if r["status"] == "ok"}
    for stale in glob.glob(glob.escape(_record_prefix(args.out)) + "*.json"):
        os.unlink(stale)          # left by a study of this CSV killed with -9
    todo = [(p, r) for p, r in runs if (run_id(p), r) not in done]
    print(f"study {args.kind}: {len(points)} point(s) x {args.repeats} repeat(s) = "
          f"{len(runs)} run(s); {len(runs) - len(todo)} already in {args.out}, "
          f"{len(todo)} to go", file=sys.stderr)
    progress = Progress(len(runs), len(runs) - len(todo))
    failures = 0

    def interrupted(signum, frame):
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupted)
    for point, repeat in todo:
        progress.show(f"ranks={point['ranks']} S_kv={point['seq_len']} "
                      f"{args.kind} repeat {repeat + 1}")
        row = run_point(point, repeat, args.launcher, args.timeout, args.out)
        blocked = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)   # a row is written whole
        try:
            append_row(args.out, row)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        failures += row["status"] != "ok"
        progress.step()
        if row["status"] != "ok":
            sys.stderr.write(f"\n  {row['status']}: ranks={point['ranks']} "
                             f"{row.get('error', '')}\n")
    progress.show("done")
    sys.stderr.write("\n")
    summarise(read_results(args.out), sys.stdout)
    return 1 if failures else 0


# ---------------------------------------------------------------- summary and plots

def medians(rows: Iterable[Dict]) -> List[Dict]:
    """One entry per point: medians over the repeats of each timing."""
    import statistics
    groups: Dict[str, List[Dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault(r["run_id"], []).append(r)
    out = []
    for rid, rs in groups.items():
        m = dict(rs[0])
        for phase in PHASES:
            vals = [float(r[f"{phase}_max"]) for r in rs if r.get(f"{phase}_max")]
            m[phase] = statistics.median(vals) if vals else float("nan")
        for key in ("ranks", "seq_len", "tile"):
            m[key] = int(m[key])
        m["repeats"] = len(rs)
        out.append(m)
    return sorted(out, key=lambda m: (m["study"], m["ranks"], str(m["tile"]), m["wire"],
                                      m["reduce_schedule"], m["grid"]))


def scaling(points: List[Dict]) -> List[Dict]:
    """Speed-up and parallel efficiency of the step time against the fewest ranks."""
    for kind in ("strong", "weak"):
        pts = [p for p in points if p["study"] == kind]
        if not pts:
            continue
        ref = min(pts, key=lambda p: p["ranks"])
        for p in pts:
            ratio = p["ranks"] / ref["ranks"]
            if kind == "strong":
                p["efficiency"] = ref["step"] / (ratio * p["step"])
            else:
                p["efficiency"] = ref["step"] / p["step"]
            p["tokens_per_s"] = p["seq_len"] / p["step"]
    return points


def summarise(rows: List[Dict], stream) -> None:
    """Medians per point. ``step`` is the decode step of the slowest rank (local
    attention + reduction + finalize), ``local`` the slowest local sweep, and
    ``beyond`` their difference: what the reduction costs on top of the local work."""
    points = scaling(medians(rows))
    if not points:
        return
    stream.write(f"{'study':>6} {'ranks':>5} {'S_kv':>9} {'tile':>5} {'wire':>6} "
                 f"{'reduce':>6} {'grid':>4} {'step ms':>9} {'local ms':>9} "
                 f"{'beyond ms':>9} {'eff':>5} {'n':>2}\n")
    for p in points:
        eff = p.get("efficiency")
        stream.write(f"{p['study']:>6} {p['ranks']:>5} {p['seq_len']:>9} {p['tile']:>5} "
                     f"{p['wire']:>6} {p['reduce_schedule']:>6} {p['grid']:>4} "
                     f"{p['step'] * 1e3:>9.2f} {p['local_attention'] * 1e3:>9.2f} "
                     f"{(p['step'] - p['local_attention']) * 1e3:>9.2f} "
                     f"{'' if eff is None else f'{eff:.2f}':>5} {p['repeats']:>2}\n")


def plot(csv_path: str, out_dir: str) -> List[str]:
    """Draw the study's PNGs next to each other in ``out_dir``; return their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("gqa_mpi.study plot: matplotlib is missing; "
                         "pip install -e \".[study]\"")
    points = scaling(medians(read_results(csv_path)))
    if not points:
        raise SystemExit(f"gqa_mpi.study plot: no finished runs in {csv_path}")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    stem = os.path.splitext(os.path.basename(csv_path))[0]

    def save(fig, name):
        # named after the CSV too, so two studies plotted into one folder both survive
        kind = name.split("_")[0]
        path = os.path.join(out_dir, name if stem == kind else f"{stem}_{name}")
        fig.tight_layout()
        tmp = path + ".tmp.png"
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
        plt.close(fig)
        written.append(path)

    for kind in ("strong", "weak"):
        pts = sorted((p for p in points if p["study"] == kind), key=lambda p: p["ranks"])
        if not pts:
            continue
        n = [p["ranks"] for p in pts]
        step = [p["step"] * 1e3 for p in pts]
        title = (f"{kind} scaling: S_kv = {pts[0]['seq_len']}" if kind == "strong" else
                 f"weak scaling: {pts[0]['tokens_per_rank']} tokens per rank")
        title += f", h_kv={pts[0]['heads_kv']}, d={pts[0]['head_dim']}"

        fig, ax = plt.subplots(figsize=(6, 4.2))
        ax.plot(n, step, "o-", label="measured (median of max over ranks)")
        ideal = ([step[0] * n[0] / x for x in n] if kind == "strong" else [step[0]] * len(n))
        ax.plot(n, ideal, "--", color="gray", label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log" if kind == "strong" else "linear")
        ax.set_xticks(n, [str(x) for x in n])
        ax.set_xlabel("MPI ranks (one PE each)")
        ax.set_ylabel("step time, ms (local attention + reduction)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, f"{kind}_time.png")

        fig, ax = plt.subplots(figsize=(6, 4.2))
        ax.plot(n, [p["efficiency"] for p in pts], "o-")
        ax.axhline(1.0, ls="--", color="gray")
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.set_ylim(0, max(1.15, 1.05 * max(p["efficiency"] for p in pts)))
        ax.set_xlabel("MPI ranks")
        ax.set_ylabel("parallel efficiency")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        save(fig, f"{kind}_efficiency.png")

        fig, ax = plt.subplots(figsize=(6, 4.2))
        local = [p["local_attention"] * 1e3 for p in pts]
        beyond = [max(p["step"] * 1e3 - lo, 0.0) for p, lo in zip(pts, local)]
        x = range(len(n))
        ax.bar(x, local, label="local attention (slowest rank)")
        ax.bar(x, beyond, bottom=local,
               label="reduction and waiting beyond it (step - slowest local)")
        ax.set_xticks(list(x), [str(v) for v in n])
        ax.set_xlabel("MPI ranks")
        ax.set_ylabel("ms (median over repeats)")
        ax.set_title(title + ": breakdown", fontsize=9)
        ax.legend(fontsize=8)
        save(fig, f"{kind}_breakdown.png")

        fig, ax = plt.subplots(figsize=(6, 4.2))
        ax.plot(n, [p["tokens_per_s"] / 1e6 for p in pts], "o-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(v) for v in n])
        ax.set_xlabel("MPI ranks")
        ax.set_ylabel("KV tokens per second (millions)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        save(fig, f"{kind}_throughput.png")

    for kind, field in (("tile", "tile"), ("wire", "wire"), ("reduce", "reduce_schedule"),
                        ("grid", "grid")):
        pts = [p for p in points if p["study"] == kind]
        if not pts:
            continue
        if kind == "tile":                  # 256 before 1024, whatever order was asked
            pts.sort(key=lambda p: int(p["tile"]))
        fig, ax = plt.subplots(figsize=(6, 4.2))
        labels = [str(p[field]) for p in pts]
        local = [p["local_attention"] * 1e3 for p in pts]
        beyond = [max(p["step"] * 1e3 - lo, 0.0) for p, lo in zip(pts, local)]
        ax.bar(labels, local, label="local attention (slowest rank)")
        ax.bar(labels, beyond, bottom=local, label="reduction beyond it")
        ax.set_xlabel(field)
        ax.set_ylabel("ms (median of max over ranks)")
        ax.set_title(f"{kind} sweep at {pts[0]['ranks']} ranks, S_kv = {pts[0]['seq_len']}",
                     fontsize=9)
        ax.legend(fontsize=8)
        save(fig, f"{kind}_sweep.png")
    return written


# ---------------------------------------------------------------- command line

DEFAULTS = dict(kind="strong", ranks="1,2,4,8,16", seq_len=65536, tokens_per_rank=8192,
                heads_q=32, heads_kv=8, head_dim=128, queries=1, batch=1, tile=1024,
                wire="fp32", reduce="chain", grid="2x4", tiles="256,512,1024,2048,4096",
                wires="fp32,kernel,packed", reduces="chain,tree,mpi",
                grids="2x4,1x8,4x2,8x1", repeats=3, timeout=600.0,
                out="study.csv", launcher=None)


def _load_config(path: str) -> Dict:
    with open(path, "rb") as f:
        if path.endswith(".json"):
            data = json.load(f)
        else:
            try:
                import tomllib
            except ImportError:  # Python < 3.11
                raise SystemExit(f"{path}: TOML needs Python 3.11+; use a .json file")
            data = tomllib.load(f)
    unknown = {k.replace("-", "_") for k in data} - set(DEFAULTS) - {"extra"}
    if unknown:
        raise SystemExit(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    return {k.replace("-", "_"): v for k, v in data.items()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gqa_mpi.study", description=plain(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run (or resume) a study",
                       description="Run or resume a study; options default from "
                                   "--config, then from the values shown.")
    r.add_argument("--config", help="TOML or JSON file with any of the options below")
    r.add_argument("--kind", choices=KINDS, help="strong (default), weak, tile, wire, "
                   "reduce or grid")
    r.add_argument("--ranks", help="rank counts, e.g. 1,2,4,8,16 (sweeps use the last)")
    r.add_argument("--seq-len", type=int, help="S_kv of strong scaling and sweeps (65536)")
    r.add_argument("--tokens-per-rank", type=int, help="weak scaling: S_kv / ranks (8192)")
    for name, kind in (("heads-q", int), ("heads-kv", int), ("head-dim", int),
                       ("queries", int), ("batch", int), ("tile", int)):
        r.add_argument(f"--{name}", type=kind, help=f"passed to gqa_mpi (default "
                       f"{DEFAULTS[name.replace('-', '_')]})")
    r.add_argument("--wire", help="passed to gqa_mpi (fp32)")
    r.add_argument("--reduce", help="passed to gqa_mpi (chain)")
    r.add_argument("--grid", help="passed to gqa_mpi (2x4)")
    r.add_argument("--tiles", help="tile sweep values")
    r.add_argument("--wires", help="wire sweep values")
    r.add_argument("--reduces", help="reduction sweep values")
    r.add_argument("--grids", help="grid sweep values")
    r.add_argument("--repeats", type=int, help="runs per point; medians are reported (3)")
    r.add_argument("--timeout", type=float, help="seconds before a run is killed (600)")
    r.add_argument("--out", help="results CSV, appended to and resumed from (study.csv)")
    r.add_argument("--launcher", help="launch template with {n} for the rank count, e.g. "
                   "'srun -n {n} --mpi=pmi2' or 'mpiexec -f hosts -n {n}' "
                   "(default: mpirun -n {n} from this environment)")
    r.add_argument("extra", nargs="*", help="after --: more gqa_mpi options, e.g. -- --causal")
    pl = sub.add_parser("plot", help="draw PNGs from a results CSV")
    pl.add_argument("csv")
    pl.add_argument("--out-dir", default=None, help="where the PNGs go (default: beside the CSV)")
    s = sub.add_parser("summary", help="print the medians of a results CSV")
    s.add_argument("csv")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "plot":
        out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.csv))
        for path in plot(args.csv, out_dir):
            print(path)
        return 0
    if args.command == "summary":
        if not os.path.isfile(args.csv):
            print(f"gqa_mpi.study: error: {args.csv}: no such results file", file=sys.stderr)
            return 2
        try:
            summarise(read_results(args.csv), sys.stdout)
        except StudyError as e:
            print(f"gqa_mpi.study: error: {e}", file=sys.stderr)
            return 2
        return 0
    values = dict(DEFAULTS)
    if args.config:
        values.update(_load_config(args.config))
    for key, value in vars(args).items():
        if key in DEFAULTS and value is not None:
            values[key] = value
    extra = args.extra or values.get("extra", [])
    merged = argparse.Namespace(**values)
    merged.extra = shlex.split(extra) if isinstance(extra, str) else list(extra)
    try:
        check_study_args(merged)
        return run_study(merged)
    except StudyError as e:
        print(f"gqa_mpi.study: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"\ngqa_mpi.study: interrupted by {e}: the launch in flight was ended and "
              f"not recorded; finished runs are in {merged.out}, run the same command to "
              f"resume", file=sys.stderr)
        return 128 + e.signum


def check_study_args(args) -> None:
    """Raise StudyError (one line) for arguments that cannot make a study."""
    try:
        ranks = _ints(args.ranks)
    except ValueError:
        raise StudyError(f"--ranks {args.ranks!r}: expected rank counts such as 1,2,4,8,16")
    if not ranks or min(ranks) < 1:
        raise StudyError(f"--ranks {args.ranks!r}: every rank count must be at least 1")
    if args.repeats < 1 or not (args.timeout > 0 and args.timeout < float("inf")):
        raise StudyError("--repeats and --timeout must be positive")
    why = check_paths({"--out": args.out})
    if why:
        raise StudyError(why)
    launcher = shlex.split(args.launcher.replace("{n}", "1")) if args.launcher else None
    if launcher and not shutil.which(launcher[0]):
        raise StudyError(f"--launcher: {launcher[0]!r} is not a command found on PATH")
    if not launcher:
        try:
            mpirun_command(1, [])
        except FileNotFoundError as e:
            raise StudyError(str(e))


if __name__ == "__main__":
    raise SystemExit(main())
