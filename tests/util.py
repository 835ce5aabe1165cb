"""Helpers shared by the tests: launching real MPI runs, writing inputs."""
import json
import os
import subprocess

import numpy as np

from gqa_mpi.launcher import gqa_command

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
