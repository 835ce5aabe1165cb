"""The kernel DSL's ``tl`` on NumPy, for one PE, shaped like Triton's interpreter.

No MPI here: ``send``/``recv`` go to a ``link`` object the caller gives
(:mod:`gqa_mpi.mpi.tl_link` on MPI; any object with the same two methods in tests).

- :class:`Tensor` is a NumPy array and, through it, a dtype (a float, int32 or bool).
- :class:`Backend` has one method per builtin; each is one NumPy call on whole blocks.
  The rules live once: :func:`_align` is the row-broadcast rule of every call with
  several operands; the dtypes are :data:`gqa_mpi.step.dtypes.DSL`'s.
- :class:`Monitor` sits beside the ops and keeps what a kernel author is told:
  scratch per scope and its high-water mark, the first calls that made inf or NaN
  from finite operands, and (with a recorder) one trace span per call. A call's line
  in the kernel's file is looked up only when a fault, a non-finite origin or a
  trace span needs it.

SPEC.md's ``tl`` table is the contract; where the kernel's framework is silent these
are gqa_mpi's choices:

- **memory**: each tensor (Q, this PE's K and V slices, O) is a byte buffer at a base
  address of its own (:data:`BASE` apart, so that no overrun reaches another tensor),
  in its dtype (Q and O float16, K and V ``--kv-dtype``'s; the pointers say which:
  :class:`Pointer`); ``tl.load``/``tl.store`` must stay inside the tensor their
  pointer is in.
  A load reads the memory as it is at the call (a later store never reaches it).
- **arithmetic**: an op on float16 operands gives float16 (NumPy computes each op and
  rounds once; on bfloat16 and float8, ml_dtypes computes in float32 and rounds once);
  a Python number keeps the tensor's dtype; mixed dtypes promote as NumPy does. ``tl.dot`` and ``tl.sum`` accumulate in float32 and round once.
- **row broadcasting**: an ``(M,)`` operand of a call that also has an ``(M, N)`` one
  is taken as ``(M, 1)`` (row ``i`` uses element ``i``), as in ``scores - m_local``,
  for every call: arithmetic, comparisons, ``maximum``/``minimum`` and ``where``.
- **scratch**: tensors made inside ``with tl.scratch_scope():`` are released when the
  block ends; using one afterwards is a fault that names both lines. Tensors made
  outside any scope are *persistent*, counted apart (a loop that forgets its scope
  shows there, growing with the slice).
- **messages**: ``tl.send`` sends the values ``src`` has at the call; a later write to
  ``src`` does not reach the message.
- **extension**: ``tl.local_tokens()``, the token rows of this PE's K slice (the one
  call SPEC does not list; see its docstring).
- **faults** (:class:`KernelFault`) name the call and the kernel file's line; the
  runner adds the rank.
"""
from __future__ import annotations

import heapq
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..step.dtypes import DSL, DSL_NAMES, DSL_NARROW, NARROW, Dtypes, is_float
from .predict import Call

BASE = 1 << 40
"""Distance between the base addresses of two tensors in a PE's memory."""
MAX_NONFINITE = 5
"""Non-finite origins kept per PE."""
SCRATCH_TOP = 5
"""Tensors named at the scratch high-water mark."""
NUMBERS = (bool, int, float, np.integer, np.floating)
DTYPES = Dtypes({"f16": DSL["f16"], "f32": DSL["f32"], "i32": np.dtype(np.int32),
                 "i1": np.dtype(np.bool_)}, DSL_NARROW)
"""The dtypes a kernel may name: memory's floats, and the ints and booleans of indices
and masks (bfloat16 and float8 resolved when first named)."""
MEMORY_NAMES = frozenset(("float16", *NARROW.values()))
"""NumPy's names of the dtypes memory may hold a tensor as
(:data:`gqa_mpi.step.dtypes.MEMORY`)."""
UNTRACED = nullcontext()
REDUCTIONS = ("sum", "max", "min", "argmax", "argmin", "cumsum", "softmax")
"""Calls costed by their operand's elements; the other ops by their result's."""
VIEWS = ("reshape", "view", "expand_dims", "ravel")
FREE = ("[]",) + VIEWS
"""Calls that cost nothing in SPEC's model (a view of the same elements)."""
MAKES_NONFINITE = frozenset(("+", "-", "*", "/", "exp", "log", "dot", "sum", "cast", "exp2",
                             "log2", "sqrt", "rsqrt", "**", "fma", "//", "%", "cumsum"))
"""The calls that can make inf or NaN from finite operands (an overflow, a log of 0, a
cast to float16); the results of the others (max, where, slices, ...) are not scanned."""


def dtype_name(dt) -> str:
    """A dtype as a profile's rate table names it: ``f16``, ``f32``, ``i1`` for a
    comparison's booleans, else NumPy's name."""
    dt = np.dtype(dt)
    return DSL_NAMES.get(dt.name) or ("i1" if dt == np.bool_ else "i32" if dt == np.int32
                                 else dt.name)


class DType(str):
    """A dtype as a kernel names it (``"f16"``, ``"bf16"``, ...: a string, as every
    ``dtype=`` takes), with Triton's ``primitive_bitwidth``."""

    __slots__ = ()

    @property
    def primitive_bitwidth(self) -> int:
        return DTYPES[self].itemsize * 8


class PointerType:
    """A pointer's type: ``element_ty``, the dtype of the memory it points into."""

    __slots__ = ("element_ty",)

    def __init__(self, element_ty: DType):
        self.element_ty = element_ty

    def __repr__(self):
        return f"pointer<{self.element_ty}>"


class Pointer(int):
    """A base address (SPEC's ``*_ptr``, a plain int in arithmetic: ``k_ptr + 64`` is an
    int), whose ``dtype.element_ty`` says what its memory holds, as a Triton pointer's
    does: ``k_ptr.dtype.element_ty.primitive_bitwidth // 8`` is a K element's bytes."""

    def __new__(cls, address: int, element: str):
        p = super().__new__(cls, address)
        p.dtype = PointerType(DType(element))
        return p


class KernelFault(Exception):
    """The kernel under test did something the hardware would not survive."""

    def __init__(self, call: str, message: str, line: Optional[int] = None):
        super().__init__(message)
        self.call, self.message, self.line = call, message, line


