"""The check, in one place: the float64 references of the checked steps, streamed over
the cache and spread over the ranks, folded on rank 0, compared and judged.

The check's chunks (:func:`gqa_mpi.check.streamed.plan`) are dealt round robin, chunk
``i`` to rank ``i % size``: a rule of the check's own, not the run's split, so a token
the run dropped or counted twice still shows. Each rank builds the float64 partials of
its chunks straight from the inputs and merges them (:mod:`gqa_mpi.check.streamed`,
:mod:`gqa_mpi.check.reference`: the arithmetic, no MPI); rank 0 then receives the
ranks' partials as one buffer each, in rank order, folds them with the reference's own
merge, and divides. The float32 control behind the tolerance is built the same way.
No rank holds more than a chunk, whatever ``S_kv``.

The verdict is :mod:`gqa_mpi.check.judge`'s.
"""
from __future__ import annotations

import resource
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..config import loop
from ..config.config import Config
from ..check.kernel_model import kernel_output
from .progress import Progress
from ..check.reference import reference_finish, reference_merge
from ..check.judge import Comparison, judge
from ..check.streamed import chunk_partials, kinds, plan, plan_size
from ..mpi import watchdog
from ..mpi.collective import fold_to_root


def references(comm, cfg: Config, q: np.ndarray, cache_len: int, *, n_tokens: int,
               progress: Optional[Callable[[int, int], None]] = None
               ) -> Optional[Dict[str, np.ndarray]]:
    """The references of one step, called on every rank; on rank 0 a dict of
    ``(B, T_q, h_q*d)`` arrays by kind (:func:`gqa_mpi.check.streamed.kinds`), None
    elsewhere.

    ``q``: the step's queries ``(B, T_q, h_q*d)`` as the ranks hold them;
    ``n_tokens``: the length the inputs were generated at. K and V are taken at
    the values the ranks hold (float16's, bfloat16's, float8's). ``progress(done, total)`` is called
    after each of this rank's chunks.
    """
    held = cfg.kv_dtype if cfg.kv_dtype != "float32" else None
    tasks = plan(cfg, cache_len)[comm.rank::comm.size]
    shapes = kinds(cfg)
    mine = {kind: _empty(*shape) for kind, shape in shapes.items()}
    for i, task in enumerate(tasks):
        parts = chunk_partials(cfg, task, q, cache_len, n_tokens=n_tokens, held=held)
        for kind, part in parts.items():
            mine[kind] = reference_merge(mine[kind], part)
        if progress is not None:
            progress(i + 1, len(tasks))
    folded = _fold(comm, mine, shapes)
    if folded is None:
        return None
    out = {kind: reference_finish(part) for kind, part in folded.items()}
    if "model" in out:      # the kernel's (G*T_q, d) lands at the start of a zeroed O
        out["model"] = kernel_output(out["model"], q.shape, dtype=np.float64)
    return out


def _empty(heads: tuple, rows: tuple, dtype) -> tuple:
    """The partial of no key: the identity of the merge."""
    return (np.full(heads, -np.inf, dtype), np.zeros(heads, dtype), np.zeros(rows, dtype))


def _pack(partials: Dict[str, tuple]) -> np.ndarray:
    return np.concatenate([np.ravel(a).astype(np.float64) for part in partials.values()
                           for a in part])


def _unpack(buf: np.ndarray, shapes: Dict[str, tuple]) -> Dict[str, tuple]:
    out, at = {}, 0
    for kind, (heads, rows, dtype) in shapes.items():
        arrays = []
        for shape in (heads, heads, rows):
            n = int(np.prod(shape))
            arrays.append(buf[at:at + n].reshape(shape).astype(dtype))
            at += n
        out[kind] = tuple(arrays)
    return out


def _fold(comm, mine: Dict[str, tuple], shapes: Dict[str, tuple]
          ) -> Optional[Dict[str, tuple]]:
    """Rank 0 merges every rank's partials in rank order, one buffer at a time (a
    float32 control travels widened to float64, which is exact)."""
    acc = dict(mine)

    def fold(theirs: np.ndarray) -> None:
        for kind, part in _unpack(theirs, shapes).items():
            acc[kind] = reference_merge(acc[kind], part)
    return acc if fold_to_root(comm, _pack(mine), fold) else None


def check_steps(comm, cfg: Config, kept: List[tuple], m_rounding: float,
                progress: Progress) -> Tuple[List[Tuple[Comparison, Optional[Comparison]]],
                                             Tuple[float, float]]:
    """Check the kept steps ``(step, O on rank 0, Q)`` on every rank together.

    Returns, on rank 0, the ``(check, vs_exact)`` of each (``[]`` elsewhere), and on
    every rank ``(seconds, peak MiB)`` of its share, the check's memory included.
    ``m_rounding`` is the largest rounding of ``m`` on the path, any rank.
    """
    t0 = time.perf_counter()
    checks = []
    if kept:
        # one stage for every checked step, counted in rank 0's chunks
        counts = [-(-plan_size(cfg, loop.cache_len(cfg, step)) // comm.size) for step, _, _ in kept]
        total = sum(counts)
        progress.stage("check", "chunks on rank 0" + (f", {len(kept)} steps" if len(kept) > 1
                                                      else ""))
        for (step, out, q_step), before in zip(kept, np.cumsum([0] + counts[:-1])):
            watchdog.phase(f"check of step {step}")
            q_step = cfg.mode.held_queries(q_step)
            refs = references(comm, cfg, q_step, loop.cache_len(cfg, step), n_tokens=loop.final_len(cfg),
                              progress=lambda i, _, b=int(before): progress.update(b + i,
                                                                                   total))
            if refs is not None:
                checks.append(judge(cfg, out, m_rounding, refs))
    return checks, (time.perf_counter() - t0,
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
