"""The root's account of a run: the check, the statistics, the text and JSON report.

No MPI here: the driver gathers, this module only summarises and writes.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from .sizing import fmt


PHASES = ("inputs", "local_attention", "reduce", "finalize", "step", "total")
"""Timed phases of a run, in order; ``step`` is local attention + reduce + finalize."""

TOLERANCE = {"fp32": 1e-4, "packed": 1e-4, "kernel": 1e-2}
"""Largest accepted ``max_rel_err`` per wire, before the m rounding below. float32
accumulation over many tiles stays far below 1e-4; the kernel's float16 wire rounds
l and O to 11 bits, hence 1e-2."""


def tolerance(wire: str, m_rounding: float) -> float:
    """The pass threshold of a run whose wire changed some ``m`` by up to ``m_rounding``.

    A partial whose ``m`` arrives off by ``delta`` has all its weights scaled by
    ``e**delta``; merged with the others, that moves O by at most about
    ``2 * delta * max|O|``. With large scores (no 1/sqrt(d) scale, say) float16's
    rounding of m alone reaches 1e-2, so it is added to the wire's own threshold.
    """
    return TOLERANCE[wire] + 2 * m_rounding


CONTROL_FACTOR = 4.0
"""The check also accepts an error up to this multiple of the float32 control's own
(measured on ill-conditioned problems: the NumPy sweep up to 1.4x, the fused kernel,
whose summation order differs from BLAS', up to 2.9x)."""


def compare(out: np.ndarray, ref: np.ndarray, tolerance: float,
            control: Optional[np.ndarray] = None) -> Dict:
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
    return dict(max_abs_err=max_abs, max_rel_err=max_rel, tolerance=threshold,
                floor=tolerance, control_rel_err=control_rel, finite=finite,
                nonfinite=int(np.count_nonzero(~np.isfinite(out64))),
                passed=bool(finite and max_rel <= threshold))


def spread(values: List[float]) -> Dict[str, float]:
    """min / median / max of per-rank values."""
    a = np.asarray(values, dtype=np.float64)
    return dict(min=float(a.min()), median=float(np.median(a)), max=float(a.max()))


def format_report(record: Dict) -> str:
    """The few lines rank 0 prints."""
    c = record["config"]
    t = record["topology"]
    if c["kernel_faithful"]:
        scale = "1 (kernel-faithful)"
    else:
        scale = "1/sqrt(d)" if c["softmax_scale"] is None else f"{c['scale']:g}"
    source = (f"generated (seed {c['seed']})" if c["inputs"] is None
              else f"from {c['inputs']}")
    lines = [
        f"problem   B={c['batch']} T_q={c['queries']} S_kv={c['seq_len']} "
        f"h_q={c['heads_q']} h_kv={c['heads_kv']} (G={c['group']}) d={c['head_dim']} "
        f"scale={scale} causal={'yes' if c['causal'] else 'no'}; inputs {source}",
        f"topology  C={t['cubes']} cubes x P={t['pes']} PEs = {t['ranks']} ranks; "
        f"PE grid {c['grid']} ({t['rows_used']} row(s) x {t['cols_used']} col(s) used); "
        f"chain depth {t['chain_depth']} hops",
        "reduce    " + {
            "chain": "chain (the kernel's: row chain, column bridge, inter-cube chain)",
            "tree": f"binomial tree, {c['reduce_depth']} hops on the critical path",
            "mpi": "MPI.Reduce with the merge as a user-defined operator"}[c["reduce"]],
        f"split     {record['tokens_per_rank']['min']}..{record['tokens_per_rank']['max']}"
        f" tokens per rank, tile {c['tile']}; wire {c['wire']}",
    ]
    kern = record.get("kernel")
    if kern:
        used = "+".join(kern["used"])
        isa = f" ({kern['isa']})" if "fused" in kern["used"] else ""
        lines.append(f"kernel    {used}{isa}; K/V resident as {c['kv_dtype']}"
                     + (f"; NOTE {kern['fallback']}" if kern["fallback"] else ""))
    chk = record["check"]
    faithful = c["kernel_faithful"]
    if chk is None:
        lines.append("check     skipped (--no-check)")
    else:
        verdict = "PASSED" if chk["passed"] else "FAILED"
        against = "a float64 model of the kernel" if faithful else "float64 reference"
        if not faithful and c["kv_dtype"] == "float16":
            against += " on the float16 K/V the ranks hold"
        rule = f"tolerance {chk['tolerance']:.3g}"
        if chk.get("control_rel_err") is not None:
            rule += (f" = {chk['floor']:.3g} + {CONTROL_FACTOR:g} x float32 control's "
                     f"{chk['control_rel_err']:.3g}")
        if not chk["finite"]:
            lines.append(f"check     output or reference not finite ({chk['nonfinite']} "
                         f"element(s) of O are NaN or inf) vs {against}: FAILED")
        else:
            lines.append(f"check     max_abs_err={chk['max_abs_err']:.3g} "
                         f"max_rel_err={chk['max_rel_err']:.3g} ({rule}) vs {against}: "
                         f"{verdict}")
    exact = record.get("faithful_vs_exact")
    if exact is not None:
        dropped = c["seq_len"] % t["ranks"]
        lines.append(f"faithful  kernel arithmetic differs from exact attention by "
                     f"max_abs_err={exact['max_abs_err']:.3g} "
                     f"max_rel_err={exact['max_rel_err']:.3g} (no 1/sqrt(d) scale, "
                     f"{dropped} tail token(s) dropped, K and Q reshaped not transposed, "
                     f"float16)")
    num = record.get("numerics")
    if num and num["output_nonfinite"]:
        why = ""
        if num["scores_nonfinite_ranks"]:
            ranks = ",".join(map(str, num["scores_nonfinite_ranks"][:8]))
            why = (f"; scores were NaN or +inf on rank(s) {ranks}"
                   + (": float32 overflow of scale * q.k (the inputs are finite)"
                      if num["inputs_checked_finite"] else ""))
        lines.append(f"numerics  O holds {num['output_nonfinite']} NaN or inf element(s)"
                     f"{why}; the output is invalid")
    loss = record["wire_loss"]
    if loss["overflow"]:
        lines.append(f"WARNING   float16 wire overflowed: {loss['overflow']} element(s) "
                     f"of m/l/O became inf on the way to the root; the output is invalid")
    elif c["wire"] == "kernel":
        lines.append(f"wire      float16: no overflow; m rounded by up to "
                     f"{loss['m_rounding']:.3g}")
    tm = record["timings"]
    lines.append("time      max over ranks: " + ", ".join(
        f"{name} {tm[name]['max'] * 1e3:.1f} ms" for name in tm))
    msg = record["messages"]
    mem = record["memory"]["peak_rss_mib"]
    lines.append(f"traffic   {msg['count']} messages, {fmt(msg['bytes'])}; "
                 f"peak memory per rank {mem['max']:.0f} MiB (max)")
    for key in ("output", "trace", "json"):
        if c.get(key):
            lines.append(f"{key:<9} {c[key]}")
    return "\n".join(lines)


def build_record(config: Dict, topology: Dict, check: Optional[Dict], per_rank: List[Dict],
                 output: Optional[str]) -> Dict:
    """The run record (also the JSON file) from what every rank reported."""
    for r in per_rank:  # the decode step proper, from resident slices to the output
        r["timings"]["step"] = sum(r["timings"].get(p, 0.0)
                                   for p in ("local_attention", "reduce", "finalize"))
    phases = [p for p in PHASES if any(p in r["timings"] for r in per_rank)]
    loss_overflow = sum(r["overflow"] for r in per_rank)
    return dict(
        config=config,
        topology=topology,
        check=check,
        timings={p: spread([r["timings"].get(p, 0.0) for r in per_rank]) for p in phases},
        messages=dict(count=sum(r["messages"] for r in per_rank),
                      bytes=sum(r["bytes"] for r in per_rank)),
        wire_loss=dict(overflow=loss_overflow,
                       m_rounding=max(r["m_rounding"] for r in per_rank)),
        memory=dict(peak_rss_mib=spread([r["peak_rss_mib"] for r in per_rank]),
                    per_rank_mib=[round(r["peak_rss_mib"], 1) for r in per_rank]),
        tokens_per_rank=dict(min=min(r["tokens"] for r in per_rank),
                             max=max(r["tokens"] for r in per_rank)),
        per_rank_timings=[r["timings"] for r in per_rank],
        output=output,
    )
