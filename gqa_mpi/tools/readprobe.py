"""``mpirun -n N python -m gqa_mpi.tools.readprobe BYTES``: the host's read bandwidth
at N processes, each streaming BYTES of its own memory at the same time.

Every rank fills its buffer (so the pages are its own and resident), then, after a
barrier, reads it once, each way :mod:`gqa_mpi.tools.reads` knows (NumPy's sum and
dot, BLAS sgemv, torch.sum, the C streaming read), one thread each; a repeat's time
is the slowest rank's, and the best repeat of the fastest way gives
``N * BYTES / seconds``. This is the limit a decode step that streams K and V once
cannot beat on that many processes. Rank 0 prints one JSON line, with the way and
the bandwidth of the old limit (NumPy's sum and dot) beside it.
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from . import reads  # noqa: E402


def probe(comm, n_bytes: int, repeats: int) -> dict:
    """``{ranks, bytes_per_rank, seconds, bandwidth, way, old_bandwidth}`` (bytes/s,
    all ranks together)."""
    from mpi4py import MPI
    x = np.ones(max(2, n_bytes // 8 * 2), dtype=np.float32)     # a whole number of int64
    times = {}
    for name, fn in reads.ways([x]).items():
        best = float("inf")
        for _ in range(repeats):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        times[name] = best
    read = reads.fastest(times)
    total = comm.size * x.nbytes
    return dict(ranks=comm.size, bytes_per_rank=x.nbytes, seconds=read["read_s"],
                bandwidth=total / read["read_s"], way=read["read_way"],
                old_bandwidth=total / read["read_old_s"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gqa_mpi.tools.readprobe",
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
