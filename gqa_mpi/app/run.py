"""One run as the user sees it: the inputs, the decode steps on a
:class:`~gqa_mpi.app.decode.Decoder`, the root's checks of the kept steps after the loop,
then the root's outputs and report; returns the exit code."""
from __future__ import annotations

import dataclasses
import time

from mpi4py import MPI

import numpy as np

from ..core import inputs
from ..mpi import watchdog
from . import outputs, report
from .check import check_output
from ..core.config import Config
from .decode import Decoder


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


def new_tokens(cfg: Config, rank: int):
    """``{step: (k_rows, v_rows)}``: the tokens ``rank`` takes after each step but the
    last, ``(B, n, h_kv*d)`` each, drawn before the loop so that no rank generates
    inputs between timed steps."""
    plan = {}
    for step in range(cfg.steps - 1):           # T_q tokens a step: linear in the steps
        mine = [t for t in range(cfg.cache_len(step), cfg.cache_len(step + 1))
                if cfg.owner(t) == rank]
        if mine:
            plan[step] = mine
    if not plan:
        return {}
    lo = min(p[0] for p in plan.values())
    hi = max(p[-1] for p in plan.values()) + 1
    k, v = (np.asarray(inputs.GeneratedRows(cfg.seed, name, cfg.B, cfg.final_len,
                                            cfg.heads_kv * cfg.head_dim, lo, hi))
            for name in "kv")
    return {step: (k[:, [t - lo for t in ts]], v[:, [t - lo for t in ts]])
            for step, ts in plan.items()}


def run(comm: MPI.Comm, cfg: Config) -> int:
    """Run the decode steps; return the exit code (0 passed, 1 check failed, 2 an
    output could not be written)."""
    start, stop = cfg.tokens(comm.rank)
    q, k, v = inputs.load_rows(cfg.inputs, cfg.seed, cfg.B, cfg.queries, cfg.final_len,
                               cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim,
                               start, stop)
    if cfg.inputs is not None and not cfg.allow_nonfinite:
        refuse_nonfinite(comm, [("q", q, 0), ("k", k, start), ("v", v, start)])
    kept = []                       # (step, O, Q) of the checked steps, on rank 0
    dec = Decoder.from_config(comm, cfg, q, k, v)
    try:
        del q, k, v
        future = new_tokens(cfg, comm.rank)
        stream = (inputs.query_stream(cfg.seed, cfg.B, cfg.steps, cfg.queries,
                                      cfg.heads_q * cfg.head_dim)    # drawn before the loop
                  if cfg.steps > 1 else None)
        empty = np.empty((cfg.B, 0, cfg.heads_kv * cfg.head_dim), np.float32)
        for step in range(cfg.steps):
            # step 0 takes the run's Q (generated, or q.npy)
            q_step = inputs.step_queries(stream, step, cfg.queries) if step else None
            output = dec.step(q_step)
            if cfg.checked(step) and comm.rank == 0:
                kept.append((step, output, q_step))
            if step < cfg.steps - 1:
                dec.append(*future.pop(step, (empty, empty)))
        record, trace = dec.record()
    finally:
        dec.close()
    checks = []
    if comm.rank == 0:
        # checked after the loop, so that no timed step follows a check (whose float64
        # pass would leave it cold caches and late neighbours); the tolerance takes the
        # largest rounding of m along the whole path, on any rank
        rounding = max(r.m_rounding for r in record.ranks)
        for step, out, q_step in kept:
            watchdog.phase(f"check of step {step}")
            checks.append(check_output(cfg, out, rounding, step, q_step))
    checked = [step for step, _, _ in kept]
    code = 0
    if comm.rank == 0:
        watchdog.phase("outputs")
        record = dataclasses.replace(
            record, inputs_checked_finite=cfg.inputs is None or not cfg.allow_nonfinite,
            written={key: getattr(cfg, key) for key in ("output", "trace", "json")
                     if getattr(cfg, key)},
            checks=[c for c, _ in checks], checked_steps=checked,
            vs_exact=next((x for _, x in checks if x is not None), None))
        write_error = not outputs.write_all(cfg.output, output, cfg.trace, trace, cfg.json,
                                            record.to_json())
        if not cfg.quiet:
            if comm.size == 1:
                print("note      one MPI rank, so C = P = 1; for 2 cubes x 8 PEs run "
                      "`mpirun -n 16 python -m gqa_mpi`")
            print(report.format_report(record), flush=True)
        code = 2 if write_error else 0 if record.passed else 1
    watchdog.phase("end of run")
    with watchdog.waiting("rank 0 (outputs)"):
        wait_for_root(comm)
        return comm.bcast(code, root=0)
