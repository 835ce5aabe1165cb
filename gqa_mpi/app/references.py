"""The float64 references a run is checked against, streamed over the cache and
spread over the ranks.

The cache is walked in chunks of at most :data:`CHUNK_BYTES` of K and V, and chunk
``i`` goes to rank ``i % size``: a rule of the check's own, not the run's split, so a
token the run dropped or counted twice still shows. Each rank reads its chunks
straight from the inputs (generated rows from the seed, ``.npy`` files through a
memory map), builds their float64 partial ``(m, l, O)`` with the reference's own
arithmetic (:func:`~gqa_mpi.core.reference.reference_partial`, never
:mod:`gqa_mpi.core.attention`'s), and merges them; rank 0 then folds the ranks' partials
in rank order, one at a time, and divides. The float32 control behind the tolerance is
built the same way. No rank holds more than a chunk, whatever ``S_kv``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..core.config import Config
from ..core.inputs import GEN_BLOCK, read_rows
from ..core.kernel_model import kernel_partial, kernel_rows, kernel_units
from ..core.reference import (float16_values, reference_finish, reference_merge,
                              reference_partial)
from ..mpi import watchdog

CHUNK_BYTES = 32 << 20
"""K and V of one chunk as read (float32), whatever S_kv; a whole number of the
generator's blocks where one fits, so that no block is drawn twice."""

SUB_BYTES = 2 << 20
"""K and V of one chunk held in float64 at a time (in cache)."""

TAG = 0x6368
"""Tag of the partials sent to rank 0."""


@dataclass(frozen=True)
class Task:
    """One chunk of the check: the cache rows ``[a, b)`` it reads, and for a
    ``--kernel-faithful`` model the kernel's unit of tiles (see
    :func:`~gqa_mpi.core.kernel_model.kernel_units`) those rows hold."""

    rows: Tuple[int, int]
    unit: Optional[Tuple[int, int, int]] = None


