"""One run as the user sees it: the inputs, :func:`~gqa_mpi.app.decode.decode`, then
the root's check, outputs and report; returns the exit code."""
from __future__ import annotations

import dataclasses
import sys
import time

from mpi4py import MPI

from ..core import inputs
from ..mpi import watchdog
from . import outputs, report
from .check import check_output
from .config import Config
from .decode import decode


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


def refuse_nonfinite(comm: MPI.Comm, tensors) -> None:
    """Raise the same InputError on every rank if any rank's inputs hold NaN or inf."""
    mine = None
    for name, array, offset in tensors:
        mine = mine or inputs.first_nonfinite(name, array, offset)
    with watchdog.waiting("all ranks (input check)"):
        found = [m for m in comm.allgather(mine) if m]
    if found:
        raise inputs.InputError(f"{found[0]} (pass --allow-nonfinite to accept it)")


def run(comm: MPI.Comm, cfg: Config) -> int:
    """Run one decode step; return the exit code (0 passed, 1 check failed, 2 an
    output could not be written)."""
    start, stop = cfg.tokens(comm.rank)
    q, k, v = inputs.load_rows(cfg.inputs, cfg.seed, cfg.B, cfg.queries, cfg.seq_len,
                               cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim,
                               start, stop)
    if cfg.inputs is not None and not cfg.allow_nonfinite:
        refuse_nonfinite(comm, [("q", q, 0), ("k", k, start), ("v", v, start)])
    result = decode(q, k, v, cfg, comm=comm)
    code = 0
    if comm.rank == 0:
        watchdog.phase("check and outputs")
        record = dataclasses.replace(
            result.record, inputs_checked_finite=cfg.inputs is None or not cfg.allow_nonfinite,
            written={key: getattr(cfg, key) for key in ("output", "trace", "json")
                     if getattr(cfg, key)})
        if cfg.check:
            record.check, record.vs_exact = check_output(cfg, result.output,
                                                         record.m_rounding)
        writes = [(cfg.output, lambda p: outputs.write_npy(p, result.output)),
                  (cfg.trace, lambda p: outputs.write_json(p, result.trace)),
                  (cfg.json, lambda p: outputs.write_json(p, record.to_json()))]
        write_error = False
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
        if not cfg.quiet:
            if comm.size == 1:
                print("note      one MPI rank, so C = P = 1; for 2 cubes x 8 PEs run "
                      "`mpirun -n 16 python -m gqa_mpi`")
            print(report.format_report(record), flush=True)
        code = 2 if write_error else 0 if record.passed else 1
    watchdog.phase("end of run")
    with watchdog.waiting("rank 0 (check and outputs)"):
        wait_for_root(comm)
        return comm.bcast(code, root=0)
