"""Every way this machine has of reading some arrays once: the bench's read limit is
the fastest of them, so that no kernel can beat it by reading more cleverly.

- ``numpy.sum`` and ``numpy.dot`` over the bytes seen as float32 (the bench's limit
  before: NumPy's sum streams at about half of what a core can);
- ``sgemv``: a BLAS matrix-vector product of the bytes (as a float32 matrix) against a
  vector of ones;
- ``torch.sum``, where PyTorch is installed;
- ``C``: :func:`gqa_mpi._fused.read`, a vectorised streaming read on the sweep's
  instruction set, one array after the other or in turns of 64 KiB (as the sweep
  reads K and V), each line prefetched 0, 4, 16 or 64 KiB ahead, or (as the sweep
  does) 64 or 128 KiB ahead and again at half that; and as eight streams at once (the
  arrays cut into pieces read in turns of 64 KiB), as a BLAS sgemv reads several rows
  at once: on one device instance sgemv read the sweep's bytes in 23.5 ms where one
  stream took 35, and on another eight streams took 29.1 ms where two took 31.8.

Each is one thread: the callers pin BLAS and PyTorch to one.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

OLD = ("numpy.sum", "numpy.dot")
"""The ways the read limit was the fastest of before: printed beside the honest one."""


def _matrix(x: np.ndarray) -> np.ndarray:
    """``x`` (flat float32) as a matrix of rows of at most 1024, covering all of it."""
    cols = next(c for c in (1024, 256, 64, 16, 4, 1) if x.size % c == 0)
    return x.reshape(-1, cols)


STREAMS = 8
"""Streams of the concurrent C read (at most what ``_fused.read`` takes at once)."""


def pieces(arrays: List[np.ndarray], streams: int = STREAMS) -> List[np.ndarray]:
    """``arrays`` (C-contiguous) cut into about ``streams`` contiguous flat pieces, in
    order: every byte in exactly one piece."""
    each = max(1, streams // len(arrays))
    return [p for a in arrays for p in np.array_split(a.reshape(-1), each) if p.size]


def ways(arrays: List[np.ndarray]) -> Dict[str, Callable[[], object]]:
    """Name -> a call that reads every byte of ``arrays`` once."""
    flat = [a.reshape(-1).view(np.uint8)[: a.nbytes // 4 * 4].view(np.float32) for a in arrays]

    def each(fn):
        return lambda: [fn(x) for x in flat]

    out = {"numpy.sum": each(np.sum), "numpy.dot": each(lambda x: np.dot(x, x))}
    mats = [_matrix(x) for x in flat]
    ones = {m.shape[0]: np.ones(m.shape[0], np.float32) for m in mats}
    out["sgemv"] = lambda: [ones[m.shape[0]] @ m for m in mats]
    try:
        import torch
        torch.set_num_threads(1)
        tensors = [torch.from_numpy(x) for x in flat]
        out["torch.sum"] = lambda: [t.sum() for t in tensors]
    except ImportError:
        pass
    try:
        from .. import _fused
    except ImportError:
        return out
    for chunk in (0, 65536):
        for ahead in (0, 4096, 16384, 65536):
            out[f"C chunk={chunk // 1024}K ahead={ahead // 1024}K"] = (
                lambda chunk=chunk, ahead=ahead: _fused.read(arrays, ahead, chunk))
        for ahead in (65536, 131072):
            out[f"C chunk={chunk // 1024}K ahead={ahead // 1024}K twice"] = (
                lambda chunk=chunk, ahead=ahead: _fused.read(arrays, ahead, chunk, ahead // 2))
    cut = pieces(arrays)
    if len(arrays) < len(cut) <= STREAMS:   # more streams than arrays, no more than read takes
        for ahead in (0, 4096):
            out[f"C {len(cut)} streams chunk=64K ahead={ahead // 1024}K"] = (
                lambda ahead=ahead: _fused.read(cut, ahead, 65536))
    return out


def fastest(times: Dict[str, float]) -> Dict:
    """``{read_s, read_way, read_old_s}`` from the time each way took: the fastest of
    all, which one it was, and the fastest of the old ones (:data:`OLD`)."""
    way = min(times, key=times.get)
    return dict(read_s=times[way], read_way=way,
                read_old_s=min(times[w] for w in OLD if w in times))


def short(way: str) -> str:
    """A way's name for a table column: ``C`` for every C read."""
    return way.split(" ")[0]
