"""One run as the user sees it, in the kernel's order: the inputs, the decode steps on
a :class:`~gqa_mpi.app.decode.Decoder` (each the emulated step or the kernel's own
function), the check of the kept steps after the loop, then the record, the root's
outputs and report; returns the exit code."""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..config import loop
from ..config import inputs
from ..config.config import Config
from .progress import Progress
from ..exits import Exit
from ..mpi import watchdog
from . import outputs, report
from .check import check_steps
from ..mpi.collective import from_root, refuse_nonfinite, to_root, wait_for_root
from .decode import Decoder


def run(comm, cfg: Config) -> Exit:
    """Run the decode steps; return the exit code (:class:`~gqa_mpi.exits.Exit`)."""
    progress = Progress(enabled=comm.rank == 0 and not cfg.quiet)
    start, stop = cfg.tokens(comm.rank)
    q, k, v = inputs.load_rows(cfg.inputs, cfg.seed, cfg.B, cfg.queries, loop.final_len(cfg),
                               cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim,
                               start, stop)
    if cfg.inputs is not None and not cfg.allow_nonfinite:
        refuse_nonfinite(comm, [("q", q, 0), ("k", k, start), ("v", v, start)])
    kept = []                       # (step, O on rank 0, Q) of the checked steps
    progress.stage("inputs", "tokens of rank 0's slice")
    dec = Decoder.from_config(comm, cfg, q, k, v, progress.update)
    try:
        del k, v
        future = loop.new_tokens(cfg, comm.rank)
        stream = (inputs.query_stream(cfg.seed, cfg.B, cfg.steps, cfg.queries,
                                      cfg.heads_q * cfg.head_dim)    # drawn before the loop
                  if cfg.steps > 1 else None)
        empty = np.empty((cfg.B, 0, cfg.heads_kv * cfg.head_dim), np.float32)
        progress.stage("steps", "decode steps")
        for step in range(cfg.steps):
            # step 0 takes the run's Q (generated, or q.npy)
            q_step = inputs.step_queries(stream, step, cfg.queries) if step else q
            output = dec.step(None if step == 0 else q_step)
            if loop.checked(cfg, step):
                kept.append((step, output, q_step))
            if step < cfg.steps - 1:
                dec.append(*future.pop(step, (empty, empty)))
            progress.update(step + 1, cfg.steps)
        record, trace = dec.record(write_trace=False)
    finally:
        dec.close()
    # checked after the loop, so that no timed step follows a check (whose float64
    # pass would leave it cold caches and late neighbours); every rank takes part
    t0 = time.perf_counter()
    checks, share = check_steps(comm, cfg, kept, record.m_rounding, progress)
    span = dec.rank.recorder.event("check", "phase", t0, time.perf_counter(),
                                   dict(steps=[step for step, _, _ in kept]))
    progress.end()
    every = to_root(comm, (share, span) if kept else None, "every rank (the end of the check)")
    code = Exit.PASSED
    if comm.rank == 0:
        watchdog.phase("outputs")
        for r, mine in zip(record.ranks, every):
            if mine is not None:
                (seconds, peak), span = mine
                r.timings["check"] = seconds
                r.peak_rss_mib = max(r.peak_rss_mib, peak)
                if trace is not None:           # the check on the run's time axis
                    trace["traceEvents"].append(span)
        record = dataclasses.replace(
            record, inputs_checked_finite=cfg.inputs is None or not cfg.allow_nonfinite,
            written={key: getattr(cfg, key) for key in ("output", "trace", "json")
                     if getattr(cfg, key)},
            checks=[c for c, _ in checks], checked_steps=[step for step, _, _ in kept],
            vs_exact=next((x for _, x in checks if x is not None), None))
        write_error = not outputs.write_all(cfg.output, output, cfg.trace, trace, cfg.json,
                                            record.to_json())
        if not cfg.quiet:
            if comm.size == 1 and not record.in_process:
                print("note      one MPI rank, so C = P = 1; for 2 cubes x 8 PEs run "
                      "`mpirun -n 16 python -m gqa_mpi`")
            print(report.format_report(record), flush=True)
        code = (Exit.USAGE if write_error else Exit.PASSED if record.passed
                else Exit.FAILED)
    watchdog.phase("end of run")
    with watchdog.waiting("rank 0 (outputs)"):
        wait_for_root(comm)
    return Exit(from_root(comm, code, "rank 0 (outputs)"))
