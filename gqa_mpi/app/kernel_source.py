"""``--kernel-source FILE[:FUNCTION]``: the kernel's own code, run on every rank.

Every rank loads FILE and calls the kernel with SPEC's signature and its own ``tl``
(:class:`gqa_mpi.core.tl.Backend`, with :mod:`gqa_mpi.mpi.tl_link` behind ``send`` and
``recv``). Its memory holds Q (replicated), its slice of K and V (the configured split)
and O, all float16. The output is O as it stands in rank 0's memory once every rank has
returned, checked against float64 exact attention with the run's softmax scale; the
report adds what a kernel author needs (tokens read, inf/NaN and where they first
appeared, scratch, bytes loaded, ``tl.dot`` flops, messages per direction).

A fault (:class:`~gqa_mpi.core.tl.KernelFault`, or an exception of the kernel's own)
is one line (the exception's traceback trimmed to FILE's frames) from the rank that
saw it, and every rank leaves with exit code 5.
"""
from __future__ import annotations

import os
import runpy
import time
import traceback
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..core.config import Config
from ..core.inputs import load_rows
from ..core.reference import float16_values
from ..core.tl import Backend, KernelFault, run_kernel
from ..core.trace import Recorder, chrome_trace
from ..mpi import watchdog
from ..mpi.tl_link import EXIT_FAULT, MpiLink, Watch
from ..mpi.topology import Topology
from . import outputs
from .check import compare
from .references import references
from .sizing import fmt

BUILTIN = "builtin:"
KERNELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "kernels")


def resolve(spec: str) -> Tuple[str, Optional[str]]:
    """``FILE[:FUNCTION]`` -> ``(absolute path, function or None)``; ``builtin:NAME`` is
    ``gqa_mpi/kernels/NAME.py``."""
    if spec.startswith(BUILTIN):
        name, _, fn = spec[len(BUILTIN):].partition(":")
        return os.path.join(KERNELS_DIR, name + ".py"), fn or None
    path, fn = spec, None
    if not os.path.exists(spec) and ":" in spec:
        head, _, tail = spec.rpartition(":")
        if tail.isidentifier():
            path, fn = head, tail
    return os.path.abspath(path), fn


def load(spec: str) -> Tuple[Callable, str]:
    """The kernel function and its file; ValueError with one line otherwise."""
    path, name = resolve(spec)
    if not os.path.isfile(path):
        raise ValueError(f"--kernel-source {spec}: no such file {path}")
    try:
        namespace = runpy.run_path(path, run_name="gqa_mpi_kernel_source")
    except SyntaxError as e:
        raise ValueError(f"--kernel-source {spec}: syntax error at {path}:{e.lineno}: "
                         f"{e.msg}") from None
    except Exception as e:  # noqa: BLE001 - the file's own top level failed
        raise ValueError(f"--kernel-source {spec}: running {path} failed: "
                         f"{type(e).__name__}: {e}") from None
    if name is not None:
        fn = namespace.get(name)
        if not callable(fn):
            raise ValueError(f"--kernel-source {spec}: {path} defines no function {name!r}")
        return fn, path
    found = sorted(k for k, v in namespace.items()
                   if k.endswith("_kernel") and callable(v) and not k.startswith("_"))
    if len(found) != 1:
        what = "no function whose name ends in _kernel" if not found else \
            f"several kernels ({', '.join(found)})"
        raise ValueError(f"--kernel-source {spec}: {path} has {what}; name one as "
                         f"FILE:FUNCTION")
    return namespace[found[0]], path


def _fault_line(rank: int, place, fault: KernelFault, path: str) -> str:
    where = f"{path}:{fault.line}" if fault.line is not None else path
    return (f"gqa_mpi: error: kernel fault on rank {rank} (cube {place.cube}, PE "
            f"{place.pe}): "
            f"{fault.message} (tl.{fault.call} at {where})")


