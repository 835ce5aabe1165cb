"""Several PEs of a DSL kernel in one process, one thread each, their links queues:
for the cost model's exact cases (no MPI)."""
import queue
import threading

import numpy as np

from gqa_mpi.step.grid import Grid
from gqa_mpi.dsl.tl import Backend, run_kernel


class Mailbox:
    """The links of one PE: a queue per ordered pair of neighbours."""

    def __init__(self, grid, rank, queues):
        self.grid, self.rank, self.queues = grid, rank, queues

    def _queue(self, src, dst):
        return self.queues.setdefault((src, dst), queue.Queue())

    def send(self, direction, a, line):
        self._queue(self.rank, self.grid.neighbour(self.rank, direction)).put(a.tobytes())

    def recv(self, direction, nbytes, line, what):
        return self._queue(self.grid.neighbour(self.rank, direction), self.rank).get(timeout=20)


def run_pes(fn, path, C=1, P=1, cols=4, S=16, width=16, T_q=1, h_q=1, h_kv=1, d=16,
            k=None, v=None, q=None):
    """Run ``fn`` on C*P PEs with recording on; ``{rank: backend}``."""
    grid = Grid(C, P, cols)
    n = C * P
    rng = np.random.default_rng(0)
    q = rng.standard_normal((T_q, h_q * d)).astype(np.float16) if q is None else q
    k = rng.standard_normal((S, width)).astype(np.float16) if k is None else k
    v = rng.standard_normal((S, width)).astype(np.float16) if v is None else v
    queues, backends, errors = {}, {}, []
    base, extra = divmod(S, n)

    def one(rank):
        a = rank * base + min(rank, extra)
        b = a + base + (rank < extra)
        place = grid.place(rank)
        backends[rank] = tl = Backend(place.pe, place.cube, [
            ("Q", q, 0, 0), ("K", k[a:b], width * 2, a), ("V", v[a:b], width * 2, a),
            ("O", np.zeros_like(q), 0, 0)], Mailbox(grid, rank, queues), path, record=True)
        try:
            run_kernel(fn, tl, T_q, S, h_q, h_kv, d, C, P)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append((rank, e))

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return grid, backends
