"""``python -m gqa_mpi.bench [SUBCOMMAND]``: how close one rank's attention gets to the
roofline, and what the rest of a step adds.

Everything is measured in one run, on the same data, with one BLAS thread, and
printed as a ratio to a baseline measured alongside it. One subcommand per table:

- ``local``: both local sweeps (the fused C sweep and the NumPy reference) against the
  limit ``max(time to read the resident K and V once, flops at the peak sgemm rate)``,
  both measured here, for float32 and float16 resident K/V (each with its own read
  time, the fastest way :mod:`gqa_mpi.tools.reads` has); with the scratch high-water
  mark of the sweep (flat in S_local);
- a naive NumPy attention (no tiling) and, when PyTorch is installed, PyTorch SDPA in
  float32 with the query groups folded into the query axis and with ``enable_gqa``,
  each as its time over ours (above 1: we are faster);
- ``reduce``, from real ``mpirun`` launches: reduction time against local time per
  schedule and wire; ``startup``: a tiny 16-rank run against the bare imports;
- ``step``: the whole decode step of real launches at 1..N ranks
  against the host's read limit (the K and V bytes all ranks hold over the bandwidth
  of a read probe on as many processes, the fastest way it has), for ``chain`` and
  ``allgather``, float32 and float16 K/V, with what explains the gap (the slowest sweep, the skew between
  sweeps, what the reduction adds);
- ``source FILE``: a kernel's own file run through gqa_mpi's ``tl`` against the NumPy
  sweep of the same float16 tiles, per launch;
- ``in-process FILE``: the same checked run of a kernel's file ``--in-process`` (every
  PE a thread of one process) and launched on MPI ranks, whole command and step;
- ``predict FILE --profile P``: the step ``--predict P`` predicts against the step
  measured in the same launch (with the ``host`` profile the probe wrote, how well
  the cost model describes this machine).

With no subcommand it runs ``local``, ``reduce`` and ``startup`` with their defaults.
Each table prints a line as it starts, and each launch or size as it goes.

Absolute times mean little on a shared or oversubscribed machine; the ratios are the
result. Run it on idle cores.
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from typing import Callable, Dict, List  # noqa: E402

import numpy as np  # noqa: E402

from ..step import sweeps  # noqa: E402
from ..step.attention import fold_queries, local_attention  # noqa: E402
from . import reads  # noqa: E402
from .launcher import gqa_command, mpirun_command, plain, run_bounded  # noqa: E402
from ..app.outputs import write_json  # noqa: E402
from ..app.record import RunRecord  # noqa: E402
from ..step.schedules import SCHEDULES  # noqa: E402
from ..step.wires import WIRES  # noqa: E402
from ..exits import Exit, quiet_when_the_reader_leaves  # noqa: E402


def best_of(fn: Callable[[], object], repeats: int, number: int = 1) -> float:
    """The fastest of ``repeats`` rounds of ``number`` calls, in seconds per call."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def peak_sgemm_rate(repeats: int) -> float:
    """FLOP/s of a large square float32 matrix product on this thread."""
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    return 2 * n ** 3 / best_of(lambda: a @ a, repeats)


def naive_attention(q, k, v, scale):
    """No tiling: all scores of the slice at once. ``q (1,h,R,d)``, ``k, v (1,h,S,d)``."""
    s = np.matmul(q * np.float32(scale), k.swapaxes(-1, -2))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    return np.matmul(s, v) / s.sum(axis=-1, keepdims=True)


