"""An obviously correct float64 GQA attention: plain softmax, no tiling, no MPI.

Used to check the distributed result; it shares no code with the fast path.
"""
from __future__ import annotations

import numpy as np


def attention_reference(q, k, v, *, h_kv: int, scale: float | None = None,
                        causal: bool = False, dtype=np.float64) -> np.ndarray:
    """Exact GQA attention in float64 (or, as a control, in ``dtype``).

    IEEE arithmetic all the way: a NaN or inf in Q, K or V, or scores that overflow,
    give NaN in the rows they reach, never a silent zero. Only a query that sees no
    key at all (causal) gives zeros.

    Parameters
    ----------
    q : (B, T_q, h_q*d) or (T_q, h_q*d)
    k, v : (B, S_kv, h_kv*d) or (S_kv, h_kv*d)
    h_kv : int
        KV heads; ``d = k.shape[-1] // h_kv`` and query head ``j`` uses KV head ``j // G``.
    scale : float, optional
        Score multiplier, ``1/sqrt(d)`` by default.
    causal : bool
        Query ``t`` sees keys ``0 .. S_kv - T_q + t``; a query that sees none gives zeros.

    dtype : float64 for the reference; float32 gives the untiled float32 control whose
        own error sets the pass rule's scale (:func:`gqa_mpi.app.check.compare`).

    Returns
    -------
    (B, T_q, h_q*d) or (T_q, h_q*d) of ``dtype``, the layout of ``q``.
    """
    squeeze = np.ndim(q) == 2
    q, k, v = (np.asarray(x) for x in (q, k, v))       # converted one head at a time
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    B, T_q, width_q = q.shape
    S_kv = k.shape[1]
    d = k.shape[-1] // h_kv
    h_q = width_q // d
    G = h_q // h_kv
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    scale = dtype(scale)
    visible = np.ones((T_q, S_kv), dtype=bool)
    if causal:
        visible = np.arange(S_kv)[None, :] <= (S_kv - T_q + np.arange(T_q))[:, None]
    out = np.zeros((B, T_q, h_q, d), dtype=dtype)
    qh = q.reshape(B, T_q, h_q, d).astype(dtype)
    for h in range(h_kv):
        kh = k[:, :, h * d:(h + 1) * d].astype(dtype)     # (B, S, d)
        vh = v[:, :, h * d:(h + 1) * d].astype(dtype)
        qg = qh[:, :, h * G:(h + 1) * G].reshape(B, T_q * G, d)
        with np.errstate(all="ignore"):                  # NaN and inf propagate
            s = (qg @ kh.transpose(0, 2, 1)).reshape(B, T_q, G, S_kv) * scale
            s = np.where(visible[None, :, None, :], s, -np.inf)
            smax = s.max(axis=-1, keepdims=True, initial=-np.inf)
            smax = np.where(np.isneginf(smax), 0, smax)  # a row that sees no key
            p = np.exp(s - smax)
            denom = p.sum(axis=-1, keepdims=True)
            p = np.divide(p, denom, out=np.zeros_like(p), where=denom != 0)
            out[:, :, h * G:(h + 1) * G] = (p.reshape(B, T_q * G, S_kv) @ vh
                                            ).reshape(B, T_q, G, d)
    out = out.reshape(B, T_q, h_q * d)
    return out[0] if squeeze else out


# ---- the same attention a chunk of keys at a time, for a check that streams the cache
#
# A partial is ``(m, l, o)``: per query head the largest score ``m``, the sum ``l`` of
# ``exp(s - m)`` and the unnormalised output ``o``, all in the reference's own dtype.
# This merge is written here, apart from :mod:`gqa_mpi.core.attention`'s, so that the
# check never reuses the arithmetic it checks.

def reference_partial(q, k, v, *, h_kv: int, scale: float | None = None,
                      first: int = 0, cache_len: int | None = None, causal: bool = False,
                      dtype=np.float64):
    """``(m, l, o)`` of exact attention of ``q`` over keys ``first .. first+n`` of a
    cache of ``cache_len`` tokens (``k``, ``v`` hold those ``n`` rows).

    Parameters as :func:`attention_reference`, with 3-D ``q (B, T_q, h_q*d)`` and
    ``k, v (B, n, h_kv*d)``; ``first`` and ``cache_len`` place the chunk for the
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