def _align(*arrays):
    """The row-broadcast rule, for every call: with some ``(M, N)`` operand, every
    ``(M,)`` operand is taken as ``(M, 1)``; numbers and other shapes are left as
    NumPy broadcasts them."""
    rows = next((x.shape[0] for x in arrays if isinstance(x, np.ndarray) and x.ndim == 2),
                None)
    if rows is None:
        return arrays
    return tuple(x[:, None] if isinstance(x, np.ndarray) and x.ndim == 1 and len(x) == rows
                 else x for x in arrays)


def _widen(arrays):
    """The dtype rules NumPy's promotion leaves to the DSL: an int tensor with a float
    one takes the float's dtype; integer arithmetic that leaves int32 (a byte address
    plus an int tensor) is int64."""
    floats = [x.dtype for x in arrays if isinstance(x, np.ndarray) and is_float(x.dtype)]
    ints = [x for x in arrays if isinstance(x, np.ndarray) and x.dtype.kind in "iu"]
    if floats and ints:
        to = np.result_type(*floats)
        return tuple(x.astype(to) if isinstance(x, np.ndarray) and x.dtype.kind in "iu"
                     else x for x in arrays)
    big = any(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
              and not -2 ** 31 <= int(x) < 2 ** 31 for x in arrays)
    if not big:
        return arrays
    return tuple(x.astype(np.int64) if isinstance(x, np.ndarray) and x.dtype.kind in "iu"
                 else x for x in arrays)


def _bad_count(a: np.ndarray) -> int:
    """Elements of a float array that are inf or NaN (float16 by its exponent bits)."""
    if a.dtype == np.float16:
        return int(np.count_nonzero((a.view(np.uint16) & 0x7C00) == 0x7C00))
    return a.size - int(np.count_nonzero(np.isfinite(a)))


class Scope:
    """One ``with tl.scratch_scope():`` block: its line, its live bytes, whether it
    ended, and the tensors made in it (``[bytes, line, shape, dtype]``; the line is
    looked up only for a tensor that raised the high-water mark)."""

    __slots__ = ("line", "live", "ended", "made")

    def __init__(self, line: Optional[int]):
        self.line, self.live, self.ended, self.made = line, 0, False, []


def _values(a: np.ndarray) -> str:
    """A tensor's values as a debugging line shows them (long ones summarised)."""
    return np.array2string(np.asarray(a), threshold=64, edgeitems=3, precision=6,
                           separator=", ", max_line_width=10 ** 6)


def _floordiv(a, b):
    """``//``: integers truncate toward zero, as Triton's do; floats floor."""
    a, b = np.asarray(a), np.asarray(b)
    if np.issubdtype(np.result_type(a, b), np.integer):
        q = np.floor_divide(a, b)
        return q + ((np.fmod(a, b) != 0) & ((a < 0) != (b < 0)))
    return np.floor_divide(a, b)


class Tensor:
    """A block of values with a dtype (float16, float32 or bool), as the kernel sees it."""

    __slots__ = ("a", "tl", "scope", "cell", "__weakref__")

    def __init__(self, a: np.ndarray, tl: "Backend", cell: int = 0):
        self.a, self.tl, self.cell = a, tl, cell
        """``cell``: what the replay of ``--predict`` knows its values by (a view shares
        its base's; 0: made by no call that costs)."""
        self.scope = tl.monitor.made(a)

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: DType(dtype_name(self.a.dtype)))
    ndim = property(lambda self: self.a.ndim)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, values={_values(self.a)})"

    __str__ = __repr__

    def __len__(self):
        return len(self.a)

    def __getitem__(self, index):
        return self.tl._op("[]", lambda a: a[index], self)   # a view: tensors are values

    def __iter__(self):
        raise self.tl.fault("iter", "a tensor cannot be iterated inside a kernel (index "
                                    "it with slices, or use tl calls on the whole block)")

    def __array__(self, dtype=None, copy=None):
        raise self.tl.fault("array", "a tensor cannot be passed to NumPy inside a kernel "
                                     "(use the tl call: tl.exp, tl.sum, ...)")

    def __bool__(self):
        raise self.tl.fault("bool", "a tensor has no truth value inside a kernel (compare "
                                    "with tl.where, or use Python numbers for control flow)")

    def __float__(self):
        raise self.tl.fault("float", "a tensor is not a Python number inside a kernel")

    __int__ = __index__ = __float__

    def _bin(self, other, fn, name, swap=False):
        return self.tl._op(name, fn, other, self) if swap else self.tl._op(name, fn, self, other)

    __hash__ = object.__hash__

    def __neg__(self):
        return self.tl._op("-", np.negative, self)

    def __invert__(self):
        return self.tl._op("~", np.invert, self)

    def to(self, dtype, fp_downcast_rounding=None, bitcast: bool = False) -> "Tensor":
        """``tl.cast(self, dtype, ...)``."""
        return self.tl.cast(self, dtype, fp_downcast_rounding, bitcast)

    T = property(lambda self: self.tl.trans(self))


OPERATORS = {"add": (np.add, "+"), "sub": (np.subtract, "-"), "mul": (np.multiply, "*"),
             "truediv": (np.divide, "/"), "floordiv": (_floordiv, "//"),
             "mod": (np.fmod, "%"), "pow": (np.power, "**"), "and": (np.bitwise_and, "&"),
             "or": (np.bitwise_or, "|"), "xor": (np.bitwise_xor, "^")}
"""A tensor's arithmetic operators, each with its reflected form (``2 * x``)."""
COMPARISONS = {"lt": (np.less, "<"), "gt": (np.greater, ">"), "le": (np.less_equal, "<="),
               "ge": (np.greater_equal, ">="), "eq": (np.equal, "=="),
               "ne": (np.not_equal, "!=")}
"""A tensor's comparisons: their results are ``i1``."""


def _operator(fn, symbol: str, swap: bool = False):
    return lambda self, other: self._bin(other, fn, symbol, swap)


for _name, (_fn, _symbol) in OPERATORS.items():
    setattr(Tensor, f"__{_name}__", _operator(_fn, _symbol))
    setattr(Tensor, f"__r{_name}__", _operator(_fn, _symbol, swap=True))
for _name, (_fn, _symbol) in COMPARISONS.items():
    setattr(Tensor, f"__{_name}__", _operator(_fn, _symbol))


