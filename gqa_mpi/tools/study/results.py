"""A study's results file: one CSV row per finished launch, appended and synced at
once; read back whole, repaired after a kill, and summarised (medians, scaling)."""
from __future__ import annotations

import csv
import functools
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, Iterable, List

from ...app.record import PHASES, RunRecord
from .plan import POINT_KEYS, Point, StudyError

PREDICTED = ("predicted_step_s", "predicted_last_pe", "predicted_memory_s", "predicted_dot_s",
             "predicted_vector_s", "predicted_send_s", "predicted_wait_s")
"""With ``--predict``: the predicted step and its last PE's split (empty otherwise)."""
_BEFORE_CORES = (tuple(f"{p}_{s}" for p in PHASES for s in ("min", "median", "max"))
            + ("messages", "bytes", "peak_rss_max_mib", "max_rel_err", "passed",
               "wall_s", "finished_at", "host", "error", "err_p50", "err_p99",
               "control_rel_err")
            + PREDICTED)
MEASURED = _BEFORE_CORES + ("ranks_per_core", "commit")
"""What a launch measured; ``ranks_per_core``: the most ranks any of its hosts ran per
core (above 1 its times are of shared cores, not of one rank on a core); ``commit``: the
gqa_mpi that ran it (its version, and its git commit where it is a checkout)."""

COLUMNS = ("run_id", "repeat", "status") + POINT_KEYS + MEASURED
"""The CSV's columns: the run, the point (:data:`~.plan.POINT_KEYS`), what it measured."""
STATUSES = ("ok", "check_failed", "failed", "timeout")

_OLD_POINT = ("study", "ranks", "cubes", "pes", "grid", "seq_len", "tokens_per_rank",
              "heads_q", "heads_kv", "head_dim", "queries", "batch", "tile", "wire",
              "reduce_schedule", "steps", "extra")
_OLD_MEASURED = (tuple(f"{p}_{s}" for p in ("inputs", "local_attention", "reduce", "finalize",
                                             "step", "total")
                       for s in ("min", "median", "max"))
                 + ("messages", "bytes", "peak_rss_max_mib", "max_rel_err", "passed", "wall_s",
                    "finished_at", "host", "error", "err_p50", "err_p99", "control_rel_err"))
OLDER = {
    "before the decode loop": ("run_id", "repeat", "status")
    + tuple(c for c in _OLD_POINT + _OLD_MEASURED
            if c not in ("steps", "err_p50", "err_p99", "control_rel_err")),
    "before the full key": ("run_id", "repeat", "status") + _OLD_POINT + _OLD_MEASURED,
    "before ranks per core": ("run_id", "repeat", "status") + POINT_KEYS + _BEFORE_CORES,
    "before the one pipeline": ('run_id', 'repeat', 'status', 'study', 'ranks', 'tokens_per_rank', 'cubes', 'pes', 'grid', 'split', 'placement', 'seq_len', 'heads_q', 'heads_kv', 'head_dim', 'queries', 'steps', 'batch', 'softmax_scale', 'causal', 'seed', 'inputs', 'allow_nonfinite', 'tile', 'kernel', 'kv_dtype', 'reduce_schedule', 'wire', 'kernel_faithful', 'kernel_source', 'check', 'check_every', 'extra', 'inputs_min', 'inputs_median', 'inputs_max', 'local_attention_min', 'local_attention_median', 'local_attention_max', 'reduce_min', 'reduce_median', 'reduce_max', 'finalize_min', 'finalize_median', 'finalize_max', 'step_min', 'step_median', 'step_max', 'total_min', 'total_median', 'total_max', 'check_min', 'check_median', 'check_max', 'messages', 'bytes', 'peak_rss_max_mib', 'max_rel_err', 'passed', 'wall_s', 'finished_at', 'host', 'error', 'err_p50', 'err_p99', 'control_rel_err'),
}
"""Headers of studies written by earlier versions. Their rows are read as what they
are: a column they lack is empty (unknown), ``steps`` is 1 where there was none; their
run ids are not today's, so a resumed study runs those points again."""


