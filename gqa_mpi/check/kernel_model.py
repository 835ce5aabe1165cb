"""The accelerator kernel's own split, reads and arithmetic, and their float64 model.

A check reference (``--check-against kernel-model`` of a ``--kernel-source`` run). No
MPI here.

The accelerator kernel reads its operands with byte-conserving reshapes, not
transposes (SPEC defects 2-5):

- Q is loaded as ``(G*T_q, d)`` from the start of ``(T_q, h_q*d)``: the first
  ``G*T_q*d`` values, which for ``T_q = 1`` are the query heads of KV head 0;
- tile ``t`` of K is the ``d * tile_s`` values starting at element ``t*TILE*d`` of the
  rank's ``(S_local, h_kv*d)`` slice, read as ``(d, tile_s)``;
- tile ``t`` of V is the same values read as ``(tile_s, d)``;
- every operand is float16, no softmax scale is applied, ``S_local = S_kv // (C*P)``
  (the tail tokens are dropped) and the root stores ``(G*T_q, d)`` at the start of O.

For ``T_q = 1``, ``h_kv = 1`` and K tiles whose ``(tile_s, d)`` block equals its own
``(d, tile_s)`` reading (symmetric ``d x d`` tiles, for instance) this is exact
attention with scale 1; otherwise it is not, and the report says by how much.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np



def kernel_token_range(S_kv: int, n_ranks: int, rank: int) -> Tuple[int, int]:
    """The tokens the kernel reads on ``rank``: the first ``S_local = S_kv // n_ranks`` of
    the slice its memory holds (SPEC's balanced split, the first ``S_kv % n_ranks`` ranks
    holding one more), so one token of each of those ranks is dropped (defect 2).

    The kernel never sees global token indices, only its own slice, so what it drops
    is the last token of each longer slice, not the tail of the cache.
    """
    base, extra = divmod(S_kv, n_ranks)
    start = rank * base + min(rank, extra)
    return start, start + base


def kernel_output(o: np.ndarray, q_shape: tuple, dtype=np.float32) -> np.ndarray:
    """Place the root's ``(G*T_q, d)`` result at the start of a zeroed O like Q."""
    out = np.zeros(int(np.prod(q_shape)), dtype=dtype)
    out[:o.size] = o.ravel()
    return out.reshape(q_shape)


# ---- the same model a group of tiles at a time, for a check that streams the cache

def kernel_units(S_kv: int, n_ranks: int, tile: int, tiles: int) -> List[Tuple[int, int, int]]:
    """``(rank, s0, s1)``: the tiles the kernel reads on each rank, ``tiles`` at a time
    (``s0``, ``s1`` count the rank's own tokens, from 0 to ``S_local``)."""
    S_local = S_kv // n_ranks
    step = tile * max(1, tiles)
    return [(r, s0, min(s0 + step, S_local)) for r in range(n_ranks)
            for s0 in range(0, S_local, step)]


def kernel_rows(S_kv: int, n_ranks: int, unit: Tuple[int, int, int],
                width: int, d: int) -> Tuple[int, int]:
    """The cache rows ``[a, b)`` that hold the values a unit of :func:`kernel_units`
    reads (the kernel reads ``d`` values a token from the start of its slice, not
    whole rows of ``width``)."""
    rank, s0, s1 = unit
    start, _ = kernel_token_range(S_kv, n_ranks, rank)
    return start + s0 * d // width, start + -(-s1 * d // width)


def kernel_partial(q, k_rows, v_rows, *, S_kv: int, n_ranks: int,
                   unit: Tuple[int, int, int], h_kv: int, tile: int):
    """``(m, l, o)`` float64 of the kernel's softmax over one unit of
    :func:`kernel_units`, from the rows :func:`kernel_rows` names; shaped
    ``(1, 1, G*T_q)`` and ``(1, 1, G*T_q, d)`` like :func:`~gqa_mpi.check.reference.
    reference_partial`'s, so that its merge and finish apply."""
    width = np.shape(k_rows)[-1]
    d = width // h_kv
    T_q = np.shape(q)[-2]
    G = np.shape(q)[-1] // d // h_kv
    _, s0, s1 = unit
    a, _ = kernel_rows(S_kv, n_ranks, unit, width, d)
    offset = (kernel_token_range(S_kv, n_ranks, unit[0])[0] - a) * width + s0 * d
    n = (s1 - s0) * d
    # the values as the kernel's float16 memory holds them, widened a tile at a time
    k_flat, v_flat = (np.asarray(x, dtype=np.float16).ravel()[offset:offset + n]
                      for x in (k_rows, v_rows))
    q_rows = np.asarray(q, dtype=np.float16).astype(np.float64).ravel()[
        :G * T_q * d].reshape(G * T_q, d)
    tiles = [(t0, min(tile, s1 - s0 - t0)) for t0 in range(0, s1 - s0, tile)]
    with np.errstate(all="ignore"):
        s = np.concatenate([q_rows @ k_flat[t0 * d:(t0 + ts) * d].astype(np.float64)
                            .reshape(d, ts) for t0, ts in tiles], axis=1)
        m = s.max(axis=1)
        p = np.exp(s - m[:, None])
        o = np.zeros((G * T_q, d))
        for t0, ts in tiles:
            o += p[:, t0:t0 + ts] @ v_flat[t0 * d:(t0 + ts) * d].astype(np.float64).reshape(ts, d)
        return m[None, None], p.sum(axis=1)[None, None], o[None, None]
