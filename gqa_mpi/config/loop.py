"""The decode loop's arithmetic: how the cache grows, who takes each new token, which
steps are checked, and the tokens each rank appends. No MPI here.

Step ``s`` (from 0) attends to ``S_kv + s*T_q`` tokens; after it (but the last) its
``T_q`` new tokens go to the ranks by ``--placement``. ``cfg`` is a placed
:class:`~gqa_mpi.config.config.Config`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .inputs import GeneratedRows


def owner(cfg, token: int) -> int:
    """The rank that takes new token ``token`` (a global index) of the cache."""
    return cfg.placement.owner(token, cfg.n_ranks)


def cache_len(cfg, step: int) -> int:
    """Tokens in the cache that step ``step`` (from 0) attends to."""
    return cfg.seq_len + step * cfg.queries


def final_len(cfg) -> int:
    """Tokens in the cache after the last step's append."""
    return cache_len(cfg, cfg.steps)


def appended(cfg, rank: int, steps: Optional[int] = None) -> int:
    """New tokens ``rank`` takes in the appends after the first ``steps`` steps (all
    of them by default)."""
    stop = cache_len(cfg, cfg.steps if steps is None else steps)
    return cfg.placement.taken(rank, cfg.n_ranks, cfg.seq_len, stop)


def checked(cfg, step: int) -> bool:
    """Whether step ``step`` is checked (every ``check_every``-th, and the last)."""
    return cfg.check and (step % cfg.check_every == cfg.check_every - 1
                          or step == cfg.steps - 1)


def new_tokens(cfg, rank: int):
    """``{step: (k_rows, v_rows)}``: the tokens ``rank`` takes after each step but the
    last, ``(B, n, h_kv*d)`` each, drawn before the loop so that no rank generates
    inputs between timed steps."""
    plan = {}
    for step in range(cfg.steps - 1):           # T_q tokens a step: linear in the steps
        mine = [t for t in range(cache_len(cfg, step), cache_len(cfg, step + 1))
                if owner(cfg, t) == rank]
        if mine:
            plan[step] = mine
    if not plan:
        return {}
    lo = min(p[0] for p in plan.values())
    hi = max(p[-1] for p in plan.values()) + 1
    k, v = (np.asarray(GeneratedRows(cfg.seed, name, cfg.B, final_len(cfg),
                                            cfg.heads_kv * cfg.head_dim, lo, hi))
            for name in "kv")
    return {step: (k[:, [t - lo for t in ts]], v[:, [t - lo for t in ts]])
            for step, ts in plan.items()}
