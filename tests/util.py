"""Helpers shared by the tests: launching real MPI runs, writing inputs, and the
small pieces only tests use (the chain's depth by SPEC's formula, Open MPI beside
the default MPI, taking an entry out of a registry)."""
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from typing import List, Optional

import numpy as np

from gqa_mpi.step.attention import (causal_limits, empty_partial, finalize, fold_queries,
                               local_attention, merge, unfold_output)
from gqa_mpi.step.sweeps import NumpySweep, make_resident
from gqa_mpi.step.partition import token_range
from gqa_mpi.tools import launcher
from gqa_mpi.tools.launcher import gqa_command

TIMEOUT = 120


def run_bounded(cmd, timeout=TIMEOUT, **kw):
    """:func:`gqa_mpi.tools.launcher.run_bounded`, failing the test on timeout."""
    try:
        return launcher.run_bounded(cmd, timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(map(str, cmd))} ran past {timeout} s:\n"
                             f"{((e.stdout or '') + (e.stderr or ''))[-3000:]}") from None


def launch(n, args, timeout=TIMEOUT, **kw):
    """Run ``mpirun -n n python -m gqa_mpi args``; the CompletedProcess, or fail on timeout."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(kw.pop("env", {}))
    return run_bounded(gqa_command(n, [str(a) for a in args]), timeout=timeout, env=env, **kw)


def run_cli(capsys, *argv):
    """``python -m gqa_mpi argv`` in this process (one rank): ``(code, stdout, stderr)``."""
    from gqa_mpi.app import cli
    code = cli.main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def in_process(capsys, n, args):
    """``python -m gqa_mpi --in-process`` on the grid ``mpirun -n n`` would place, in
    this process: a ``CompletedProcess`` as :func:`launch` gives (for the tests whose
    point is the run, not MPI: its O and report are the MPI run's)."""
    from gqa_mpi.config.config import Config, default_topology
    args = [str(a) for a in args]
    cubes, pes = default_topology(n, None, None, Config.grid)      # the default --grid
    code, out, err = run_cli(capsys, "--in-process", "--cubes", cubes, "--pes", pes, *args)
    return subprocess.CompletedProcess(args, code, out, err)


def assert_refused(code, out, err, words):
    """A user mistake's answer: exit 2, one line on stderr that starts ``gqa_mpi:
    error:`` and says ``words``, no traceback, nothing on stdout."""
    assert code == 2, out + err
    lines = [s for s in err.splitlines() if s.strip()]
    assert len(lines) == 1 and lines[0].startswith("gqa_mpi: error: "), lines
    assert words in lines[0], lines
    assert "Traceback" not in err and out == "", out + err
    return lines[0]


def refused(capsys, *argv, words):
    """Run ``argv`` in this process and :func:`assert_refused` its answer."""
    return assert_refused(*run_cli(capsys, *argv), words)


def marker(base):
    """A ``--seed`` no other test or concurrent run uses: :func:`leftovers` finds the
    processes started with it."""
    return str(base + (os.getpid() * 7919 + time.time_ns() // 1000) % 1_000_000)


def leftovers(mark):
    """PIDs of processes still running with ``--seed mark``."""
    out = subprocess.run(["pgrep", "-f", "--", f"--seed {mark}"], capture_output=True,
                         text=True)
    assert out.returncode in (0, 1), out.stderr       # 1: nothing matched
    return out.stdout.split()


def wait_until(cond, within, what):
    """Poll ``cond`` until true, failing with ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def assert_no_leftovers(mark, within=10.0, but=()):
    """Poll until no process marked ``mark`` (but the PIDs ``but``) is left."""
    left = lambda: [p for p in leftovers(mark) if int(p) not in but]  # noqa: E731
    wait_until(lambda: not left(), within, lambda: f"left running: {left()}")


def write_inputs(directory, q, k, v):
    """Save q.npy, k.npy, v.npy into ``directory``; return its path as str."""
    os.makedirs(directory, exist_ok=True)
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(directory, f"{name}.npy"), a)
    return str(directory)


def random_inputs(rng, *, S, h_q, h_kv, d, T_q=1, B=None, dtype=np.float32):
    lead = () if B is None else (B,)
    q = rng.standard_normal(lead + (T_q, h_q * d)).astype(dtype)
    k = rng.standard_normal(lead + (S, h_kv * d)).astype(dtype)
    v = rng.standard_normal(lead + (S, h_kv * d)).astype(dtype)
    return q, k, v


def read_json(path):
    with open(path) as f:
        return json.load(f)


def distributed(q, k, v, *, h_kv, n_ranks, tile, scale=None, causal=False, bounds=None,
                order=None):
    """Emulate the whole pipeline without MPI: split, sweep, merge.

    ``order`` is a function from the list of partials (in rank order) to the merged
    one; by default they are merged right to left, as the chain does along a row.
    """
    B, T_q, _ = q.shape
    S = k.shape[1]
    d = k.shape[-1] // h_kv
    G = q.shape[-1] // d // h_kv
    scale = 1 / np.sqrt(d) if scale is None else scale
    qf = fold_queries(q.astype(np.float32), h_kv, d)
    limit = causal_limits(S, T_q, G) if causal else None
    bounds = bounds or [token_range(S, n_ranks, r) for r in range(n_ranks)]
    def held(start, stop):
        rows = {"k": k[:, start:stop], "v": v[:, start:stop]}
        return make_resident(NumpySweep, lambda n, i, j: rows[n][:, i:j], stop - start,
                             B, h_kv, d, np.float32)

    partials = [local_attention(qf, *held(start, stop), scale=scale, tile=tile,
                                start=start, causal_limit=limit)
                for start, stop in bounds]
    if order is None:
        total = empty_partial(B, h_kv, G * T_q, d)
        for p in reversed(partials):
            total = merge(p, total)
    else:
        total = order(partials)
    return unfold_output(finalize(total), T_q), total


def spec_schedule(rank, C, P, cols=4):
    """This rank's (op, dir, tensor) messages, straight from SPEC.md's chain rules."""
    cube, pe = divmod(rank, P)
    row, col = divmod(pe, cols)
    rows = -(-P // cols)
    row_len = min(cols, P - row * cols)
    hops = []
    if col < row_len - 1:
        hops.append(("recv", "intra_E"))
    if col > 0:
        hops.append(("send", "intra_W"))
    if col == 0:
        if row < rows - 1:
            hops.append(("recv", "intra_S"))
        if row > 0:
            hops.append(("send", "intra_N"))
    if pe == 0:
        if cube < C - 1:
            hops.append(("recv", "E"))
        if cube > 0:
            hops.append(("send", "W"))
    return [(op, d, t) for op, d in hops for t in "mlO"]


def spec_depth(C, P, cols=4):
    """Hops on the chain's critical path, by walking each rank's sends to rank 0 with
    SPEC's index rules (a rank's partial is ready once its slowest child's is, so the
    depth is the longest such walk)."""
    step = {"intra_W": -1, "intra_N": -cols, "W": -P}
    longest = 0
    for rank in range(C * P):
        hops, r = 0, rank
        while r:
            sends = [d for op, d, t in spec_schedule(r, C, P, cols) if op == "send" and t == "m"]
            r, hops = r + step[sends[0]], hops + 1
        longest = max(longest, hops)
    return longest


def spec_kernel_model(q, k, v, *, h_kv, n, tile):
    """The kernel's output in float64, from SPEC.md's index rules alone (defects 2-5).

    Independent of ``gqa_mpi.check.kernel_model``: every operand element is fetched by
    its flat index. With ``S_local = S_kv // n`` (the tail dropped), tile ``t`` of rank
    ``r`` covers ``ts = min(tile, S_local - t*tile)`` tokens starting at flat element
    ``base = t*tile*d`` of the rank's row-major ``(S_local, h_kv*d)`` slice; K's
    ``(d, ts)`` element ``(i, j)`` is flat element ``base + i*ts + j``, V's ``(ts, d)``
    element ``(j, i)`` is ``base + j*d + i``, and Q's ``(G*T_q, d)`` element ``(a, i)`` is
    flat element ``a*d + i`` of Q. float16 operands, no scale, one softmax over all the
    scores; the ``(G*T_q, d)`` result lands at the start of a zeroed O.
    """
    f16 = lambda a: np.asarray(a, dtype=np.float16).astype(np.float64)  # noqa: E731
    qf, kf, vf = (f16(a).ravel() for a in (q, k, v))
    width = np.shape(k)[-1]
    d = width // h_kv
    rows = (np.size(q) // np.shape(q)[-1]) * (np.shape(q)[-1] // d // h_kv)  # G*T_q
    S_local = np.shape(k)[0] // n
    Q = qf[np.arange(rows)[:, None] * d + np.arange(d)[None, :]]
    scores, values = [], []
    for r in range(n):
        first = (r * S_local + min(r, np.shape(k)[0] % n)) * width   # its slice's start
        for t0 in range(0, S_local, tile):
            ts = min(tile, S_local - t0)
            base = first + t0 * d
            K = kf[base + np.arange(d)[:, None] * ts + np.arange(ts)[None, :]]
            V = vf[base + np.arange(ts)[:, None] * d + np.arange(d)[None, :]]
            scores.append(Q @ K)
            values.append(V)
    s = np.concatenate(scores, axis=1)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    o = (w / w.sum(axis=1, keepdims=True)) @ np.concatenate(values, axis=0)
    out = np.zeros(np.size(q))
    out[:o.size] = o.ravel()
    return out.reshape(np.shape(q))


@functools.lru_cache(maxsize=None)
def open_mpi() -> Optional[List[str]]:
    """A launch prefix for Open MPI beside the default MPI, or None: the system's Open
    MPI ``mpirun`` (Debian's ``openmpi-bin``), with mpi4py told to load Open MPI
    (``MPI4PY_MPIABI=openmpi``), where both are there. ``+ ["-n", N, ...]`` follows."""
    for cand in ("mpirun.openmpi", "/usr/bin/mpirun"):
        path = shutil.which(cand)
        if path is None:
            continue
        try:
            version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                     timeout=30).stdout
            loads = subprocess.run(
                [sys.executable, "-c", "from mpi4py import MPI; "
                 "print(MPI.Get_library_version())"], capture_output=True, text=True,
                timeout=60, env=dict(os.environ, MPI4PY_MPIABI="openmpi")).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if "Open MPI" in version and "Open MPI" in loads:
            root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
            return [path, *root, "--oversubscribe", "-x", "MPI4PY_MPIABI=openmpi",
                    "-x", "PATH", "-x", "PYTHONPATH"]
    return None


def chain_depth(grid) -> int:
    """Hops on the critical path of the kernel's chain over a :class:`Grid`: PE
    ``(row, col)`` is ``col + row`` hops from PE 0 and cube ``c`` is ``c`` more (5 for 2
    cubes of 2x4); with a short last row the farthest PE may end the row above it."""
    return max(sum(divmod(pe, grid.cols)) for pe in range(grid.pes)) + grid.cubes - 1


def unregister(registry, name: str) -> None:
    """Take a test's own entry out of a registry again."""
    registry._items.pop(name, None)
