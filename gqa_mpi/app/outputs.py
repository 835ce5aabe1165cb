"""Writing what a run produces without ever destroying what the user owns. No MPI here.

- :func:`check_paths` refuses, before any compute, an output that exists and is not a
  regular file (a device, a FIFO, a directory), an output that is one of the inputs
  or another output, a name too long for its file system, a missing or read-only
  directory, or a file system without room for the output.
- :func:`atomic_write` writes through a temporary file in the same directory and
  renames it over the target: a reader sees the old file or the whole new one. A
  replaced file keeps its mode; a new one gets the umask's. SIGTERM or SIGINT in the
  middle of a write removes the temporary file before the process ends.

A symbolic link is followed: the file it points to is replaced, the link stays. A
path that names this process's own stdout or stderr (``/dev/stdout``, ``/dev/fd/2``,
or the file the shell redirected stdout to) is that stream: written in place, after
what was printed before it, never renamed over.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import sys
import tempfile
from contextlib import contextmanager
from typing import Callable, Dict, Iterable, Optional

import numpy as np

from ..mpi.faults import inject
from .sizing import fmt

TEMP_PREFIX, TEMP_SUFFIX = ".gqa_mpi-", ".tmp"
"""Temporary names are short and fixed in length, whatever the target's name."""
PROBE_PREFIX = ".gqa_mpi_probe-"
"""The empty file that proves a directory writable (removed at once)."""


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived (while an output was written, or during a study)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def stream(path: str) -> Optional[int]:
    """The file descriptor (1 or 2) of this process's stdout or stderr that ``path``
    names, else None."""
    try:
        target = os.stat(path)
    except OSError:
        return None
    for fd in (1, 2):
        try:
            if os.path.samestat(target, os.fstat(fd)):
                return fd
        except OSError:
            pass
    return None


def check_paths(outputs: Dict[str, Optional[str]], inputs: Iterable[str] = (),
                sizes: Optional[Dict[str, int]] = None) -> Optional[str]:
    """Why the outputs ``{flag: path}`` cannot be written safely, or None.

    ``inputs`` are files the run reads; ``sizes`` the bytes each output will take
    (estimated), checked against the free space of its file system.
    """
    sizes = sizes or {}
    seen: Dict[str, str] = {}
    ins = {os.path.realpath(p): p for p in inputs}
    for flag, path in outputs.items():
        if path is None:
            continue
        if not path:
            return f"{flag}: empty file name"
        fd = stream(path)
        if fd is not None:                  # written in place, after what came before
            name = f"<fd {fd}>"
            if name in seen:
                return (f"{flag} {path}: is also the {seen[name]} output; give each output "
                        f"its own file")
            seen[name] = flag
            continue
        real = os.path.realpath(path)
        where = f"{flag} {path}"
        if os.path.lexists(real) and not os.path.isfile(real):
            try:
                kind = _kind(os.stat(real).st_mode)
            except OSError:
                kind = "a dangling link"
            return f"{where}: exists and is {kind}; refusing to replace it"
        if real in ins:
            return f"{where}: is the input file {ins[real]}; refusing to overwrite it"
        if real in seen:
            return f"{where}: is also the {seen[real]} output; give each output its own file"
        seen[real] = flag
        directory, name = os.path.split(real)
        if not os.path.isdir(directory):
            return f"{where}: directory {directory} does not exist"
        try:
            limit = os.pathconf(directory, "PC_NAME_MAX")
        except (OSError, ValueError):
            limit = 255
        if len(os.fsencode(name)) > limit:
            return f"{where}: file name longer than {limit} bytes"
        try:  # access() says yes to root even on a read-only file system: really try
            fd, probe = tempfile.mkstemp(dir=directory, prefix=PROBE_PREFIX, suffix=TEMP_SUFFIX)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            return f"{where}: directory {directory} is not writable ({e.strerror})"
        need = sizes.get(flag, 0)
        if need:
            st = os.statvfs(directory)
            free = st.f_bavail * st.f_frsize
            old = os.path.getsize(real) if os.path.isfile(real) else 0
            if need > free:  # the old file stays until the rename: count it as used
                return (f"{where}: needs about {fmt(need)} but {directory} has "
                        f"{fmt(free)} free (the old file, {fmt(old)}, stays until the "
                        f"new one is complete)")
    return None


@contextmanager
def _signals_raise():
    """Turn SIGTERM and SIGINT into :class:`Interrupted` (main thread only)."""
    def handler(signum, frame):
        raise Interrupted(signum)

    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: leave the signals alone
        old = {}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write: Callable[[object], None], mode: str = "wb") -> None:
    """Write ``path`` through a temporary file in the same directory, then rename.

    Raises OSError (no space, permissions, ...) or :class:`Interrupted`, in both
    cases with the temporary file removed and the old ``path`` untouched. A ``path``
    that is this process's stdout or stderr (:func:`stream`) is written to it in place.
    """
    fd = stream(path)
    if fd is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        with os.fdopen(os.dup(fd), mode) as f:
            write(f)
        return
    real = os.path.realpath(path)
    directory = os.path.dirname(real)
    try:
        keep = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        keep = 0o666 & ~_umask()
    with _signals_raise():
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX)
        try:
            with os.fdopen(fd, mode) as f:
                write(f)
                f.flush()
                inject("write", 0)
                os.fsync(f.fileno())
            os.chmod(tmp, keep)
            os.replace(tmp, real)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def write_json(path: str, record: Dict) -> None:
    """Strict JSON (no NaN or Infinity literals: non-finite numbers become null)."""
    def write(f):
        json.dump(_strict(record), f, indent=2, allow_nan=False)
        f.write("\n")
    atomic_write(path, write, mode="w")


def _strict(x):
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


def write_npy(path: str, array: np.ndarray) -> None:
    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False))


def npy_bytes(shape) -> int:
    """Size of a float32 .npy file of ``shape`` (header included)."""
    return int(np.prod(shape, dtype=np.float64)) * 4 + 128


def write_all(output: Optional[str], array, trace: Optional[str], trace_doc,
              json_path: Optional[str], record: Optional[Dict]) -> bool:
    """Rank 0's outputs, each written atomically: O (``.npy``), the trace and the run
    record, those whose path is set. A write that fails is one line on stderr and the
    others still go; returns whether every write succeeded."""
    ok = True
    for path, write in ((output, lambda p: write_npy(p, array)),
                        (trace, lambda p: write_json(p, trace_doc)),
                        (json_path, lambda p: write_json(p, record))):
        if path is None:
            continue
        try:
            write(path)
        except OSError as e:  # checked up front; the disk can still fill meanwhile
            print(f"gqa_mpi: error: writing {path}: {e.strerror or e}; the old file, if "
                  f"any, is untouched and no temporary file is left", file=sys.stderr,
                  flush=True)
            ok = False
    return ok
