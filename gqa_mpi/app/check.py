"""The root's check of O against float64 references, and its pass rule. No MPI here."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from ..core.wires import Wire
from .record import Comparison

CONTROL_FACTOR = 4.0
"""The check also accepts an error up to this multiple of the float32 control's own
(measured on ill-conditioned problems: the NumPy sweep up to 1.4x, the fused kernel,
whose summation order differs from BLAS', up to 2.9x)."""


def tolerance(wire: Wire, m_rounding: float) -> float:
    """The pass threshold of a run whose wire changed some ``m`` by up to ``m_rounding``.

    A partial whose ``m`` arrives off by ``delta`` has all its weights scaled by
    ``e**delta``; merged with the others, that moves O by at most about
    ``2 * delta * max|O|``. With large scores (no 1/sqrt(d) scale, say) float16's
    rounding of m alone reaches 1e-2, so it is added to the wire's own threshold.
    """
    return wire.tolerance + 2 * m_rounding


def compare(out: np.ndarray, ref: np.ndarray, tolerance: float,
            control: Optional[np.ndarray] = None) -> Comparison:
    """Errors of ``out`` against the float64 ``ref``, and the verdict.

    ``max_rel_err`` is normwise: the largest absolute error over the largest
    ``|ref|`` (elementwise ratios blow up where the output crosses zero). The pass
    rule follows flash-attention's tests: the error may reach ``tolerance`` (the
    floor) plus :data:`CONTROL_FACTOR` times the normwise error of ``control``, an
    untiled float32 attention on the same inputs, so that a problem float32 cannot
    resolve (scores near -1e5, say) is judged by what float32 can do on it. A
    non-finite output, or a non-finite reference, never passes.
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


def check_output(cfg, output: np.ndarray, m_rounding: float,
                 refs: Dict[str, np.ndarray]) -> Tuple[Comparison, Optional[Comparison]]:
    """``(check, vs_exact)`` of the root's output of one decode step against its
    references (:func:`gqa_mpi.app.references.references`).

    The default path is checked against exact attention, with the float32 control. A
    kernel-faithful run is checked against a float64 model of the kernel, and
    ``vs_exact`` says how far the kernel's arithmetic lands from exact attention on the
    same inputs.
    """
    out = output if cfg.batched else output[None]
    limit = tolerance(cfg.wire_format, m_rounding)
    if not cfg.kernel_faithful:
        return compare(out, refs["ref"], limit, refs["control"]), None
    return compare(out, refs["model"], limit), compare(out, refs["exact"], limit)
