"""The kernel's own function as a rank's local step (``--kernel-source``).

Each decode step, every rank calls the kernel once with SPEC's signature and its own
``tl`` (:class:`gqa_mpi.dsl.tl.Backend`, with :mod:`gqa_mpi.mpi.tl_link` behind
``send`` and ``recv``). Its memory holds that step's Q (replicated), its slice of K
and V as the cache then stands, and O (zeros), all float16; ``S_kv`` is the step's
cache length. The step's output is O as it stands in rank 0's memory once every rank
has returned.

A fault (:class:`~gqa_mpi.dsl.tl.KernelFault`, or any exception of the kernel's
own, ``SystemExit`` and ``KeyboardInterrupt`` included) is one report, each kind once
with the ranks that hit it (:meth:`gqa_mpi.mpi.tl_link.Watch.fault`; an exception's
traceback trimmed to FILE's frames), and every rank leaves with
:attr:`~gqa_mpi.exits.Exit.FAULT`.
"""
from __future__ import annotations

import sys
import traceback
from typing import Dict, List, Optional

import numpy as np

from ..config.config import Config
from ..dsl.kernel_file import grid_problem, load
from ..dsl.tl import Backend, Counters, KernelFault, run_kernel
from ..step.schedules import Traffic
from ..step.sweeps import CHUNK
from ..step.dtypes import MEMORY
from ..step.trace import Recorder
from . import watchdog
from .local import LocalStep
from .tl_link import MpiLink, Watch
from .topology import Topology