COUNTS = ("repeat", "ranks", "seq_len", "tokens_per_rank", "heads_q", "heads_kv",
          "head_dim", "queries", "batch", "tile", "steps")
"""Columns that hold counts (whole numbers; all but ``repeat`` and ``tokens_per_rank``
at least 1)."""


def _row_ok(row: Dict) -> bool:
    """A whole row whose cells can be what they say: every column present, a known
    status, counts that are counts, and for a finished run finite, non-negative times
    with a positive step. A row that fails is damaged: skipped, and its run redone."""
    if None in row or any(v is None or "\x00" in v for v in row.values()):
        return False                     # cut short, or NUL bytes from a torn write
    if row["status"] not in STATUSES or not row["run_id"]:
        return False
    for key in COUNTS:
        value = row.get(key, "")
        if key in ("repeat", "ranks", "seq_len") or value != "":
            low = 0 if key in ("repeat", "tokens_per_rank") else 1
            if not (value.isdigit() and int(value) >= low):
                return False
    if row["status"] == "ok":
        for key in (k for k in MEASURED if k.endswith(("_min", "_median", "_max"))):
            if row[key] == "":
                continue
            try:
                value = float(row[key])
            except ValueError:
                return False
            if not (math.isfinite(value) and value >= 0):
                return False
        try:
            return float(row["step_max"]) > 0
        except ValueError:
            return False
    return True


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
    text = data.decode("utf-8-sig", errors="replace")   # a spreadsheet may add a BOM
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    older = next((name for name, cols in OLDER.items() if header == list(cols)), None)
    columns = COLUMNS if header == list(COLUMNS) else OLDER.get(older)
    if columns is None:
        raise StudyError(f"{path}: the header is not a gqa_mpi study's (damaged, or another "
                         f"file)" + ("; move it away or choose another --out" if repair
                                    else ""))
    if older and repair:
        raise StudyError(f"{path}: written by an older gqa_mpi ({older}); summary and plot "
                         f"still read it, but new runs need another --out")
    rows, garbage = [], []
    for n, fields in enumerate(reader, start=2):
        row = dict(zip(columns, fields)) if len(fields) == len(columns) else {None: fields}
        if older and None not in row:
            row = dict(dict.fromkeys(COLUMNS, ""), **row)
            row["steps"] = row["steps"] or "1"
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


def row_from_record(point: Point, repeat: int, rec: RunRecord, wall: float) -> Dict:
    """The CSV row of one finished launch, from its run record."""
    row = dict(point.columns(), run_id=point.run_id, repeat=repeat, status="ok",
               wall_s=wall, finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
               host=",".join(rec.hosts), error="")
    row["cubes"], row["pes"] = rec.config.cubes, rec.config.pes
    timings = rec.timings()
    for phase in PHASES:
        for stat in ("min", "median", "max"):
            row[f"{phase}_{stat}"] = timings.get(phase, {}).get(stat, "")
    row["messages"], row["bytes"] = rec.messages, rec.bytes
    row["peak_rss_max_mib"] = rec.peak_rss_mib["max"]
    row["ranks_per_core"] = rec.ranks_per_core or ""
    row["commit"] = commit()
    check = rec.check
    for key in ("max_rel_err", "passed", "err_p50", "err_p99", "control_rel_err"):
        value = None if check is None else getattr(check, key)
        row[key] = "" if value is None else value
    p = rec.predicted
    if p is not None and "error" not in p:
        last = next(pe for pe in p["pes"] if pe["rank"] == p["last_pe"])
        row.update(predicted_step_s=p["step_s"], predicted_last_pe=p["last_pe"],
                   **{f"predicted_{k}": last[k] for k in ("memory_s", "dot_s", "vector_s",
                                                           "send_s", "wait_s")})
    return row


