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
        own error sets the pass rule's scale (:func:`gqa_mpi.report.compare`).

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


def kernel_reference(q, k, v, *, h_kv: int, n_ranks: int, tile: int) -> np.ndarray:
    """float64 model of what the kernel computes (``--kernel-faithful``), no MPI.

    Inputs rounded to float16; ``S_local = S_kv // n_ranks`` tokens per rank (tail
    dropped); Q read as the first ``G*T_q*d`` values as ``(G*T_q, d)``; tile ``t`` of
    each rank's ``(S_local, h_kv*d)`` slice read from element ``t*tile*d`` as
    ``(d, tile_s)`` for K and ``(tile_s, d)`` for V; no scale; one softmax over all
    the scores. The ``(G*T_q, d)`` result lands at the start of a zeroed O like Q.

    Parameters
    ----------
    q : (T_q, h_q*d) or (1, T_q, h_q*d)
    k, v : (S_kv, h_kv*d) or (1, S_kv, h_kv*d)
    """
    shape = np.shape(q)
    q, k, v = (np.asarray(x, dtype=np.float16).astype(np.float64).reshape(-1, x.shape[-1])
               for x in (np.asarray(q), np.asarray(k), np.asarray(v)))
    T_q = q.shape[0]
    d = k.shape[-1] // h_kv
    G = q.shape[-1] // d // h_kv
    S_local = k.shape[0] // n_ranks
    q_rows = q.ravel()[:G * T_q * d].reshape(G * T_q, d)
    scores, values = [], []
    for r in range(n_ranks):
        k_flat = k[r * S_local:(r + 1) * S_local].ravel()
        v_flat = v[r * S_local:(r + 1) * S_local].ravel()
        for s0 in range(0, S_local, tile):
            ts = min(tile, S_local - s0)
            scores.append(q_rows @ k_flat[s0 * d:(s0 + ts) * d].reshape(d, ts))
            values.append(v_flat[s0 * d:(s0 + ts) * d].reshape(ts, d))
    s = np.concatenate(scores, axis=1)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    o = (p / p.sum(axis=1, keepdims=True)) @ np.concatenate(values, axis=0)
    out = np.zeros(int(np.prod(shape)))
    out[:o.size] = o.ravel()
    return out.reshape(shape)
