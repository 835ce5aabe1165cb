"""The streamed check's chunks and their partials. No MPI here.

The float64 reference of a step walks the cache in chunks of at most
:data:`CHUNK_BYTES` of K and V (:func:`plan`); :func:`chunk_partials` builds the
partials ``(m, l, O)`` of one chunk straight from the inputs (generated rows from the
seed, ``.npy`` files through a memory map) with the reference's own arithmetic
(:mod:`gqa_mpi.check.reference`, never :mod:`gqa_mpi.step.attention`'s). How the chunks
are dealt to the ranks and folded is :mod:`gqa_mpi.app.check`'s.

A ``--kernel-source`` run checked with ``--check-against kernel-model`` also has the
kernel's own units of tiles (:func:`~gqa_mpi.check.kernel_model.kernel_units`) in its
plan, for the float64 model of the reference kernel's arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..config.config import Config
from ..config.inputs import GEN_BLOCK, read_rows
from .kernel_model import kernel_partial, kernel_rows, kernel_units
from ..step.dtypes import MEMORY
from .reference import float16_values, reference_merge, reference_partial

CHUNK_BYTES = 32 << 20
"""K and V of one chunk as read (float32), whatever S_kv; a whole number of the
generator's blocks where one fits, so that no block is drawn twice."""

SUB_BYTES = 2 << 20
"""K and V of one chunk held in float64 at a time (in cache)."""


@dataclass(frozen=True)
class Task:
    """One chunk of the check: the cache rows ``[a, b)`` it reads, and for the
    kernel model the kernel's unit of tiles (see
    :func:`~gqa_mpi.check.kernel_model.kernel_units`) those rows hold."""

    rows: Tuple[int, int]
    unit: Optional[Tuple[int, int, int]] = None


def modelled(cfg: Config) -> bool:
    """Whether the check is against the float64 model of the reference kernel."""
    return cfg.check_against == "kernel-model"


def kinds(cfg: Config) -> Dict[str, Tuple[tuple, tuple, type]]:
    """The partials a check folds, by kind: ``(shape of m and l, shape of o, dtype)``.

    ``ref`` (float64) and ``control`` (float32) of exact attention with the run's scale
    and mask; for the kernel model, ``model`` (the kernel's ``(G*T_q, d)`` arithmetic,
    float64) and ``exact`` (float64 attention with the run's scale)."""
    heads = (cfg.B, cfg.queries, cfg.heads_q)
    full = (heads, heads + (cfg.head_dim,))
    if modelled(cfg):
        rows = (1, 1, cfg.group * cfg.queries)
        return {"model": (rows, rows + (cfg.head_dim,), np.float64),
                "exact": full + (np.float64,)}
    return {"ref": full + (np.float64,), "control": full + (np.float32,)}


def chunk_tokens(batch: int, width: int) -> int:
    """Tokens of one chunk: as many as :data:`CHUNK_BYTES` holds, in whole generator
    blocks where one fits."""
    n = max(1, CHUNK_BYTES // (2 * batch * width * 4))
    return n // GEN_BLOCK * GEN_BLOCK if n >= GEN_BLOCK else n


def plan(cfg: Config, cache_len: int) -> List[Task]:
    """Every chunk of the check of a step over ``cache_len`` tokens, in order."""
    width = cfg.heads_kv * cfg.head_dim
    n = chunk_tokens(cfg.B, width)
    tasks = [Task((a, min(a + n, cache_len))) for a in range(0, cache_len, n)]
    if modelled(cfg):
        tiles = max(1, n * width // (cfg.head_dim * cfg.tile))
        tasks += [Task(kernel_rows(cache_len, cfg.n_ranks, unit, width, cfg.head_dim), unit)
                  for unit in kernel_units(cache_len, cfg.n_ranks, cfg.tile, tiles)]
    return tasks


def plan_size(cfg: Config, cache_len: int) -> int:
    """``len(plan(cfg, cache_len))``, counted without building it (a modelled run,
    always one step, builds it)."""
    if modelled(cfg):
        return len(plan(cfg, cache_len))
    return -(-cache_len // chunk_tokens(cfg.B, cfg.heads_kv * cfg.head_dim))


def chunk_partials(cfg: Config, task: Task, q: np.ndarray, cache_len: int, *,
                   n_tokens: int, held: Optional[str]) -> Dict[str, tuple]:
    """The partials of one chunk of the check of a step over ``cache_len`` tokens,
    by kind (see :func:`kinds`), from rows read here, K and V at the values of the
    dtype ``held`` (a name of :data:`~gqa_mpi.step.dtypes.MEMORY`; None: as read)."""
    width = cfg.heads_kv * cfg.head_dim
    k, v = (read_rows(cfg.inputs, cfg.seed, cfg.B, n_tokens, width, name, *task.rows)
            for name in "kv")
    if task.unit is not None:
        return {"model": kernel_partial(q, k, v, S_kv=cache_len, n_ranks=cfg.n_ranks,
                                        unit=task.unit, h_kv=cfg.heads_kv, tile=cfg.tile)}
    return _exact(cfg, q, k, v, task.rows[0], cache_len, held)


def _exact(cfg: Config, q, k, v, first: int, cache_len: int,
           memory: Optional[str]) -> Dict[str, tuple]:
    """Partials of exact attention over one chunk, ``SUB_BYTES`` of float64 at a time:
    a piece small enough for the rounding, the conversions and the products to stay in
    cache, in buffers allocated once, so that the check streams its chunk from memory
    once (a fresh array a piece costs more in page faults than the arithmetic)."""
    if modelled(cfg):    # how far the kernel lands from attention as specified
        kinds = {"exact": (np.float64, cfg.scale, False)}
    else:
        kinds = {"ref": (np.float64, cfg.scale, cfg.causal),
                 "control": (np.float32, cfg.scale, cfg.causal)}
    B, n, width = k.shape
    step = min(n, max(1, SUB_BYTES // (2 * B * width * 8)))
    k32, v32, k64, v64 = (np.empty((B, step, width), dt)
                          for dt in (np.float32, np.float32, np.float64, np.float64))
    out: Dict[str, tuple] = {}
    for s0 in range(0, n, step):
        m = min(step, n - s0)
        kc, vc = k[:, s0:s0 + m], v[:, s0:s0 + m]
        if memory == "float16":
            kc, vc = float16_values(kc, out=k32[:, :m]), float16_values(vc, out=v32[:, :m])
        elif memory is not None:
            np.copyto(k32[:, :m], kc.astype(MEMORY[memory]), casting="unsafe")
            np.copyto(v32[:, :m], vc.astype(MEMORY[memory]), casting="unsafe")
            kc, vc = k32[:, :m], v32[:, :m]
        np.copyto(k64[:, :m], kc)
        np.copyto(v64[:, :m], vc)
        held = {np.float32: (kc, vc), np.float64: (k64[:, :m], v64[:, :m])}
        for kind, (dtype, scale, causal) in kinds.items():
            part = reference_partial(q, *held[dtype], h_kv=cfg.heads_kv, scale=scale,
                                     first=first + s0, cache_len=cache_len, causal=causal,
                                     dtype=dtype)
            out[kind] = reference_merge(out[kind], part) if kind in out else part
    return out
