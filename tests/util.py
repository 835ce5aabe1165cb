"""Helpers shared by the tests: launching real MPI runs, writing inputs."""
import json
import os
import subprocess

import numpy as np

from gqa_mpi.core.attention import (causal_limits, empty_partial, finalize, fold_queries,
                               local_attention, merge, unfold_output)
from gqa_mpi.core.kernels import NumpyKernel, make_resident
from gqa_mpi.core.partition import token_range
from gqa_mpi.tools.launcher import gqa_command

TIMEOUT = 120


def launch(n, args, timeout=TIMEOUT, **kw):
    """Run ``mpirun -n n python -m gqa_mpi args``; the CompletedProcess, or fail on timeout."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(kw.pop("env", {}))
    return subprocess.run(gqa_command(n, [str(a) for a in args]), capture_output=True,
                          text=True, timeout=timeout, env=env, **kw)


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
        return make_resident(NumpyKernel, lambda n, i, j: rows[n][:, i:j], stop - start,
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
