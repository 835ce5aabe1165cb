"""Tiled online-softmax attention over one rank's KV slice, in pure NumPy.

This module never imports MPI: it is the arithmetic of one PE, testable alone.

Shapes used throughout (``R = G * T_q`` query rows per KV head)::

    q        (B, h_kv, R, d)        query rows grouped by the KV head they use
    k, v     (B, h_kv, S_local, d)  the rank's resident slice, float32 or float16
    Partial  m, l: (B, h_kv, R)     O: (B, h_kv, R, d)

Row ``r`` of KV head ``h`` is query head ``h * G + r // T_q`` at query position
``r % T_q``, so query head ``j`` uses KV head ``j // G`` (SPEC.md).
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple, Optional

import numpy as np

__all__ = [
    "Partial", "empty_partial", "rescale", "merge", "fold_queries", "unfold_output",
    "local_attention", "causal_limits", "finalize",
]


class Partial(NamedTuple):
    """A running online-softmax state ``(m, l, O)``.

    ``m`` is the running max score, ``l`` the running sum of ``exp(s - m)`` and
    ``O`` the running unnormalised ``sum exp(s - m) * v``. The empty partial
    ``(-inf, 0, 0)`` is the identity of :func:`merge`.
    """

    m: np.ndarray
    l: np.ndarray
    O: np.ndarray


def empty_partial(batch: int, h_kv: int, rows: int, d: int) -> Partial:
    """The identity partial ``(-inf, 0, 0)`` in float32."""
    return Partial(
        np.full((batch, h_kv, rows), -np.inf, dtype=np.float32),
        np.zeros((batch, h_kv, rows), dtype=np.float32),
        np.zeros((batch, h_kv, rows, d), dtype=np.float32),
    )


def _shift(m: np.ndarray) -> np.ndarray:
    """The max to subtract before ``exp``: ``m``, with ``-inf`` replaced by 0.

    Rows that have seen no key keep ``m = -inf``; subtracting 0 instead makes
    their ``exp(-inf - 0) = 0`` rather than ``exp(-inf + inf) = NaN``.
    """
    return np.where(np.isneginf(m), np.float32(0), m)


def rescale(ms):
    """The common max of several running maxima and each one's factor onto it.

    ``ms`` is a sequence of ``m`` arrays (or one array stacked on axis 0); returns
    ``(m, [e^(m_i - m)])``. Every exponent is ``<= 0``, so nothing overflows however
    far apart the maxima are, and a row no partial has seen (all ``-inf``) gets factors
    of 0, never NaN. This is the merge's arithmetic, written once: :func:`merge` and
    every reduction that merges more than two partials at a time use it.
    """
    m = np.maximum.reduce(ms)
    shift = _shift(m)
    with np.errstate(invalid="ignore"):  # NaN or +inf m (overflowed scores) stay NaN
        return m, [np.exp(mi - shift) for mi in ms]


def merge(a: Partial, b: Partial) -> Partial:
    """Merge two partials (SPEC "Per-rank work", step 3); never produces NaN.

    ``m' = max(m1, m2)``, ``l' = l1 e^(m1-m') + l2 e^(m2-m')`` and the same for O.
    """
    m, (ea, eb) = rescale([a.m, b.m])
    l = a.l * ea + b.l * eb
    O = a.O * ea[..., None] + b.O * eb[..., None]
    return Partial(m, l, O)


def fold_queries(q: np.ndarray, h_kv: int, d: int) -> np.ndarray:
    """``(B, T_q, h_q*d)`` -> ``(B, h_kv, G*T_q, d)``, grouping heads by KV head."""
    B, T_q, width = q.shape
    G = width // (h_kv * d)
    return (q.reshape(B, T_q, h_kv, G, d)
             .transpose(0, 2, 3, 1, 4)
             .reshape(B, h_kv, G * T_q, d))


def unfold_output(o: np.ndarray, T_q: int) -> np.ndarray:
    """Inverse of :func:`fold_queries`: ``(B, h_kv, G*T_q, d)`` -> ``(B, T_q, h_q*d)``."""
    B, h_kv, R, d = o.shape
    G = R // T_q
    return (o.reshape(B, h_kv, G, T_q, d)
             .transpose(0, 3, 1, 2, 4)
             .reshape(B, T_q, h_kv * G * d))


@np.errstate(over="ignore", invalid="ignore")  # overflowed scores become NaN, reported
def local_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *,
                    scale: float, tile: int = 1024, start: int = 0,
                    causal_limit: np.ndarray | None = None,
                    on_tile: Optional[Callable[[int, int, int, float, float], None]] = None
                    ) -> Partial:
    """Sweep one rank's slice in tiles of ``tile`` tokens with an online softmax.

    Parameters
    ----------
    q : (B, h_kv, R, d) float32
        Folded queries (:func:`fold_queries`).
    k, v : (B, h_kv, S_local, d) float32 or float16
        The rank's resident slice (:func:`gqa_mpi.step.sweeps.make_resident`);
        ``S_local`` may be 0. float16
        tiles are widened to float32 one tile at a time; accumulation is float32.
    scale : float
        Multiplies every score ``q . k``.
    tile : int
        Tokens per tile; scratch memory is ``O(B * h_kv * R * tile)``
        whatever ``S_local`` is.
    start : int
        Global index of the slice's first token (for the causal mask).
    causal_limit : (R,) int array, optional
        Row ``r`` sees global keys ``<= causal_limit[r]``; None for no mask.
    on_tile : callable, optional
        ``on_tile(index, s0, s1, t_start, t_end)`` after each tile (for tracing).

    Returns
    -------
    Partial
        ``(m, l, O)`` of this slice; the empty partial when ``S_local == 0``.
    """
    B, h_kv, R, d = q.shape
    S_local = k.shape[2]
    qs = (q * np.float32(scale)).astype(np.float32, copy=False)
    m, l, O = empty_partial(B, h_kv, R, d)
    # Scratch reused by every tile: its size depends on the tile, never on S_local.
    width = min(tile, S_local)
    scores_buf = np.empty((B, h_kv, R, width), dtype=np.float32)
    pv = np.empty_like(O)
    widen = k.dtype != np.float32
    if widen:
        k_buf, v_buf = (np.empty((B, h_kv, width, d), dtype=np.float32) for _ in "kv")
    for s0 in range(0, S_local, tile):
        t0 = time.perf_counter() if on_tile else 0.0
        s1 = min(s0 + tile, S_local)
        scores = scores_buf if s1 - s0 == width else np.empty((B, h_kv, R, s1 - s0),
                                                              dtype=np.float32)
        k_t, v_t = k[:, :, s0:s1], v[:, :, s0:s1]
        if widen:
            k_t, v_t = k_buf[:, :, :s1 - s0], v_buf[:, :, :s1 - s0]
            np.copyto(k_t, k[:, :, s0:s1])
            np.copyto(v_t, v[:, :, s0:s1])
        np.matmul(qs, k_t.swapaxes(-1, -2), out=scores)  # (B, h_kv, R, t)
        if causal_limit is not None and start + s1 - 1 > causal_limit.min():
            hidden = np.arange(start + s0, start + s1)[None, :] > causal_limit[:, None]
            np.copyto(scores, -np.inf, where=hidden)
        m_new = np.maximum(m, scores.max(axis=-1))
        shift = _shift(m_new)
        np.subtract(scores, shift[..., None], out=scores)
        np.exp(scores, out=scores)
        alpha = np.exp(m - shift)
        l *= alpha
        l += scores.sum(axis=-1)
        O *= alpha[..., None]
        O += np.matmul(scores, v_t, out=pv)
        m = m_new
        if on_tile:
            on_tile(s0 // tile, start + s0, start + s1, t0, time.perf_counter())
    return Partial(m, l, O)


def causal_limits(S_kv: int, T_q: int, G: int) -> np.ndarray:
    """Last visible key per folded row: query ``t`` sees keys ``0 .. S_kv - T_q + t``."""
    t = np.arange(G * T_q) % T_q
    return S_kv - T_q + t


def finalize(p: Partial) -> np.ndarray:
    """``O / l`` as float32; rows that saw no key (``l == 0``) give zeros, and a NaN
    anywhere in a row's partial stays NaN (it is never turned into a zero)."""
    l = p.l[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(l == 0, np.float32(0), p.O / np.where(l == 0, 1, l))
    return out.astype(np.float32, copy=False)
