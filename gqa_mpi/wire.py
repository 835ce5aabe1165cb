"""What one hop of the reduction carries, and what the carrying loses. No MPI here.

=========  ==========================================  =========================
wire       messages per hop                            note
=========  ==========================================  =========================
fp32       ``m``, ``l``, ``O``, float32                 default; exact for any S_kv
kernel     ``m``, ``l``, ``O``, float16                 the kernel's own wire
packed     ``mlO``: m, l and O in one float32 buffer    fewest latencies
=========  ==========================================  =========================

float16 tops out at 65504: ``l`` alone exceeds it once a partial has seen more than
65504 keys of equal score. :func:`encode` counts such losses instead of letting them
pass silently.
"""
from __future__ import annotations

from typing import List, NamedTuple, Tuple

import numpy as np

from .attention import Partial

TAGS = {"m": 1, "l": 2, "O": 3, "mlO": 4}
"""MPI tag of each tensor, so a hop's messages cannot be confused."""


class Loss(NamedTuple):
    """What a float16 hop lost: elements that became inf, and the largest change of m."""

    overflow: int = 0
    m_rounding: float = 0.0

    def __add__(self, other):  # type: ignore[override]
        return Loss(self.overflow + other.overflow, max(self.m_rounding, other.m_rounding))


def _dtype(wire: str):
    return np.float16 if wire == "kernel" else np.float32


def pack(p: Partial) -> np.ndarray:
    """``[m | l | O]`` as one contiguous float32 buffer."""
    return np.concatenate([p.m.ravel(), p.l.ravel(), p.O.ravel()]).astype(np.float32,
                                                                          copy=False)


def unpack(flat: np.ndarray, like: Partial) -> Partial:
    """The partial held by a :func:`pack` ed buffer, shaped like ``like`` (a view)."""
    a, b = like.m.size, like.m.size + like.l.size
    return Partial(flat[:a].reshape(like.m.shape), flat[a:b].reshape(like.l.shape),
                   flat[b:].reshape(like.O.shape))


def encode(p: Partial, wire: str) -> Tuple[List[Tuple[str, np.ndarray]], Loss]:
    """The buffers of one hop, in send order, and what casting to them lost."""
    if wire == "packed":
        return [("mlO", pack(p))], Loss()
    dtype = _dtype(wire)
    bufs = [(name, np.ascontiguousarray(x, dtype=dtype)) for name, x in zip("mlO", p)]
    if dtype == np.float32:
        return bufs, Loss()
    m16, l16, O16 = (b for _, b in bufs)
    overflow = sum(int(np.count_nonzero(np.isinf(lo) & np.isfinite(hi)))
                   for lo, hi in ((m16, p.m), (l16, p.l), (O16, p.O)))
    finite = np.isfinite(p.m) & np.isfinite(m16)
    rounding = float(np.max(np.abs(m16[finite].astype(np.float32) - p.m[finite]),
                            initial=0.0))
    return bufs, Loss(overflow, rounding)


def receive_buffers(like: Partial, wire: str) -> List[Tuple[str, np.ndarray]]:
    """Empty buffers for one incoming hop, shaped like ``like``."""
    if wire == "packed":
        n = like.m.size + like.l.size + like.O.size
        return [("mlO", np.empty(n, dtype=np.float32))]
    dtype = _dtype(wire)
    return [(name, np.empty(x.shape, dtype=dtype)) for name, x in zip("mlO", like)]


def as_message(buf: np.ndarray):
    """``buf`` as MPI sees it: float16 travels as its 16-bit patterns (``uint16``),
    because MPI has no standard float16 datatype (Open MPI 4 refuses one)."""
    return buf.view(np.uint16) if buf.dtype == np.float16 else buf


def decode(bufs: List[Tuple[str, np.ndarray]], like: Partial) -> Partial:
    """The float32 partial held by ``bufs`` (the inverse of :func:`encode`)."""
    if len(bufs) == 1:
        return unpack(bufs[0][1], like)
    return Partial(*(b.astype(np.float32) for _, b in bufs))
