"""The few lines rank 0 prints about a run, from its :class:`~gqa_mpi.app.record.RunRecord`.

No MPI here, and nothing computed that the record does not hold. An emulated run and a
``--kernel-source`` run share every line but those that say what ran locally.
"""
from __future__ import annotations

from typing import Dict, List

from ..config import loop
from ..dsl.tl import Counters
from ..check.judge import CONTROL_FACTOR, Comparison
from .record import RunRecord
from .sizing import fmt


def format_report(record: RunRecord) -> str:
    c = record.config
    lines = c.describe()
    mode = REPORTS[c.mode.name]
    lines += mode.lines(record)
    if c.steps > 1:
        lat, held = record.latency(), record.held
        lines.append(f"steps     {c.steps} decode steps, {c.queries} new token(s) each to "
                     f"{c.placement} placement; step time (slowest rank) p50 "
                     f"{lat['p50'] * 1e3:.1f} ms, p90 {lat['p90'] * 1e3:.1f} ms, p99 "
                     f"{lat['p99'] * 1e3:.1f} ms, max {lat['max'] * 1e3:.1f} ms; tokens per "
                     f"rank at the end {held['min']}..{held['max']}")
    blind = c.queries - c.seq_len if c.causal else 0
    if blind > 0:
        lines.append(f"note      --causal with T_q={c.queries} > S_kv={c.seq_len}: the first "
                     f"{blind} queries see no key, and their rows of O are zero")
    if record.in_process:
        lines.append(f"note      in process: the {len(record.ranks)} PEs are threads of one "
                     f"process (no MPI) and share its interpreter: the times below are "
                     f"not those of ranks on cores of their own; the results are not "
                     f"affected")
    for h in ([] if record.in_process else record.crowded):
        lines.append(f"note      {h['host']}: {h['ranks']} rank(s) on {h['cores']} core(s)"
                     + (f", already busy at the start (load {h['load']:.1f})"
                        if h["busy"] else "")
                     + ": the times below are of shared cores, not of one rank on a core of "
                       "its own; the results are not affected")
    if record.predicted is not None:
        lines += _predicted_lines(record)
    lines += _check_lines(record)
    if record.output_nonfinite:
        why = ""
        if record.scores_nonfinite_ranks:
            ranks = ",".join(map(str, record.scores_nonfinite_ranks[:8]))
            why = (f"; scores were NaN or +inf on rank(s) {ranks}"
                   + (": float32 overflow of scale * q.k (the inputs are finite)"
                      if record.inputs_checked_finite else ""))
        lines.append(f"numerics  O holds {record.output_nonfinite} NaN or inf element(s)"
                     f"{why}; the output is invalid")
    wire = c.wire_format
    if record.overflow:
        lines.append(f"WARNING   {wire.narrowest} wire overflowed (--wire "
                     f"{wire.name}): {record.overflow} element(s) of m/l/O became inf on "
                     f"the way to the root; the output is invalid")
    else:
        lines += mode.wire_lines(record)
    tm = record.timings()
    median = " (the median step's)" if c.steps > 1 else ""
    lines.append(f"time      max over ranks{median}: " + ", ".join(
        f"{name} {tm[name]['max'] * 1e3:.1f} ms" for name in tm))
    peak = record.peak_rss_mib["max"]
    lines.append(f"{mode.traffic(record)}" + (
        f"peak memory of the process (all {len(record.ranks)} PEs) {peak:.0f} MiB"
        if record.in_process else
        f"peak memory per rank {peak:.0f} MiB (max); {len(record.hosts)} host(s)"))
    for key, path in record.written.items():
        lines.append(f"{key:<9} {path}")
    return "\n".join(lines)




def _emulated_lines(record: RunRecord) -> List[str]:
    c = record.config
    wire, tokens = c.wire_format, record.tokens
    used = "+".join(record.kernels)
    isa = f" ({record.isa})" if "fused" in record.kernels else ""
    return [f"reduce    {c.schedule.describe(c.layout)}",
            f"split     {tokens['min']}..{tokens['max']} tokens per rank, tile {c.tile}; "
            f"wire {wire.name} ({wire.help})",
            f"kernel    {used}{isa}; K/V resident as {c.kv_dtype}"
            + (f"; NOTE {record.kernel_note}" if record.kernel_note else "")]


def memory(kv_dtype: str) -> str:
    """What a kernel's memory holds, as its report line says."""
    if kv_dtype == "float16":
        return "float16 memory"
    return f"memory: K and V {kv_dtype}, Q and O float16"


