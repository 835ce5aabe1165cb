"""One run as the user sees it: topology, the decode step, then the root's account."""
from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from . import inputs, report
from .config import Config
from .driver import decode_step
from .reference import attention_reference
from .topology import Topology


def wait_idle(comm: MPI.Comm, root_busy: bool) -> None:
    """Hold every rank until the root is done, sleeping rather than busy-polling.

    MPI ranks spin while they wait; on an oversubscribed machine the spinning ranks
    would steal the cores the root needs for its float64 check.
    """
    req = comm.Ibarrier()
    if comm.rank != 0 or not root_busy:
        while not req.Test():
            time.sleep(0.005)
    else:
        req.Wait()


def global_inputs(cfg: Config):
    """The whole Q, K, V as the root's reference sees them, ``(B, ., width)``."""
    if cfg.inputs is None:
        d = cfg.head_dim
        q = inputs.generate(cfg.seed, "q", cfg.batch, cfg.queries, cfg.heads_q * d)
        k, v = (inputs.generate(cfg.seed, n, cfg.batch, cfg.seq_len, cfg.heads_kv * d)
                for n in "kv")
        return q, k, v
    q = inputs.load_q(cfg.inputs)
    k, v = (inputs.open_rows(cfg.inputs, n, 0, cfg.seq_len) for n in "kv")
    return q, k, v


def run(comm: MPI.Comm, cfg: Config, quiet: bool = False) -> int:
    """Run one decode step; return the exit code (0 passed, 1 check failed)."""
    topo = Topology(comm, cfg.cubes, cfg.pes, cfg.grid[1])
    result = decode_step(cfg, topo)
    mine = dict(timings=result.timings, messages=result.traffic.messages,
                bytes=result.traffic.bytes, overflow=result.traffic.loss.overflow,
                m_rounding=result.traffic.loss.m_rounding,
                peak_rss_mib=result.peak_rss_mib, tokens=result.stop - result.start)
    per_rank = topo.comm.gather(mine, root=0)
    code = 0
    if topo.is_root:
        check = None
        if cfg.check:
            q, k, v = global_inputs(cfg)
            ref = attention_reference(q, k, v, h_kv=cfg.heads_kv, scale=cfg.scale,
                                      causal=cfg.causal)
            out = result.output if cfg.batched else result.output[None]
            check = report.compare(out, ref, report.TOLERANCE[cfg.wire])
        topology = dict(cubes=cfg.cubes, pes=cfg.pes, ranks=cfg.n_ranks,
                        rows_used=cfg.rows_used, cols_used=cfg.cols_used,
                        chain_depth=cfg.chain_depth)
        record = report.build_record(cfg.as_dict(), topology, check, per_rank, cfg.output)
        if cfg.output:
            report.write_npy(cfg.output, result.output)
        if cfg.json:
            report.write_json(cfg.json, record)
        if not quiet:
            if comm.size == 1:
                print("note      one MPI rank, so C = P = 1; for 2 cubes x 8 PEs run "
                      "`mpirun -n 16 python -m gqa_mpi`")
            print(report.format_report(record), flush=True)
        failed = (check is not None and not check["passed"]) or record["wire_loss"]["overflow"]
        code = 1 if failed else 0
    wait_idle(topo.comm, root_busy=True)
    code = topo.comm.bcast(code, root=0)
    topo.free()
    return code
