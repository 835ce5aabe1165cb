"""What one hop of the reduction carries, and what the carrying loses. No MPI here.

==========  ==========================================  ===========================
wire        messages per hop                            note
==========  ==========================================  ===========================
fp32        ``m``, ``l``, ``O``, float32                 default; exact for any S_kv
kernel      ``m``, ``l``, ``O``, float16                 the kernel's own wire (alias
                                                        ``fp16-stats``)
packed      ``mlO``: m, l and O in one float32 buffer    fewest latencies
bf16        ``m``, ``l`` float32, ``O`` bfloat16          as Helix sends
fp16        ``m``, ``l`` float32, ``O`` float16           the kernel's O, exact stats
==========  ==========================================  ===========================

float16 tops out at 65504: ``l`` alone exceeds it once a partial has seen more than
65504 keys of equal score. :meth:`Wire.encode` counts such losses instead of letting
them pass silently. Each wire is one :data:`WIRES` entry owning its name, help text
and check tolerance.
"""
from __future__ import annotations

from typing import List, NamedTuple, Tuple

import numpy as np

from .attention import Partial
from .dtypes import FLOATS
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
    """``buf`` as MPI sees it: float16 travels as its 16-bit patterns (``uint16``, as
    bfloat16 always does), because MPI has no standard float16 datatype (Open MPI 4
    refuses one)."""
    return buf.view(np.uint16) if buf.dtype == np.float16 else buf


def cast_loss(p: Partial, sent: Partial) -> Loss:
    """What casting ``p`` to the buffers ``sent`` lost: new infs, and m's rounding."""
    overflow = sum(int(np.count_nonzero(np.isinf(lo) & np.isfinite(hi)))
                   for lo, hi in zip(sent, p))
    finite = np.isfinite(p.m) & np.isfinite(sent.m)
    rounding = float(np.max(np.abs(sent.m[finite].astype(np.float32) - p.m[finite]),
                            initial=0.0))
    return Loss(overflow, rounding)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (``uint16``), rounded to nearest even; NaN stays
    NaN and a value past bfloat16's largest becomes inf, as a cast would."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
           >> np.uint32(16)).astype(np.uint16)
    out[np.isnan(x)] = 0x7FC0
    return out


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (``uint16``) -> float32, exactly."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


FORMATS = dict(FLOATS, bfloat16=np.dtype(np.uint16))
"""How a tensor travels: the buffer dtype of each format (bfloat16 as its bits)."""


def _cast(x: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "bfloat16":
        return to_bf16(x)
    with np.errstate(over="ignore"):              # overflow is counted, not warned about
        return np.ascontiguousarray(x, dtype=FORMATS[fmt])


def _uncast(buf: np.ndarray, fmt: str) -> np.ndarray:
    return from_bf16(buf) if fmt == "bfloat16" else buf.astype(np.float32, copy=False)


class Wire:
    """A hop format: ``m``, ``l``, ``O`` as three messages, each in its ``formats``
    entry (``float32``, ``float16`` or ``bfloat16``)."""

    name = ""
    help = ""
    tolerance = 1e-4
    """Largest accepted normwise error of the check (before m rounding)."""
    formats = ("float32", "float32", "float32")

    @property
    def lossy(self) -> bool:
        """Whether a hop rounds what it carries (anything narrower than float32)."""
        return any(f != "float32" for f in self.formats)

    @property
    def narrowest(self) -> str:
        """The narrowest format it sends, for the report: 'float16', 'bfloat16', ..."""
        return next((f for f in self.formats if f != "float32"), "float32")

    def cast(self, index: int, x: np.ndarray) -> np.ndarray:
        """Tensor ``index`` (0 ``m``, 1 ``l``, 2 ``O``) as it travels."""
        return _cast(x, self.formats[index])

    def uncast(self, index: int, buf: np.ndarray) -> np.ndarray:
        """The float32 values a buffer of tensor ``index`` holds."""
        return _uncast(buf, self.formats[index])

    def empty(self, index: int, shape) -> np.ndarray:
        """A receive buffer for tensor ``index``."""
        return np.empty(shape, dtype=FORMATS[self.formats[index]])

    packed = False
    """Whether the three tensors travel as one message (``mlO``) instead of three."""

    def cast_all(self, p: Partial) -> Tuple[List[np.ndarray], Loss]:
        """``m``, ``l``, ``O`` as they travel, each in its format, and what that lost."""
        cast = [self.cast(i, x) for i, x in enumerate(p)]
        loss = cast_loss(p, Partial(*(self.uncast(i, b) for i, b in enumerate(cast)))) \
            if self.lossy else Loss()
        return cast, loss

    def encode(self, p: Partial) -> Tuple[Buffers, Loss]:
        """The buffers of one hop, in send order, and what casting to them lost. A tensor
        with no elements (the O of a hop that carries only the statistics) is not sent."""
        cast, loss = self.cast_all(p)
        if self.packed:
            return [("mlO", np.concatenate([b.ravel() for b in cast]))], loss
        return [(name, b) for name, b in zip("mlO", cast) if b.size], loss

    def buffers(self, like: Partial) -> Buffers:
        """Empty buffers for one incoming hop, shaped like ``like``."""
        if self.packed:
            return [("mlO", self.empty(0, like.m.size + like.l.size + like.O.size))]
        return [(name, self.empty(i, x.shape)) for i, (name, x) in enumerate(zip("mlO", like))
                if x.size]

    def decode(self, bufs: Buffers, like: Partial) -> Partial:
        """The float32 partial held by ``bufs`` (the inverse of :meth:`encode`)."""
        if self.packed:
            flat = bufs[0][1]
            bounds = np.cumsum([0, like.m.size, like.l.size, like.O.size])
            parts = [flat[a:b].reshape(x.shape) for a, b, x in zip(bounds, bounds[1:], like)]
        else:
            got = dict(bufs)
            parts = [got.get(name, np.zeros(x.shape, np.float32)) for name, x in zip("mlO", like)]
        return Partial(*(self.uncast(i, b) for i, b in enumerate(parts)))


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
    help = ("m, l and O all in float16, as the kernel sends (overflow is detected and "
            "reported; also called fp16-stats)")
    tolerance = 1e-2
    formats = ("float16", "float16", "float16")


WIRES.alias("fp16-stats", "kernel")


@WIRES.register
class Packed(Wire):
    """float32 like fp32, with the three tensors in one message: one latency a hop."""

    name = "packed"
    help = "m, l, O in one float32 message per hop"
    packed = True


@WIRES.register
class Bf16(Wire):
    """bfloat16 keeps float32's range (no overflow where float16 overflows) with 8
    significant bits: each hop may move O by 2**-8 of its size."""

    name = "bf16"
    help = "O in bfloat16, m and l in float32, as Helix sends"
    tolerance = 2e-2
    formats = ("float32", "float32", "bfloat16")


@WIRES.register
class Fp16(Wire):
    """O alone in float16: what the kernel's wire costs without rounding m and l."""

    name = "fp16"
    help = "O in float16, m and l in float32"
    tolerance = 1e-2
    formats = ("float32", "float32", "float16")
