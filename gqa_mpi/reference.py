"""An obviously correct float64 GQA attention: plain softmax, no tiling, no MPI.

Used to check the distributed result; it shares no code with the fast path.
"""
from __future__ import annotations

import numpy as np


def attention_reference(q, k, v, *, h_kv: int, scale: float | None = None,
                        causal: bool = False) -> np.ndarray:
    """Exact GQA attention in float64.

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

    Returns
    -------
    (B, T_q, h_q*d) or (T_q, h_q*d) float64, the layout of ``q``.
    """
    squeeze = q.ndim == 2
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    B, T_q, width_q = q.shape
    S_kv = k.shape[1]
    d = k.shape[-1] // h_kv
    h_q = width_q // d
    G = h_q // h_kv
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    visible = np.ones((T_q, S_kv), dtype=bool)
    if causal:
        visible = np.arange(S_kv)[None, :] <= (S_kv - T_q + np.arange(T_q))[:, None]
    out = np.zeros((B, T_q, h_q, d))
    qh = q.reshape(B, T_q, h_q, d)
    for h in range(h_kv):
        kh = k[:, :, h * d:(h + 1) * d]                      # (B, S, d)
        vh = v[:, :, h * d:(h + 1) * d]
        qg = qh[:, :, h * G:(h + 1) * G]                     # (B, T_q, G, d)
        s = np.einsum("btgd,bsd->btgs", qg, kh) * scale
        s = np.where(visible[None, :, None, :], s, -np.inf)
        smax = s.max(axis=-1, keepdims=True)
        smax = np.where(np.isfinite(smax), smax, 0.0)
        p = np.exp(s - smax)
        denom = p.sum(axis=-1, keepdims=True)
        p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
        out[:, :, h * G:(h + 1) * G] = np.einsum("btgs,bsd->btgd", p, vh)
    out = out.reshape(B, T_q, h_q * d)
    return out[0] if squeeze else out
