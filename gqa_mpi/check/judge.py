"""The check's verdict: the errors of an output against its float64 reference, the
tolerance, and whether it passes. No MPI.

The pass rule (:func:`compare`) follows flash-attention's tests: a floor, plus a
multiple of an untiled float32 attention's own error on the same inputs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..config.config import Config
from .streamed import modelled

CONTROL_FACTOR = 4.0
"""The check also accepts an error up to this multiple of the float32 control's own
(measured on ill-conditioned problems: the NumPy sweep up to 1.4x, the fused kernel,
whose summation order differs from BLAS', up to 2.9x)."""

@dataclass
class Comparison:
    """Errors of an output against a float64 reference, and the verdict."""

    max_abs_err: float
    max_rel_err: float
    """Normwise: the largest absolute error over the largest ``|ref|``."""
    tolerance: float
    """The pass threshold: ``floor`` plus the control term."""
    floor: float
    control_rel_err: Optional[float]
    """Normwise error of an untiled float32 attention on the same inputs."""
    finite: bool
    nonfinite: int
    passed: bool
    err_p50: Optional[float] = None
    err_p99: Optional[float] = None
    """Percentiles over the elements of ``|out - ref| / max|ref|``: how the error
    spreads, where ``max_rel_err`` is its largest element."""
    by_head: Optional[List[float]] = None
    """The normwise error of each query head (its ``d`` columns of every row)."""
    by_row: Optional[List[float]] = None
    """The normwise error of each query row (``T_q``; with a batch, its rows of every
    batch entry)."""

    def to_json(self) -> Dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Optional[Dict]) -> Optional["Comparison"]:
        if d is None:
            return None
        d = dict(d)
        for key in ("max_abs_err", "max_rel_err"):   # strict JSON wrote inf as null
            if d.get(key) is None:
                d[key] = float("inf")
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in fields(cls)}})


def tolerance(cfg: Config, m_rounding: float) -> float:
    """The pass floor of a run whose wire changed some ``m`` by up to ``m_rounding``:
    its mode's rule (:meth:`gqa_mpi.config.modes.Emulated.tolerance`; a source run's is
    :data:`~gqa_mpi.config.modes.SOURCE_TOLERANCE`). With large scores (no 1/sqrt(d)
    scale, say) float16's rounding of m alone reaches 1e-2, which is why it counts."""
    return cfg.mode.tolerance(cfg.wire_format, m_rounding, cfg.kv_dtype)


def compare(out: np.ndarray, ref: np.ndarray, tolerance: float,
            control: Optional[np.ndarray] = None, heads: Optional[int] = None) -> Comparison:
    """Errors of ``out`` against the float64 ``ref``, and the verdict.

    ``max_rel_err`` is normwise: the largest absolute error over the largest
    ``|ref|`` (elementwise ratios blow up where the output crosses zero). The error
    may reach ``tolerance`` (the floor) plus :data:`CONTROL_FACTOR` times the normwise
    error of ``control``, an untiled float32 attention on the same inputs, so that a
    problem float32 cannot resolve (scores near -1e5, say) is judged by what float32
    can do on it. A non-finite output, or a non-finite reference, never passes.
    With ``heads`` (``out`` is ``(B, T_q, heads*d)``), the error by query head and by
    query row too, on the same scale.
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
    by_head = by_row = None
    if heads and finite and err.ndim == 3 and err.size:
        B, T, width = err.shape
        by_head = (err.reshape(B, T, heads, width // heads).max(axis=(0, 1, 3)) / norm).tolist()
        by_row = (err.max(axis=(0, 2)) / norm).tolist()
    return Comparison(max_abs_err=max_abs, max_rel_err=max_rel, tolerance=threshold,
                      floor=tolerance, control_rel_err=control_rel, finite=finite,
                      nonfinite=int(np.count_nonzero(~np.isfinite(out64))),
                      passed=bool(finite and max_rel <= threshold), err_p50=p50, err_p99=p99,
                      by_head=by_head, by_row=by_row)


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
    h = cfg.heads_q
    if not modelled(cfg):
        return compare(out, refs["ref"], limit, refs["control"], heads=h), None
    return compare(out, refs["model"], limit, heads=h), compare(out, refs["exact"], limit)
