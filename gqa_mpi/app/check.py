"""The check, in one place: the float64 references of the checked steps, streamed over
the cache and spread over the ranks, folded on rank 0, compared and judged.

The check's chunks (:func:`gqa_mpi.core.streamed.plan`) are dealt round robin, chunk
``i`` to rank ``i % size``: a rule of the check's own, not the run's split, so a token
the run dropped or counted twice still shows. Each rank builds the float64 partials of
its chunks straight from the inputs and merges them (:mod:`gqa_mpi.core.streamed`,
:mod:`gqa_mpi.core.reference`: the arithmetic, no MPI); rank 0 then receives the
ranks' partials as one buffer each, in rank order, folds them with the reference's own
merge, and divides. The float32 control behind the tolerance is built the same way.
No rank holds more than a chunk, whatever ``S_kv``.

The pass rule (:func:`compare`) follows flash-attention's tests: a floor, plus a
multiple of an untiled float32 attention's own error on the same inputs.
"""
from __future__ import annotations

import resource
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..core import loop
from ..core.config import Config
from ..core.kernel_model import kernel_output
from ..core.progress import Progress
from ..core.reference import float16_values, reference_finish, reference_merge
from ..core.streamed import chunk_partials, kinds, modelled, plan, plan_size
from ..core.wires import Wire
from ..mpi import watchdog
from .record import Comparison

CONTROL_FACTOR = 4.0
"""The check also accepts an error up to this multiple of the float32 control's own
(measured on ill-conditioned problems: the NumPy sweep up to 1.4x, the fused kernel,
whose summation order differs from BLAS', up to 2.9x)."""

SOURCE_TOLERANCE = 1e-2
"""The floor of a ``--kernel-source`` run: the kernel's memory, its operands and its
messages are float16 (a relative rounding of 2**-11 an operation, accumulated over the
merges of a chain), and so is the O it stores."""

TAG = 0x6368
"""Tag of the partials sent to rank 0."""


def tolerance(cfg: Config, m_rounding: float) -> float:
    """The pass floor of a run whose wire changed some ``m`` by up to ``m_rounding``.

    A partial whose ``m`` arrives off by ``delta`` has all its weights scaled by
    ``e**delta``; merged with the others, that moves O by at most about
    ``2 * delta * max|O|``. With large scores (no 1/sqrt(d) scale, say) float16's
    rounding of m alone reaches 1e-2, so it is added to the wire's own threshold. A
    source run's floor is :data:`SOURCE_TOLERANCE`, its own rule, not a wire's.
    """
    if cfg.kernel_source is not None:
        return SOURCE_TOLERANCE
    return wire_tolerance(cfg.wire_format, m_rounding)


def wire_tolerance(wire: Wire, m_rounding: float) -> float:
    """See :func:`tolerance`."""
    return wire.tolerance + 2 * m_rounding


def compare(out: np.ndarray, ref: np.ndarray, tolerance: float,
            control: Optional[np.ndarray] = None) -> Comparison:
    """Errors of ``out`` against the float64 ``ref``, and the verdict.

    ``max_rel_err`` is normwise: the largest absolute error over the largest
    ``|ref|`` (elementwise ratios blow up where the output crosses zero). The error
    may reach ``tolerance`` (the floor) plus :data:`CONTROL_FACTOR` times the normwise
    error of ``control``, an untiled float32 attention on the same inputs, so that a
    problem float32 cannot resolve (scores near -1e5, say) is judged by what float32
    can do on it. A non-finite output, or a non-finite reference, never passes.
    """
    out64 = np.asarray(out, dtype=np.float64)
    finite = bool(np.isfinite(out64).all() and np.isfinite(ref).all())
    with np.errstate(invalid="ignore"):
        err = np.abs(out64 - ref)
    max_abs = float(err.max(initial=0.0)) if finite else float("inf")
    scale = float(np.abs(ref).max(initial=0.0)) if finite else 0.0
    norm = scale if scale > 0 else 1.0
    max_rel = max_abs / norm
    control_rel = None
    threshold = tolerance
    if control is not None and finite:
        with np.errstate(invalid="ignore"):
            c_err = float(np.abs(np.asarray(control, dtype=np.float64) - ref).max(initial=0.0))
        if np.isfinite(c_err):
            control_rel = c_err / norm
            threshold = tolerance + CONTROL_FACTOR * control_rel
    p50, p99 = ((float(x) / norm for x in np.percentile(err, [50, 99]))
                if finite and err.size else (None, None))
    return Comparison(max_abs_err=max_abs, max_rel_err=max_rel, tolerance=threshold,
                      floor=tolerance, control_rel_err=control_rel, finite=finite,
                      nonfinite=int(np.count_nonzero(~np.isfinite(out64))),
                      passed=bool(finite and max_rel <= threshold), err_p50=p50, err_p99=p99)


def judge(cfg: Config, output: np.ndarray, m_rounding: float,
          refs: Dict[str, np.ndarray]) -> Tuple[Comparison, Optional[Comparison]]:
    """``(check, vs_exact)`` of the root's output of one decode step against its
    references (:func:`references`).

    Checked against exact attention with the float32 control; with
    ``--check-against kernel-model``, against the float64 model of the kernel, and
    ``vs_exact`` says how far the kernel's arithmetic lands from exact attention.
    """
    out = output if cfg.batched else output[None]
    limit = tolerance(cfg, m_rounding)
    if not modelled(cfg):
        return compare(out, refs["ref"], limit, refs["control"]), None
    return compare(out, refs["model"], limit), compare(out, refs["exact"], limit)


def references(comm, cfg: Config, q: np.ndarray, cache_len: int, *, n_tokens: int,
               progress: Optional[Callable[[int, int], None]] = None
               ) -> Optional[Dict[str, np.ndarray]]:
    """The references of one step, called on every rank; on rank 0 a dict of
    ``(B, T_q, h_q*d)`` arrays by kind (:func:`gqa_mpi.core.streamed.kinds`), None
    elsewhere.

    ``q``: the step's queries ``(B, T_q, h_q*d)`` as the ranks hold them;
    ``n_tokens``: the length the inputs were generated at. K and V are taken at
    float16's values where the ranks hold them so. ``progress(done, total)`` is called
    after each of this rank's chunks.
    """
    rounded = cfg.kv_dtype == "float16"
    tasks = plan(cfg, cache_len)[comm.rank::comm.size]
    shapes = kinds(cfg)
    mine = {kind: _empty(*shape) for kind, shape in shapes.items()}
    for i, task in enumerate(tasks):
        parts = chunk_partials(cfg, task, q, cache_len, n_tokens=n_tokens, rounded=rounded)
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
    buf = _pack(mine)
    if comm.rank != 0:
        with watchdog.waiting("rank 0 (the check's partials)"):
            comm.Send(buf, dest=0, tag=TAG)
        return None
    acc = mine
    theirs = np.empty_like(buf)
    for source in range(1, comm.size):
        with watchdog.waiting(f"rank {source} (its part of the check)"):
            comm.Recv(theirs, source=source, tag=TAG)
        for kind, part in _unpack(theirs, shapes).items():
            acc[kind] = reference_merge(acc[kind], part)
    return acc


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
            if cfg.kernel_source is not None:    # what the kernel's float16 memory holds
                q_step = float16_values(q_step)
            refs = references(comm, cfg, q_step, loop.cache_len(cfg, step), n_tokens=loop.final_len(cfg),
                              progress=lambda i, _, b=int(before): progress.update(b + i,
                                                                                   total))
            if refs is not None:
                checks.append(judge(cfg, out, m_rounding, refs))
    return checks, (time.perf_counter() - t0,
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
