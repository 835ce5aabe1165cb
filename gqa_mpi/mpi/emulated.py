"""The emulation's local step: the rank's sweep of its tokens (fused C or NumPy), then
the configured schedule carries the partial ``(m, l, O)`` to rank 0, which computes
``O / l``."""
from __future__ import annotations

from typing import List

import numpy as np

from ..config.config import Config
from ..step.attention import causal_limits, finalize, fold_queries, unfold_output
from ..step.schedules import Traffic
from ..step.sweeps import append, grow, isa, make_resident, select
from ..step.trace import Recorder
from . import watchdog
from .exchange import execute
from .faults import inject
from .local import LocalStep
from .topology import Topology


class EmulatedStep(LocalStep):
    """The emulation's step: the local sweep (fused C or NumPy), then the schedule."""

    def __init__(self, cfg: Config, topo: Topology, recorder: Recorder):
        self.cfg, self.topo, self.rec = cfg, topo, recorder
        self.sweep, self.note = select(cfg.kernel)
        self.name = self.sweep.name
        self.isa = isa(cfg.group * cfg.queries, cfg.kv_dtype)
        self.calls: List = []
        self.traffic = Traffic()
        self.scores_nonfinite = False

    def resident(self, q_in, rows, count, room):
        cfg = self.cfg
        self.queries(q_in)
        self.k, self.v = make_resident(self.sweep, rows, count, q_in.shape[0], cfg.heads_kv,
                                       cfg.head_dim, np.dtype(cfg.kv_dtype), room)

    def queries(self, q_in):
        self.q = fold_queries(q_in, self.cfg.heads_kv, self.cfg.head_dim)

    def step(self, index, total, start, count):
        cfg, topo, rec = self.cfg, self.topo, self.rec
        out = None
        with rec.phase("local_attention", tile=cfg.tile, step=index):
            watchdog.phase("local_attention")
            inject("local_attention", topo.rank)
            limit = causal_limits(total, cfg.queries, cfg.group) if cfg.causal else None
            partial = self.sweep.sweep(self.q, self.k, self.v, scale=cfg.scale,
                                       tile=cfg.tile, start=start, causal_limit=limit,
                                       on_tile=rec.tile if rec.tiles else None, count=count)
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
        self.traffic = Traffic(self.traffic.messages + traffic.messages,
                               self.traffic.bytes + traffic.bytes,
                               self.traffic.loss + traffic.loss)
        self.scores_nonfinite |= nonfinite
        return out

    def append(self, k_rows, v_rows, count):
        need = count + k_rows.shape[1]
        if need > self.v.shape[2]:      # room doubled when full
            self.k, self.v = grow(self.sweep, self.k, self.v, max(need, 2 * count))
        append(self.sweep, self.k, self.v, k_rows, v_rows, count)
