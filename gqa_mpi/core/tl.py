"""The kernel DSL's ``tl`` on NumPy, for one PE: memory, tensors and every local call.

No MPI here: ``send``/``recv`` go to a ``link`` object the caller gives
(:mod:`gqa_mpi.mpi.tl_link` on MPI; any object with the same two methods in tests).
SPEC.md's last section is the contract; where the kernel's framework is silent these
are gqa_mpi's choices:

- **memory**: each tensor (Q, this PE's K and V slices, O) is a float16 byte buffer at a
  base address of its own (:data:`BASE` apart, so that no overrun reaches another
  tensor); ``tl.load``/``tl.store`` must stay inside the tensor their pointer is in.
- **tensors** (:class:`Tensor`) hold a NumPy array in float16, float32 or bool. An op
  on float16 operands gives float16 (NumPy computes each op and rounds once); a Python
  number keeps the tensor's dtype; mixed dtypes promote as NumPy does. ``tl.dot`` and
  ``tl.sum`` accumulate in float32 and round once to their operands' dtype.
- **row broadcasting**: an ``(M,)`` operand against an ``(M, N)`` one is taken as
  ``(M, 1)`` (row ``i`` uses element ``i``), as in ``scores - m_local``.
- **scratch**: bytes of tensors made inside ``with tl.scratch_scope():`` are live until
  the block ends; the high-water mark of those is the rank's scratch. Tensors made
  outside any scope are *persistent* and counted apart (a loop that forgets its scope
  shows there, growing with the slice).
- **faults** (:class:`KernelFault`) name the call and the kernel file's line; the
  runner adds the rank. Every op is one NumPy call on whole blocks.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

DTYPES = {"f16": np.dtype(np.float16), "f32": np.dtype(np.float32)}
NAMES = {v: k for k, v in DTYPES.items()}
BASE = 1 << 40
"""Distance between the base addresses of two tensors in a PE's memory."""


class KernelFault(Exception):
    """The kernel under test did something the hardware would not survive."""

    def __init__(self, call: str, message: str, line: Optional[int] = None):
        super().__init__(message)
        self.call, self.message, self.line = call, message, line


def dtype_of(name) -> np.dtype:
    """``"f16"``/``"f32"`` (or a NumPy float dtype) -> the NumPy dtype."""
    if isinstance(name, str) and name in DTYPES:
        return DTYPES[name]
    try:
        dt = np.dtype(name)
    except TypeError:
        dt = None
    if dt not in NAMES:
        raise KernelFault("dtype", f"dtype must be 'f16' or 'f32', got {name!r}")
    return dt


def _shape(shape) -> Tuple[int, ...]:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(s, (int, np.integer)) and s >= 0 for s in shape):
        raise KernelFault("shape", f"a shape is non-negative integers, got {shape!r}")
    return tuple(int(s) for s in shape)


class Tensor:
    """A block of values with a dtype (float16, float32 or bool), as the kernel sees it."""

    __slots__ = ("a", "tl", "__weakref__")

    def __init__(self, a: np.ndarray, tl: "Backend"):
        self.a, self.tl = a, tl
        tl._made(a.nbytes)

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: NAMES.get(self.a.dtype, str(self.a.dtype)))
    ndim = property(lambda self: self.a.ndim)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype})"

    def __len__(self):
        return len(self.a)

    def __getitem__(self, index):
        return self.tl._op("[]", lambda: np.array(self.a[index]), self)

    def _bin(self, other, fn, name, swap=False):
        return self.tl._binary(name, fn, other, self) if swap else \
            self.tl._binary(name, fn, self, other)

    __add__ = lambda s, o: s._bin(o, np.add, "+")                    # noqa: E731
    __radd__ = lambda s, o: s._bin(o, np.add, "+", True)             # noqa: E731
    __sub__ = lambda s, o: s._bin(o, np.subtract, "-")               # noqa: E731
    __rsub__ = lambda s, o: s._bin(o, np.subtract, "-", True)        # noqa: E731
    __mul__ = lambda s, o: s._bin(o, np.multiply, "*")               # noqa: E731
    __rmul__ = lambda s, o: s._bin(o, np.multiply, "*", True)        # noqa: E731
    __truediv__ = lambda s, o: s._bin(o, np.divide, "/")             # noqa: E731
    __rtruediv__ = lambda s, o: s._bin(o, np.divide, "/", True)      # noqa: E731
    __lt__ = lambda s, o: s._bin(o, np.less, "<")                    # noqa: E731
    __gt__ = lambda s, o: s._bin(o, np.greater, ">")                 # noqa: E731
    __le__ = lambda s, o: s._bin(o, np.less_equal, "<=")             # noqa: E731
    __ge__ = lambda s, o: s._bin(o, np.greater_equal, ">=")          # noqa: E731
    __eq__ = lambda s, o: s._bin(o, np.equal, "==")                  # noqa: E731
    __ne__ = lambda s, o: s._bin(o, np.not_equal, "!=")              # noqa: E731
    __hash__ = object.__hash__

    def __neg__(self):
        return self.tl._op("-", lambda: np.negative(self.a), self)

    def __bool__(self):
        raise KernelFault("bool", "a tensor has no truth value inside a kernel (compare "
                                  "with tl.where, or use Python numbers for control flow)")


