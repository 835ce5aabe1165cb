"""One run as the user sees it: topology, the decode step, then the root's account."""
from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from . import outputs, report, watchdog
from .config import Config
from .driver import decode_step, load_slice
from .kernels import isa
from .reference import attention_reference, kernel_reference
from .topology import Topology
from .trace import chrome_trace


def wait_for_root(comm: MPI.Comm) -> None:
    """Hold every rank until the root is done, sleeping rather than busy-polling.

    MPI ranks spin while they wait; on an oversubscribed machine the spinning ranks
    would steal the cores the root needs for its float64 check.
    """
    req = comm.Ibarrier()
    if comm.rank == 0:
        req.Wait()
    while not req.Test():
        time.sleep(0.005)


def check_output(cfg: Config, output: np.ndarray, m_rounding: float):
    """``(check, vs_exact)`` of the root's output against float64 references.

    The default path is checked against exact attention. A kernel-faithful run is
    checked against a float64 model of the kernel, and ``vs_exact`` says how far the
    kernel's arithmetic lands from exact attention on the same inputs.
    """
    q, k, v = load_slice(cfg, 0, cfg.seq_len)   # the whole of K and V, on the root only
    # drawn (or read) once for the reference and the control; float16 when the ranks
    # hold K and V in float16, so that the reference sees the same values
    held = np.float16 if cfg.kv_dtype == "float16" and not cfg.kernel_faithful else None
    k, v = (np.asarray(x, dtype=held) for x in (k, v))
    out = output if cfg.batched else output[None]
    tolerance = report.tolerance(cfg.wire, m_rounding)
    if not cfg.kernel_faithful:
        kw = dict(h_kv=cfg.heads_kv, scale=cfg.scale, causal=cfg.causal)
        ref = attention_reference(q, k, v, **kw)
        control = attention_reference(q, k, v, dtype=np.float32, **kw)
        return report.compare(out, ref, tolerance, control), None
    model = kernel_reference(q, k, v, h_kv=cfg.heads_kv, n_ranks=cfg.n_ranks, tile=cfg.tile)
    exact = attention_reference(q, k, v, h_kv=cfg.heads_kv)
    return report.compare(out, model, tolerance), report.compare(out, exact, tolerance)


def run(comm: MPI.Comm, cfg: Config, quiet: bool = False) -> int:
    """Run one decode step; return the exit code (0 passed, 1 check failed)."""
    topo = Topology(comm, cfg.cubes, cfg.pes, cfg.grid[1])
    result = decode_step(cfg, topo)
    rec = result.recorder
    mine = dict(timings=rec.timings, messages=result.traffic.messages,
                bytes=result.traffic.bytes, overflow=result.traffic.loss.overflow,
                m_rounding=result.traffic.loss.m_rounding,
                peak_rss_mib=result.peak_rss_mib, tokens=result.stop - result.start,
                events=rec.events, place=topo.describe(), kernel=result.kernel,
                scores_nonfinite=result.scores_nonfinite)
    watchdog.rendezvous(topo.comm, "the gathering of results")
    per_rank = topo.comm.gather(mine, root=0)
    code = 0
    write_error = False
    if topo.is_root:
        check = vs_exact = None
        watchdog.phase("check and outputs")
        if cfg.check:
            m_rounding = max(r["m_rounding"] for r in per_rank)
            check, vs_exact = check_output(cfg, result.output, m_rounding)
        topology = dict(cubes=cfg.cubes, pes=cfg.pes, ranks=cfg.n_ranks,
                        rows_used=cfg.rows_used, cols_used=cfg.cols_used,
                        chain_depth=cfg.chain_depth)
        record = report.build_record(cfg.as_dict(), topology, check, per_rank, cfg.output)
        record["faithful_vs_exact"] = vs_exact
        record["kernel"] = dict(used=sorted({r["kernel"] for r in per_rank}), isa=isa(),
                                fallback=result.kernel_note)
        record["numerics"] = dict(
            output_nonfinite=int(np.count_nonzero(~np.isfinite(result.output))),
            scores_nonfinite_ranks=[i for i, r in enumerate(per_rank)
                                    if r["scores_nonfinite"]],
            inputs_checked_finite=cfg.inputs is None or not cfg.allow_nonfinite)
        writes = [(cfg.output, lambda p: outputs.write_npy(p, result.output)),
                  (cfg.trace, lambda p: outputs.write_json(p, chrome_trace(
                      [r["events"] for r in per_rank], [r["place"] for r in per_rank]))),
                  (cfg.json, lambda p: outputs.write_json(p, record))]
        for path, write in writes:
            if path is None:
                continue
            try:
                write(path)
            except OSError as e:  # checked up front; the disk can still fill meanwhile
                print(f"gqa_mpi: error: writing {path}: {e.strerror or e}; the old file, "
                      f"if any, is untouched and no temporary file is left",
                      file=sys.stderr, flush=True)
                write_error = True
        if not quiet:
            if comm.size == 1:
                print("note      one MPI rank, so C = P = 1; for 2 cubes x 8 PEs run "
                      "`mpirun -n 16 python -m gqa_mpi`")
            print(report.format_report(record), flush=True)
        if write_error:
            code = 2
        elif ((check is not None and not check["passed"])
              or record["wire_loss"]["overflow"] or record["numerics"]["output_nonfinite"]):
            code = 1
    watchdog.phase("end of run")
    with watchdog.waiting("rank 0 (check and outputs)"):
        wait_for_root(topo.comm)
        code = topo.comm.bcast(code, root=0)
    topo.free()
    return code
