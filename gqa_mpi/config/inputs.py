"""Where Q, K and V come from: generated from a seed, or read from .npy files.

Generated inputs do not depend on the rank count: token block ``b`` of tensor ``t``
of sequence ``i`` is always drawn from ``default_rng([seed, t, i, b])``, so a rank
draws only the blocks that overlap its slice and the global tensors are the same
whether 1 or 64 ranks run.

Files are ``q.npy`` ``(T_q, h_q*d)`` or ``(B, T_q, h_q*d)`` and ``k.npy``, ``v.npy``
``(S_kv, h_kv*d)`` or ``(B, S_kv, h_kv*d)``, float16 or float32. Their headers are
checked without reading data (:func:`inspect_inputs`); K and V are memory-mapped so a
rank reads only its own rows.
"""
from __future__ import annotations

import math
import os
from typing import Dict, Tuple

import numpy as np

from ..step.dtypes import FLOATS

GEN_BLOCK = 4096
"""Tokens per independently seeded block of generated K and V."""

MAX_DIM = 1 << 40
"""No dimension of an input file can be this large (1 Ti elements)."""

TENSORS = ("q", "k", "v")


def generate(seed: int, tensor: str, batch: int, n_tokens: int, width: int,
             start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows ``start:stop`` of a generated ``(batch, n_tokens, width)`` float32 tensor.

    Values are uniform on ``[-sqrt(3), sqrt(3))``, so mean 0 and variance 1 like a
    normalised activation (uniform draws are several times faster than normal ones,
    which matters at millions of tokens); any ``start:stop`` window equals the same
    window of the whole tensor.
    """
    stop = n_tokens if stop is None else stop
    tid = TENSORS.index(tensor)
    out = np.empty((batch, stop - start, width), dtype=np.float32)
    for i in range(batch):
        for blk in range(start // GEN_BLOCK, -(-stop // GEN_BLOCK)):
            b0 = blk * GEN_BLOCK
            b1 = min(b0 + GEN_BLOCK, n_tokens)
            rng = np.random.default_rng([seed, tid, i, blk])
            lo, hi = max(start, b0), min(stop, b1)
            whole = (lo, hi) == (b0, b1)      # drawn in place, or drawn whole and cut
            block = (out[i, lo - start:hi - start] if whole
                     else np.empty((b1 - b0, width), dtype=np.float32))
            rng.random(dtype=np.float32, out=block)
            rows = max(1, _PIECE_BYTES // (4 * width))
            for r in range(0, b1 - b0, rows):     # scaled a cache-sized piece at a time
                piece = block[r:r + rows]
                piece -= np.float32(0.5)
                piece *= np.float32(2 * np.sqrt(3))
            if not whole:
                out[i, lo - start:hi - start] = block[lo - b0:hi - b0]
    return out


_PIECE_BYTES = 256 << 10
"""Bytes of a generated block scaled at a time (kept in cache)."""


def query_stream(seed: int, batch: int, steps: int, queries: int, width: int) -> np.ndarray:
    """The queries of a generated decode loop, ``(B, steps*T_q, h_q*d)``, drawn at once:
    step ``s`` takes rows ``s*T_q ..`` (:func:`step_queries`), and step 0's are the
    one-step run's Q."""
    return generate(seed, "q", batch, steps * queries, width)


def step_queries(stream: np.ndarray, step: int, queries: int) -> np.ndarray:
    """Q ``(B, T_q, h_q*d)`` of decode step ``step`` of a :func:`query_stream`."""
    return stream[:, step * queries:(step + 1) * queries]


class GeneratedRows:
    """Rows ``start:stop`` of a generated K or V, drawn only when sliced.

    ``rows[:, i:j]`` gives tokens ``start+i .. start+j`` as float32
    ``(batch, j-i, width)``; ``np.asarray(rows)`` gives them all. A rank can so make
    its slice resident a chunk at a time instead of holding it twice.
    """

    def __init__(self, seed: int, tensor: str, batch: int, n_tokens: int, width: int,
                 start: int, stop: int):
        self.args = (seed, tensor, batch, n_tokens, width)
        self.start = start
        self.shape = (batch, stop - start, width)

    def __getitem__(self, key):
        batch, tokens = key
        if batch != slice(None) or tokens.step not in (None, 1):
            raise IndexError("GeneratedRows takes [:, i:j] only")
        i, j, _ = tokens.indices(self.shape[1])
        return generate(*self.args, self.start + i, self.start + max(i, j))

    def __array__(self, dtype=None, copy=None):
        out = self[:, 0:self.shape[1]]
        return out if dtype is None else out.astype(dtype, copy=False)


class InputError(ValueError):
    """An input file that cannot be used; the message says which and why."""


def _header(path: str) -> Tuple[tuple, np.dtype, bool, int]:
    """``(shape, dtype, fortran_order, data_offset)`` of a .npy file, data unread."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            reader = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if reader is None:
                raise InputError(f"{path}: not a readable .npy file (format version {version})")
            shape, fortran, dtype = reader(f, max_header_size=100_000)
            offset = f.tell()
    except InputError:
        raise
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"{path}: not a readable .npy file ({e})") from None
    if dtype.hasobject:
        raise InputError(f"{path}: holds Python objects (pickled); "
                         "only float16 or float32 arrays are accepted")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 or n >= MAX_DIM
           for n in shape):
        raise InputError(f"{path}: header shape {shape!r} is not a shape (every "
                         f"dimension must be an integer from 0 to {MAX_DIM - 1})")
    need = offset + math.prod(shape) * dtype.itemsize   # Python ints: no overflow
    size = os.path.getsize(path)
    if size < need:
        raise InputError(f"{path}: truncated ({size} bytes, the header promises {need})")
    return tuple(shape), dtype, fortran, offset


def inspect_inputs(directory: str, head_dim: int) -> Dict[str, int]:
    """Check ``q.npy``, ``k.npy``, ``v.npy`` in ``directory`` and return the problem.

    Returns
    -------
    dict with ``batch`` (None for 2-D files), ``queries``, ``seq_len``, ``heads_q``,
    ``heads_kv`` and ``kv_dtype`` (the dtype of k.npy: a float16 cache stays float16
    by default).

    Raises
    ------
    InputError
        Missing, unreadable, truncated, pickled, wrongly typed or mismatched files.
    """
    if not os.path.isdir(directory):
        raise InputError(f"--inputs {directory}: not a directory")
    shapes, dtypes = {}, {}
    for name in TENSORS:
        path = os.path.join(directory, f"{name}.npy")
        shape, dtype, fortran, _ = _header(path)
        if dtype not in FLOATS.values():
            raise InputError(f"{path}: dtype {dtype} (need float16 or float32)")
        if len(shape) not in (2, 3):
            raise InputError(f"{path}: shape {shape} (need 2-D (tokens, heads*d) "
                             "or 3-D (batch, tokens, heads*d))")
        if fortran and len(shape) > 1:
            raise InputError(f"{path}: Fortran order (need C order, row-major)")
        shapes[name] = shape
        dtypes[name] = dtype
    q, k, v = shapes["q"], shapes["k"], shapes["v"]
    if not len(q) == len(k) == len(v):
        raise InputError(f"q, k, v must all be 2-D or all 3-D, got shapes {q}, {k}, {v}")
    if k != v:
        raise InputError(f"k.npy {k} and v.npy {v} differ in shape")
    if len(q) == 3 and q[0] != k[0]:
        raise InputError(f"q.npy has batch {q[0]} but k.npy has batch {k[0]}")
    for name, width in (("q", q[-1]), ("k", k[-1])):
        if width % head_dim:
            raise InputError(f"{name}.npy width {width} is not a multiple of "
                             f"--head-dim {head_dim}")
    for name, shape in shapes.items():
        if 0 in shape:
            raise InputError(f"{name}.npy shape {shape} is empty")
    return dict(batch=q[0] if len(q) == 3 else None, queries=q[-2], seq_len=k[-2],
                heads_q=q[-1] // head_dim, heads_kv=k[-1] // head_dim,
                kv_dtype=dtypes["k"].name)


def _mapped(directory: str, name: str) -> np.ndarray:
    """``name.npy`` as a read-only memory map, ``(B, n, width)``, read through the same
    header reader as the root's check (so any header it accepts, however long, maps)."""
    path = os.path.join(directory, f"{name}.npy")
    shape, dtype, fortran, offset = _header(path)
    a = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                  order="F" if fortran else "C")
    return a[None] if a.ndim == 2 else a


