"""One GQA decode step on all ranks, in the kernel's order.

Each rank holds a ``S_local`` slice of K, V and the full Q (replicated). The local
attention is a tile sweep over the slice, so per-rank scratch is bounded by the tile
whatever ``S_local`` is. The partial ``(m, l, O)`` is then reduced to PE 0 of cube 0
along the two-level chain (intra-cube row chain and column bridge, then the
inter-cube chain), and the root writes ``O / l``.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np

from . import inputs, watchdog
from .attention import causal_limits, empty_partial, finalize, fold_queries, unfold_output
from .config import Config
from .faults import inject
from .faithful import kernel_operands, kernel_output
from .kernels import make_resident, select
from .reduce import Traffic, chain_schedule, mpi_reduce, run_schedule, tree_schedule
from .topology import Topology
from .trace import Recorder


def token_range(S_kv: int, n_ranks: int, rank: int) -> Tuple[int, int]:
    """``[start, stop)`` of ``rank``'s tokens: contiguous, balanced, covering all.

    The first ``S_kv % n_ranks`` ranks take one token more; when ``S_kv < n_ranks``
    the last ranks take none (SPEC defects 2 and 6 fixed).
    """
    base, extra = divmod(S_kv, n_ranks)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def kernel_token_range(S_kv: int, n_ranks: int, rank: int) -> Tuple[int, int]:
    """The kernel's split: ``S_local = S_kv // n_ranks`` each, the tail dropped (defect 2)."""
    S_local = S_kv // n_ranks
    return rank * S_local, (rank + 1) * S_local


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


def load_slice(cfg: Config, start: int, stop: int):
    """Q ``(B, T_q, h_q*d)`` and this rank's K, V rows ``(B, stop-start, h_kv*d)``.

    K and V are read lazily (generated on slicing, or memory-mapped), so that
    making them resident never holds the slice twice.
    """
    d = cfg.head_dim
    if cfg.inputs is None:
        q = inputs.generate(cfg.seed, "q", cfg.batch, cfg.queries, cfg.heads_q * d)
        k, v = (inputs.GeneratedRows(cfg.seed, name, cfg.batch, cfg.seq_len,
                                     cfg.heads_kv * d, start, stop) for name in "kv")
    else:
        q = inputs.load_q(cfg.inputs)
        k, v = (inputs.open_rows(cfg.inputs, name, start, stop) for name in "kv")
    return q, k, v


def operands(cfg: Config, kernel, q: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray):
    """Q folded by KV head and the K, V slice resident in ``kernel``'s layout."""
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


def rank_tokens(cfg: Config, rank: int) -> Tuple[int, int]:
    """``[start, stop)`` of ``rank``'s tokens under the configured split."""
    if cfg.split is not None:
        start = sum(cfg.split[:rank])
        return start, start + cfg.split[rank]
    split = kernel_token_range if cfg.kernel_faithful else token_range
    return split(cfg.seq_len, cfg.n_ranks, rank)


def refuse_nonfinite(comm, tensors) -> None:
    """Raise the same InputError on every rank if any rank's inputs hold NaN or inf."""
    mine = None
    for name, array, offset in tensors:
        mine = mine or inputs.first_nonfinite(name, array, offset)
    with watchdog.waiting("all ranks (input check)"):
        found = [m for m in comm.allgather(mine) if m]
    if found:
        raise inputs.InputError(f"{found[0]} (pass --allow-nonfinite to accept it)")


def warm_up(comm, cfg: Config, steps) -> None:
    """Send one tiny partial along the reduction's own path, untimed.

    MPI libraries set up a connection on the first message between two ranks; a
    decode step of a running model finds them set up, so the timed step should too.
    """
    tiny = empty_partial(1, 1, 1, 1)
    if cfg.reduce == "mpi":
        mpi_reduce(comm, tiny, Traffic())
    else:
        run_schedule(comm, tiny, steps, cfg.wire, Traffic())


def decode_step(cfg: Config, topo: Topology) -> StepResult:
    """Run one decode step on this rank; the root's result holds the output."""
    comm = topo.comm
    start, stop = rank_tokens(cfg, topo.rank)
    rec = Recorder(topo.rank, events=cfg.trace is not None, tiles=cfg.trace_tiles)
    kernel, note = select(cfg.kernel)
    result = StepResult(None, start, stop, rec, kernel=kernel.name, kernel_note=note)
    steps = {"chain": lambda: chain_schedule(topo.neighbours, topo.cube, topo.pe,
                                             topo.row, topo.col),
             "tree": lambda: tree_schedule(topo.rank, comm.size),
             "mpi": lambda: None}[cfg.reduce]()
    watchdog.phase("warm-up")
    with watchdog.waiting("a neighbour (warm-up)"):
        warm_up(comm, cfg, steps)
    watchdog.rendezvous(comm, "the start of the step")
    rec.start()  # a common origin for every rank's clock

    with rec.phase("inputs", tokens=[start, stop]):
        watchdog.phase("inputs")
        inject("inputs", topo.rank)
        q_in, k_rows, v_rows = load_slice(cfg, start, stop)
        if cfg.inputs is not None and not cfg.allow_nonfinite:
            refuse_nonfinite(comm, [("q", q_in, 0), ("k", k_rows, start),
                                    ("v", v_rows, start)])
        q, k, v = operands(cfg, kernel, q_in, k_rows, v_rows)
        del k_rows, v_rows
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

    with rec.phase("reduce", wire=cfg.wire, schedule=cfg.reduce):
        watchdog.phase("reduce")
        inject("reduce", topo.rank)
        if cfg.reduce == "mpi":
            partial = mpi_reduce(comm, partial, result.traffic, rec)
        else:
            partial = run_schedule(comm, partial, steps, cfg.wire, result.traffic, rec)

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
