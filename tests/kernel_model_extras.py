"""Test-only companions of :mod:`gqa_mpi.check.kernel_model`: the kernel's operands as
the retired ``--kernel-faithful`` mode read them, and the model folded over a whole
cache in memory (what the streamed check computes a unit at a time)."""
import numpy as np

from gqa_mpi.check.kernel_model import (kernel_output, kernel_partial, kernel_rows,
                                       kernel_units)
from gqa_mpi.check.reference import reference_finish, reference_merge


def kernel_operands(q: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray, *,
                    group: int, d: int, tile: int):
    """Q, K, V of one rank as the kernel reads them, in :mod:`~gqa_mpi.step.attention` layout.

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




def kernel_reference(q, k, v, *, h_kv: int, n_ranks: int, tile: int) -> np.ndarray:
    """float64 model of what the kernel computes (``--kernel-faithful``), no MPI.

    Inputs rounded to float16; ``S_local = S_kv // n_ranks`` tokens per rank (tail
    dropped); Q read as the first ``G*T_q*d`` values as ``(G*T_q, d)``; tile ``t`` of
    each rank's ``(S_local, h_kv*d)`` slice read from element ``t*tile*d`` as
    ``(d, tile_s)`` for K and ``(tile_s, d)`` for V; no scale; one softmax over all
    the scores (merged a rank's slice at a time, as the streamed check does). The
    ``(G*T_q, d)`` result lands at the start of a zeroed O like Q.

    Parameters
    ----------
    q : (T_q, h_q*d) or (1, T_q, h_q*d)
    k, v : (S_kv, h_kv*d) or (1, S_kv, h_kv*d)
    """
    k, v = (np.asarray(x).reshape(-1, np.shape(x)[-1]) for x in (k, v))
    S_kv, width = k.shape
    acc = None
    for unit in kernel_units(S_kv, n_ranks, tile, tiles=S_kv):    # a rank's slice each
        a, b = kernel_rows(S_kv, n_ranks, unit, width, width // h_kv)
        part = kernel_partial(q, k[a:b], v[a:b], S_kv=S_kv, n_ranks=n_ranks, unit=unit,
                              h_kv=h_kv, tile=tile)
        acc = part if acc is None else reference_merge(acc, part)
    if acc is None:
        raise ValueError(f"S_kv={S_kv} < {n_ranks} ranks: the kernel reads no token")
    return kernel_output(reference_finish(acc), np.shape(q), dtype=np.float64)


