"""A kernel's own file (``--kernel-source FILE[:FUNCTION]``): found, loaded once, and its
function's signature checked before any rank calls it. No MPI here.

``builtin:NAME`` is ``gqa_mpi/kernels/NAME.py``. Without ``:FUNCTION`` the kernel is the
one public function whose name ends in ``_kernel``. Its signature must take the
arguments ``(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, *, tl)``.
Before it runs, its source is scanned for every ``tl.NAME`` that gqa_mpi's ``tl`` does
not have: they are refused together, each with its first line.

A kernel is taken to assume the design card's PE grid of 4 columns (``pe % 4``, as
the reference kernel computes it); one that works out its neighbours for any
``--grid`` says so in its file, after its definition: ``my_kernel.any_grid = True``.
"""
from __future__ import annotations

import inspect
import tokenize
import os
import runpy
import sys
import threading
import types
from typing import Callable, Dict, List, Optional, Tuple

BUILTIN = "builtin:"
KERNELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "kernels")
POSITIONAL = 11
"""``q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P``."""

_loaded: Dict[Tuple[str, Optional[str], float], Tuple[Callable, str]] = {}
_loading = threading.Lock()


def resolve(spec: str) -> Tuple[str, Optional[str]]:
    """``FILE[:FUNCTION]`` -> ``(absolute path, function or None)``."""
    if spec.startswith(BUILTIN):
        name, _, fn = spec[len(BUILTIN):].partition(":")
        return os.path.join(KERNELS_DIR, name + ".py"), fn or None
    path, fn = spec, None
    if not os.path.exists(spec) and ":" in spec:
        head, _, tail = spec.rpartition(":")
        if tail.isidentifier():
            path, fn = head, tail
    return os.path.abspath(path), fn


def builtins() -> list:
    """The names ``builtin:NAME`` takes: the kernels that ship with gqa_mpi."""
    return sorted(f[:-3] for f in os.listdir(KERNELS_DIR)
                  if f.endswith(".py") and not f.startswith("_"))


def load(spec: str) -> Tuple[Callable, str]:
    """The kernel function and its file, loaded once per process (its top-level code
    runs once, and PEs that are threads of one process share its module); ValueError
    with one line otherwise."""
    path, name = resolve(spec)
    if not os.path.isfile(path):
        if spec.startswith(BUILTIN):
            raise ValueError(f"--kernel-source {spec}: no builtin kernel "
                             f"{spec[len(BUILTIN):].partition(':')[0]!r} (the builtins: "
                             f"{', '.join(builtins())})")
        raise ValueError(f"--kernel-source {spec}: no such file {path}")
    key = (path, name, os.path.getmtime(path))
    with _loading:                # PEs in process: one loads it, the others share it
        if key not in _loaded:
            lacking = missing_calls(path)
            if lacking:
                shown = spec.rsplit(":", 1)[0] if name else spec
                raise ValueError(f"kernel {shown} uses calls gqa_mpi's tl does not have: "
                                 + ", ".join(f"tl.{n} (line {line})" for n, line in lacking))
            _loaded[key] = _load(spec, path, name)
        return _loaded[key]


