"""The local sweeps: the NumPy tile sweep (the reference) and the fused C sweep.

No MPI here. Both compute the same partial ``(m, l, O)`` of one rank's slice
(:func:`gqa_mpi.step.attention.local_attention` is the NumPy one); they differ in how the
resident slice is laid out and in speed:

=======  ======================================================================
numpy    K and V as ``(B, h_kv, S_local, d)``; two BLAS products per tile with
         M = G*T_q rows; float16 K/V are widened one tile at a time
fused    ``gqa_mpi._fused`` (C, built at install): K in blocks of 16 tokens laid
         out ``(d, 16)``, V as ``(B, h_kv, S_local, d)``; one pass per tile does
         scores, online softmax and P @ V with each K and V value read once for
         all G*T_q rows; float16 K/V widened in registers. AVX-512, AVX2+FMA+F16C
         or portable C, picked at import from the CPU
=======  ======================================================================

``--kernel auto`` takes ``fused`` when it loads, else ``numpy`` with one line saying
why (:func:`select`).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import numpy as np

from .attention import Partial, empty_partial, local_attention

try:
    from .. import _fused
    FUSED_ERROR: Optional[str] = None
except ImportError as e:  # not built (no compiler at install) or not loadable here
    _fused = None
    FUSED_ERROR = f"gqa_mpi._fused is not available ({e})"

BLOCK = 16
"""Tokens per K block of the fused layout (one AVX-512 vector of scores)."""


ALIGN = 4096
"""Bytes the resident K and V start on: a page, so that every vector load of the fused
kernel lies in one cache line. NumPy's large arrays start 16 bytes into a line, where
each 64-byte load spans two (on the Xeon this made the sweep's loops, K and V in cache,
1.2-1.8 times as long)."""


def aligned(shape, dtype, zero: bool = False) -> np.ndarray:
    """An uninitialised (or, with ``zero``, zeroed) C-contiguous array that starts on
    :data:`ALIGN` bytes."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (np.zeros if zero else np.empty)(nbytes + ALIGN, np.uint8)
    at = -raw.ctypes.data % ALIGN
    return raw[at:at + nbytes].view(dtype).reshape(shape)


def isa(rows: int = 0, dtype=np.float32) -> str:
    """The instruction set the fused sweep of ``rows`` query rows per KV head (K and V of
    ``dtype``) runs on here, 'avx512', 'avx2' or 'generic'; with ``rows`` 0 the best this
    CPU has; 'none' where the fused sweep is not built. On a CPU with AVX-512 and AVX2, a
    sweep whose groups of rows wait on memory runs on AVX2 (docs/performance.md)."""
    if _fused is None:
        return "none"
    return _fused.isa(rows, np.dtype(dtype) == np.float16)


