"""Several PEs of a DSL kernel in one process (:func:`gqa_mpi.in_process`), each with
its own ``tl`` and recording on: for the cost model's exact cases (no MPI)."""
import numpy as np

from gqa_mpi import in_process
from gqa_mpi.step.grid import Grid
from gqa_mpi.dsl.tl import Backend, run_kernel
from gqa_mpi.mpi.tl_link import MpiLink, Watch
from gqa_mpi.mpi.topology import Topology


def run_pes(fn, path, C=1, P=1, cols=4, S=16, width=16, T_q=1, h_q=1, h_kv=1, d=16,
            k=None, v=None, q=None):
    """Run ``fn`` on C*P PEs with recording on; ``(grid, {rank: backend})``."""
    grid = Grid(C, P, cols)
    n = C * P
    rng = np.random.default_rng(0)
    q = rng.standard_normal((T_q, h_q * d)).astype(np.float16) if q is None else q
    k = rng.standard_normal((S, width)).astype(np.float16) if k is None else k
    v = rng.standard_normal((S, width)).astype(np.float16) if v is None else v
    base, extra = divmod(S, n)

    def one(comm):
        topo = Topology(comm, grid)
        a = topo.rank * base + min(topo.rank, extra)
        b = a + base + (topo.rank < extra)
        place = topo.place
        tl = Backend(place.pe, place.cube, [
            ("Q", q, 0, 0), ("K", k[a:b], width * 2, a), ("V", v[a:b], width * 2, a),
            ("O", np.zeros_like(q), 0, 0)], MpiLink(topo, Watch(topo, path)), path,
            record=True)
        run_kernel(fn, tl, T_q, S, h_q, h_kv, d, C, P)
        tl.link.finish()
        return tl

    return grid, dict(enumerate(in_process(n, one)))
