"""Decode steps on one rank, in the kernel's order.

Each rank holds a slice of K and V and the full Q (replicated). It makes the slice
resident in its kernel's layout (with room for the tokens the decode loop will
append), then, every step, runs one of two local steps:

- the emulation's: sweep its tokens in tiles (scratch bounded by the tile, whatever
  the slice), reduce the partial ``(m, l, O)`` to rank 0 along the configured schedule
  (the kernel's chain by default: row chain and column bridge in each cube, then the
  inter-cube chain), and the root computes ``O / l``;
- the kernel's own function (``--kernel-source``, :mod:`gqa_mpi.mpi.source`), which
  does all of that itself through ``tl``, over the slice held as float16 rows.

Between steps the new tokens a rank takes are appended to its cache.

``cfg`` is a placed :class:`gqa_mpi.core.config.Config`; this module reads it and
never builds one.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from ..core import loop
from ..core.config import Config
from ..core.attention import causal_limits, empty_partial, finalize, fold_queries, unfold_output
from ..core.kernels import CHUNK, append, grow, make_resident, select
from ..core.schedules import Traffic
from ..core.trace import Recorder
from . import watchdog
from .exchange import execute
from .faults import inject
from .source import SourceStep
from .topology import Topology

TRACE_STEPS = 20
"""Decode steps whose events ``--trace`` keeps (timings are kept for every step)."""


@dataclass
class Rank:
    """One rank's PE across decode steps: its resident cache and what it measured."""

    cfg: Config
    topo: Topology
    start: int
    """Global index of its first initial token."""
    count: int = 0
    """Tokens resident now."""
    kernel: object = None
    """The local kernel of the emulated step (None for a source run)."""
    kernel_note: Optional[str] = None
    source: Optional[SourceStep] = None
    """The kernel's own function, with ``--kernel-source``."""
    recorder: Recorder = None
    q: np.ndarray = None
    k: np.ndarray = None
    v: np.ndarray = None
    steps: List[Dict[str, float]] = field(default_factory=list)
    traffic: Traffic = field(default_factory=Traffic)
    scores_nonfinite: bool = False

    @classmethod
    def load(cls, cfg: Config, topo: Topology, q_in: np.ndarray, k_rows, v_rows,
             progress: Optional[Callable[[int, int], None]] = None) -> "Rank":
        """Warm the reduction path up, then make this rank's slice resident.

        ``q_in`` is ``(B, T_q, h_q*d)`` float32; ``k_rows``, ``v_rows`` are this rank's
        tokens ``cfg.tokens(rank)`` as ``(B, S_local, h_kv*d)`` arrays, or anything
        sliced as ``[:, i:j]`` (generated rows, memory maps): they are converted a chunk
        at a time, so loading never holds the slice twice. ``progress(done, total)``
        hears how many of its tokens are resident.
        """
        start, _ = cfg.tokens(topo.rank)
        recorder = Recorder(topo.rank, events=cfg.trace is not None, tiles=cfg.trace_tiles)
        if cfg.kernel_source is not None:
            rank = cls(cfg, topo, start, recorder=recorder,
                       source=SourceStep(cfg, topo, recorder))
        else:
            kernel, note = select(cfg.kernel)
            rank = cls(cfg, topo, start, kernel=kernel, kernel_note=note, recorder=recorder)
        watchdog.phase("warm-up")
        with watchdog.waiting("a neighbour (warm-up)"):
            # MPI sets a connection up on the first message between two ranks; a decode
            # step of a running model finds them set up, so the timed step should too
            execute(topo, empty_partial(1, 1, 1, 1), cfg.schedule, cfg.wire_format)
        watchdog.rendezvous(topo.comm, "the start of the step")
        wall = topo.comm.bcast(time.time() if topo.is_root else None, root=0)
        rank.recorder.start(wall)  # one time axis for every rank's events
        with rank.recorder.phase("inputs", tokens=[start, start + k_rows.shape[1]]):
            watchdog.phase("inputs")
            inject("inputs", topo.rank)
            rank._resident(q_in, k_rows, v_rows, progress)
        # the kernel starts with its slice resident: time it from there
        watchdog.rendezvous(topo.comm, "the end of inputs")
        return rank

    def _resident(self, q_in, k_rows, v_rows, progress=None) -> None:
        cfg = self.cfg
        rows = {"k": k_rows, "v": v_rows}
        self.count = k_rows.shape[1]
        room = self.count + loop.appended(cfg, self.topo.rank, cfg.steps - 1)

        def chunk(name, i, j):
            if progress is not None and name == "v":
                progress(i, self.count)
            return rows[name][:, i:j]

        if self.source is not None:      # the kernel's memory: float16 rows, as given
            self.q = np.asarray(q_in, dtype=np.float16)
            self.k, self.v = (np.empty((k_rows.shape[0], room, k_rows.shape[2]), np.float16)
                              for _ in "kv")
            for i in range(0, self.count, CHUNK):
                j = min(i + CHUNK, self.count)
                self.k[:, i:j], self.v[:, i:j] = chunk("k", i, j), chunk("v", i, j)
            return
        self.q = fold_queries(q_in, cfg.heads_kv, cfg.head_dim)
        self.k, self.v = make_resident(self.kernel, chunk,
                                       self.count, k_rows.shape[0], cfg.heads_kv,
                                       cfg.head_dim, np.dtype(cfg.kv_dtype), room)

    def step(self, index: int, q_in: Optional[np.ndarray] = None,
             cache_len: Optional[int] = None) -> Optional[np.ndarray]:
        """Decode step ``index``: attend over the cache as it stands, reduce, finalize;
        O in the layout of Q (float32) on the root, None elsewhere.

        ``q_in`` gives this step's queries ``(B, T_q, h_q*d)``; by default those given
        to :meth:`load`. ``cache_len``: tokens in the whole cache (all ranks), for the
        causal mask; by default the command line's ``loop.cache_len(cfg, index)``.
        """
        cfg, topo, rec = self.cfg, self.topo, self.recorder
        rec.last.clear()
        rec.paused = index >= TRACE_STEPS    # a long loop traces its first steps only
        total = loop.cache_len(cfg, index) if cache_len is None else cache_len
        if self.source is not None:
            if q_in is not None:
                self.q = np.asarray(q_in, dtype=np.float16)
            with rec.phase("kernel", step=index):
                watchdog.phase(f"the kernel under test (step {index})")
                out = self.source.step(self.q[0], self.k[0, :self.count],
                                       self.v[0, :self.count], total, self.start)
            self.steps.append(dict(rec.last))
            return out
        if q_in is not None:
            self.q = fold_queries(q_in, cfg.heads_kv, cfg.head_dim)
        out = None
        with rec.phase("local_attention", tile=cfg.tile, step=index):
            watchdog.phase("local_attention")
            inject("local_attention", topo.rank)
            limit = causal_limits(total, cfg.queries, cfg.group) if cfg.causal else None
            partial = self.kernel.sweep(self.q, self.k, self.v, scale=cfg.scale,
                                        tile=cfg.tile, start=self.start, causal_limit=limit,
                                        on_tile=rec.tile if rec.tiles else None,
                                        count=self.count)
            nonfinite = bool(np.isnan(partial.m).any() or np.isposinf(partial.m).any())
        with rec.phase("reduce", wire=cfg.wire_format.name, schedule=cfg.reduce, step=index):
            watchdog.phase("reduce")
            inject("reduce", topo.rank)
            partial, traffic = execute(topo, partial, cfg.schedule, cfg.wire_format, rec)
        if topo.is_root:
            with rec.phase("finalize", step=index):
                watchdog.phase("finalize")
                inject("finalize", topo.rank)
                out = unfold_output(finalize(partial), cfg.queries)
                out = out if cfg.batched else out[0]
        self.steps.append(dict(rec.last))     # this step's phases, as the recorder timed them
        self.traffic = Traffic(self.traffic.messages + traffic.messages,
                               self.traffic.bytes + traffic.bytes,
                               self.traffic.loss + traffic.loss)
        self.scores_nonfinite |= nonfinite
        return out

    def append(self, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Add new tokens ``(B, n, h_kv*d)`` to this rank's cache (which doubles its room
        when they do not fit: the command line sizes it for its whole loop up front)."""
        with self.recorder.phase("append"):
            need = self.count + k_rows.shape[1]
            if self.source is not None:      # float16 rows, room doubled when full
                if need > self.k.shape[1]:
                    self.k, self.v = (_room(a, self.count, max(need, 2 * self.count))
                                      for a in (self.k, self.v))
                self.k[:, self.count:need], self.v[:, self.count:need] = k_rows, v_rows
            else:
                if need > self.v.shape[2]:
                    self.k, self.v = grow(self.kernel, self.k, self.v,
                                          max(need, 2 * self.count))
                append(self.kernel, self.k, self.v, k_rows, v_rows, self.count)
        self.count += k_rows.shape[1]

    def finish(self) -> None:
        self.recorder.timings["total"] = time.perf_counter() - self.recorder.origin

    @property
    def peak_rss_mib(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _room(rows: np.ndarray, count: int, capacity: int) -> np.ndarray:
    """``(B, capacity, width)`` holding the first ``count`` tokens of ``rows``."""
    out = np.empty((rows.shape[0], capacity, rows.shape[2]), rows.dtype)
    out[:, :count] = rows[:, :count]
    return out
