"""One distributed decode step on arrays the ranks hold: mpirun -n 4 python docs/examples/decode.py"""
import numpy as np
from mpi4py import MPI
from gqa_mpi import decode

comm = MPI.COMM_WORLD
q = np.random.default_rng(0).standard_normal((1, 32 * 64), dtype=np.float32)   # same Q everywhere
mine = np.random.default_rng(1 + comm.rank)                                     # this rank's tokens
k, v = (mine.standard_normal((1000, 8 * 64), dtype=np.float32) for _ in "kv")
result = decode(q, k, v, heads_kv=8, comm=comm, reduce="tree", tile=256)        # any option, by name
if comm.rank == 0:
    print(result.output.shape, f"step {result.record.timings()['step']['max'] * 1e3:.1f} ms")