def chunk_tokens(batch: int, width: int, budget: int = CHUNK_BYTES) -> int:
    """Tokens of one chunk: as many as ``budget`` holds, in whole generator blocks
    where one fits."""
    n = max(1, budget // (2 * batch * width * 4))
    return n // GEN_BLOCK * GEN_BLOCK if n >= GEN_BLOCK else n


def plan(cfg: Config, cache_len: int) -> List[Task]:
    """Every chunk of the check of a step over ``cache_len`` tokens, in order."""
    width = cfg.heads_kv * cfg.head_dim
    n = chunk_tokens(cfg.B, width)
    tasks = [Task((a, min(a + n, cache_len))) for a in range(0, cache_len, n)]
    if cfg.kernel_faithful:
        tiles = max(1, n * width // (cfg.head_dim * cfg.tile))
        tasks += [Task(kernel_rows(cache_len, cfg.n_ranks, unit, width, cfg.head_dim), unit)
                  for unit in kernel_units(cache_len, cfg.n_ranks, cfg.tile, tiles)]
    return tasks


def references(comm: MPI.Comm, cfg: Config, q: np.ndarray, cache_len: int, *,
               n_tokens: int, rounded: bool,
               progress: Optional[Callable[[int, int], None]] = None
               ) -> Optional[Dict[str, np.ndarray]]:
    """The references of one step, called on every rank; on rank 0 a dict of
    ``(B, T_q, h_q*d)`` arrays, None elsewhere.

    Keys: ``ref`` (float64) and ``control`` (float32) of exact attention with the run's
    scale and mask; with ``--kernel-faithful``, ``model`` (the kernel's arithmetic, in
    float64) and ``exact`` (float64 attention with the default scale).

    ``q``: the step's queries ``(B, T_q, h_q*d)``; ``n_tokens``: the length the inputs
    were generated at; ``rounded``: K and V are taken at float16's values (the ranks
    hold them so). ``progress(done, total)`` is called after each of this rank's chunks.
    """
    tasks = plan(cfg, cache_len)[comm.rank::comm.size]
    width = cfg.heads_kv * cfg.head_dim
    mine: Dict[str, tuple] = {}
    for i, task in enumerate(tasks):
        k, v = (read_rows(cfg.inputs, cfg.seed, cfg.B, n_tokens, width, name, *task.rows)
                for name in "kv")
        if task.unit is not None:
            parts = {"model": kernel_partial(q, k, v, S_kv=cache_len, n_ranks=cfg.n_ranks,
                                             unit=task.unit, h_kv=cfg.heads_kv,
                                             tile=cfg.tile)}
        else:
            parts = _exact(cfg, q, k, v, task.rows[0], cache_len, rounded)
        for kind, part in parts.items():
            mine[kind] = reference_merge(mine[kind], part) if kind in mine else part
        del k, v, parts
        if progress is not None:
            progress(i + 1, len(tasks))
    folded = _fold(comm, mine)
    if folded is None:
        return None
    out = {kind: reference_finish(part) for kind, part in folded.items()}
    if "model" in out:      # the kernel's (G*T_q, d) lands at the start of a zeroed O
        placed = np.zeros(q.shape)
        placed.ravel()[:out["model"].size] = out["model"].ravel()
        out["model"] = placed
    return out


def _exact(cfg: Config, q, k, v, first: int, cache_len: int,
           rounded: bool) -> Dict[str, tuple]:
    """Partials of exact attention over one chunk, ``SUB_BYTES`` of float64 at a time:
    a piece small enough for the rounding, the conversions and the products to stay in
    cache, in buffers allocated once, so that the check streams its chunk from memory
    once (a fresh array a piece costs more in page faults than the arithmetic)."""
    if cfg.kernel_faithful:    # how far the kernel lands from attention as specified
        kinds = {"exact": (np.float64, None, False)}
    else:
        kinds = {"ref": (np.float64, cfg.scale, cfg.causal),
                 "control": (np.float32, cfg.scale, cfg.causal)}
    B, n, width = k.shape
    step = min(n, max(1, SUB_BYTES // (2 * B * width * 8)))
    bufs = {dt: (np.empty((B, step, width), dt), np.empty((B, step, width), dt))
            for dt in (np.float32, np.float64)}
    out: Dict[str, tuple] = {}
    for s0 in range(0, n, step):
        m = min(step, n - s0)
        held = {}
        for dt, (kb, vb) in bufs.items():
            kb, vb = kb[:, :m], vb[:, :m]
            if dt is np.float32 and rounded:
                float16_values(k[:, s0:s0 + m], out=kb)
                float16_values(v[:, s0:s0 + m], out=vb)
            else:
                src = held.get(np.float32, (k[:, s0:s0 + m], v[:, s0:s0 + m]))
                np.copyto(kb, src[0])
                np.copyto(vb, src[1])
            held[dt] = kb, vb
        for kind, (dtype, scale, causal) in kinds.items():
            part = reference_partial(q, *held[dtype], h_kv=cfg.heads_kv, scale=scale,
                                     first=first + s0, cache_len=cache_len, causal=causal,
                                     dtype=dtype)
            out[kind] = reference_merge(out[kind], part) if kind in out else part
    return out


def _fold(comm: MPI.Comm, mine: Dict[str, tuple]) -> Optional[Dict[str, tuple]]:
    """Rank 0 merges every rank's partials in rank order, holding two at a time."""
    if comm.rank != 0:
        with watchdog.waiting("rank 0 (the check's partials)"):
            comm.send(mine, dest=0, tag=TAG)
        return None
    acc = dict(mine)
    for source in range(1, comm.size):
        with watchdog.waiting(f"rank {source} (its part of the check)"):
            theirs = comm.recv(source=source, tag=TAG)
        for kind, part in theirs.items():
            acc[kind] = reference_merge(acc[kind], part) if kind in acc else part
    return acc