def torch_baselines(q, k, v, G, repeats, gqa_limit_bytes):
    """PyTorch SDPA float32 on the same arrays: groups folded, and enable_gqa."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    torch.set_num_threads(1)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))     # (1, h_kv, ., d), no copy
    out = {"torch_folded": best_of(lambda: F.scaled_dot_product_attention(tq, tk, tv),
                                   repeats)}
    h_kv, d = q.shape[1], q.shape[-1]
    expanded = k.nbytes * G * 2                                # repeated K and V
    if expanded <= gqa_limit_bytes:
        qh = tq.reshape(1, h_kv * G, 1, d)
        out["torch_gqa"] = best_of(
            lambda: F.scaled_dot_product_attention(qh, tk, tv, enable_gqa=True), repeats)
    return out


def read_time(arrays, repeats: int) -> Dict:
    """``{read_s, read_way}``: the time to stream every byte of ``arrays`` once, the
    fastest way :mod:`gqa_mpi.tools.reads` has, and which way that was."""
    times = {name: best_of(fn, repeats) for name, fn in reads.ways(arrays).items()}
    way = min(times, key=times.get)
    return dict(read_s=times[way], read_way=way)


def local_table(tokens: List[int], tiles: List[int], groups: List[int], h_kv: int,
                d: int, repeats: int, torch_gqa_limit: int) -> List[Dict]:
    """Per S_local, G, K/V dtype and tile: the fused and NumPy sweeps over the limit,
    and PyTorch SDPA (float32) over the fused sweep, all on the same data."""
    rate = peak_sgemm_rate(repeats)
    rng = np.random.default_rng(0)
    fused = sweeps.FusedSweep if sweeps.FUSED_ERROR is None else None
    rows = []
    for S in tokens:
        k_rows, v_rows = (rng.standard_normal((1, S, h_kv * d), dtype=np.float32)
                          for _ in "kv")
        for dtype in ("float32", "float16"):
            _progress(f"local: S_local {S}, {dtype} K/V")
            src = {"k": k_rows, "v": v_rows}
            held = {kern.name: sweeps.make_resident(kern, lambda n, i, j: src[n][:, i:j],
                                                     S, 1, h_kv, d, np.dtype(dtype))
                    for kern in (sweeps.NumpySweep, fused) if kern is not None}
            read = read_time(held.get("fused", held["numpy"]), repeats)
            for G in groups:
                q = fold_queries(rng.standard_normal((1, 1, h_kv * G * d), dtype=np.float32),
                                 h_kv, d)
                scale = 1 / np.sqrt(d)
                flop = 4 * S * h_kv * G * d / rate
                limit = max(read["read_s"], flop)
                base = dict(G=G, S_local=S, kv_dtype=dtype, flop_s=flop, limit_s=limit,
                            sgemm_gflops=rate / 1e9, **read)
                baselines = {}
                if dtype == "float32":
                    k32, v32 = held["numpy"]
                    baselines["naive_numpy"] = best_of(
                        lambda: naive_attention(q, k32, v32, scale), repeats)
                    baselines.update(torch_baselines(q, k32, v32, G, repeats, torch_gqa_limit))
                for tile in tiles:
                    row = dict(base, tile=tile)
                    for name, (k, v) in held.items():
                        sweep = sweeps.FusedSweep.sweep if name == "fused" else local_attention
                        tracemalloc.start()
                        sweep(q, k, v, scale=scale, tile=tile)
                        scratch = tracemalloc.get_traced_memory()[1]
                        tracemalloc.stop()
                        if name == "fused":
                            scratch += sweeps.FusedSweep.scratch_bytes(G, d)
                        t = best_of(lambda: sweep(q, k, v, scale=scale, tile=tile), repeats)
                        row.update({f"{name}_s": t, f"{name}_over_limit": t / limit,
                                    f"{name}_scratch_bytes": scratch})
                    ours = row.get("fused_s", row["numpy_s"])
                    for name, bt in baselines.items():
                        row[f"{name}_s"] = bt
                        row[f"{name}_over_ours"] = bt / ours
                    rows.append(row)
    return rows


def reduction_table(ranks: List[int], tokens_per_rank: List[int], steps: int, timeout: int,
                    every_wire: bool = True) -> List[Dict]:
    """Real launches: what the reduction adds to a step beyond the slowest local sweep,
    against that sweep, for every schedule and every wire it carries (or only its
    default wire); each the median over ``steps`` decode steps (the steady state)."""
    combos = [(s.name, w.name) for s in SCHEDULES for w in WIRES
              if s.accepts(w) and (every_wire or w.name == s.default_wire)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, per_rank in ((n, t) for n in ranks for t in tokens_per_rank):
            _progress(f"reduce: {n} rank(s), {per_rank} tokens per rank, "
                      f"{len(combos)} launch(es)")
            for schedule, wire in combos:
                path = os.path.join(tmp, f"{n}-{schedule}-{wire}.json")
                cmd = gqa_command(n, ["--seq-len", str(per_rank * n), "--reduce", schedule,
                                      "--wire", wire, "--steps", str(steps), "--no-check",
                                      "--quiet", "--json", path])
                proc = _launch(cmd, timeout)
                if proc.returncode != 0:
                    rows.append(dict(ranks=n, tokens_per_rank=per_rank, reduce=schedule,
                                     wire=wire,
                                     error=_why(proc)))
                    continue
                rec = RunRecord.load(path)
                red = float(np.median(rec.beyond_local()))
                loc = rec.timings()["local_attention"]["max"]
                rows.append(dict(ranks=n, tokens_per_rank=per_rank, reduce=schedule, wire=wire,
                                 hops=rec.config.schedule.depth(rec.config.layout),
                                 reduce_s=red, local_s=loc, reduce_over_local=red / loc,
                                 messages=rec.messages, bytes=rec.bytes))
    return rows


def step_table(ranks: List[int], per_rank: int, groups: List[int], dtypes: List[str],
               schedules: List[str], h_kv: int, d: int, steps: int, repeats: int,
               timeout: float) -> List[Dict]:
    """Real launches: the loop's step at rank 0 (its step times summed over the steps,
    over the steps) against the host's read limit, the K and V bytes all ranks hold
    over the bandwidth of a read probe on as many processes, launched just before
    (:mod:`gqa_mpi.tools.reads`); per rank count, K/V dtype, G and schedule.

    With it, what explains a step above the limit: the slowest rank's sweep over the
    limit (contention and the kernel), the skew between the ranks' sweeps, and what
    the reduction adds beyond the slowest sweep (each the median over the steps)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            for dtype in dtypes:
                row_bytes = h_kv * d * (2 if dtype == "float16" else 4) * 2     # K and V
                _progress(f"step: {n} rank(s), {dtype} K/V: the read probe, then the runs")
                probe = _launch(mpirun_command(n, [sys.executable, "-m",
                                                   "gqa_mpi.tools.reads",
                                                   str(per_rank * row_bytes), "--repeats",
                                                   str(max(3, repeats))]), timeout)
                if probe.returncode != 0:
                    rows.append(dict(ranks=n, kv_dtype=dtype, error=_why(probe)))
                    continue
                probed = json.loads(probe.stdout.strip().splitlines()[-1])
                bandwidth = probed["bandwidth"]
                for G in groups:
                    for schedule in schedules:
                        path = os.path.join(tmp, f"{n}-{dtype}-{G}-{schedule}.json")
                        proc = _launch(gqa_command(n, [
                            "--seq-len", str(per_rank * n), "--heads-kv", str(h_kv),
                            "--heads-q", str(G * h_kv), "--head-dim", str(d),
                            "--kv-dtype", dtype, "--reduce", schedule, "--steps", str(steps),
                            "--no-check", "--quiet", "--json", path]), timeout)
                        head = dict(ranks=n, kv_dtype=dtype, G=G, reduce=schedule,
                                    read_gbs=bandwidth / 1e9, read_way=probed["way"])
                        if proc.returncode != 0:
                            rows.append(dict(head, error=_why(proc)))
                            continue
                        rows.append(dict(head, **_step_row(RunRecord.load(path), row_bytes,
                                                           bandwidth)))
    return rows


