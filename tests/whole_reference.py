"""Exact float64 GQA attention in one piece (plain softmax, no tiling, no MPI): the
tests' yardstick beside the streamed check's chunked reference
(:mod:`gqa_mpi.check.reference`), with which it shares no code."""
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
        own error sets the pass rule's scale (:func:`gqa_mpi.check.judge.compare`).

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
