"""What one hop of the reduction carries, and what the carrying loses. No MPI here.

=========  ==========================================  =========================
wire       messages per hop                            note
=========  ==========================================  =========================
fp32       ``m``, ``l``, ``O``, float32                 default; exact for any S_kv
kernel     ``m``, ``l``, ``O``, float16                 the kernel's own wire
packed     ``mlO``: m, l and O in one float32 buffer    fewest latencies
=========  ==========================================  =========================

float16 tops out at 65504: ``l`` alone exceeds it once a partial has seen more than
65504 keys of equal score. :meth:`Wire.encode` counts such losses instead of letting
them pass silently. Each wire is one :data:`WIRES` entry owning its name, help text
and check tolerance.
"""
from __future__ import annotations

from typing import List, NamedTuple, Tuple

import numpy as np

from .attention import Partial
from .registry import Registry

Buffers = List[Tuple[str, np.ndarray]]

TAGS = {"m": 1, "l": 2, "O": 3, "mlO": 4}
"""MPI tag of each tensor, so a hop's messages cannot be confused."""


class Loss(NamedTuple):
    """What a hop lost: elements that became inf, and the largest change of m."""

    overflow: int = 0
    m_rounding: float = 0.0

    def __add__(self, other):  # type: ignore[override]
        return Loss(self.overflow + other.overflow, max(self.m_rounding, other.m_rounding))


def pack(p: Partial) -> np.ndarray:
    """``[m | l | O]`` as one contiguous float32 buffer."""
    return np.concatenate([p.m.ravel(), p.l.ravel(), p.O.ravel()]).astype(np.float32,
                                                                          copy=False)


def unpack(flat: np.ndarray, like: Partial) -> Partial:
    """The partial held by a :func:`pack` ed buffer, shaped like ``like`` (a view)."""
    a, b = like.m.size, like.m.size + like.l.size
    return Partial(flat[:a].reshape(like.m.shape), flat[a:b].reshape(like.l.shape),
                   flat[b:].reshape(like.O.shape))


def as_message(buf: np.ndarray):
    """``buf`` as MPI sees it: float16 travels as its 16-bit patterns (``uint16``),
    because MPI has no standard float16 datatype (Open MPI 4 refuses one)."""
    return buf.view(np.uint16) if buf.dtype == np.float16 else buf


def cast_loss(p: Partial, sent: Partial) -> Loss:
    """What casting ``p`` to the buffers ``sent`` lost: new infs, and m's rounding."""
    overflow = sum(int(np.count_nonzero(np.isinf(lo) & np.isfinite(hi)))
                   for lo, hi in zip(sent, p))
    finite = np.isfinite(p.m) & np.isfinite(sent.m)
    rounding = float(np.max(np.abs(sent.m[finite].astype(np.float32) - p.m[finite]),
                            initial=0.0))
    return Loss(overflow, rounding)


class Wire:
    """A hop format: ``m``, ``l``, ``O`` as three messages of ``dtype``."""

    name = ""
    help = ""
    tolerance = 1e-4
    """Largest accepted normwise error of the check (before m rounding)."""
    dtype = np.float32

    @property
    def lossy(self) -> bool:
        """Whether a hop rounds what it carries (anything narrower than float32)."""
        return np.dtype(self.dtype).itemsize < 4

    def encode(self, p: Partial) -> Tuple[Buffers, Loss]:
        """The buffers of one hop, in send order, and what casting to them lost."""
        with np.errstate(over="ignore"):          # overflow is counted, not warned about
            bufs = [(name, np.ascontiguousarray(x, dtype=self.dtype))
                    for name, x in zip("mlO", p)]
        if self.dtype == np.float32:
            return bufs, Loss()
        return bufs, cast_loss(p, Partial(*(b for _, b in bufs)))

    def buffers(self, like: Partial) -> Buffers:
        """Empty buffers for one incoming hop, shaped like ``like``."""
        return [(name, np.empty(x.shape, dtype=self.dtype)) for name, x in zip("mlO", like)]

    def decode(self, bufs: Buffers, like: Partial) -> Partial:
        """The float32 partial held by ``bufs`` (the inverse of :meth:`encode`)."""
        return Partial(*(b.astype(np.float32) for _, b in bufs))


WIRES: Registry[Wire] = Registry("--wire")


@WIRES.register
class Fp32(Wire):
    name = "fp32"
    help = "m, l, O as three float32 messages"


@WIRES.register
class Kernel(Wire):
    """float32 accumulation over many tiles stays far below 1e-4; the kernel's float16
    wire rounds l and O to 11 bits, hence 1e-2."""

    name = "kernel"
    help = ("the same in float16, as the kernel sends (overflow is detected and "
            "reported)")
    tolerance = 1e-2
    dtype = np.float16


@WIRES.register
class Packed(Wire):
    name = "packed"
    help = "m, l, O in one float32 message per hop"

    def encode(self, p: Partial) -> Tuple[Buffers, Loss]:
        return [("mlO", pack(p))], Loss()

    def buffers(self, like: Partial) -> Buffers:
        return [("mlO", np.empty(like.m.size + like.l.size + like.O.size, np.float32))]

    def decode(self, bufs: Buffers, like: Partial) -> Partial:
        return unpack(bufs[0][1], like)
