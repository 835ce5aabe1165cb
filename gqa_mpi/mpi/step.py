"""Decode steps on one rank, in the kernel's order.

Each rank holds a slice of K and V and the full Q (replicated). It makes the slice
resident in its local step's layout (with room for the tokens the decode loop will
append), then, every step, runs its local step, one of two implementations of
:class:`~gqa_mpi.mpi.local.LocalStep`, chosen once by the run's mode
(:mod:`gqa_mpi.config.modes`):

- :class:`~gqa_mpi.mpi.emulated.EmulatedStep`, the emulation's: sweep its tokens in
  tiles (scratch bounded by the tile, whatever the slice), reduce the partial
  ``(m, l, O)`` to rank 0 along the configured schedule (the kernel's chain by
  default: row chain and column bridge in each cube, then the inter-cube chain), and
  the root computes ``O / l``;
- :class:`~gqa_mpi.mpi.source.SourceStep`, the kernel's own function
  (``--kernel-source``), which does all of that itself through ``tl``, over the slice
  held as float16 rows.

Between steps the new tokens a rank takes are appended to its cache.

``cfg`` is a placed :class:`gqa_mpi.config.config.Config`; this module reads it and
never builds one.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from ..config import loop
from ..config.config import Config
from ..step.attention import empty_partial
from ..step.schedules import Traffic
from ..step.trace import Recorder
from . import watchdog
from .emulated import EmulatedStep
from .exchange import execute
from .faults import inject
from .local import LocalStep
from .source import SourceStep
from .topology import Topology

TRACE_STEPS = 20
"""Decode steps whose events ``--trace`` keeps (timings are kept for every step)."""


LOCAL_STEPS = {"emulated": EmulatedStep, "source": SourceStep}
"""Each mode's local step (:attr:`gqa_mpi.config.modes.Emulated.name`)."""


@dataclass
class Rank:
    """One rank's PE across decode steps: its local step and what it measured."""

    cfg: Config
    topo: Topology
    start: int
    """Global index of its first initial token."""
    local: LocalStep
    recorder: Recorder
    count: int = 0
    """Tokens resident now."""
    steps: List[Dict[str, float]] = field(default_factory=list)

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
        rank = cls(cfg, topo, start, LOCAL_STEPS[cfg.mode.name](cfg, topo, recorder), recorder)
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
            rank.count = k_rows.shape[1]
            rows = {"k": k_rows, "v": v_rows}

            def chunk(name, i, j):
                if progress is not None and name == "v":
                    progress(i, rank.count)
                return rows[name][:, i:j]
            room = rank.count + loop.appended(cfg, topo.rank, cfg.steps - 1)
            rank.local.resident(q_in, chunk, rank.count, room)
        # the kernel starts with its slice resident: time it from there
        watchdog.rendezvous(topo.comm, "the end of inputs")
        return rank

    def step(self, index: int, q_in: Optional[np.ndarray] = None,
             cache_len: Optional[int] = None) -> Optional[np.ndarray]:
        """Decode step ``index``: attend over the cache as it stands, reduce, finalize;
        O in the layout of Q (float32) on the root, None elsewhere.

        ``q_in`` gives this step's queries ``(B, T_q, h_q*d)``; by default those given
        to :meth:`load`. ``cache_len``: tokens in the whole cache (all ranks), for the
        causal mask; by default the command line's ``loop.cache_len(cfg, index)``.
        """
        rec = self.recorder
        rec.last.clear()
        rec.paused = index >= TRACE_STEPS    # a long loop traces its first steps only
        total = loop.cache_len(self.cfg, index) if cache_len is None else cache_len
        if q_in is not None:
            self.local.queries(q_in)
        out = self.local.step(index, total, self.start, self.count)
        self.steps.append(dict(rec.last))     # this step's phases, as the recorder timed them
        return out

    def append(self, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Add new tokens ``(B, n, h_kv*d)`` to this rank's cache (which doubles its room
        when they do not fit: the command line sizes it for its whole loop up front)."""
        with self.recorder.phase("append"):
            self.local.append(k_rows, v_rows, self.count)
        self.count += k_rows.shape[1]

    @property
    def traffic(self) -> Traffic:
        return self.local.traffic

    @property
    def scores_nonfinite(self) -> bool:
        return self.local.scores_nonfinite

    def finish(self) -> None:
        self.recorder.timings["total"] = time.perf_counter() - self.recorder.origin

    @property
    def peak_rss_mib(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