def _own_exception(exc: BaseException, path: str) -> str:
    """The kernel's exception with its traceback trimmed to FILE's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    text = "".join(traceback.format_list(frames))
    return f"{text}{type(exc).__name__}: {exc}"


def run(comm: MPI.Comm, cfg: Config) -> int:
    """Run the kernel on every rank; return the exit code (0 passed, 1 failed, 2 an
    output could not be written; 5 ends the job from the rank that faulted)."""
    fn, path = load(cfg.kernel_source)
    topo = Topology(comm, cfg.layout)
    place = topo.place
    start, stop = cfg.tokens(topo.rank)
    width_q, width_kv = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim
    q, k, v = load_rows(cfg.inputs, cfg.seed, 1, cfg.queries, cfg.seq_len, width_q,
                        width_kv, start, stop)
    row = width_kv * 2
    regions = [("Q", q[0], 0, 0), ("K", np.asarray(k)[0], row, start),
               ("V", np.asarray(v)[0], row, start),
               ("O", np.zeros((cfg.queries, width_q), np.float16), 0, 0)]
    q_held = float16_values(q)     # the reference sees what the kernel's memory holds
    del q, k, v
    rec = Recorder(topo.rank, events=cfg.trace is not None)
    watch = Watch(topo, path)
    backend = Backend(place.pe, place.cube, regions, MpiLink(topo, watch, rec), path, rec)
    watchdog.rendezvous(topo.comm, "the kernel's start")
    rec.start(topo.comm.bcast(time.time() if topo.is_root else None, root=0))
    t0 = time.perf_counter()
    watchdog.phase("the kernel under test")
    try:
        with rec.phase("kernel"):
            run_kernel(fn, backend, cfg.queries, cfg.seq_len, cfg.heads_q, cfg.heads_kv,
                       cfg.head_dim, cfg.cubes, cfg.pes)
    except KernelFault as fault:
        _leave(comm, _fault_line(topo.rank, place, fault, path))
    except Exception as exc:  # noqa: BLE001 - the kernel's own code raised
        _leave(comm, f"gqa_mpi: error: the kernel raised on rank {topo.rank} (cube "
                     f"{place.cube}, PE {place.pe}):\n{_own_exception(exc, path)}")
    seconds = time.perf_counter() - t0
    backend.link.finish()
    stats = dict(rank=topo.rank, place=place.describe(), start=start, stop=stop,
                 k_rows=backend.region("K").rows_read(),
                 v_rows=backend.region("V").rows_read(), seconds=seconds,
                 **{k: getattr(backend.count, k) for k in (
                     "loaded_bytes", "stored_bytes", "dot_flops", "scratch_peak",
                     "persistent", "sent", "received", "nonfinite")})
    every = topo.comm.gather(stats, root=0)
    events = topo.comm.gather(rec.events, root=0) if cfg.trace is not None else None
    watchdog.phase("check")
    refs = (references(topo.comm, cfg, q_held, cfg.seq_len, n_tokens=cfg.seq_len,
                       rounded=True) if cfg.check else None)
    code = 0
    if topo.is_root:
        out = backend.region("O").data.astype(np.float32)
        record = _record(cfg, path, fn.__name__, every, out, refs)
        code = _finish(cfg, record, out, events, every)
    topo.free()
    with watchdog.waiting("rank 0 (outputs)"):
        return comm.bcast(code, root=0)


def _leave(comm: MPI.Comm, line: str) -> None:
    watchdog.say_and_abort(comm, line, EXIT_FAULT)


def _record(cfg: Config, path: str, name: str, every: List[Dict], out: np.ndarray,
            refs: Optional[Dict[str, np.ndarray]]) -> Dict:
    check = (None if refs is None else
             compare(out[None], refs["ref"], cfg.wire_format.tolerance, refs["control"]))
    return dict(config=cfg.to_json(), kernel=dict(file=path, function=name),
                check=None if check is None else asdict(check), ranks=every,
                mpi_library=MPI.Get_library_version().strip().splitlines()[0].strip())


def _directions(every: List[Dict]) -> str:
    total: Dict[str, List[int]] = {}
    for s in every:
        for d, (n, b) in s["sent"].items():
            t = total.setdefault(d, [0, 0])
            t[0], t[1] = t[0] + n, t[1] + b
    return ", ".join(f"{d} {n} ({fmt(b)})" for d, (n, b) in total.items()) or "none"


def report(cfg: Config, record: Dict) -> str:
    """The lines rank 0 prints for a ``--kernel-source`` run."""
    every = record["ranks"]
    S = cfg.seq_len
    k_read = sum(s["k_rows"] for s in every)
    v_read = sum(s["v_rows"] for s in every)
    held = [s["stop"] - s["start"] for s in every]
    per_rank = [s["k_rows"] for s in every]
    lines = [
        f"problem   T_q={cfg.queries} S_kv={S} h_q={cfg.heads_q} h_kv={cfg.heads_kv} "
        f"(G={cfg.group}) d={cfg.head_dim}; check scale={cfg.scale:g}; inputs "
        + (f"from {cfg.inputs}" if cfg.inputs else f"generated (seed {cfg.seed})"),
        f"topology  C={cfg.cubes} cubes x P={cfg.pes} PEs = {cfg.n_ranks} ranks",
        f"kernel    {record['kernel']['function']} from {record['kernel']['file']}, on "
        f"every rank with gqa_mpi's tl (float16 memory)",
        f"read      K {k_read} of S_kv={S} tokens ({S - k_read} never read), V {v_read} "
        f"({S - v_read} never read); per rank {min(per_rank)}..{max(per_rank)} of "
        f"{min(held)}..{max(held)} held",
    ]
    bad = [(s["rank"], c, line, n) for s in every for c, line, n in s["nonfinite"]]
    if bad:
        first = {}
        for r, c, line, n in bad:
            first.setdefault((c, line), []).append(r)
        shown = "; ".join(f"tl.{c} at line {line} on rank(s) "
                          f"{','.join(map(str, rs[:8]))}{' ...' if len(rs) > 8 else ''}"
                          for (c, line), rs in list(first.items())[:4])
        lines.append(f"numerics  inf or NaN first made by {shown}")
    lines.append(f"scratch   high-water {fmt(max(s['scratch_peak'] for s in every))} per "
                 f"rank (max); persistent {fmt(max(s['persistent'] for s in every))}")
    lines.append(f"traffic   loaded {fmt(sum(s['loaded_bytes'] for s in every))}, tl.dot "
                 f"{sum(s['dot_flops'] for s in every) / 1e9:.3g} GFLOP; messages "
                 f"{_directions(every)}")
    check = record["check"]
    if check is None:
        lines.append("check     skipped (--no-check)")
    else:
        verdict = "PASSED" if check["passed"] else "FAILED"
        lines.append(f"check     max_abs_err={check['max_abs_err']:.3g} max_rel_err="
                     f"{check['max_rel_err']:.3g} (tolerance {check['tolerance']:.3g} = "
                     f"{check['floor']:g} + 4 x float32 control's "
                     f"{check['control_rel_err'] or 0:.3g}) vs float64 exact attention: "
                     f"{verdict}")
    lines.append(f"time      kernel {1e3 * max(s['seconds'] for s in every):.1f} ms (max "
                 f"over ranks)")
    return "\n".join(lines)


def _finish(cfg: Config, record: Dict, out: np.ndarray, events, every) -> int:
    trace = None
    if events is not None:
        trace = chrome_trace(events, [s["place"] for s in every])
    write_error = not outputs.write_all(cfg.output, out, cfg.trace, trace, cfg.json, record)
    if not cfg.quiet:
        print(report(cfg, record), flush=True)
    if write_error:
        return 2
    check = record["check"]
    finite = bool(np.isfinite(out).all())
    return 0 if finite and (check is None or check["passed"]) else 1