@dataclass
class Region:
    """One tensor of a PE's memory: its name, base address and float16 bytes."""

    name: str
    base: int
    data: np.ndarray
    """The tensor's values, as stored (float16, row-major)."""
    row_bytes: int = 0
    """Bytes per token row, for K and V (counting the rows the kernel read)."""
    first_row: int = 0
    """Global index of its first row (K and V slices)."""
    read: List[Tuple[int, int]] = field(default_factory=list)
    """Byte ranges loaded, merged at the end."""

    @property
    def size(self) -> int:
        return self.data.nbytes

    def rows_read(self) -> int:
        """Distinct token rows any byte of which was loaded."""
        if not self.row_bytes:
            return 0
        spans = sorted((a // self.row_bytes, -(-b // self.row_bytes)) for a, b in self.read)
        total, end = 0, -1
        for a, b in spans:
            a = max(a, end)
            if b > a:
                total, end = total + b - a, b
        return total


@dataclass
class Counters:
    """What one PE's kernel did, for the report."""

    loaded_bytes: int = 0
    stored_bytes: int = 0
    dot_flops: int = 0
    calls: int = 0
    scratch_peak: int = 0
    persistent: int = 0
    sent: Dict[str, List[int]] = field(default_factory=dict)
    """Direction -> [messages, bytes] sent."""
    received: Dict[str, List[int]] = field(default_factory=dict)
    nonfinite: List[Tuple[str, int, int]] = field(default_factory=list)
    """``(call, line, count)`` of the first calls whose result had inf or NaN where
    their operands had none (at most :data:`MAX_NONFINITE`)."""

    def add(self, other: "Counters") -> None:
        """Fold another call's (a later decode step's) counts into these: sums, the
        larger high-water marks, the first non-finite origins."""
        for name in ("loaded_bytes", "stored_bytes", "dot_flops", "calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.scratch_peak = max(self.scratch_peak, other.scratch_peak)
        self.persistent = max(self.persistent, other.persistent)
        for mine, theirs in ((self.sent, other.sent), (self.received, other.received)):
            for d, (n, b) in theirs.items():
                t = mine.setdefault(d, [0, 0])
                t[0], t[1] = t[0] + n, t[1] + b
        self.nonfinite = (self.nonfinite + [x for x in other.nonfinite
                                            if x[:2] not in {y[:2] for y in self.nonfinite}]
                          )[:MAX_NONFINITE]


MAX_NONFINITE = 5


class Backend:
    """``tl`` for one PE: call the kernel as ``kernel(..., tl=backend)``.

    Parameters
    ----------
    pe, cube : int
        ``tl.program_id(axis=0)`` and ``(axis=1)``.
    regions : list of (name, float16 array, row_bytes, first_row)
        The PE's memory in order (Q, K, V, O); ``pointer(name)`` is each base.
    link : object, optional
        ``send(direction, array)`` and ``recv(direction, nbytes) -> bytes``.
    source : str, optional
        The kernel file, whose lines faults and trace spans name.
    recorder : Recorder, optional
        With events on, one span per call and a scratch counter track.
    """

    def __init__(self, pe: int, cube: int, regions, link=None, source: Optional[str] = None,
                 recorder=None):
        self.pe, self.cube, self.link, self.source = pe, cube, link, source
        self.regions: List[Region] = []
        for i, (name, data, row_bytes, first_row) in enumerate(regions):
            data = np.ascontiguousarray(data, dtype=np.float16)
            self.regions.append(Region(name, (i + 1) * BASE, data, row_bytes, first_row))
        self.count = Counters()
        self._scopes: List[int] = []
        self._live = 0
        self.rec = recorder if recorder is not None and recorder.events is not None else None

    # ---- bookkeeping
    def pointer(self, name: str) -> int:
        return next(r.base for r in self.regions if r.name == name)

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def line(self) -> Optional[int]:
        """The kernel file's line that made the current call (innermost frame in it)."""
        f = sys._getframe(1)
        while f is not None:
            if self.source is not None and f.f_code.co_filename == self.source:
                return f.f_lineno
            f = f.f_back
        return None

    def _made(self, nbytes: int) -> None:
        self.count.calls += 1
        if self._scopes:
            self._scopes[-1] += nbytes
            self._live += nbytes
            if self._live > self.count.scratch_peak:
                self.count.scratch_peak = self._live
                if self.rec is not None:
                    self.rec.counter("scratch", self._live)
        else:
            self.count.persistent += nbytes

    @contextmanager
    def scratch_scope(self):
        """Tensors made inside are scratch, released when the block ends."""
        self._scopes.append(0)
        try:
            yield
        finally:
            self._live -= self._scopes.pop()
            if self.rec is not None:
                self.rec.counter("scratch", self._live)

    @contextmanager
    def _call(self, name: str, **args):
        """Trace one call as a span, with its line (only when tracing)."""
        if self.rec is None:
            yield
            return
        t0 = time.perf_counter()
        yield
        self.rec.span_at(f"tl.{name}", "tl", t0, time.perf_counter(),
                         dict(args, line=self.line()))

    def _tensor(self, a: np.ndarray, call: str, inputs=()) -> Tensor:
        if a.dtype.kind == "f" and len(self.count.nonfinite) < MAX_NONFINITE:
            bad = a.size - int(np.count_nonzero(np.isfinite(a)))
            if bad and all(np.isfinite(x.a).all() for x in inputs
                           if isinstance(x, Tensor) and x.a.dtype.kind == "f"):
                self.count.nonfinite.append((call, self.line(), bad))
        return Tensor(a, self)

    def _operand(self, x, call: str) -> np.ndarray:
        if isinstance(x, Tensor):
            return x.a
        if isinstance(x, (bool, int, float, np.integer, np.floating)):
            return x
        raise KernelFault(call, f"operand of {call} is a {type(x).__name__}, not a tensor "
                                f"or a number", self.line())

    def _binary(self, name: str, fn, a, b) -> Tensor:
        x, y = self._operand(a, name), self._operand(b, name)
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.ndim != y.ndim:
            if x.ndim == 1 and y.ndim == 2 and len(x) == len(y):        # row broadcasting
                x = x[:, None]
            elif y.ndim == 1 and x.ndim == 2 and len(x) == len(y):
                y = y[:, None]
        with self._call(name):
            try:
                with np.errstate(all="ignore"):
                    out = fn(x, y)
            except ValueError:
                raise KernelFault(name, f"operands of '{name}' do not broadcast: "
                                        f"{np.shape(x)} and {np.shape(y)}", self.line()) from None
        return self._tensor(np.asarray(out), name, (a, b))

    def _op(self, name: str, compute, *inputs) -> Tensor:
        with self._call(name):
            try:
                with np.errstate(all="ignore"):
                    out = compute()
            except (ValueError, IndexError, TypeError) as e:
                raise KernelFault(name, f"tl.{name}: {e}", self.line()) from None
        return self._tensor(np.asarray(out), name, inputs)

    def _find(self, ptr, nbytes: int, call: str) -> Tuple[Region, int]:
        if not isinstance(ptr, (int, np.integer)) or isinstance(ptr, bool):
            raise KernelFault(call, f"tl.{call}: the pointer is a {type(ptr).__name__}, "
                                    f"not an address (int)", self.line())
        ptr = int(ptr)
        for r in self.regions:
            if r.base <= ptr < r.base + max(r.size, 1):
                off = ptr - r.base
                if off + nbytes > r.size:
                    raise KernelFault(call, (
                        f"tl.{call} of {nbytes} bytes at {r.name}+{off} runs past the end "
                        f"of {r.name} ({r.size} bytes) by {off + nbytes - r.size} bytes"),
                        self.line())
                return r, off
        near = min(self.regions, key=lambda r: abs(ptr - r.base))
        raise KernelFault(call, f"tl.{call} at {near.name}{ptr - near.base:+d}: outside "
                                f"every tensor of this PE's memory", self.line())

    # ---- the DSL
    def program_id(self, axis: int = 0) -> int:
        """This PE's index (axis 0) or its cube's (axis 1)."""
        if axis not in (0, 1):
            raise KernelFault("program_id", f"tl.program_id: axis must be 0 (PE) or 1 "
                                            f"(cube), got {axis!r}", self.line())
        return self.pe if axis == 0 else self.cube

    def local_tokens(self) -> int:
        """gqa_mpi's one extension of the DSL: the token rows of K (and of V) in this
        PE's memory. SPEC's signature gives only ``S_kv``; under ``--split`` or a decode
        loop's ``--placement`` the slice is not the balanced split of it."""
        return int(self.region("K").data.shape[0])

    def load(self, ptr, shape, dtype="f16") -> Tensor:
        """``prod(shape)`` contiguous elements of ``dtype`` from byte ``ptr``, as ``shape``."""
        shape, dt = _shape(shape), dtype_of(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        r, off = self._find(ptr, n * dt.itemsize, "load")
        with self._call("load", shape=list(shape), dtype=NAMES[dt], bytes=n * dt.itemsize):
            a = np.array(r.data.reshape(-1).view(np.uint8)[off:off + n * dt.itemsize]).view(dt)
            a = a.reshape(shape)
        self.count.loaded_bytes += a.nbytes
        if r.row_bytes:
            r.read.append((off, off + a.nbytes))
        return Tensor(a, self)

    def store(self, ptr, x: Tensor) -> None:
        """``x``'s elements, contiguous from ``ptr``, in the dtype of the tensor there."""
        a = self._operand(x, "store")
        a = np.asarray(a, dtype=np.float16).ravel()
        r, off = self._find(ptr, a.nbytes, "store")
        with self._call("store", shape=list(np.shape(x.a if isinstance(x, Tensor) else a)),
                        bytes=a.nbytes):
            r.data.reshape(-1).view(np.uint8)[off:off + a.nbytes] = a.view(np.uint8)
        self.count.stored_bytes += a.nbytes

    def dot(self, a: Tensor, b: Tensor) -> Tensor:
        """``a @ b``, accumulated in float32 and rounded once to the operands' dtype."""
        x, y = self._operand(a, "dot"), self._operand(b, "dot")
        if np.ndim(x) != 2 or np.ndim(y) != 2 or x.shape[1] != y.shape[0]:
            raise KernelFault("dot", f"tl.dot needs (M, K) and (K, N), got {np.shape(x)} "
                                     f"and {np.shape(y)}", self.line())
        out_dt = np.result_type(x.dtype, y.dtype)
        with self._call("dot", shape=[x.shape[0], y.shape[1]], k=x.shape[1]):
            out = np.matmul(x.astype(np.float32, copy=False), y.astype(np.float32, copy=False))
            with np.errstate(over="ignore"):
                out = out.astype(out_dt, copy=False)
        self.count.dot_flops += 2 * x.shape[0] * x.shape[1] * y.shape[1]
        return self._tensor(out, "dot", (a, b))

    def sum(self, x: Tensor, axis: int = -1) -> Tensor:
        """Sum along ``axis`` in float32, rounded once to ``x``'s dtype."""
        a = self._operand(x, "sum")
        return self._op("sum", lambda: np.sum(a, axis=axis, dtype=np.float32).astype(a.dtype),
                        x)

    def max(self, x: Tensor, axis: int = -1) -> Tensor:
        return self._op("max", lambda: np.max(self._operand(x, "max"), axis=axis), x)

    def min(self, x: Tensor, axis: int = -1) -> Tensor:
        return self._op("min", lambda: np.min(self._operand(x, "min"), axis=axis), x)

    def exp(self, x: Tensor) -> Tensor:
        return self._op("exp", lambda: np.exp(self._operand(x, "exp")), x)

    def log(self, x: Tensor) -> Tensor:
        return self._op("log", lambda: np.log(self._operand(x, "log")), x)

    def maximum(self, a, b) -> Tensor:
        return self._binary("maximum", np.maximum, a, b)

    def minimum(self, a, b) -> Tensor:
        return self._binary("minimum", np.minimum, a, b)

    def where(self, cond, a, b) -> Tensor:
        c = self._operand(cond, "where")
        x, y = self._operand(a, "where"), self._operand(b, "where")
        if isinstance(c, np.ndarray) and c.ndim == 1:
            for other in (x, y):
                if isinstance(other, np.ndarray) and other.ndim == 2 and len(other) == len(c):
                    c = c[:, None]
                    break
        return self._op("where", lambda: np.where(c, x, y), cond, a, b)

    def trans(self, x: Tensor) -> Tensor:
        return self._op("trans", lambda: np.ascontiguousarray(self._operand(x, "trans").T), x)

    def reshape(self, x: Tensor, shape) -> Tensor:
        """The same elements in row-major order, as ``shape`` (a byte-conserving reshape)."""
        a, shape = self._operand(x, "reshape"), _shape(shape)
        if int(np.prod(shape, dtype=np.int64)) != a.size:
            raise KernelFault("reshape", f"tl.reshape of {a.shape} ({a.size} elements) to "
                                         f"{shape}", self.line())
        return self._op("reshape", lambda: a.reshape(shape).copy(), x)

    def cast(self, x: Tensor, dtype) -> Tensor:
        dt = dtype_of(dtype)
        return self._op("cast", lambda: self._operand(x, "cast").astype(dt), x)

    def zeros(self, shape, dtype="f32") -> Tensor:
        shape, dt = _shape(shape), dtype_of(dtype)
        return self._op("zeros", lambda: np.zeros(shape, dt))

    def full(self, shape, value, dtype="f32") -> Tensor:
        shape, dt = _shape(shape), dtype_of(dtype)
        return self._op("full", lambda: np.full(shape, value, dt))

    def copy_to(self, dst: Tensor, src) -> None:
        """Overwrite ``dst``'s values with ``src``'s (same shape), in ``dst``'s dtype."""
        if not isinstance(dst, Tensor):
            raise KernelFault("copy_to", "tl.copy_to: the destination is not a tensor",
                              self.line())
        a = self._operand(src, "copy_to")
        if np.shape(a) != dst.shape:
            raise KernelFault("copy_to", f"tl.copy_to of {np.shape(a)} into {dst.shape}",
                              self.line())
        with self._call("copy_to", shape=list(dst.shape)):
            np.copyto(dst.a, a, casting="unsafe")

    def send(self, dir: str, src: Tensor) -> None:  # noqa: A002 (the kernel's keyword)
        """``src``'s elements, in its dtype, to the neighbour in direction ``dir``."""
        a = np.ascontiguousarray(self._operand(src, "send"))
        self._need_link("send")
        with self._call("send", dir=dir, shape=list(a.shape), dtype=NAMES.get(a.dtype),
                        bytes=a.nbytes):
            self.link.send(dir, a, self.line())
        sent = self.count.sent.setdefault(dir, [0, 0])
        sent[0], sent[1] = sent[0] + 1, sent[1] + a.nbytes

    def recv(self, dir: str, shape, dtype="f16") -> Tensor:  # noqa: A002
        """The next message sent this way from ``dir``, as ``shape`` of ``dtype``."""
        shape, dt = _shape(shape), dtype_of(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        self._need_link("recv")
        with self._call("recv", dir=dir, shape=list(shape), dtype=NAMES[dt], bytes=nbytes):
            raw = self.link.recv(dir, nbytes, self.line(),
                                 f"shape {shape} {NAMES[dt]}")
        got = self.count.received.setdefault(dir, [0, 0])
        got[0], got[1] = got[0] + 1, got[1] + nbytes
        return Tensor(np.frombuffer(raw, dtype=dt).reshape(shape).copy(), self)

    def _need_link(self, call: str) -> None:
        if self.link is None:
            raise KernelFault(call, f"tl.{call}: this PE has no links (a single-PE run)",
                              self.line())


def run_kernel(fn, backend: Backend, T_q: int, S_kv: int, h_q: int, h_kv: int, d: int,
               C: int, P: int):
    """Call the kernel with SPEC's signature on ``backend``'s memory."""
    ptr = backend.pointer
    return fn(ptr("Q"), ptr("K"), ptr("V"), ptr("O"), T_q, S_kv, h_q, h_kv, d, C, P,
              tl=backend)