@dataclass
class Region:
    """One tensor of a PE's memory: its name, base address and bytes."""

    name: str
    base: int
    data: np.ndarray
    """The tensor's values, as stored (in its dtype, row-major)."""
    row_bytes: int = 0
    """Bytes per token row, for K and V (counting the rows the kernel read)."""
    first_row: int = 0
    """Global index of its first row (K and V slices)."""
    read: List[Tuple[int, int]] = field(default_factory=list)
    """Byte ranges loaded, merged at the end."""
    lent: bool = False
    """A load handed out a view of ``data``: a store copies it first."""

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
    scratch_top: List[Tuple[int, Optional[int], str]] = field(default_factory=list)
    """The largest tensors alive at (within 1% of) the scratch high-water mark:
    ``(bytes, line made, "shape dtype")``, at most :data:`SCRATCH_TOP`."""
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
        if other.scratch_peak > self.scratch_peak:
            self.scratch_peak, self.scratch_top = other.scratch_peak, other.scratch_top
        self.persistent = max(self.persistent, other.persistent)
        for mine, theirs in ((self.sent, other.sent), (self.received, other.received)):
            for d, (n, b) in theirs.items():
                t = mine.setdefault(d, [0, 0])
                t[0], t[1] = t[0] + n, t[1] + b
        seen = {x[:2] for x in self.nonfinite}
        self.nonfinite = (self.nonfinite + [x for x in other.nonfinite
                                            if x[:2] not in seen])[:MAX_NONFINITE]


class Monitor:
    """What the backend keeps beside its ops (see the module doc): the counters, the
    scratch scopes, the non-finite origins, the kernel file's lines and trace spans."""

    def __init__(self, source: Optional[str], recorder=None, record: bool = False):
        self.source = source
        self.count = Counters()
        self.calls: Optional[List[Call]] = [] if record else None
        """With ``record``: each call that has a cost, a :class:`~gqa_mpi.dsl.predict.Call`."""
        self.cells = 0
        """The cells handed out so far (:meth:`call`'s ``makes``)."""
        self.scopes: List[Scope] = []
        self.printed: List[str] = []
        """The lines of ``tl.device_print``, in this PE's program order."""
        self.live = 0
        self.noted = 0
        """The high-water mark at which :attr:`Counters.scratch_top` was taken."""
        self.rec = recorder if recorder is not None and recorder.events is not None else None

    def line(self) -> Optional[int]:
        """The kernel file's line of the call under way (its innermost frame there)."""
        f = sys._getframe(1)
        while f is not None:
            if self.source is not None and f.f_code.co_filename == self.source:
                return f.f_lineno
            f = f.f_back
        return None

    def call(self, name: str, kind: str, amount: float, direction: Optional[str] = None,
             dtype: Optional[np.dtype] = None, reads=(), makes: bool = False) -> int:
        """A call that has a cost: counted for the report (its bytes, flops, messages),
        and kept for the replay of ``--predict`` when recording, with the dtype its
        rate is looked up by (:func:`dtype_name`) and the tensors it reads. With
        ``makes``, the values it makes get a new cell, which is returned (0 without)."""
        writes = None
        if makes:
            self.cells += 1
            writes = self.cells
        c = self.count
        if kind == "mem":
            if name == "load":
                c.loaded_bytes += amount
            else:
                c.stored_bytes += amount
        elif kind == "dot":
            c.dot_flops += amount
        elif kind in ("send", "recv"):
            total = (c.sent if kind == "send" else c.received).setdefault(direction, [0, 0])
            total[0], total[1] = total[0] + 1, total[1] + amount
        if self.calls is not None:
            self.calls.append(Call(name, kind, amount, direction, self.line(),
                                   None if dtype is None else dtype_name(dtype),
                                   tuple(x.cell for x in reads if isinstance(x, Tensor)),
                                   writes))
        return writes or 0

    def made(self, a: np.ndarray) -> Optional[Scope]:
        """A tensor holding ``a`` was made: its scope (None: persistent). A new
        high-water mark notes the tensor's line and, once it is 1% past the last one
        noted, the largest tensors alive."""
        self.count.calls += 1
        nbytes = a.nbytes
        if not self.scopes:
            self.count.persistent += nbytes
            return None
        scope = self.scopes[-1]
        scope.live += nbytes
        self.live += nbytes
        entry = [nbytes, None, a.shape, a.dtype]
        scope.made.append(entry)
        c = self.count
        if self.live > c.scratch_peak:
            c.scratch_peak = self.live
            entry[1] = self.line()
            if self.live >= 1.01 * self.noted:
                self.noted = self.live
                alive = (e for sc in self.scopes for e in sc.made)
                c.scratch_top = [(b, line, f"{tuple(shape)} {dtype_name(dt)}") for b, line,
                                 shape, dt in heapq.nlargest(SCRATCH_TOP, alive,
                                                             key=lambda e: e[0])]
            if self.rec is not None:
                self.rec.counter("scratch", self.live)
        return scope

    def enter(self) -> Scope:
        scope = Scope(self.line())
        self.scopes.append(scope)
        return scope

    def leave(self, scope: Scope) -> None:
        self.scopes.remove(scope)
        scope.ended = True
        self.live -= scope.live
        if self.rec is not None:
            self.rec.counter("scratch", self.live)

    def result(self, call: str, out: np.ndarray, operands) -> None:
        """Note ``call`` if it made inf or NaN from finite operands (the result is
        scanned; the operands only when it holds some)."""
        if (call not in MAKES_NONFINITE or not is_float(out.dtype)
                or len(self.count.nonfinite) >= MAX_NONFINITE):
            return
        bad = _bad_count(out)
        if bad and all(not _bad_count(x) for x in operands
                       if isinstance(x, np.ndarray) and is_float(x.dtype)):
            self.count.nonfinite.append((call, self.line(), bad))

    @contextmanager
    def span(self, name: str, **args):
        """One trace span of a call, with its line (only when tracing)."""
        t0 = time.perf_counter()
        yield
        self.rec.span_at(f"tl.{name}", "tl", t0, time.perf_counter(),
                         dict(args, line=self.line()))