def _source_lines(record: RunRecord) -> List[str]:
    """What a kernel author needs of a ``--kernel-source`` run: what it read, where
    values first became non-finite, its scratch, bytes, flops and messages."""
    c, ks = record.config, record.kernel_source
    every = [r.source for r in record.ranks]
    S = loop.cache_len(c, c.steps - 1)
    k_read = sum(s["k_rows"] for s in every)
    v_read = sum(s["v_rows"] for s in every)
    per_rank = [s["k_rows"] for s in every]
    held = [r.held or r.tokens for r in record.ranks]
    last = " in the last step" if c.steps > 1 else ""
    lines = [
        f"kernel    {ks['function']} from {ks['file']}, on every rank with gqa_mpi's tl "
        f"({memory(c.kv_dtype)})",
        f"read      K {k_read} of S_kv={S} tokens ({S - k_read} never read), V {v_read} "
        f"({S - v_read} never read){last}; per rank {min(per_rank)}..{max(per_rank)} of "
        f"{min(held)}..{max(held)} held",
    ]
    first: Dict[tuple, List[int]] = {}
    for r in record.ranks:
        for call, line, _ in r.source["nonfinite"]:
            ranks = first.setdefault((call, line), [])
            if r.rank not in ranks:
                ranks.append(r.rank)
    if first:
        shown = "; ".join(f"tl.{call} at line {line} on rank(s) "
                          f"{','.join(map(str, rs[:8]))}{' ...' if len(rs) > 8 else ''}"
                          for (call, line), rs in list(first.items())[:4])
        lines.append(f"numerics  inf or NaN first made by {shown}")
    peak = max(range(len(every)), key=lambda r: every[r]["scratch_peak"])
    top = every[peak].get("scratch_top") or []
    over = record.predicted is not None and not record.predicted.get("fits_scratch", True)
    named = (f"; at it on rank {peak}: " + ", ".join(
        f"{fmt(b)} {what} (line {line})" if line is not None else f"{fmt(b)} {what}"
        for b, line, what in top) if over and top else "")
    lines.append(f"scratch   high-water {fmt(every[peak]['scratch_peak'])} per rank (max)"
                 f"{' DOES NOT FIT the profile' if over else ''}{named}; persistent "
                 f"{fmt(max(s['persistent'] for s in every))}")
    sent = Counters()
    for s in every:
        sent.add(Counters(sent=s["sent"]))        # the kernel's own sum of directions
    directions = ", ".join(f"{d} {n} ({fmt(b)})" for d, (n, b) in sent.sent.items()) or "none"
    lines.append(f"traffic   loaded {fmt(sum(s['loaded_bytes'] for s in every))}, tl.dot "
                 f"{sum(s['dot_flops'] for s in every) / 1e9:.3g} GFLOP; messages "
                 f"{directions}")
    return lines


class _Emulated:
    """The report's lines of the emulation's own step."""

    lines = staticmethod(_emulated_lines)

    @staticmethod
    def wire_lines(record: RunRecord) -> List[str]:
        wire = record.config.wire_format
        return ([f"wire      {wire.name}: no overflow; m rounded by up to "
                 f"{record.m_rounding:.3g}"] if wire.lossy else [])

    @staticmethod
    def traffic(record: RunRecord) -> str:
        return f"{'traffic':<9} {record.messages} messages, {fmt(record.bytes)}; "

    @staticmethod
    def against(record: RunRecord) -> str:
        return "float64 reference" + (" on the float16 K/V the ranks hold"
                                      if record.config.kv_dtype == "float16" else "")


class _Source:
    """The report's lines of a ``--kernel-source`` run."""

    lines = staticmethod(_source_lines)

    @staticmethod
    def wire_lines(record: RunRecord) -> List[str]:
        return []

    @staticmethod
    def traffic(record: RunRecord) -> str:
        return f"{'memory':<9} "

    @staticmethod
    def against(record: RunRecord) -> str:
        return (f"float64 exact attention on the {record.config.kv_dtype} values the "
                f"kernel's memory holds")


REPORTS = {"emulated": _Emulated, "source": _Source}
"""Each mode's lines (:attr:`gqa_mpi.config.modes.Emulated.name`)."""


