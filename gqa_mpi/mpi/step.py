"""One GQA decode step on all ranks, in the kernel's order.

Each rank holds a ``S_local`` slice of K, V and the full Q (replicated). It makes
the slice resident in its kernel's layout, sweeps it in tiles (per-rank scratch is
bounded by the tile whatever ``S_local`` is), then the partial ``(m, l, O)`` is
reduced to rank 0 along the configured schedule (the kernel's chain by default:
row chain and column bridge in each cube, then the inter-cube chain), and the root
computes ``O / l``.

``cfg`` is a placed :class:`gqa_mpi.app.config.Config`; this module reads it and
never builds one.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.attention import causal_limits, empty_partial, finalize, fold_queries, unfold_output
from ..core.kernel_model import kernel_operands, kernel_output
from ..core.kernels import make_resident, select
from ..core.schedules import Traffic
from ..core.trace import Recorder
from . import watchdog
from .exchange import execute
from .faults import inject
from .topology import Topology


@dataclass
class StepResult:
    """What one rank knows after the step."""

    output: Optional[np.ndarray]
    """O in the layout of Q, float32; the root only."""
    start: int
    stop: int
    recorder: Recorder
    traffic: Traffic = field(default_factory=Traffic)
    peak_rss_mib: float = 0.0
    kernel: str = "numpy"
    """The local kernel that ran (``--kernel auto`` may fall back to numpy)."""
    kernel_note: Optional[str] = None
    """Why ``--kernel auto`` fell back to numpy, if it did."""
    scores_nonfinite: bool = False
    """Some score of this rank's sweep was NaN or +inf (float32 overflow, or NaN input)."""


def operands(cfg, kernel, q: np.ndarray, k_rows, v_rows):
    """Q folded by KV head and the K, V slice resident in ``kernel``'s layout.

    ``k_rows``, ``v_rows`` are ``(B, S_local, h_kv*d)`` arrays or anything sliced as
    ``[:, i:j]`` (generated rows, memory maps): they are converted a chunk at a time.
    """
    if cfg.kernel_faithful:  # the kernel's reshapes give one float16-valued head
        q, k_rows, v_rows = kernel_operands(q, k_rows, v_rows, group=cfg.group,
                                            d=cfg.head_dim, tile=cfg.tile)
        k_rows, v_rows = k_rows[0], v_rows[0]
        h_kv, dtype = 1, np.float32
    else:
        q = fold_queries(q, cfg.heads_kv, cfg.head_dim)
        h_kv, dtype = cfg.heads_kv, np.dtype(cfg.kv_dtype)
    rows = {"k": k_rows, "v": v_rows}
    k, v = make_resident(kernel, lambda name, i, j: rows[name][:, i:j], k_rows.shape[1],
                         k_rows.shape[0], h_kv, cfg.head_dim, dtype)
    return q, k, v


def warm_up(comm, cfg) -> None:
    """Send one tiny partial along the reduction's own path, untimed.

    MPI libraries set up a connection on the first message between two ranks; a
    decode step of a running model finds them set up, so the timed step should too.
    """
    execute(comm, empty_partial(1, 1, 1, 1), cfg.schedule, cfg.layout, cfg.wire_format)


def decode_step(cfg, topo: Topology, q_in: np.ndarray, k_rows, v_rows) -> StepResult:
    """Run one decode step on this rank; the root's result holds the output.

    ``q_in`` is ``(B, T_q, h_q*d)`` float32 on every rank; ``k_rows``, ``v_rows`` are
    this rank's tokens ``cfg.tokens(rank)`` as ``(B, S_local, h_kv*d)``.
    """
    comm = topo.comm
    start, stop = cfg.tokens(topo.rank)
    rec = Recorder(topo.rank, events=cfg.trace is not None, tiles=cfg.trace_tiles)
    kernel, note = select(cfg.kernel)
    result = StepResult(None, start, stop, rec, kernel=kernel.name, kernel_note=note)
    wire = cfg.wire_format
    watchdog.phase("warm-up")
    with watchdog.waiting("a neighbour (warm-up)"):
        warm_up(comm, cfg)
    watchdog.rendezvous(comm, "the start of the step")
    rec.start()  # a common origin for every rank's clock

    with rec.phase("inputs", tokens=[start, stop]):
        watchdog.phase("inputs")
        inject("inputs", topo.rank)
        q, k, v = operands(cfg, kernel, q_in, k_rows, v_rows)
    # the kernel starts with its slice resident: time it from there
    watchdog.rendezvous(comm, "the end of inputs")

    with rec.phase("local_attention", tile=cfg.tile):
        watchdog.phase("local_attention")
        inject("local_attention", topo.rank)
        limit = (causal_limits(cfg.seq_len, cfg.queries, cfg.group)
                 if cfg.causal else None)
        partial = kernel.sweep(q, k, v, scale=cfg.scale, tile=cfg.tile, start=start,
                               causal_limit=limit, on_tile=rec.tile if rec.tiles else None)
        result.scores_nonfinite = bool(np.isnan(partial.m).any() or np.isposinf(partial.m).any())

    with rec.phase("reduce", wire=wire.name, schedule=cfg.reduce):
        watchdog.phase("reduce")
        inject("reduce", topo.rank)
        partial, result.traffic = execute(comm, partial, cfg.schedule, cfg.layout, wire, rec)

    if topo.is_root:
        with rec.phase("finalize"):
            watchdog.phase("finalize")
            inject("finalize", topo.rank)
            out = finalize(partial)
            if cfg.kernel_faithful:
                out = kernel_output(out, q_in.shape)
            else:
                out = unfold_output(out, cfg.queries)
            result.output = out if cfg.batched else out[0]

    rec.timings["total"] = time.perf_counter() - rec.origin
    result.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result
