"""The read limit of the bench: the time to stream some arrays once, the fastest of the
ways NumPy, BLAS and PyTorch have (``numpy.sum``, ``numpy.dot``, a BLAS ``sgemv``
against a vector of ones, ``torch.sum`` where PyTorch is installed), one thread each.
A kernel that reads every byte once cannot beat it.

``mpirun -n N python -m gqa_mpi.tools.reads BYTES``: the host's read bandwidth at N
processes, each streaming BYTES of its own memory at the same time (a repeat's time is
the slowest rank's); rank 0 prints one JSON line. ``bench step``'s limit.
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List  # noqa: E402

import numpy as np  # noqa: E402


def ways(arrays: List[np.ndarray]) -> Dict[str, Callable[[], object]]:
    """Name -> a call that reads every byte of ``arrays`` (C-contiguous) once."""
    flat = [a.reshape(-1).view(np.uint8)[: a.nbytes // 4 * 4].view(np.float32) for a in arrays]
    mats = [x.reshape(-1, next(c for c in (1024, 256, 64, 16, 4, 1) if x.size % c == 0))
            for x in flat]
    ones = {m.shape[0]: np.ones(m.shape[0], np.float32) for m in mats}
    out = {"numpy.sum": lambda: [np.sum(x) for x in flat],
           "numpy.dot": lambda: [np.dot(x, x) for x in flat],
           "sgemv": lambda: [ones[m.shape[0]] @ m for m in mats]}
    try:
        import torch
        torch.set_num_threads(1)
        tensors = [torch.from_numpy(x) for x in flat]
        out["torch.sum"] = lambda: [t.sum() for t in tensors]
    except ImportError:
        pass
    return out


def probe(comm, n_bytes: int, repeats: int) -> dict:
    """``{ranks, bytes_per_rank, seconds, bandwidth, way}``: every rank reads a buffer of
    its own at once, each way; bytes/s of all ranks together, the fastest way."""
    from mpi4py import MPI
    x = np.ones(max(2, n_bytes // 4), dtype=np.float32)
    times = {}
    for name, fn in ways([x]).items():
        best = float("inf")
        for _ in range(repeats):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        times[name] = best
    way = min(times, key=times.get)
    return dict(ranks=comm.size, bytes_per_rank=x.nbytes, seconds=times[way],
                bandwidth=comm.size * x.nbytes / times[way], way=way)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gqa_mpi.tools.reads",
                                description=__doc__.replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bytes", type=int, help="bytes each rank reads")
    p.add_argument("--repeats", type=int, default=5, help="best of N (default 5)")
    args = p.parse_args(argv)
    if args.bytes < 8 or args.repeats < 1:
        p.error("BYTES must be at least 8 and --repeats at least 1")
    from mpi4py import MPI
    result = probe(MPI.COMM_WORLD, args.bytes, args.repeats)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
