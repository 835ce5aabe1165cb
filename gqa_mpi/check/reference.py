"""An obviously correct float64 GQA attention, a chunk of keys at a time: plain
softmax within a chunk, its own merge between chunks, no MPI.

The streamed check builds on it; it shares no code with the fast path. (The same
attention in one piece, for the tests, is ``tests/whole_reference.py``.)
"""
from __future__ import annotations

import numpy as np


# ---- the same attention a chunk of keys at a time, for a check that streams the cache
#
# A partial is ``(m, l, o)``: per query head the largest score ``m``, the sum ``l`` of
# ``exp(s - m)`` and the unnormalised output ``o``, all in the reference's own dtype.
# This merge is written here, apart from :mod:`gqa_mpi.step.attention`'s, so that the
# check never reuses the arithmetic it checks.

def reference_partial(q, k, v, *, h_kv: int, scale: float | None = None,
                      first: int = 0, cache_len: int | None = None, causal: bool = False,
                      dtype=np.float64):
    """``(m, l, o)`` of exact attention of ``q`` over keys ``first .. first+n`` of a
    cache of ``cache_len`` tokens (``k``, ``v`` hold those ``n`` rows).

    ``q (B, T_q, h_q*d)``, ``k, v (B, n, h_kv*d)``; ``h_kv`` KV heads (``d`` is
    ``k``'s width over it), query head ``j`` using KV head ``j // G``; ``scale``
    ``1/sqrt(d)`` by default; ``first`` and ``cache_len`` place the chunk for the
    causal mask. Returns ``m, l (B, T_q, h_q)`` and ``o (B, T_q, h_q, d)``; a query
    that sees no key of the chunk has ``m = -inf``, ``l = 0``, ``o = 0``.
    """
    B, T_q, width_q = q.shape
    n = k.shape[1]
    d = k.shape[-1] // h_kv
    h_q = width_q // d
    G = h_q // h_kv
    scale = dtype(1.0 / np.sqrt(d) if scale is None else scale)
    # every head at once: (B, h_kv, T_q*G, d) @ (B, h_kv, d, n), K read in place
    qh = np.ascontiguousarray(np.asarray(q, dtype=dtype).reshape(B, T_q, h_kv, G, d)
                              .transpose(0, 2, 1, 3, 4)).reshape(B, h_kv, T_q * G, d)
    kh = np.asarray(k, dtype=dtype).reshape(B, n, h_kv, d).transpose(0, 2, 3, 1)
    vh = np.asarray(v, dtype=dtype).reshape(B, n, h_kv, d).transpose(0, 2, 1, 3)
    with np.errstate(all="ignore"):                     # NaN and inf propagate
        s = (qh @ kh).reshape(B, h_kv, T_q, G, n)
        s *= scale
        if causal:
            last = cache_len - T_q + np.arange(T_q)     # the newest key query t sees
            hidden = (first + np.arange(n))[None, :] > last[:, None]
            np.copyto(s, -np.inf, where=hidden[:, None, :])
        m = s.max(axis=-1, initial=-np.inf)             # (B, h_kv, T_q, G)
        shift = np.where(np.isneginf(m), 0, m)
        s -= shift[..., None]
        np.exp(s, out=s)
        l = s.sum(axis=-1)
        o = (s.reshape(B, h_kv, T_q * G, n) @ vh).reshape(B, h_kv, T_q, G, d)
    heads = lambda a: np.moveaxis(a, 1, 2).reshape(B, T_q, h_q, *a.shape[4:])  # noqa: E731
    return heads(m), heads(l), heads(o)


def float16_values(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``x`` rounded to the nearest float16 (ties to even), kept as float32
    (in ``out`` if given): the values a rank holds when K and V are resident in float16.

    The same numbers as ``x.astype(float16).astype(float32)`` at a fraction of its cost:
    normal float16 values are rounded in the float32 bits (the low 13 bits of the
    significand, to nearest even); subnormals, overflow, inf and NaN go through NumPy.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x) if out is None else out
    bits, o = x.view(np.uint32), out.view(np.uint32)
    np.right_shift(bits, np.uint32(13), out=o)
    np.bitwise_and(o, np.uint32(1), out=o)              # ties go to the even neighbour
    o += np.uint32(0xFFF)
    o += bits
    o &= np.uint32(0xFFFFE000)
    # float16's normal range is float32 exponent bits 0x38800000 .. 0x477FEFFF (|x| from
    # 2**-14 to just below 65520); one unsigned comparison finds what lies outside it
    e = np.bitwise_and(bits, np.uint32(0x7FFFFFFF))
    e -= np.uint32(0x38800000)
    odd = np.flatnonzero(e >= np.uint32(0x477FF000 - 0x38800000))
    if odd.size:
        with np.errstate(over="ignore"):                 # overflow is inf, as in float16
            out.reshape(-1)[odd] = x.reshape(-1)[odd].astype(np.float16).astype(np.float32)
    return out


def reference_merge(a, b):
    """The partial of two disjoint key sets from theirs, in their dtype."""
    (ma, la, oa), (mb, lb, ob) = a, b
    with np.errstate(all="ignore"):
        m = np.maximum(ma, mb)                          # NaN propagates
        base = np.where(np.isneginf(m), 0, m)
        wa = np.where(np.isneginf(ma), 0, np.exp(ma - base)).astype(ma.dtype)
        wb = np.where(np.isneginf(mb), 0, np.exp(mb - base)).astype(mb.dtype)
        return m, la * wa + lb * wb, oa * wa[..., None] + ob * wb[..., None]


def reference_finish(partial) -> np.ndarray:
    """``o / l`` of a partial, ``(B, T_q, h_q*d)``; zeros where no key was seen."""
    _, l, o = partial
    with np.errstate(all="ignore"):
        out = np.where(l[..., None] != 0, o / np.where(l == 0, 1, l)[..., None], 0)
    return out.astype(o.dtype).reshape(*o.shape[:2], -1)
