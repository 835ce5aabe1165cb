"""The few lines rank 0 prints about a run, from its :class:`~gqa_mpi.app.record.RunRecord`.

No MPI here, and nothing computed that the record does not hold.
"""
from __future__ import annotations

from .check import CONTROL_FACTOR
from .record import RunRecord
from .sizing import fmt


def format_report(record: RunRecord) -> str:
    c = record.config
    grid = c.layout
    wire = c.wire_format
    if c.kernel_faithful:
        scale = "1 (kernel-faithful)"
    else:
        scale = "1/sqrt(d)" if c.softmax_scale is None else f"{c.scale:g}"
    source = f"generated (seed {c.seed})" if c.inputs is None else f"from {c.inputs}"
    tokens = record.tokens
    lines = [
        f"problem   B={c.B} T_q={c.queries} S_kv={c.seq_len} h_q={c.heads_q} "
        f"h_kv={c.heads_kv} (G={c.group}) d={c.head_dim} scale={scale} "
        f"causal={'yes' if c.causal else 'no'}; inputs {source}",
        f"topology  C={c.cubes} cubes x P={c.pes} PEs = {c.n_ranks} ranks; PE grid "
        f"{c.grid[0]}x{c.grid[1]} ({grid.rows_used} row(s) x {grid.cols_used} col(s) used)",
        f"reduce    {c.schedule.describe(grid)}",
        f"split     {tokens['min']}..{tokens['max']} tokens per rank, tile {c.tile}; "
        f"wire {wire.name} ({wire.help})",
    ]
    if c.steps > 1:
        lat, held = record.latency(), record.held
        lines.append(f"steps     {c.steps} decode steps, {c.queries} new token(s) each to "
                     f"{c.placement} placement; step time (slowest rank) p50 "
                     f"{lat['p50'] * 1e3:.1f} ms, p90 {lat['p90'] * 1e3:.1f} ms, p99 "
                     f"{lat['p99'] * 1e3:.1f} ms, max {lat['max'] * 1e3:.1f} ms; tokens per "
                     f"rank at the end {held['min']}..{held['max']}")
    used = "+".join(record.kernels)
    isa = f" ({record.isa})" if "fused" in record.kernels else ""
    lines.append(f"kernel    {used}{isa}; K/V resident as {c.kv_dtype}"
                 + (f"; NOTE {record.kernel_note}" if record.kernel_note else ""))
    chk = record.check
    if chk is None:
        lines.append("check     skipped (--no-check)")
    else:
        against = "a float64 model of the kernel" if c.kernel_faithful else "float64 reference"
        if not c.kernel_faithful and c.kv_dtype == "float16":
            against += " on the float16 K/V the ranks hold"
        if c.steps > 1:
            against += (f", {len(record.checks)} of {c.steps} steps checked, the worst "
                        f"shown")
        rule = f"tolerance {chk.tolerance:.3g}"
        if chk.control_rel_err is not None:
            rule += (f" = {chk.floor:.3g} + {CONTROL_FACTOR:g} x float32 control's "
                     f"{chk.control_rel_err:.3g}")
        if not chk.finite:
            lines.append(f"check     output or reference not finite ({chk.nonfinite} "
                         f"element(s) of O are NaN or inf) vs {against}: FAILED")
        else:
            lines.append(f"check     max_abs_err={chk.max_abs_err:.3g} "
                         f"max_rel_err={chk.max_rel_err:.3g} ({rule}) vs {against}: "
                         f"{'PASSED' if chk.passed else 'FAILED'}")
    exact = record.vs_exact
    if exact is not None:
        dropped = c.seq_len % c.n_ranks
        lines.append(f"faithful  kernel arithmetic differs from exact attention by "
                     f"max_abs_err={exact.max_abs_err:.3g} "
                     f"max_rel_err={exact.max_rel_err:.3g} (no 1/sqrt(d) scale, "
                     f"{dropped} tail token(s) dropped, K and Q reshaped not transposed, "
                     f"float16)")
    if record.output_nonfinite:
        why = ""
        if record.scores_nonfinite_ranks:
            ranks = ",".join(map(str, record.scores_nonfinite_ranks[:8]))
            why = (f"; scores were NaN or +inf on rank(s) {ranks}"
                   + (": float32 overflow of scale * q.k (the inputs are finite)"
                      if record.inputs_checked_finite else ""))
        lines.append(f"numerics  O holds {record.output_nonfinite} NaN or inf element(s)"
                     f"{why}; the output is invalid")
    if record.overflow:
        lines.append(f"WARNING   {wire.narrowest} wire overflowed (--wire "
                     f"{wire.name}): {record.overflow} element(s) of m/l/O became inf on "
                     f"the way to the root; the output is invalid")
    elif wire.lossy:
        lines.append(f"wire      {wire.name}: no overflow; m rounded by up to "
                     f"{record.m_rounding:.3g}")
    tm = record.timings()
    median = " (the median step's)" if c.steps > 1 else ""
    lines.append(f"time      max over ranks{median}: " + ", ".join(
        f"{name} {tm[name]['max'] * 1e3:.1f} ms" for name in tm))
    lines.append(f"traffic   {record.messages} messages, {fmt(record.bytes)}; "
                 f"peak memory per rank {record.peak_rss_mib['max']:.0f} MiB (max); "
                 f"{len(record.hosts)} host(s)")
    for key, path in record.written.items():
        lines.append(f"{key:<9} {path}")
    return "\n".join(lines)