def key_blocks(S: int, B: int, h_kv: int, d: int, dtype) -> np.ndarray:
    """An empty K of ``S`` tokens in the fused layout, ``(B, h_kv, ceil(S/16), d, 16)``.

    Token ``16*b + j`` of head ``h`` is ``out[:, h, b, :, j]``; the tail of the last
    block stays zero (the kernel never reads it as a token).
    """
    return aligned((B, h_kv, -(-S // BLOCK), d, BLOCK), dtype, zero=True)


def put_key_blocks(out: np.ndarray, rows: np.ndarray, at: int) -> None:
    """Write ``rows`` ``(B, n, h_kv*d)`` as tokens ``at .. at+n`` of a :func:`key_blocks`
    array (whole blocks at once where ``at`` is a multiple of 16)."""
    B, n, _ = rows.shape
    h_kv, d = out.shape[1], out.shape[3]
    if at % BLOCK:                     # a few tokens appended mid-block: one by one
        t = at + np.arange(n)
        out[:, :, t // BLOCK, :, t % BLOCK] = rows.reshape(B, n, h_kv, d).transpose(1, 0, 2, 3)
        return
    full, tail = divmod(n, BLOCK)
    b = at // BLOCK
    out[:, :, b:b + full] = (rows[:, :full * BLOCK].reshape(B, full, BLOCK, h_kv, d)
                             .transpose(0, 3, 1, 4, 2))
    if tail:
        out[:, :, b + full, :, :tail] = (rows[:, full * BLOCK:].reshape(B, tail, h_kv, d)
                                         .transpose(0, 2, 3, 1))


def put_rows(out: np.ndarray, rows: np.ndarray, at: int) -> None:
    """Write ``rows`` ``(B, n, h_kv*d)`` as tokens ``at .. at+n`` of a resident
    ``(B, h_kv, S, d)`` array: every tile of every head is then one contiguous block
    that BLAS reads without a copy."""
    B, n, _ = rows.shape
    h_kv, d = out.shape[1], out.shape[3]
    out[:, :, at:at + n] = rows.reshape(B, n, h_kv, d).transpose(0, 2, 1, 3)


class NumpySweep:
    """The reference sweep of :mod:`gqa_mpi.step.attention` (BLAS products per tile)."""

    name = "numpy"

    @staticmethod
    def sweep(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, count: Optional[int] = None,
              **kw) -> Partial:
        """:func:`~gqa_mpi.step.attention.local_attention` over the first ``count``
        tokens of the resident ``k``, ``v`` (all of them by default)."""
        return local_attention(q, k[:, :, :count], v[:, :, :count], **kw)

    @staticmethod
    def empty_k(S: int, B: int, h_kv: int, d: int, dtype) -> np.ndarray:
        return aligned((B, h_kv, S, d), dtype)

    put_k = staticmethod(put_rows)


class FusedSweep:
    """The C kernel: one pass per tile, each K and V value read once for all rows."""

    name = "fused"
    empty_k = staticmethod(key_blocks)
    put_k = staticmethod(put_key_blocks)

    @staticmethod
    def scratch_bytes(rows: int, d: int) -> int:
        """The scratch one sweep allocates for ``rows`` query rows of ``d``: a block's
        scores, the rows transposed and the tile's partial."""
        return _fused.scratch_bytes(rows, d)

    @staticmethod
    def sweep(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float,
              tile: int = 1024, start: int = 0, causal_limit: Optional[np.ndarray] = None,
              on_tile: Optional[Callable] = None, count: Optional[int] = None) -> Partial:
        """Same contract as :func:`gqa_mpi.step.attention.local_attention`; ``k`` in the
        :func:`key_blocks` layout, ``v`` resident, both float32 or both float16; only
        the first ``count`` tokens (all by default) are swept."""
        B, h_kv, R, d = q.shape
        S_local = v.shape[2] if count is None else count
        tile = max(1, min(tile, S_local))   # the kernel's scratch is sized by the tile
        qs = np.ascontiguousarray(q * np.float32(scale), dtype=np.float32)
        p = empty_partial(B, h_kv, R, d)
        row_hi = None
        if causal_limit is not None:
            row_hi = np.clip(np.asarray(causal_limit, dtype=np.int64) - start + 1,
                             0, S_local).astype(np.int64)
        if on_tile is None:
            _fused.sweep(qs, k, v, p.m, p.l, p.O, 0, S_local, tile, row_hi)
            return p
        for s0 in range(0, S_local, tile):
            s1 = min(s0 + tile, S_local)
            t0 = time.perf_counter()
            _fused.sweep(qs, k, v, p.m, p.l, p.O, s0, s1, tile, row_hi)
            on_tile(s0 // tile, start + s0, start + s1, t0, time.perf_counter())
        return p


CHUNK = 8192
"""Tokens converted at a time when a slice is made resident (a multiple of 16)."""


def make_resident(kernel, rows: Callable[[str, int, int], np.ndarray], n: int, B: int,
                  h_kv: int, d: int, dtype, capacity: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """K and V of an ``n``-token slice in ``kernel``'s layout, as ``dtype``, with room
    for ``capacity`` tokens in all (for a cache that grows: :func:`append`).

    ``rows(name, i, j)`` gives tokens ``i:j`` of the slice as ``(B, j-i, h_kv*d)`` in
    any float dtype (generated, or a memory map). They are converted ``CHUNK`` tokens
    at a time, so loading never holds more than the resident slice and one chunk.
    """
    room = max(n, capacity)
    k = kernel.empty_k(room, B, h_kv, d, dtype)
    v = aligned((B, h_kv, room, d), dtype)
    for i in range(0, n, CHUNK):
        j = min(i + CHUNK, n)
        kernel.put_k(k, rows("k", i, j), i)
        put_rows(v, rows("v", i, j), i)
    return k, v


def append(kernel, k: np.ndarray, v: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray,
           at: int) -> None:
    """Write new tokens ``(B, n, h_kv*d)`` at ``at .. at+n`` of a resident K and V."""
    kernel.put_k(k, k_rows, at)
    put_rows(v, v_rows, at)


def grow(kernel, k: np.ndarray, v: np.ndarray, capacity: int) -> Tuple[np.ndarray, np.ndarray]:
    """A resident K and V with room for ``capacity`` tokens, holding ``k``'s and ``v``'s
    (both layouts keep tokens, or blocks of them, on axis 2)."""
    B, h_kv, _, d = v.shape
    k2 = kernel.empty_k(capacity, B, h_kv, d, v.dtype)
    v2 = aligned((B, h_kv, capacity, d), v.dtype)
    k2[:, :, :k.shape[2]] = k
    v2[:, :, :v.shape[2]] = v
    return k2, v2


def select(name: str):
    """``(kernel, note)`` for ``--kernel name``; ``note`` says why auto fell back.

    Raises ValueError when ``fused`` is asked for and cannot load.
    """
    if name == "numpy":
        return NumpySweep, None
    if _fused is not None:
        return FusedSweep, None
    if name == "fused":
        raise ValueError(f"--kernel fused: {FUSED_ERROR}; reinstall with a C compiler "
                         f"(pip install -e .) or use --kernel numpy")
    return NumpySweep, f"fused kernel unavailable, using the NumPy sweep: {FUSED_ERROR}"