class SourceStep(LocalStep):
    """One rank's calls of the kernel's function, and what they did (summed over the
    steps; the token rows read are the last step's), its memory holding Q, K and V as
    float16 rows, as given."""

    isa = "tl"
    note = None
    scores_nonfinite = False

    def __init__(self, cfg: Config, topo: Topology, recorder: Recorder):
        self.fn, self.path = load(cfg.kernel_source)
        why = grid_problem(self.fn, self.path, cfg.grid)
        if why:
            raise ValueError(why)
        self.cfg, self.topo, self.rec = cfg, topo, recorder
        self.total = Counters()
        self.rows_read = (0, 0)
        self.calls: List[List[tuple]] = []
        """With ``--predict``: each step's recorded calls (one entry a call)."""
        self.traffic = Traffic()      # its messages are counted by its own counters
        self.when = ""
        """Which decode step a fault happened in, for its line (none in a one-step run)."""
        self.source = dict(file=self.path, function=self.name)

    @property
    def name(self) -> str:
        return self.fn.__name__

    def resident(self, q_in, rows, count, room):
        self.queries(q_in)
        width = self.cfg.heads_kv * self.cfg.head_dim
        held = MEMORY[self.cfg.kv_dtype]         # what the kernel's memory holds K and V as
        self.k, self.v = (np.empty((q_in.shape[0], room, width), held) for _ in "kv")
        for i in range(0, count, CHUNK):
            j = min(i + CHUNK, count)
            self.k[:, i:j], self.v[:, i:j] = rows("k", i, j), rows("v", i, j)

    def queries(self, q_in):
        self.q = np.asarray(q_in, dtype=np.float16)

    def append(self, k_rows, v_rows, count):
        need = count + k_rows.shape[1]
        if need > self.k.shape[1]:      # room doubled when full
            self.k, self.v = (_room(a, count, max(need, 2 * count)) for a in (self.k, self.v))
        self.k[:, count:need], self.v[:, count:need] = k_rows, v_rows

    def step(self, index: int, total: int, start: int, count: int) -> Optional[np.ndarray]:
        """Call the kernel over this rank's first ``count`` tokens (global rows from
        ``start``) of a cache of ``total``; O ``(T_q, h_q*d)`` float32 on the root."""
        with self.rec.phase("kernel", step=index):
            watchdog.phase(f"the kernel under test (step {index})")
            self.when = (f" in decode step {index} (S_kv={total})"
                         if index or self.cfg.steps > 1 else "")
            return self._call(self.q[0], self.k[0, :count], self.v[0, :count], total, start)

    def _call(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, cache_len: int,
              first: int) -> Optional[np.ndarray]:
        """Call the kernel over this rank's ``k``, ``v`` ``(S_local, h_kv*d)`` as memory
        holds them (global rows from ``first``) with queries ``q`` ``(T_q, h_q*d)``; O
        ``(T_q, h_q*d)`` float32 on the root, None elsewhere."""
        cfg, topo = self.cfg, self.topo
        row = k.shape[1] * k.dtype.itemsize
        regions = [("Q", q, 0, 0), ("K", k, row, first), ("V", v, row, first),
                   ("O", np.zeros(q.shape, np.float16), 0, 0)]
        watch = Watch(topo, self.path, cfg.describe() if not cfg.quiet else None)
        backend = Backend(topo.place.pe, topo.place.cube, regions,
                          MpiLink(topo, watch, self.rec), self.path, self.rec,
                          record=cfg.predict is not None)
        try:
            run_kernel(self.fn, backend, q.shape[0], cache_len, cfg.heads_q, cfg.heads_kv,
                       cfg.head_dim, cfg.cubes, cfg.pes)
        except KernelFault as fault:
            if fault.line is None:        # raised below the backend's line lookup
                fault.line = self._innermost(fault)
            watch.fault((fault.call, fault.line), self._fault_line(fault))
        except BaseException as exc:  # noqa: BLE001 - the kernel's own code raised
            place = topo.place
            watch.fault((type(exc).__name__, self._innermost(exc)),
                        f"gqa_mpi: error: the kernel raised on rank {topo.rank} (cube "
                        f"{place.cube}, PE {place.pe}){self.when}:\n"
                        f"{self._own_exception(exc)}")
        backend.link.finish()
        self._print(backend.monitor.printed)
        self.total.add(backend.count)
        if backend.monitor.calls is not None:
            self.calls.append(backend.monitor.calls)
        self.rows_read = (backend.region("K").rows_read(), backend.region("V").rows_read())
        if topo.is_root:
            return backend.region("O").data.astype(np.float32)
        return None

    def _print(self, mine: List[str]) -> None:
        """Rank 0 prints every PE's ``tl.device_print`` lines, rank by rank, each PE's in
        its program order, prefixed with the PE."""
        every = self.topo.comm.gather(mine, root=0)
        if self.topo.is_root and any(every):
            for rank, lines in enumerate(every):
                place = self.cfg.layout.place(rank)
                for line in lines:
                    print(f"[rank {rank}: cube {place.cube} / PE {place.pe}{self.when}] "
                          f"{line}")
            sys.stdout.flush()

    def stats(self) -> Dict:
        """What the kernel did on this rank, for :class:`~gqa_mpi.app.record.RankStats`."""
        c = self.total
        return dict(k_rows=self.rows_read[0],
                    v_rows=self.rows_read[1], loaded_bytes=c.loaded_bytes,
                    stored_bytes=c.stored_bytes, dot_flops=c.dot_flops, calls=c.calls,
                    scratch_peak=c.scratch_peak, persistent=c.persistent,
                    scratch_top=[list(x) for x in c.scratch_top],
                    sent=c.sent, received=c.received,
                    nonfinite=[list(x) for x in c.nonfinite])

    def _fault_line(self, fault: KernelFault) -> str:
        place = self.topo.place
        where = f"{self.path}:{fault.line}" if fault.line is not None else self.path
        return (f"gqa_mpi: error: kernel fault on rank {self.topo.rank} (cube {place.cube}, "
                f"PE {place.pe}){self.when}: {fault.message} (tl.{fault.call} at {where})")

    def _frames(self, exc: BaseException) -> list:
        """The exception's traceback, trimmed to the kernel file's frames."""
        return [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == self.path]

    def _innermost(self, exc: BaseException) -> Optional[int]:
        """The line of the kernel's file nearest the raise."""
        frames = self._frames(exc)
        return frames[-1].lineno if frames else None

    def _own_exception(self, exc: BaseException) -> str:
        """The kernel's exception with its traceback trimmed to FILE's frames."""
        text = "".join(traceback.format_list(self._frames(exc)))
        return f"{text}{type(exc).__name__}: {exc}"


def _room(rows: np.ndarray, count: int, capacity: int) -> np.ndarray:
    """``(B, capacity, width)`` holding the first ``count`` tokens of ``rows``."""
    out = np.empty((rows.shape[0], capacity, rows.shape[2]), rows.dtype)
    out[:, :count] = rows[:, :count]
    return out