def _check_lines(record: RunRecord) -> List[str]:
    c, chk = record.config, record.check
    if chk is None:
        return ["check     skipped (--no-check)"]
    if c.check_against == "kernel-model":
        against = "a float64 model of the reference kernel's arithmetic"
    else:
        against = REPORTS[c.mode.name].against(record)
    if c.steps > 1:
        against += f", {len(record.checks)} of {c.steps} steps checked, the worst shown"
    lines = [_comparison("check", chk, against)]
    if not chk.passed and chk.by_head:
        lines.append(_where(chk, c.group))
    if record.vs_exact is not None:
        x = record.vs_exact
        lines.append(f"exact     the kernel's arithmetic differs from exact attention "
                     f"(scale {c.scale:g}) by max_abs_err={x.max_abs_err:.3g} "
                     f"max_rel_err={x.max_rel_err:.3g}: "
                     f"{'within' if x.passed else 'beyond'} the tolerance {x.tolerance:.3g}")
    return lines


def _comparison(head: str, chk: Comparison, against: str) -> str:
    rule = f"tolerance {chk.tolerance:.3g}"
    if chk.control_rel_err is not None:
        rule += (f" = {chk.floor:.3g} + {CONTROL_FACTOR:g} x float32 control's "
                 f"{chk.control_rel_err:.3g}")
    if not chk.finite:
        return (f"{head:<9} output or reference not finite ({chk.nonfinite} element(s) of "
                f"O are NaN or inf) vs {against}: FAILED")
    return (f"{head:<9} max_abs_err={chk.max_abs_err:.3g} max_rel_err={chk.max_rel_err:.3g} "
            f"({rule}) vs {against}: {'PASSED' if chk.passed else 'FAILED'}")


def _where(chk: Comparison, group: int, worst: int = 3) -> str:
    """Where a failing output is wrong: the error by query head, by KV head (the worst
    of its ``group`` query heads) and by query row, how many are over the tolerance,
    and the worst few."""
    heads = chk.by_head
    by_kv = [max(heads[i:i + group]) for i in range(0, len(heads), group)]
    parts = []
    for what, tag, errs in (("query head", "h", heads), ("KV head", "kv", by_kv),
                            ("query row", "t", chk.by_row)):
        over = sum(e > chk.tolerance for e in errs)
        top = sorted(range(len(errs)), key=lambda i: -errs[i])[:worst]
        parts.append(f"by {what}: {over} of {len(errs)} over, worst "
                     + ", ".join(f"{tag}{i} {errs[i]:.3g}" for i in top))
    return "where     " + "; ".join(parts)


def duration(seconds: float) -> str:
    """``12.3 us``: a time in the unit that suits it."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def _predicted_lines(record: RunRecord) -> List[str]:
    """The accelerator's predicted step, its last PE's split, the critical path."""
    p = record.predicted
    if "error" in p:
        return [f"predicted not replayed on {p['profile']}: {p['error']}"]
    last = next(pe for pe in p["pes"] if pe["rank"] == p["last_pe"])
    place = record.ranks[p["last_pe"]].place
    split = ", ".join(f"{k[:-2]} {duration(last[k])}" for k in
                      ("memory_s", "dot_s", "vector_s", "send_s", "wait_s"))
    steps = (f"; steps {duration(min(p['steps_s']))}..{duration(max(p['steps_s']))}"
             if "steps_s" in p else "")
    fits = ("fits" if p["fits_scratch"] else "DOES NOT FIT")
    bound = (f"bound by {last['bound']} ({duration(last['busy_s'][last['bound']])} "
             f"busy of {duration(last['finish_s'])}); busy " if p.get("overlap") else "")
    lines = [f"predicted step {duration(p['step_s'])} on {p['profile']}"
             f"{' (engines overlap)' if p.get('overlap') else ''}{steps}; last PE rank "
             f"{p['last_pe']}, {place}: {bound}{split}; scratch "
             f"{fmt(p['scratch_peak_bytes'])} {fits} the profile's {fmt(p['scratch_bytes'])}"]
    path = p["critical_path"]
    if path:
        hops = "; ".join(f"rank {h['from_rank']} -{h['direction']} (line {h['line']})-> "
                         f"rank {h['to_rank']} at {duration(h['arrived_s'])}, waited "
                         f"{duration(h['waited_s'])}" for h in path[-4:])
        more = f"{len(path) - 4} hop(s) before; " if len(path) > 4 else ""
        lines.append(f"critical  {len(path)} hop(s) to rank {p['last_pe']}: {more}{hops}")
    return lines
