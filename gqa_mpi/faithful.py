"""The kernel's own data layout, reproduced on request (``--kernel-faithful``). No MPI.

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

import numpy as np


def kernel_operands(q: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray, *,
                    group: int, d: int, tile: int):
    """Q, K, V of one rank as the kernel reads them, in :mod:`attention` layout.

    Parameters
    ----------
    q : (1, T_q, h_q*d)
    k_rows, v_rows : (1, S_local, h_kv*d), the rank's slice
    group : int, G = h_q / h_kv
    d, tile : int

    Returns
    -------
    q : (1, 1, G*T_q, d) float32 holding float16 values
    k, v : (1, 1, S_local, d) float32 holding float16 values; row ``s`` of ``k`` is
        column ``s - t*TILE`` of tile ``t``'s ``(d, tile_s)`` reading.
    """
    T_q = q.shape[1]
    k_rows, v_rows = np.asarray(k_rows), np.asarray(v_rows)
    S_local = k_rows.shape[1]
    as16 = lambda a: np.asarray(a, dtype=np.float16).astype(np.float32)  # noqa: E731
    qk = as16(np.ravel(q)[:group * T_q * d]).reshape(1, 1, group * T_q, d)
    kflat = as16(np.ravel(k_rows)[:S_local * d])
    vflat = as16(np.ravel(v_rows)[:S_local * d])
    k = np.empty((1, 1, S_local, d), dtype=np.float32)
    for s0 in range(0, S_local, tile):
        s1 = min(s0 + tile, S_local)
        k[0, 0, s0:s1] = kflat[s0 * d:s1 * d].reshape(d, s1 - s0).T
    return qk, k, vflat.reshape(1, 1, S_local, d)


def kernel_output(o: np.ndarray, q_shape: tuple) -> np.ndarray:
    """Place the root's ``(G*T_q, d)`` result at the start of a zeroed O like Q."""
    out = np.zeros(int(np.prod(q_shape)), dtype=np.float32)
    out[:o.size] = o.ravel()
    return out.reshape(q_shape)