@functools.lru_cache(maxsize=None)
def commit() -> str:
    """This gqa_mpi: its version, and its git commit where it runs from a checkout."""
    from ... import __version__
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        sha = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__} {sha}".strip()


def medians(rows: Iterable[Dict]) -> List[Dict]:
    """One entry per point: medians over the repeats of each timing (and, as
    ``PHASE_lo`` and ``PHASE_hi``, the fastest and slowest repeat)."""
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
            m[f"{phase}_lo"] = min(vals, default=float("nan"))
            m[f"{phase}_hi"] = max(vals, default=float("nan"))
        for key in PREDICTED[2:] + ("predicted_step_s",):   # the replay is deterministic
            m[key] = float(rs[0][key]) if rs[0].get(key) else None
        for key in ("ranks", "seq_len", "tile"):
            m[key] = int(m[key])
        m["repeats"] = len(rs)
        for key in ("max_rel_err", "err_p50", "err_p99", "control_rel_err"):
            m[key] = f"{float(m[key]):.3g}" if m.get(key) not in (None, "") else "-"
        out.append(m)
    return sorted(out, key=lambda m: (m["study"], m["ranks"], str(m["tile"]), m["wire"],
                                      m["reduce_schedule"], m["grid"]))


def scaling(points: List[Dict]) -> List[Dict]:
    """Speed-up and parallel efficiency of the step time against the fewest ranks."""
    for kind, source in {(p["study"], p.get("kernel_source", "")) for p in points}:
        if kind not in ("strong", "weak"):
            continue
        pts = [p for p in points if p["study"] == kind
               and p.get("kernel_source", "") == source]       # each kernel against itself
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
    errors = [p for p in points if p["study"] == "numerics"]
    points = [p for p in points if p["study"] != "numerics"]
    if errors:
        stream.write(f"{'ranks':>5} {'reduce':>15} {'wire':>6} {'max_rel_err':>11} "
                     f"{'p99':>9} {'p50':>9} {'float32 control':>15}\n")
        for p in errors:
            stream.write(f"{p['ranks']:>5} {p['reduce_schedule']:>15} {p['wire']:>6} "
                         + " ".join(f"{p[k]:>{w}}" for k, w in (
                             ("max_rel_err", 11), ("err_p99", 9), ("err_p50", 9),
                             ("control_rel_err", 15))) + "\n")
    if not points:
        return
    predicted = any(p.get("predicted_step_s") for p in points)
    kernels = len({p.get("kernel_source", "") for p in points}) > 1
    stream.write(f"{'study':>6} {'ranks':>5} {'S_kv':>9} {'tile':>5} {'wire':>6} "
                 f"{'reduce':>15} {'grid':>4} {'steps':>5} {'step ms':>9} {'local ms':>9} "
                 f"{'beyond ms':>9} {'eff':>5} {'n':>2}"
                 + (f" {'predicted us':>12}" if predicted else "")
                 + ("  kernel" if kernels else "") + "\n")
    for p in points:
        eff = p.get("efficiency")
        stream.write(f"{p['study']:>6} {p['ranks']:>5} {p['seq_len']:>9} {p['tile']:>5} "
                     f"{p['wire']:>6} {p['reduce_schedule']:>15} {p['grid']:>4} "
                     f"{p['steps']:>5} "
                     f"{p['step'] * 1e3:>9.2f} {p['local_attention'] * 1e3:>9.2f} "
                     f"{(p['step'] - p['local_attention']) * 1e3:>9.2f} "
                     f"{'' if eff is None else f'{eff:.2f}':>5} {p['repeats']:>2}"
                     + (f" {(p.get('predicted_step_s') or float('nan')) * 1e6:>12.2f}"
                        if predicted else "")
                     + (f"  {p.get('kernel_source', '')}" if kernels else "") + "\n")
