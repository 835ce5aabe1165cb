"""The float64 references a run is checked against, streamed over the cache and
spread over the ranks.

The check's chunks (:func:`gqa_mpi.core.streamed.plan`) are dealt round robin, chunk
``i`` to rank ``i % size``: a rule of the check's own, not the run's split, so a token
the run dropped or counted twice still shows. Each rank builds the float64 partials of
its chunks straight from the inputs and merges them; rank 0 then folds the ranks'
partials in rank order, one at a time, with the reference's own merge, and divides.
The float32 control behind the tolerance is built the same way. No rank holds more
than a chunk, whatever ``S_kv``.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np
from mpi4py import MPI

from ..core.config import Config
from ..core.kernel_model import kernel_output
from ..core.reference import reference_finish, reference_merge
from ..core.streamed import chunk_partials, plan
from ..mpi import watchdog

TAG = 0x6368
"""Tag of the partials sent to rank 0."""


def references(comm: MPI.Comm, cfg: Config, q: np.ndarray, cache_len: int, *,
               n_tokens: int, rounded: bool,
               progress: Optional[Callable[[int, int], None]] = None
               ) -> Optional[Dict[str, np.ndarray]]:
    """The references of one step, called on every rank; on rank 0 a dict of
    ``(B, T_q, h_q*d)`` arrays, None elsewhere.

    Keys: ``ref`` (float64) and ``control`` (float32) of exact attention with the run's
    scale and mask; with ``--kernel-faithful``, ``model`` (the kernel's arithmetic, in
    float64) and ``exact`` (float64 attention with the default scale).

    ``q``: the step's queries ``(B, T_q, h_q*d)``; ``n_tokens``: the length the inputs
    were generated at; ``rounded``: K and V are taken at float16's values (the ranks
    hold them so). ``progress(done, total)`` is called after each of this rank's chunks.
    """
    tasks = plan(cfg, cache_len)[comm.rank::comm.size]
    mine: Dict[str, tuple] = {}
    for i, task in enumerate(tasks):
        parts = chunk_partials(cfg, task, q, cache_len, n_tokens=n_tokens, rounded=rounded)
        for kind, part in parts.items():
            mine[kind] = reference_merge(mine[kind], part) if kind in mine else part
        if progress is not None:
            progress(i + 1, len(tasks))
    folded = _fold(comm, mine)
    if folded is None:
        return None
    out = {kind: reference_finish(part) for kind, part in folded.items()}
    if "model" in out:      # the kernel's (G*T_q, d) lands at the start of a zeroed O
        out["model"] = kernel_output(out["model"], q.shape, dtype=np.float64)
    return out


def _fold(comm: MPI.Comm, mine: Dict[str, tuple]) -> Optional[Dict[str, tuple]]:
    """Rank 0 merges every rank's partials in rank order, holding two at a time."""
    if comm.rank != 0:
        with watchdog.waiting("rank 0 (the check's partials)"):
            comm.send(mine, dest=0, tag=TAG)
        return None
    acc = dict(mine)
    for source in range(1, comm.size):
        with watchdog.waiting(f"rank {source} (its part of the check)"):
            theirs = comm.recv(source=source, tag=TAG)
        for kind, part in theirs.items():
            acc[kind] = reference_merge(acc[kind], part) if kind in acc else part
    return acc