def missing_calls(path: str) -> List[Tuple[str, int]]:
    """Every ``tl.NAME`` of the file's code (not its comments or strings) that the
    backend lacks, with the first line it is on, in the order of the file."""
    from .tl import CALLS
    found: Dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            tokens = [t for t in tokenize.tokenize(f.readline)
                      if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        return []                       # the load that follows says what is wrong
    for a, dot, b, after in zip(tokens, tokens[1:], tokens[2:], tokens[3:] + [None]):
        if (a.type == tokenize.NAME and a.string == "tl" and dot.string == "."
                and b.type == tokenize.NAME and not b.string.startswith("_")
                and b.string not in CALLS
                and not (after is not None and after.string == "=")):   # tl.x = ...: a
            found.setdefault(b.string, b.start[0])            # setattr, faulted as such
    return list(found.items())


def _triton() -> Dict[str, types.ModuleType]:
    """Stand-ins for ``triton`` and ``triton.language``, so that a Triton kernel file's
    top (``import triton``, ``import triton.language as tl``, ``@triton.jit``,
    ``BLOCK: tl.constexpr = 64``) runs as written: ``jit`` leaves the function as it
    is, and ``triton.language`` has what a file's top level uses (``constexpr``, the
    dtypes, ``cdiv``); inside the kernel, ``tl`` is the argument gqa_mpi passes."""
    from .tl import Backend
    language = types.ModuleType("triton.language")
    for name in ("constexpr", "cdiv", "static_range", "float16", "float32", "bfloat16",
                 "float8e4nv", "float8e5", "int32", "int1"):
        setattr(language, name, getattr(Backend, name))
    triton = types.ModuleType("triton")

    def jit(fn=None, **options):
        return fn if fn is not None else (lambda f: f)
    triton.jit, triton.language, triton.cdiv = jit, language, Backend.cdiv
    return {"triton": triton, "triton.language": language}


def _load(spec: str, path: str, name: Optional[str]) -> Tuple[Callable, str]:
    stand_ins = _triton()
    saved = {k: sys.modules.get(k) for k in stand_ins}
    sys.modules.update(stand_ins)
    try:
        namespace = runpy.run_path(path, init_globals={"tl": stand_ins["triton.language"]},
                                   run_name="gqa_mpi_kernel_source")
    except SyntaxError as e:
        raise ValueError(f"--kernel-source {spec}: syntax error at {path}:{e.lineno}: "
                         f"{e.msg}") from None
    except BaseException as e:  # noqa: BLE001 - the file's own top level failed
        raise ValueError(f"--kernel-source {spec}: running {path} failed: "
                         f"{type(e).__name__}: {e}") from None
    finally:
        for k, module in saved.items():
            if module is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = module
    if name is not None:
        fn = namespace.get(name)
        if not callable(fn):
            raise ValueError(f"--kernel-source {spec}: {path} defines no function {name!r}")
    else:
        found = sorted(k for k, v in namespace.items()
                       if k.endswith("_kernel") and callable(v) and not k.startswith("_"))
        if len(found) != 1:
            what = "no function whose name ends in _kernel" if not found else \
                f"several kernels ({', '.join(found)})"
            raise ValueError(f"--kernel-source {spec}: {path} has {what}; name one as "
                             f"FILE:FUNCTION")
        fn = namespace[found[0]]
    why = signature_problem(fn)
    if why:
        line = getattr(getattr(fn, "__code__", None), "co_firstlineno", "?")
        raise ValueError(f"--kernel-source {spec}: {fn.__name__} at {path}:{line} {why}; "
                         f"SPEC's kernel is f(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, "
                         f"h_kv, d_head, C, P, *, tl)")
    return fn, path


def signature_problem(fn: Callable) -> Optional[str]:
    """Why ``fn`` cannot be called with SPEC's arguments, or None."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None                                   # a builtin: let the call tell
    try:
        sig.bind(*range(POSITIONAL), tl=None)
    except TypeError as e:
        return f"cannot take SPEC's arguments ({e})"
    return None


CARD_COLUMNS = 4
"""The PE grid's columns a kernel assumes unless it declares ``any_grid``."""


def grid_problem(fn: Callable, path: str, grid) -> Optional[str]:
    """Why ``fn`` cannot run on a ``(rows, cols)`` PE grid, or None."""
    rows, cols = grid
    if cols == CARD_COLUMNS or getattr(fn, "any_grid", False):
        return None
    return (f"--kernel-source: {fn.__name__} ({path}) assumes the card's PE grid of "
            f"{CARD_COLUMNS} columns, not --grid {rows}x{cols}; a kernel that takes any "
            f"grid says so in its file with `{fn.__name__}.any_grid = True`")