def _step_row(rec: RunRecord, row_bytes: int, bandwidth: float) -> Dict:
    """The figures of one launch of :func:`step_table`."""
    mine = rec.ranks[0].step_seconds()
    step = float(np.sum(mine) / len(mine))
    held = sum(r.held for r in rec.ranks) * row_bytes
    limit = held / bandwidth
    sweeps = np.array([[st.get("local_attention", 0.0) for st in r.steps] for r in rec.ranks])
    local = float(np.median(sweeps.max(axis=0)))
    return dict(step_s=step, limit_s=limit, step_over_limit=step / limit,
                local_over_limit=local / limit,
                skew_s=float(np.median(sweeps.max(axis=0) - sweeps.min(axis=0))),
                beyond_s=float(np.median(rec.beyond_local())))


def source_table(source: str, ranks: List[int], per_rank: int, group: int, d: int,
                 repeats: int, timeout: int) -> List[Dict]:
    """Real launches of ``--kernel-source`` against the same float16 tiles swept by the
    NumPy kernel (``--kernel numpy --kv-dtype float16``), on one problem with one KV
    head: the kernel's time over the NumPy step, each the slowest rank's, per launch."""
    rows = []
    common = ["--heads-kv", "1", "--heads-q", str(group), "--head-dim", str(d),
              "--no-check", "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            _progress(f"source: {n} rank(s), {repeats} x 2 launches")
            seq = ["--seq-len", str(per_rank * n)]
            for rep in range(repeats):
                times = {}
                for name, args in (("source", ["--kernel-source", source,
                                               "--softmax-scale", "1"]),
                                   ("numpy", ["--kernel", "numpy", "--kv-dtype", "float16"])):
                    path = os.path.join(tmp, f"{name}-{n}-{rep}.json")
                    proc = _launch(gqa_command(n, seq + common + args + ["--json", path]),
                                   timeout)
                    if proc.returncode not in (0, 1):      # 1: the kernel's own numerics
                        rows.append(dict(ranks=n, error=_why(proc)))
                        break
                    times[name] = RunRecord.load(path).timings()["step"]["max"]
                if len(times) == 2:
                    rows.append(dict(ranks=n, tokens_per_rank=per_rank, G=group, d=d,
                                     source_s=times["source"], numpy_s=times["numpy"],
                                     source_over_numpy=times["source"] / times["numpy"]))
    return rows


def predict_table(source: str, profile: str, ranks: List[int], per_rank: int, group: int,
                  h_kv: int, d: int, repeats: int, timeout: int) -> List[Dict]:
    """Real launches of ``--kernel-source FILE --predict PROFILE``: the measured step
    (the slowest rank's call of the kernel) against the predicted one, per launch."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            _progress(f"predict: {n} rank(s), {repeats} launch(es)")
            for rep in range(repeats):
                path = os.path.join(tmp, f"p-{n}-{rep}.json")
                proc = _launch(gqa_command(n, [
                    "--kernel-source", source, "--predict", profile, "--seq-len",
                    str(per_rank * n), "--heads-kv", str(h_kv), "--heads-q",
                    str(group * h_kv), "--head-dim", str(d), "--no-check", "--quiet",
                    "--json", path]), timeout)
                if proc.returncode not in (0, 1):
                    rows.append(dict(ranks=n, error=_why(proc)))
                    break
                rec = RunRecord.load(path)
                measured = rec.timings()["step"]["max"]
                p = rec.predicted
                if "error" in p:
                    rows.append(dict(ranks=n, error=f"not replayed: {p['error']}"))
                    break
                rows.append(dict(ranks=n, tokens_per_rank=per_rank, G=group,
                                 measured_s=measured, predicted_s=p["step_s"],
                                 predicted_over_measured=p["step_s"] / measured,
                                 last_pe=p["last_pe"]))
    return rows


def in_process_table(source: str, ranks: List[int], per_rank: int, group: int, d: int,
                     repeats: int, timeout: int) -> List[Dict]:
    """The same run of ``--kernel-source`` launched on MPI ranks and run ``--in-process``
    (every PE a thread of one process), checked: the whole command's wall time (start-up
    and the check included) and the kernel's step (the slowest rank's), each of the
    run with the shortest wall time of ``repeats``."""
    rows = []
    args = ["--kernel-source", source, "--heads-kv", "1", "--heads-q", str(group),
            "--head-dim", str(d), "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            _progress(f"in-process: {n} rank(s), {repeats} x 2 runs")
            grid = ["--cubes", "2", "--pes", str(n // 2)] if n % 2 == 0 else \
                ["--cubes", "1", "--pes", str(n)]
            mine = args + grid + ["--seq-len", str(per_rank * n)]
            commands = dict(mpi=gqa_command(n, mine), in_process=[
                sys.executable, "-m", "gqa_mpi", "--in-process"] + mine)
            runs: Dict[str, List[tuple]] = {name: [] for name in commands}
            try:
                for rep in range(repeats):           # alternated, as the host drifts
                    for name, cmd in commands.items():
                        runs[name].append(_timed(cmd, os.path.join(
                            tmp, f"{name}-{n}-{rep}.json"), timeout, name))
            except RuntimeError as e:
                rows.append(dict(ranks=n, error=str(e)))
                continue
            (mpi_wall, mpi_step), (ip_wall, ip_step) = min(runs["mpi"]), min(runs["in_process"])
            rows.append(dict(ranks=n, tokens_per_rank=per_rank, G=group,
                             mpi_wall_s=mpi_wall, in_process_wall_s=ip_wall,
                             wall_ratio=ip_wall / mpi_wall, mpi_step_s=mpi_step,
                             in_process_step_s=ip_step, step_ratio=ip_step / mpi_step))
    return rows


def _timed(cmd: List[str], path: str, timeout: float, name: str) -> tuple:
    """``(wall seconds, the record's slowest step)`` of one run that writes ``path``;
    RuntimeError with why, where it failed."""
    t0 = time.perf_counter()
    proc = _launch(cmd + ["--json", path], timeout)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):           # 1: the kernel's own numerics
        raise RuntimeError(f"{name}: {_why(proc)}")
    return wall, RunRecord.load(path).timings()["step"]["max"]


def _why(proc: subprocess.CompletedProcess) -> str:
    """Why a launch failed: its last line of stderr, else of stdout, and its exit code."""
    lines = (proc.stderr or "").strip().splitlines() or (proc.stdout or "").strip().splitlines()
    return f"exit {proc.returncode}: {lines[-1] if lines else 'nothing printed'}"


def _launch(cmd: List[str], timeout: float) -> subprocess.CompletedProcess:
    """One launch, said on stderr as it starts; a launch past ``timeout`` is killed with
    its ranks and comes back as a failure (exit code 124) that says so, so the tables
    keep what finished."""
    _progress("  " + shlex.join(cmd))
    try:
        return run_bounded(cmd, timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout:g} s "
                                                         f"(--timeout)")


def startup(repeats: int, timeout: int) -> Dict:
    """Import time of the package, and a tiny 16-rank run against bare imports."""
    def wall(cmd):
        return best_of(lambda: subprocess.run(cmd, capture_output=True, timeout=timeout,
                                              check=True), repeats)
    py = sys.executable
    bare = wall([py, "-c", "pass"])
    imports = wall([py, "-c", "import gqa_mpi.app.cli"])
    mpi_imports = wall(mpirun_command(16, [py, "-c", "import gqa_mpi.app.cli"]))
    tiny = wall(gqa_command(16, ["--seq-len", "1024", "--no-check", "--quiet"]))
    default = wall(gqa_command(16, ["--quiet"]))
    return dict(python_s=bare, import_s=imports - bare, mpirun16_imports_s=mpi_imports,
                mpirun16_tiny_run_s=tiny, run_over_imports=tiny / mpi_imports,
                mpirun16_default_run_s=default)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a positive number of seconds, got {text!r}")
    return value


def _sizes(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        mult = 1024 if part.endswith("K") else 1
        out.append(int(part.rstrip("K")) * mult)
    return out


def _ms(key):
    return lambda r: f"{r[key] * 1e3:.2f}"


def _ratio(key, digits=2):
    return lambda r: f"{r[key]:.{digits}f}"


def _table(title: str, rows: List[Dict], columns, lead: int = 0) -> None:
    """One table: ``title``, a header, and a row each, its columns ``(header, text of a
    row)``; a row with an ``error`` shows its first ``lead`` columns and why it failed."""
    print(title)
    width = [max(len(h), 5) for h, _ in columns]
    print(" ".join(f"{h:>{w}}" for (h, _), w in zip(columns, width)))
    for r in rows:
        cells = [(text(r) if "error" not in r or i < lead else "") for i, (_, text)
                 in enumerate(columns)]
        line = " ".join(f"{c:>{w}}" for c, w in zip(cells[:lead] if "error" in r else cells,
                                                    width))
        print(line + (f"  failed: {r['error']}" if "error" in r else ""))


def _local_columns(local: List[Dict]):
    nan = float("nan")
    extra = [k[:-len("_over_ours")] for k in local[0] if k.endswith("_over_ours")]
    return ([("G", lambda r: r["G"]), ("S_local", lambda r: r["S_local"]),
             ("K/V", lambda r: r["kv_dtype"]), ("tile", lambda r: r["tile"]),
             ("read ms", _ms("read_s")), ("read way", lambda r: r["read_way"]),
             ("flop ms", _ms("flop_s")),
             ("fused ms", lambda r: f"{r.get('fused_s', nan) * 1e3:.2f}"),
             ("fused/limit", lambda r: f"{r.get('fused_over_limit', nan):.2f}"),
             ("numpy ms", _ms("numpy_s")), ("numpy/limit", _ratio("numpy_over_limit")),
             ("scratch KiB", lambda r: "{:.0f}".format(
                 r.get("fused_scratch_bytes", r["numpy_scratch_bytes"]) / 1024))]
            + [(f"{e}/ours", lambda r, e=e: f"{r.get(e + '_over_ours', nan):.2f}")
               for e in extra])


def print_tables(result: Dict) -> None:
    local = result.get("local")
    if local:
        _table(f"local attention, 1 thread, h_kv={result['h_kv']} d={result['d']} T_q=1; "
               f"fused kernel: {result['isa']}; peak sgemm {local[0]['sgemm_gflops']:.0f} "
               f"GFLOP/s\n  limit = max(read the resident K and V once, flops at peak sgemm), "
               f"per K/V dtype; the read is the\n  fastest way NumPy, BLAS and PyTorch have "
               f"(read way: numpy.sum, numpy.dot, sgemv, torch.sum)\n  X/limit: 1.0 is the "
               f"limit, lower is impossible, higher is slower; torch/ours: above 1 we are "
               f"faster", local, _local_columns(local))
    if result.get("reduction"):
        _table("\nreduction from real mpirun launches, median step: 'reduce' is the step "
               "time beyond the slowest\nlocal sweep (what the reduction adds); 'local' the "
               "slowest rank's sweep", result["reduction"],
               [("ranks", lambda r: r["ranks"]), ("tokens/rank", lambda r: r["tokens_per_rank"]),
                ("reduce", lambda r: r["reduce"]), ("wire", lambda r: r["wire"]),
                ("hops", lambda r: "-" if r["hops"] is None else r["hops"]),
                ("reduce ms", _ms("reduce_s")), ("local ms", _ms("local_s")),
                ("reduce/local", _ratio("reduce_over_local", 3)),
                ("messages", lambda r: r["messages"])], lead=4)
    if result.get("step"):
        _table(f"\nthe whole step against the read limit, real mpirun launches at "
               f"{result['step_tokens']} tokens per rank, h_kv={result['h_kv']} "
               f"d={result['d']}:\n  limit = the K and V bytes all ranks hold / the read "
               f"bandwidth of a probe on as many processes, the\n  fastest way it has (read "
               f"way); step = rank 0's step, the mean over the loop; local = the slowest "
               f"rank's\n  sweep; skew = slowest - fastest sweep; beyond = what the reduction "
               f"adds after the slowest sweep\n  (medians over the steps)", result["step"],
               [("ranks", lambda r: r["ranks"]),
                ("read GB/s", lambda r: f"{r.get('read_gbs', float('nan')):.1f}"),
                ("read way", lambda r: r.get("read_way", "-")), ("K/V", lambda r: r["kv_dtype"]),
                ("G", lambda r: r.get("G", "-")), ("reduce", lambda r: r.get("reduce", "-")),
                ("step ms", _ms("step_s")), ("limit ms", _ms("limit_s")),
                ("step/limit", _ratio("step_over_limit")),
                ("local/limit", _ratio("local_over_limit")), ("skew ms", _ms("skew_s")),
                ("beyond ms", _ms("beyond_s"))], lead=6)
    launch = [("ranks", lambda r: r["ranks"]), ("tokens/rank", lambda r: r["tokens_per_rank"]),
              ("G", lambda r: r["G"])]
    if result.get("source"):
        _table(f"\n--kernel-source {result['source_file']} from real mpirun launches, h_kv=1: "
               f"the kernel run through gqa_mpi's tl\nover the same float16 tiles swept by "
               f"the NumPy kernel (slowest rank, one launch each)", result["source"],
               launch + [("tl ms", _ms("source_s")), ("numpy ms", _ms("numpy_s")),
                         ("tl/numpy", _ratio("source_over_numpy"))], lead=1)
    if result.get("predict"):
        _table(f"\n--kernel-source {result['predict_file']} --predict {result['profile']} from "
               f"real mpirun launches: the predicted step over the measured one (the slowest "
               f"rank's call of the kernel, one launch each)", result["predict"],
               launch + [("measured ms", _ms("measured_s")), ("predicted ms", _ms("predicted_s")),
                         ("predicted/measured", _ratio("predicted_over_measured"))], lead=1)
    if result.get("in_process"):
        _table(f"\n--kernel-source {result['in_process_file']}, checked: --in-process (every "
               f"PE a thread of one process) against\nthe same grid on MPI ranks; wall = the "
               f"whole command, start-up and check included; step = the slowest\nrank's "
               f"kernel (of the run with the shortest wall time)", result["in_process"],
               launch + [("mpi wall s", _ratio("mpi_wall_s")),
                         ("in-process wall s", _ratio("in_process_wall_s")),
                         ("wall in-process/mpi", _ratio("wall_ratio")),
                         ("mpi step ms", _ms("mpi_step_s")),
                         ("in-process step ms", _ms("in_process_step_s")),
                         ("step in-process/mpi", _ratio("step_ratio"))], lead=1)
    s = result.get("startup")
    if s:
        print(f"\nstart-up: import gqa_mpi {s['import_s'] * 1e3:.0f} ms; 16-rank tiny run "
              f"{s['mpirun16_tiny_run_s']:.2f} s vs 16-rank imports alone "
              f"{s['mpirun16_imports_s']:.2f} s (ratio {s['run_over_imports']:.2f})")


SUBCOMMANDS = {
    "local": "the local sweeps over one slice against the read/flop limit, and torch",
    "reduce": "real launches: what each schedule and wire adds to a step",
    "step": "real launches: the whole step against the host's read limit at N ranks",
    "source": "real launches: a kernel's own file through gqa_mpi's tl against the "
              "NumPy sweep of the same float16 tiles",
    "predict": "real launches: a kernel's predicted step (--predict PROFILE) against its "
               "measured step on this machine",
    "in-process": "a kernel's own file run --in-process against the same grid launched "
                  "on MPI ranks",
    "startup": "the import time and a tiny 16-rank run against bare imports",
}
SHAPED = ("local", "step")
"""The subcommands that take ``--heads-kv`` and ``--head-dim``."""
DEFAULT = ("local", "reduce", "startup")
"""What ``python -m gqa_mpi.bench`` with no subcommand measures."""


def build_parser() -> argparse.ArgumentParser:
    """``python -m gqa_mpi.bench [SUBCOMMAND] [options]``: one subcommand per table,
    each with its few options."""
    def common(suppress: bool) -> argparse.ArgumentParser:
        # a subcommand's copy leaves out what it is not given, so that options given
        # before the subcommand stand
        c = argparse.ArgumentParser(add_help=False)
        kw = dict(default=argparse.SUPPRESS) if suppress else {}
        c.add_argument("--repeats", type=int, help="best of N (default 3)",
                       **(kw or dict(default=3)))
        c.add_argument("--json", metavar="FILE", help="write every number here too", **kw)
        c.add_argument("--timeout", type=_seconds,
                       help="per mpirun launch, seconds; a launch past it is killed and "
                            "shown as failed (default 600)", **(kw or dict(default=600)))
        c.add_argument("--quick", action="store_true",
                       help="tiny sizes, to check that the benchmark runs", **kw)
        return c
    shape = argparse.ArgumentParser(add_help=False)
    shape.add_argument("--heads-kv", type=int, default=8, help="h_kv (default 8)")
    shape.add_argument("--head-dim", type=int, default=128, help="d (default 128)")
    p = argparse.ArgumentParser(
        prog="python -m gqa_mpi.bench", description=plain(__doc__), parents=[common(False)],
        epilog="With no subcommand: " + ", ".join(DEFAULT) + " with their defaults. "
               "'python -m gqa_mpi.bench SUBCOMMAND --help' lists its options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", metavar="SUBCOMMAND",
                           help="; ".join(f"{k}: {v}" for k, v in SUBCOMMANDS.items()))
    parsers = {name: sub.add_parser(name, help=text, description=text,
                                    parents=[common(True)] + (
                                        [shape] if name in SHAPED else []))
               for name, text in SUBCOMMANDS.items()}
    a = parsers["local"]
    a.add_argument("--tokens", default="8K,64K,256K",
                   help="slice lengths S_local, e.g. 8K,64K (default %(default)s)")
    a.add_argument("--tiles", default="1024", help="tile widths (default %(default)s)")
    a.add_argument("--groups", default="1,4,8", help="G = h_q / h_kv (default %(default)s)")
    a.add_argument("--torch-gqa-limit-gib", type=float, default=4.0,
                   help="skip enable_gqa when its repeated K/V would exceed this")
    def launches(a, ranks: str, tokens: str, steps: bool = True) -> None:
        a.add_argument("--ranks", default=ranks, help="rank counts, e.g. 4,16 (default "
                                                      "%(default)s)")
        a.add_argument("--tokens-per-rank", default=tokens,
                       help="S_kv / ranks, e.g. 8K,64K (default %(default)s)")
        if steps:
            a.add_argument("--steps", type=int, default=10,
                           help="decode steps per run; the median step is reported "
                                "(default 10)")
    launches(parsers["reduce"], "16", "8K")
    a = parsers["step"]
    launches(a, "1,2,4,8,16", "64K")
    a.add_argument("--groups", default="4,8", help="G values (default %(default)s)")
    a.add_argument("--reduce", default="chain,allgather",
                   help="schedules (default %(default)s)")

    def kernel(a, ranks: str, tokens: str) -> None:
        a.add_argument("kernel_source", metavar="FILE[:FUNCTION]",
                       help="the kernel's file, as --kernel-source takes it")
        launches(a, ranks, tokens, steps=False)
        a.add_argument("--group", type=int, default=8,
                       help="G, query heads per KV head (default 8)")
        a.add_argument("--head-dim", type=int, default=128, help="d (default 128)")
    kernel(parsers["source"], "16", "64K")
    kernel(parsers["in-process"], "8,16", "8K")
    a = parsers["predict"]
    kernel(a, "1,4,16", "64K")
    a.add_argument("--profile", default="host",
                   help="the profile to predict with (default %(default)s: this machine's, "
                        "as `python -m gqa_mpi.probe` wrote it)")
    a.add_argument("--heads-kv", type=int, default=1, help="h_kv (default 1)")
    return p


QUICK = dict(local=dict(tokens="1K,2K", tiles="256,1024", groups="1,8"),
             reduce=dict(ranks="2", tokens_per_rank="256", steps=1),
             step=dict(ranks="2", tokens_per_rank="1K", groups="4", steps=1),
             source=dict(ranks="1", tokens_per_rank="1K"),
             **{"in-process": dict(ranks="2", tokens_per_rank="1K")},
             predict=dict(ranks="1,2", tokens_per_rank="1K"))
"""``--quick``: tiny sizes, one repeat."""


@quiet_when_the_reader_leaves
def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    whats = DEFAULT if args.what is None else (args.what,)
    if args.quick:
        args.repeats = 1
        if args.what is None:
            whats = ("local", "reduce")       # start-up takes 16-rank launches
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    result = dict(blas_threads=1, isa=sweeps.isa())
    for what in whats:
        # the default suite takes each table's defaults: parse its subcommand alone
        mine = args if args.what is not None else p.parse_args(
            [what] + (["--quick"] if args.quick else []) + ["--repeats", str(args.repeats),
                                                            "--timeout", str(args.timeout)])
        if args.quick:
            for key, value in QUICK.get(what, {}).items():
                setattr(mine, key, value)
        try:
            _measure(what, mine, result, cores)
        except ValueError as e:
            p.error(f"{what}: {e}")
    print_tables(result)
    if args.json:
        write_json(args.json, result)
    return Exit.PASSED


def _progress(what: str) -> None:
    """One line on stderr as a piece of work starts: a long table is never a silent
    minute, and stdout keeps the tables alone."""
    print(f"bench: {what}", file=sys.stderr, flush=True)


def _measure(what: str, a, result: Dict, cores) -> None:
    """Run one table's measurements into ``result``."""
    _progress(f"{what}: {SUBCOMMANDS[what]}")
    if what == "local":
        result.update(h_kv=a.heads_kv, d=a.head_dim)
        result["local"] = local_table(_sizes(a.tokens), _sizes(a.tiles), _sizes(a.groups),
                                      a.heads_kv, a.head_dim, a.repeats,
                                      int(a.torch_gqa_limit_gib * 2 ** 30))
        if cores is not None:   # PyTorch's import may pin this process to one core; the
            os.sched_setaffinity(0, cores)      # launches that follow inherit it
    elif what == "reduce":
        result["reduction"] = reduction_table(_sizes(a.ranks), _sizes(a.tokens_per_rank),
                                              a.steps, a.timeout, every_wire=not a.quick)
    elif what == "step":
        for name in a.reduce.split(","):
            if name not in SCHEDULES.names():
                raise ValueError(f"--reduce: no schedule {name!r} (one of "
                                 f"{', '.join(SCHEDULES.names())})")
        result.update(h_kv=a.heads_kv, d=a.head_dim, step_tokens=_sizes(a.tokens_per_rank)[0])
        result["step"] = step_table(_sizes(a.ranks), result["step_tokens"], _sizes(a.groups),
                                    ["float32", "float16"], a.reduce.split(","), a.heads_kv,
                                    a.head_dim, a.steps, a.repeats, a.timeout)
    elif what == "source":
        result["source_file"] = a.kernel_source
        result["source"] = source_table(a.kernel_source, _sizes(a.ranks),
                                        _sizes(a.tokens_per_rank)[0], a.group, a.head_dim,
                                        a.repeats, a.timeout)
    elif what == "in-process":
        result["in_process_file"] = a.kernel_source
        result["in_process"] = in_process_table(a.kernel_source, _sizes(a.ranks),
                                                _sizes(a.tokens_per_rank)[0], a.group,
                                                a.head_dim, a.repeats, a.timeout)
    elif what == "predict":
        result["predict_file"], result["profile"] = a.kernel_source, a.profile
        result["predict"] = predict_table(a.kernel_source, a.profile, _sizes(a.ranks),
                                          _sizes(a.tokens_per_rank)[0], a.group, a.heads_kv,
                                          a.head_dim, a.repeats, a.timeout)
    elif what == "startup":
        try:
            result["startup"] = startup(a.repeats, a.timeout)
        except subprocess.SubprocessError as e:    # a timeout or a failed launch
            print(f"start-up not measured: {e}", file=sys.stderr)