class Backend:
    """``tl`` for one PE: call the kernel as ``kernel(..., tl=backend)``.

    Parameters
    ----------
    pe, cube : int
        ``tl.program_id(axis=0)`` and ``(axis=1)``.
    regions : list of (name, array, row_bytes, first_row)
        In memory as the array's dtype where it is one of memory's, else float16.
        The PE's memory in order (Q, K, V, O); ``pointer(name)`` is each base.
    link : object, optional
        ``send(direction, array, line)`` and ``recv(direction, nbytes, line, what) ->
        bytes``; ``line`` is a function giving the kernel file's line of the call.
    source : str, optional
        The kernel file, whose lines faults and trace spans name.
    recorder : Recorder, optional
        With events on, one span per call and a scratch counter track.
    record : bool
        Keep every call that has a cost, for ``--predict`` (:attr:`Monitor.calls`).
    """

    def __init__(self, pe: int, cube: int, regions, link=None, source: Optional[str] = None,
                 recorder=None, record: bool = False):
        self.pe, self.cube, self.link, self.source = pe, cube, link, source
        self.regions: List[Region] = []
        for i, (name, data, row_bytes, first_row) in enumerate(regions):
            data = np.ascontiguousarray(data, dtype=data.dtype if np.dtype(data.dtype).name
                                        in MEMORY_NAMES else np.float16)
            self.regions.append(Region(name, (i + 1) * BASE, data, row_bytes, first_row))
        self.monitor = Monitor(source, recorder, record)
        self.count = self.monitor.count
        self._sealed = True

    def __getattr__(self, name):
        """A call this ``tl`` does not have: a kernel fault naming it and its line (a
        file's are refused before it runs; this is one reached another way)."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise self.fault(name, f"tl.{name}: gqa_mpi's tl has no such call")

    def __setattr__(self, name, value):
        if getattr(self, "_sealed", False):
            raise self.fault("setattr", f"a kernel cannot set tl.{name}: tl is the "
                                        f"backend's, not the kernel's (keep state in "
                                        f"the kernel's own variables)")
        object.__setattr__(self, name, value)

    # ---- bookkeeping
    def pointer(self, name: str) -> "Pointer":
        r = self.region(name)
        return Pointer(r.base, dtype_name(r.data.dtype))

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def fault(self, call: str, message: str) -> KernelFault:
        """A fault of ``call`` at the kernel's line under way."""
        return KernelFault(call, message, self.monitor.line())

    def _sh(self, shape, call: str) -> Tuple[int, ...]:
        """A shape argument as a tuple of ints; a fault otherwise."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
        try:
            shape = tuple(shape)
        except TypeError:
            shape = (shape,)
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0
                   for s in shape):
            raise self.fault(call, f"tl.{call}: a shape is non-negative integers, got "
                                   f"{shape!r}")
        return tuple(int(s) for s in shape)

    def _dt(self, dtype, call: str) -> np.dtype:
        """``"f16"``, ``"f32"``, ``"i32"``, ``"i1"`` (or such a NumPy dtype) as the NumPy
        dtype; a fault otherwise."""
        if isinstance(dtype, str) and dtype in DTYPES:
            return DTYPES[dtype]
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is None or dtype_name(dt) not in DTYPES:
            raise self.fault(call, f"tl.{call}: dtype must be one of {', '.join(DTYPES)}, "
                                   f"got {dtype!r}")
        return dt

    def _array(self, x, call: str):
        """An operand as NumPy: a live tensor's array, or a Python number."""
        if isinstance(x, Tensor):
            if x.scope is not None and x.scope.ended:
                raise self.fault(call, f"tl.{call} uses a tensor made inside the "
                                       f"scratch_scope at line {x.scope.line}, which has "
                                       f"ended (its scratch was released)")
            return x.a
        if isinstance(x, NUMBERS):
            return x
        raise self.fault(call, f"tl.{call}: an operand is a {type(x).__name__}, not a "
                               f"tensor or a number")

    def _tensor(self, out: np.ndarray, call: str, operands=(), cell: int = 0) -> Tensor:
        self.monitor.result(call, out, operands)
        return Tensor(out, self, cell)

    def _op(self, name: str, fn, *operands) -> Tensor:
        """An elementwise call: ``fn`` on the aligned operands, one NumPy call."""
        arrays = _widen(_align(*(self._array(x, name) for x in operands)))
        try:
            with self._traced(name):
                out = fn(*arrays)
        except (ValueError, IndexError, TypeError) as e:
            shapes = " and ".join(str(np.shape(x)) for x in arrays)
            what = (f"operands of '{name}' do not broadcast: {shapes}"
                    if "broadcast" in str(e) else f"tl.{name}: {e}")
            raise self.fault(name, what) from None
        out = np.asarray(out)
        if name in FREE:                     # a view: its base's values
            cell = operands[0].cell
        else:                                # a reduction costs its operand's elements
            priced = np.asarray(arrays[0]) if name in REDUCTIONS else out
            cell = self.monitor.call(name, "vec", priced.size, dtype=priced.dtype,
                                     reads=operands, makes=True)
        return self._tensor(out, name, arrays, cell)

    def _block(self, name: str, out: np.ndarray) -> Tensor:
        """A block made from nothing the kernel holds (arange, zeros, full)."""
        return Tensor(out, self, self.monitor.call(name, "vec", out.size, dtype=out.dtype,
                                                   makes=True))

    def _held(self, ptr) -> np.dtype:
        """The dtype memory holds at ``ptr`` (an address, or an int tensor's first),
        float16 where no tensor is (the access then faults on its bounds)."""
        if isinstance(ptr, Tensor):
            ptr = ptr.a.flat[0] if ptr.a.size and ptr.a.dtype.kind in "iu" else None
        if isinstance(ptr, (int, np.integer)) and not isinstance(ptr, bool):
            for r in self.regions:
                if r.base <= int(ptr) < r.base + BASE:
                    return r.data.dtype
        return np.dtype(np.float16)

    def _find(self, ptr, nbytes: int, call: str) -> Tuple[Region, int]:
        if not isinstance(ptr, (int, np.integer)) or isinstance(ptr, bool):
            raise self.fault(call, f"tl.{call}: the pointer is a {type(ptr).__name__}, "
                                   f"not an address (int)")
        ptr = int(ptr)
        for r in self.regions:
            if r.base <= ptr <= r.base + r.size:
                off = ptr - r.base
                if off + nbytes > r.size:
                    raise self.fault(call, (
                        f"tl.{call} of {nbytes} bytes at {r.name}+{off} runs past the end "
                        f"of {r.name} ({r.size} bytes) by {off + nbytes - r.size} bytes"))
                return r, off
        near = min(self.regions, key=lambda r: abs(ptr - r.base))
        raise self.fault(call, f"tl.{call} at {near.name}{ptr - near.base:+d}: outside "
                               f"every tensor of this PE's memory")

    # ---- the DSL
    def program_id(self, axis: int = 0) -> int:
        """This PE's index (axis 0) or its cube's (axis 1)."""
        if axis not in (0, 1):
            raise self.fault("program_id", f"tl.program_id: axis must be 0 (PE) or 1 "
                                           f"(cube), got {axis!r}")
        return self.pe if axis == 0 else self.cube

    # ---- debugging: no cost on the hardware
    def device_print(self, prefix: str, *xs) -> None:
        """A line for rank 0 to print after the step, prefixed with this PE, in this PE's
        program order: ``prefix`` and each of ``xs`` (a tensor's values, or a number)."""
        parts = [_values(x.a) if isinstance(x, Tensor) else x if isinstance(x, str)
                 else repr(x) for x in xs]
        self.monitor.printed.append(" ".join([str(prefix)] + parts))

    def static_print(self, *xs) -> None:
        """Print now, once (from cube 0's PE 0), as Triton prints at compile time."""
        if self.pe == 0 and self.cube == 0:
            print(*xs, flush=True)

    def static_assert(self, cond, msg: str = "") -> None:
        """A compile-time check on a Python value: false is a fault naming its line."""
        if isinstance(cond, Tensor):
            raise self.fault("static_assert", "tl.static_assert takes a Python value, not "
                                              "a tensor (use tl.device_assert)")
        if not cond:
            raise self.fault("static_assert", f"static_assert failed: {msg}".rstrip(": "))

    def device_assert(self, cond, msg: str = "") -> None:
        """A run-time check: any false element is a fault naming its line."""
        values = cond.a if isinstance(cond, Tensor) else np.asarray(cond)
        if not np.all(values):
            bad = int(np.size(values) - np.count_nonzero(values))
            raise self.fault("device_assert", f"device_assert failed on {bad} of "
                                              f"{np.size(values)} element(s): {msg}".rstrip(": "))

    def local_tokens(self) -> int:
        """gqa_mpi's one extension of the DSL: the token rows of K (and of V) in this
        PE's memory. SPEC's signature gives only ``S_kv``; under ``--split`` or a decode
        loop's ``--placement`` the slice is not the balanced split of it."""
        return int(self.region("K").data.shape[0])

    @contextmanager
    def scratch_scope(self):
        """Tensors made inside are scratch, released when the block ends."""
        scope = self.monitor.enter()
        try:
            yield
        finally:
            self.monitor.leave(scope)

    def load(self, ptr, shape=None, dtype=None, mask=None, other=0, boundary_check=(),
             padding_option="", cache_modifier="", eviction_policy="",
             volatile=False) -> Tensor:
        """``prod(shape)`` contiguous elements of ``dtype`` from byte ``ptr``, as ``shape``
        (a byte-conserving reshape); or, with ``ptr`` an int tensor of byte addresses, one
        element from each (a gather). Where ``mask`` (broadcast to the shape) is false
        nothing is read and the element is ``other``. ``dtype`` defaults to the memory's
        there, as a Triton pointer's element type decides the load's. Triton's cache
        and eviction hints are taken and change nothing; its block-pointer arguments
        are a fault (``tl`` has no block pointers)."""
        self._no_block_pointer("load", boundary_check, padding_option)
        dt = self._dt(dtype, "load") if dtype is not None else self._held(ptr)
        if mask is None and not isinstance(ptr, Tensor):
            shape = self._sh(shape, "load")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            r, off = self._find(ptr, nbytes, "load")
            with self._traced("load", shape=list(shape), dtype=dtype_name(dt), bytes=nbytes):
                # a view: the store that follows into this region copies the region first
                a = r.data.reshape(-1).view(np.uint8)[off:off + nbytes].view(dt).reshape(shape)
            r.lent = True
            cell = self.monitor.call("load", "mem", nbytes, makes=True)
            if r.row_bytes:
                r.read.append((off, off + nbytes))
            return Tensor(a, self, cell)
        addrs, m = self._elements(ptr, shape, dt, mask, "load")
        out = np.full(addrs.shape, other, dt)
        read = out[m]                        # the elements the mask lets through
        with self._traced("load", shape=list(addrs.shape), dtype=dtype_name(dt)):
            for r, at, offs in self._where(addrs[m], dt.itemsize, "load"):
                memory = r.data.reshape(-1).view(np.uint8)[:r.size - r.size % dt.itemsize]
                read[at] = memory.view(dt)[offs // dt.itemsize]
                if r.row_bytes:
                    r.read += [(int(x) * r.row_bytes, (int(x) + 1) * r.row_bytes)
                               for x in np.unique(offs // r.row_bytes)]
        out[m] = read
        cell = self.monitor.call("load", "mem", int(m.sum()) * dt.itemsize,
                                 reads=(ptr, mask), makes=True)
        return Tensor(out, self, cell)

    def store(self, ptr, x: Tensor, mask=None, boundary_check=(), cache_modifier="",
              eviction_policy="") -> None:
        """``x``'s elements, contiguous from ``ptr`` (or one at each address of an int
        tensor ``ptr``: a scatter), rounded to the dtype of the tensor there; where
        ``mask`` is false nothing is written. Hints and block pointers as :meth:`load`."""
        self._no_block_pointer("store", boundary_check)
        if mask is None and not isinstance(ptr, Tensor):
            a = np.asarray(self._array(x, "store"), dtype=self._held(ptr)).ravel()
            r, off = self._find(ptr, a.nbytes, "store")
            if r.lent:                       # loads taken before keep the values they read
                r.data, r.lent = r.data.copy(), False
            with self._traced("store", shape=list(np.shape(a)), bytes=a.nbytes):
                r.data.reshape(-1).view(np.uint8)[off:off + a.nbytes] = a.view(np.uint8)
            self.monitor.call("store", "mem", a.nbytes, reads=(x,))
            return
        values = np.asarray(self._array(x, "store"))
        shape = values.shape if not isinstance(ptr, Tensor) else None
        addrs, m = self._elements(ptr, shape, self._held(ptr), mask, "store")
        values = np.broadcast_to(values, addrs.shape)[m]
        nbytes = 0
        with self._traced("store", shape=list(addrs.shape)):
            for r, at, offs in self._where(addrs[m], None, "store"):
                if r.lent:
                    r.data, r.lent = r.data.copy(), False
                size = r.data.dtype.itemsize
                r.data.reshape(-1)[offs // size] = values[at].astype(r.data.dtype)
                nbytes += len(at) * size
        self.monitor.call("store", "mem", nbytes, reads=(ptr, x, mask))

    def _no_block_pointer(self, call: str, boundary_check=(), padding_option="") -> None:
        if boundary_check or padding_option:
            raise self.fault(call, f"tl.{call}(boundary_check=, padding_option=) are for "
                                   f"block pointers (tl.make_block_ptr), which tl does not "
                                   f"have: mask the access instead")

    def _elements(self, ptr, shape, dt, mask, call):
        """``(addresses, mask)``, both of the access's shape: each element's byte address
        (a block from an int ``ptr``, or an int tensor's own) and whether it is accessed."""
        if isinstance(ptr, Tensor):
            addrs = np.asarray(ptr.a)
            if not np.issubdtype(addrs.dtype, np.integer):
                raise self.fault(call, f"tl.{call}: the addresses are {ptr.dtype}, not integers")
            if shape is not None and self._sh(shape, call) != addrs.shape:
                raise self.fault(call, f"tl.{call}: shape {shape} is not the addresses' "
                                       f"{addrs.shape}")
            addrs = addrs.astype(np.int64)
        else:
            if not isinstance(ptr, (int, np.integer)) or isinstance(ptr, bool):
                raise self.fault(call, f"tl.{call}: the pointer is a {type(ptr).__name__}, "
                                       f"not an address (int)")
            shape = self._sh(shape, call)
            addrs = int(ptr) + np.arange(int(np.prod(shape, dtype=np.int64)),
                                         dtype=np.int64).reshape(shape) * dt.itemsize
        if mask is None:
            return addrs, np.ones(addrs.shape, bool)
        try:
            m = np.broadcast_to(np.asarray(self._array(mask, call), dtype=bool), addrs.shape)
        except ValueError:
            raise self.fault(call, f"tl.{call}: the mask {np.shape(self._array(mask, call))} "
                                   f"does not broadcast to {addrs.shape}") from None
        return addrs, m

    def _where(self, addrs: np.ndarray, size: Optional[int], call: str):
        """For the regions that ``addrs`` (flat byte addresses of elements of ``size``
        bytes; None: of each region's own) fall in: ``(region, positions in addrs,
        offsets)``; an address outside every tensor, past one's end or not on an element
        is a fault."""
        left = np.ones(addrs.shape, bool)
        own = size
        for r in self.regions:
            size = own or r.data.dtype.itemsize
            inside = (addrs >= r.base) & (addrs < r.base + BASE)    # its address space
            if not inside.any():
                continue
            at = np.flatnonzero(inside)
            offs = addrs[at] - r.base
            bad = (offs + size > r.size) | (offs % size != 0)
            if bad.any():
                off = int(offs[np.argmax(bad)])
                why = (f"runs past the end of {r.name} ({r.size} bytes)"
                       if off + size > r.size else f"is not on an element of {size} bytes")
                raise self.fault(call, f"tl.{call} of an element at {r.name}+{off} {why}")
            left[at] = False
            yield r, at, offs
        if left.any():
            ptr = int(addrs[np.argmax(left)])
            near = min(self.regions, key=lambda r: abs(ptr - r.base))
            raise self.fault(call, f"tl.{call} at {near.name}{ptr - near.base:+d}: outside "
                                   f"every tensor of this PE's memory")

    def dot(self, a: Tensor, b: Tensor, acc: Optional[Tensor] = None, input_precision=None,
            allow_tf32=None, max_num_imprecise_acc=None, out_dtype=None) -> Tensor:
        """``a @ b`` (plus ``acc``, as Triton's), accumulated in float32 and rounded once
        to ``acc``'s dtype, else ``out_dtype``, else the operands'. The precision hints
        change nothing: the product is float32's."""
        x, y = self._array(a, "dot"), self._array(b, "dot")
        if np.ndim(x) != 2 or np.ndim(y) != 2 or x.shape[1] != y.shape[0]:
            raise self.fault("dot", f"tl.dot needs (M, K) and (K, N), got {np.shape(x)} "
                                    f"and {np.shape(y)}")
        out_dt = (np.result_type(x.dtype, y.dtype) if out_dtype is None
                  else self._dt(out_dtype, "dot"))
        z = None
        if acc is not None:
            z = self._array(acc, "dot")
            if np.shape(z) != (x.shape[0], y.shape[1]):
                raise self.fault("dot", f"tl.dot's acc is {np.shape(z)}, not the product's "
                                        f"{(x.shape[0], y.shape[1])}")
            if out_dtype is not None and out_dt != z.dtype:
                raise self.fault("dot", f"tl.dot's acc is {dtype_name(z.dtype)} but out_dtype "
                                        f"is {dtype_name(out_dt)}; they must agree")
            out_dt = z.dtype
        with self._traced("dot", shape=[x.shape[0], y.shape[1]], k=x.shape[1]):
            out = np.matmul(x.astype(np.float32, copy=False), y.astype(np.float32, copy=False))
            if z is not None:                # accumulated in place, as the matrix unit does
                out += z.astype(np.float32, copy=False)
            out = out.astype(out_dt, copy=False)
        flops = 2 * x.shape[0] * x.shape[1] * y.shape[1]
        cell = self.monitor.call("dot", "dot", flops, dtype=x.dtype, reads=(a, b, acc),
                                 makes=True)
        return self._tensor(out, "dot", (x, y), cell)

    def sum(self, x: Tensor, axis: Optional[int] = -1, keep_dims: bool = False,
            dtype=None) -> Tensor:
        """Sum along ``axis`` (None: all) in float32, rounded once to ``x``'s dtype (or
        ``dtype``, as Triton's)."""
        dt = None if dtype is None else self._dt(dtype, "sum")
        return self._op("sum", lambda a: np.asarray(np.sum(
            a, axis=axis, dtype=np.float32, keepdims=keep_dims)).astype(dt or a.dtype), x)

    def max(self, x: Tensor, axis: Optional[int] = -1, return_indices: bool = False,
            return_indices_tie_break_left: bool = True, keep_dims: bool = False):
        """The largest along ``axis``; with ``return_indices``, ``(values, indices)``
        (two reductions, as the cost model counts them), the first index on a tie."""
        values = self._op("max", lambda a: np.max(a, axis=axis, keepdims=keep_dims), x)
        return (values, self.argmax(x, axis, keep_dims)) if return_indices else values

    def min(self, x: Tensor, axis: Optional[int] = -1, return_indices: bool = False,
            return_indices_tie_break_left: bool = True, keep_dims: bool = False):
        """The smallest along ``axis``; ``return_indices`` as :meth:`max`."""
        values = self._op("min", lambda a: np.min(a, axis=axis, keepdims=keep_dims), x)
        return (values, self.argmin(x, axis, keep_dims)) if return_indices else values

    def argmax(self, x: Tensor, axis: Optional[int] = -1, keep_dims: bool = False) -> Tensor:
        return self._op("argmax", lambda a: np.asarray(np.argmax(
            a, axis=axis, keepdims=keep_dims)).astype(np.int32), x)

    def argmin(self, x: Tensor, axis: Optional[int] = -1, keep_dims: bool = False) -> Tensor:
        return self._op("argmin", lambda a: np.asarray(np.argmin(
            a, axis=axis, keepdims=keep_dims)).astype(np.int32), x)

    def cumsum(self, x: Tensor, axis: int = -1) -> Tensor:
        """Running sums along ``axis``, in float32, rounded once to ``x``'s dtype."""
        return self._op("cumsum", lambda a: np.cumsum(a, axis=axis, dtype=np.float32)
                        .astype(a.dtype), x)

    def softmax(self, x: Tensor, dim: int = -1) -> Tensor:
        """``exp(x - max) / sum`` along the last axis, in float32, rounded once."""
        def fn(a):
            e = np.exp(a.astype(np.float32) - np.max(a, axis=dim, keepdims=True))
            return (e / np.sum(e, axis=dim, keepdims=True)).astype(a.dtype)
        return self._op("softmax", fn, x)

    def num_programs(self, axis: int = 0) -> int:
        """The PEs of a cube (axis 0) or the cubes (axis 1)."""
        if axis not in (0, 1):
            raise self.fault("num_programs", f"tl.num_programs: axis must be 0 (PEs) or 1 "
                                             f"(cubes), got {axis!r}")
        return self._programs[axis]

    float16, float32, bfloat16, float8e4nv, float8e5, int32, int1 = (
        DType(x) for x in ("f16", "f32", "bf16", "fp8e4m3", "fp8e5m2", "i32", "i1"))
    """Triton's dtype objects, as the strings every ``dtype=`` here takes."""

    def join(self, a, b) -> Tensor:
        """``a`` and ``b`` side by side along a new last axis of 2."""
        return self._op("join", lambda x, y: np.stack(np.broadcast_arrays(x, y), axis=-1),
                        a, b)

    def split(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """The two halves of a last axis of 2: the inverse of :meth:`join`."""
        if x.shape[-1:] != (2,):
            raise self.fault("split", f"tl.split takes a last axis of 2, got {x.shape}")
        return (self._op("split", lambda a: np.ascontiguousarray(a[..., 0]), x),
                self._op("split", lambda a: np.ascontiguousarray(a[..., 1]), x))
    constexpr = staticmethod(lambda value: value)
    """An annotation of a compile-time parameter; called, ``tl.constexpr(v)`` is ``v``."""

    @staticmethod
    def static_range(start, end=None, step=None, *, num_stages=None, loop_unroll_factor=None,
                     disallow_acc_multi_buffer=False, flatten=False, warp_specialize=False,
                     disable_licm=False):
        """Python's ``range`` of ``(start, end, step)``; Triton's pipelining and unrolling
        hints are taken and change nothing (``tl.range`` is the same)."""
        return range(start) if end is None else range(start, end, 1 if step is None else step)

    range = static_range

    @staticmethod
    def cdiv(a, b):
        """``ceil(a / b)`` of integers (numbers or tensors)."""
        return (a + b - 1) // b

    def arange(self, start: int, end: int) -> Tensor:
        """``start .. end - 1`` as int32."""
        return self._block("arange", np.arange(start, end, dtype=np.int32))

    def zeros_like(self, x: Tensor) -> Tensor:
        return self._op("zeros_like", np.zeros_like, x)

    def full_like(self, x: Tensor, value) -> Tensor:
        return self._op("full_like", lambda a: np.full_like(a, value), x)

    def view(self, x: Tensor, shape) -> Tensor:
        """``reshape``: the same elements in row-major order, as ``shape``."""
        return self.reshape(x, shape)

    def expand_dims(self, x: Tensor, axis: int) -> Tensor:
        return self._op("expand_dims", lambda a: np.expand_dims(a, axis), x)

    def ravel(self, x: Tensor) -> Tensor:
        return self._op("ravel", np.ravel, x)

    def permute(self, x: Tensor, dims) -> Tensor:
        return self._op("permute", lambda a: np.ascontiguousarray(np.transpose(a, dims)), x)

    def broadcast_to(self, x: Tensor, shape) -> Tensor:
        shape = self._sh(shape, "broadcast_to")
        return self._op("broadcast_to", lambda a: np.array(np.broadcast_to(a, shape)), x)

    def trans(self, x: Tensor) -> Tensor:
        return self._op("trans", lambda a: np.ascontiguousarray(a.T), x)

    def reshape(self, x: Tensor, shape) -> Tensor:
        """The same elements in row-major order, as ``shape`` (a byte-conserving reshape)."""
        a, shape = self._array(x, "reshape"), self._sh(shape, "reshape")
        if int(np.prod(shape, dtype=np.int64)) != np.size(a):
            raise self.fault("reshape", f"tl.reshape of {np.shape(a)} ({np.size(a)} "
                                        f"elements) to {shape}")
        return self._op("reshape", lambda a: np.reshape(a, shape), x)   # a view, as a slice

    def cast(self, x: Tensor, dtype, fp_downcast_rounding=None, bitcast: bool = False
             ) -> Tensor:
        """``x`` in ``dtype``, rounded to nearest even; with ``bitcast``, its bits read as
        ``dtype`` (of the same width), as Triton's."""
        dt = self._dt(dtype, "cast")
        if fp_downcast_rounding not in (None, "rtne"):
            raise self.fault("cast", f"tl.cast(fp_downcast_rounding={fp_downcast_rounding!r}):"
                                     f" only 'rtne', round to nearest even, is emulated")
        if bitcast:
            if dt.itemsize != np.asarray(self._array(x, "cast")).dtype.itemsize:
                raise self.fault("cast", f"tl.cast(bitcast=True) from {x.dtype} to "
                                         f"{dtype_name(dt)}: the widths differ")
            return self._op("cast", lambda a: np.ascontiguousarray(a).view(dt), x)
        return self._op("cast", lambda a: np.asarray(a).astype(dt), x)

    def zeros(self, shape, dtype="f32") -> Tensor:
        shape, dt = self._sh(shape, "zeros"), self._dt(dtype, "zeros")
        return self._block("zeros", np.zeros(shape, dt))

    def full(self, shape, value, dtype="f32") -> Tensor:
        """A constant block: the value asked for, infinities included, is no origin of
        non-finite values."""
        shape, dt = self._sh(shape, "full"), self._dt(dtype, "full")
        if not isinstance(value, NUMBERS):
            raise self.fault("full", f"tl.full: the value is a {type(value).__name__}, "
                                     f"not a number")
        return self._block("full", np.full(shape, value, dt))

    def copy_to(self, dst: Tensor, src) -> None:
        """Overwrite ``dst``'s values with ``src``'s (same shape), in ``dst``'s dtype."""
        if not isinstance(dst, Tensor):
            raise self.fault("copy_to", "tl.copy_to: the destination is not a tensor")
        self._array(dst, "copy_to")
        a = self._array(src, "copy_to")
        if np.shape(a) != dst.shape:
            raise self.fault("copy_to", f"tl.copy_to of {np.shape(a)} into {dst.shape}")
        with self._traced("copy_to", shape=list(dst.shape)):
            # new values, never a write into the old ones: slices, reshapes and loads
            # are views, and a tensor viewing dst keeps the values it was made with
            dst.a = np.array(a, dtype=dst.a.dtype)
        dst.cell = self.monitor.call("copy_to", "vec", dst.a.size, dtype=dst.a.dtype,
                                     reads=(src, dst), makes=True)

    def send(self, dir: str, src: Tensor) -> None:  # noqa: A002 (the kernel's keyword)
        """``src``'s elements as they are now, in its dtype, to the neighbour ``dir``."""
        a = np.array(self._array(src, "send"), order="C")   # a copy: later writes stay
        self._need_link("send")
        with self._traced("send", dir=dir, shape=list(a.shape), dtype=dtype_name(a.dtype),
                          bytes=a.nbytes):
            self.link.send(dir, a, self.monitor.line)
        self.monitor.call("send", "send", a.nbytes, dir, reads=(src,))

    def recv(self, dir: str, shape, dtype="f16") -> Tensor:  # noqa: A002
        """The next message sent this way from ``dir``, as ``shape`` of ``dtype``."""
        shape, dt = self._sh(shape, "recv"), self._dt(dtype, "recv")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        self._need_link("recv")
        with self._traced("recv", dir=dir, shape=list(shape), dtype=dtype_name(dt),
                          bytes=nbytes):
            raw = self.link.recv(dir, nbytes, self.monitor.line,
                                 f"shape {shape} {dtype_name(dt)}")
        cell = self.monitor.call("recv", "recv", nbytes, dir, makes=True)
        return Tensor(np.frombuffer(raw, dtype=dt).reshape(shape).copy(), self, cell)

    def _need_link(self, call: str) -> None:
        if self.link is None:
            raise self.fault(call, f"tl.{call}: this PE has no links (a single-PE run)")

    def _traced(self, name: str, **args):
        """A span of the trace around a call; nothing to do (a shared null context) when
        there is no trace, so that the calls pay nothing for it."""
        return UNTRACED if self.monitor.rec is None else self.monitor.span(name, **args)


def _sigmoid(a):
    return 1 / (1 + np.exp(-a))


def _erf(a):
    """erf in float64 (Abramowitz and Stegun 7.1.26: within 1.5e-7), in ``a``'s dtype."""
    x = np.abs(a.astype(np.float64))
    t = 1 / (1 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))
    return (np.sign(a) * (1 - poly * np.exp(-x * x))).astype(a.dtype)


ELEMENTWISE = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
    "rsqrt": lambda a: np.reciprocal(np.sqrt(a)), "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "sigmoid": _sigmoid, "erf": _erf,
    "maximum": np.maximum, "minimum": np.minimum, "where": np.where,
    "fma": lambda a, b, c: a * b + c,
    "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
}
"""Triton's elementwise calls, each one NumPy call on the aligned operands (the row
rule and NumPy's broadcasting), its result in the operands' dtype: a vector call,
costed by its result's elements."""

VOCABULARY = {
    "program": (("program_id", "num_programs", "constexpr", "static_range", "range",
                 "local_tokens"), "nothing"),
    "dtypes": (("float16", "float32", "bfloat16", "float8e4nv", "float8e5", "int32", "int1"),
               "nothing; the strings f16 f32 bf16 fp8e4m3 fp8e5m2 i32 i1 too"),
    "creation": (("arange", "zeros", "full", "zeros_like", "full_like", "cast"),
                 "vector, by result elements (x.to(dtype) is cast)"),
    "views": (VIEWS, "nothing, as slices, x[:, None] and x[None, :]"),
    "moves": (("trans", "permute", "broadcast_to", "join", "split"),
              "vector, by result elements (x.T is trans)"),
    "elementwise": (tuple(ELEMENTWISE) + ("cdiv",),
                    "vector, by result elements, as the operators + - * / // % ** & | ^ ~ "
                    "and the comparisons"),
    "reductions": (REDUCTIONS, "vector, by operand elements"),
    "matrix": (("dot",), "dot, 2*M*K*N flops"),
    "memory": (("load", "store"), "mem, the bytes of the elements the mask lets through"),
    "scratch": (("scratch_scope", "copy_to"), "nothing; copy_to vector, by dst's elements"),
    "messages": (("send", "recv"), "send: its link; recv: call_s, then its message"),
    "debug": (("device_print", "static_print", "static_assert", "device_assert"), "nothing"),
}
"""Every name a kernel may call on ``tl``, by group, with its cost class in ``--predict``
(docs/kernel-source.md's table is this one); the start-up scan refuses the others."""
CALLS = frozenset(name for names, _ in VOCABULARY.values() for name in names)

for _name, _fn in ELEMENTWISE.items():
    setattr(Backend, _name, (lambda name, fn: lambda self, *xs: self._op(name, fn, *xs))(
        _name, _fn))


def run_kernel(fn, backend: Backend, T_q: int, S_kv: int, h_q: int, h_kv: int, d: int,
               C: int, P: int):
    """Call the kernel with SPEC's signature on ``backend``'s memory (NumPy's warnings
    off: inf and NaN are the kernel's values, reported by the monitor)."""
    object.__setattr__(backend, "_programs", (P, C))
    ptr = backend.pointer
    with np.errstate(all="ignore"):
        return fn(ptr("Q"), ptr("K"), ptr("V"), ptr("O"), T_q, S_kv, h_q, h_kv, d, C, P,
                  tl=backend)