def open_rows(directory: str, name: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of ``name.npy`` as a read-only memory map, ``(B, n, width)``."""
    return _mapped(directory, name)[:, start:stop]


def load_q(directory: str) -> np.ndarray:
    """The whole of ``q.npy`` as float32 ``(B, T_q, h_q*d)``."""
    return np.array(_mapped(directory, "q"), dtype=np.float32)


def first_nonfinite(name: str, array: np.ndarray, token_offset: int = 0):
    """Where the first NaN or inf of ``array`` (``(B, tokens, width)``) is, or None.

    Checked in blocks of tokens so a memory-mapped slice is never copied whole.
    """
    for t0 in range(0, array.shape[1], GEN_BLOCK):
        block = np.asarray(array[:, t0:t0 + GEN_BLOCK])
        bad = ~np.isfinite(block)
        if bad.any():
            b, t, c = (int(i) for i in np.argwhere(bad)[0])
            kind = "NaN" if np.isnan(block[b, t, c]) else "inf"
            where = "query" if name == "q" else "token"
            return (f"{name}.npy: {kind} at batch {b}, {where} {token_offset + t0 + t}, "
                    f"column {c}")
    return None


def read_rows(directory, seed: int, batch: int, seq_len: int, width: int, name: str,
              start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of K or V (``name``) in memory, ``(B, stop-start, width)``:
    generated from ``seed`` as in a cache of ``seq_len`` tokens, or read from
    ``directory``'s file (in its dtype) through a memory map that is let go at once."""
    if directory is None:
        return generate(seed, name, batch, seq_len, width, start, stop)
    return np.array(open_rows(directory, name, start, stop))


def load_rows(directory, seed: int, batch: int, queries: int, seq_len: int,
              width_q: int, width_kv: int, start: int = 0, stop=None):
    """Q ``(B, T_q, h_q*d)`` float32 and rows ``start:stop`` of K and V
    ``(B, stop-start, h_kv*d)``, from ``directory``'s files or generated from ``seed``.

    K and V are read lazily (generated on slicing, or memory-mapped), so that making
    them resident never holds the slice twice.
    """
    stop = seq_len if stop is None else stop
    if directory is None:
        q = generate(seed, "q", batch, queries, width_q)
        k, v = (GeneratedRows(seed, name, batch, seq_len, width_kv, start, stop)
                for name in "kv")
    else:
        q = load_q(directory)
        k, v = (open_rows(directory, name, start, stop) for name in "kv")
    return q, k, v
