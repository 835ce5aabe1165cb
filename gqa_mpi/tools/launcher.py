"""Build ``mpirun`` command lines for the MPI found beside this Python.

Used by the tests (and studies) to launch real multi-rank runs in a subprocess.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import List, Sequence


@functools.lru_cache(maxsize=None)
def mpirun() -> str:
    """The launcher: ``$GQA_MPI_MPIRUN``, else ``mpirun`` beside this Python, else on PATH."""
    explicit = os.environ.get("GQA_MPI_MPIRUN")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("no mpirun found: pip install mpich, or load your "
                                "site's MPI, or set GQA_MPI_MPIRUN")
    return found


@functools.lru_cache(maxsize=None)
def is_open_mpi() -> bool:
    try:
        out = subprocess.run([mpirun(), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out or "OpenRTE" in out


def mpirun_command(n: int, args: Sequence[str]) -> List[str]:
    """``mpirun -n N <args>``. With Open MPI's launcher (``GQA_MPI_MPIRUN`` pointing at
    it): oversubscribing, as root if we are, and with mpi4py told to load Open MPI
    (``MPI4PY_MPIABI=openmpi`` unless set) and the environment it needs forwarded."""
    cmd = [mpirun(), "-n", str(n)]
    if is_open_mpi():
        cmd.append("--oversubscribe")
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        abi = os.environ.get("MPI4PY_MPIABI", "openmpi")
        cmd += ["-x", f"MPI4PY_MPIABI={abi}", "-x", "PATH", "-x", "PYTHONPATH"]
    return cmd + list(args)


def gqa_command(n: int, args: Sequence[str]) -> List[str]:
    """``mpirun -n N python -m gqa_mpi <args>`` with this Python."""
    return mpirun_command(n, [sys.executable, "-m", "gqa_mpi", *args])


def run_bounded(cmd: Sequence[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd)`` with output captured, in a session of its own, so that on
    timeout the launcher and every rank it started are killed (the ranks hold the
    pipes: killing the launcher alone would leave the wait hanging). Raises
    ``subprocess.TimeoutExpired`` (with what was printed) after the kill."""
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True, **kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(list(cmd), timeout, out, err) from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def plain(doc: str) -> str:
    """A module docstring as ``--help`` text: no RST markup (literals, roles such as
    ``:mod:`x```), no table rules."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc.replace("``", ""))
    lines = [line for line in text.splitlines()
             if not (line.strip() and set(line.strip()) <= {"=", " "})]
    return "\n".join(lines)
