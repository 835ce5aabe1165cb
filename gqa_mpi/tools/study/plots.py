"""PNGs of a study's results (needs matplotlib: ``pip install -e ".[study]"``)."""
from __future__ import annotations

import math
import os
from typing import Dict, List

from ...check.judge import CONTROL_FACTOR
from ...step.wires import WIRES
from .plan import StudyError
from .results import medians, read_results, scaling

SWEEP_FIELDS = {"tile": "tile", "wire": "wire", "reduce": "reduce_schedule", "grid": "grid"}


def _stacked(ax, x, pts, top_label: str) -> None:
    """The slowest local sweep, and what the step adds on top of it, as stacked bars."""
    local = [p["local_attention"] * 1e3 for p in pts]
    beyond = [max(p["step"] * 1e3 - lo, 0.0) for p, lo in zip(pts, local)]
    ax.bar(x, local, label="local attention (slowest rank)")
    ax.bar(x, beyond, bottom=local, label=top_label)
    tops = [lo + b for lo, b in zip(local, beyond) if math.isfinite(lo + b)]
    ax.set_ylim(0, 1.3 * max(tops, default=1.0))   # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper right")


def _plain_log_ticks(axis) -> None:
    """A log axis labelled 50, 100, 200, not 5x10^1: the 1, 2, 5 of each decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _footer(points: List[Dict], shared: float) -> str:
    """Where and with what the points ran: hosts, ranks per core, gqa_mpi's commit."""
    def values(key):
        return sorted({v for p in points for v in str(p.get(key) or "").split(",") if v})
    hosts, commits = values("host"), values("commit")
    cores = sorted({round(int(p["ranks"]) / float(p["ranks_per_core"])) for p in points
                    if p.get("ranks_per_core") and p.get("ranks")})
    return "; ".join([f"host {', '.join(hosts) or 'not recorded'}"
                      + (f" ({', '.join(map(str, cores))} cores)" if cores else ""),
                      f"up to {shared:g} ranks per core" if shared else
                      "ranks per core not recorded",
                      f"gqa_mpi {', '.join(commits)}" if commits else "commit not recorded"])


SPLIT = ("memory_s", "dot_s", "vector_s", "send_s", "wait_s")


def _kernel_name(p: Dict) -> str:
    source = p.get("kernel_source") or "emulated"
    name = os.path.basename(source.split(":")[-1] if source.startswith("builtin:")
                            else source).replace(".py", "")
    return name.lstrip("_")               # matplotlib hides labels that start with _


def _predicted(plt, title: str, pts: List[Dict], strong: bool):
    """The accelerator's predicted step against the PEs, one line per kernel file, and
    the split of the PE that finished last (of the first kernel; with engines that
    overlap, their busy times beside the step)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    kernels = sorted({_kernel_name(p) for p in pts})
    for name in kernels:
        mine = sorted((p for p in pts if _kernel_name(p) == name), key=lambda p: p["ranks"])
        a.plot([p["ranks"] for p in mine], [p["predicted_step_s"] * 1e6 for p in mine], "o-",
               label=name)
    n = sorted({p["ranks"] for p in pts})
    first = min((p for p in pts if p["ranks"] == n[0]), key=lambda p: p["predicted_step_s"])
    f = first["predicted_step_s"] * 1e6
    a.plot(n, [f * n[0] / x if strong else f for x in n], "--", color="gray", label="ideal")
    a.set_xscale("log", base=2)
    a.set_yscale("log" if strong else "linear")
    a.set_xticks(n, [str(x) for x in n])
    a.set_xlabel("PEs (C x P)")
    a.set_ylabel("predicted accelerator step, us")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    mine = sorted((p for p in pts if _kernel_name(p) == kernels[0]), key=lambda p: p["ranks"])
    x = range(len(mine))
    # with engines that overlap the figures are busy times, not a split of the step
    overlap = any(sum(p[f"predicted_{k}"] for k in SPLIT) > 1.001 * p["predicted_step_s"]
                  for p in mine)
    if overlap:
        keys = [k for k in SPLIT if k != "wait_s"]
        w = 0.8 / len(keys)
        for i, key in enumerate(keys):
            b.bar([j + (i - (len(keys) - 1) / 2) * w for j in x],
                  [p[f"predicted_{key}"] * 1e6 for p in mine], width=w, label=key[:-2])
        b.plot(list(x), [p["predicted_step_s"] * 1e6 for p in mine], "k_", markersize=18,
               label="step")
    else:
        bottom = [0.0] * len(mine)
        for key in SPLIT:
            vals = [p[f"predicted_{key}"] * 1e6 for p in mine]
            b.bar(x, vals, bottom=bottom, label=key[:-2])
            bottom = [u + v for u, v in zip(bottom, vals)]
    b.set_xticks(list(x), [str(p["ranks"]) for p in mine])
    b.set_xlabel("PEs (C x P)")
    b.set_ylabel("us busy on the last PE (engines overlap)" if overlap
                 else "us, the last PE's split")
    b.set_title(kernels[0], fontsize=9)
    b.legend(fontsize=8)
    fig.suptitle(title + " (--predict)", fontsize=9)
    return fig


def plot(csv_path: str, out_dir: str) -> List[str]:
    """Draw the study's PNGs next to each other in ``out_dir``; return their paths.

    They are named after the CSV too (``strong2_time.png`` for ``strong2.csv``), so two
    studies plotted into one folder both survive.
    """
    points = scaling(medians(read_results(csv_path)))   # a bad file says so first
    if not points:
        raise StudyError(f"{csv_path}: no finished runs to plot")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("gqa_mpi.study plot: matplotlib is missing; "
                         "pip install -e \".[study]\"")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    stem = os.path.splitext(os.path.basename(csv_path))[0]

    shared = max((float(p.get("ranks_per_core") or 0) for p in points), default=0.0)
    note = (f"\nup to {shared:g} ranks per core: the times are of shared cores"
            if shared > 1 else "")
    footer = _footer(points, shared)

    def figure(title: str, xlabel: str, ylabel: str, ranks=None):
        title += note
        fig, ax = plt.subplots(figsize=(6, 4.4))
        fig.text(0.01, 0.005, footer, fontsize=6, color="gray", va="bottom")
        if ranks is not None:                  # a line against ranks, log2 axis
            ax.set_xscale("log", base=2)
            ax.set_xticks(ranks, [str(x) for x in ranks])
            ax.grid(alpha=0.3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        return fig, ax

    def save(fig, name: str) -> None:
        kind = name.split("_")[0]
        path = os.path.join(out_dir, name if stem == kind else f"{stem}_{name}")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        tmp = path + ".tmp.png"
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
        plt.close(fig)
        written.append(path)

    for kind in ("strong", "weak"):
        every = [p for p in points if p["study"] == kind]
        if every and all(p.get("predicted_step_s") for p in every):
            title = (f"{kind} scaling: S_kv = {every[0]['seq_len']}" if kind == "strong"
                     else f"weak scaling: {every[0]['tokens_per_rank']} tokens per rank")
            save(_predicted(plt, title, every, kind == "strong"), f"{kind}_predicted.png")
        # the measured plots, one per kernel file where a study holds several
        for name in sorted({_kernel_name(p) for p in every}):
            pts = sorted((p for p in every if _kernel_name(p) == name),
                         key=lambda p: p["ranks"])
            _measured(figure, save, kind, pts, "" if len({_kernel_name(p) for p in every}) == 1
                      else f"-{name}")
    _rest(plt, figure, save, points)
    return written


def _measured(figure, save, kind: str, pts: List[Dict], suffix: str) -> None:
    """The measured step, efficiency, breakdown and throughput of one kernel's points."""
    n = [p["ranks"] for p in pts]
    step = [p["step"] * 1e3 for p in pts]
    title = (f"{kind} scaling: S_kv = {pts[0]['seq_len']}" if kind == "strong" else
             f"weak scaling: {pts[0]['tokens_per_rank']} tokens per rank")
    title += f", h_kv={pts[0]['heads_kv']}, d={pts[0]['head_dim']}"

    fig, ax = figure(title, "MPI ranks (one PE each)",
                     "step time, ms (local attention + reduction)", n)
    low = [s - p["step_lo"] * 1e3 for s, p in zip(step, pts)]
    high = [p["step_hi"] * 1e3 - s for s, p in zip(step, pts)]
    ax.errorbar(n, step, yerr=[low, high], fmt="o-", capsize=3,
                label="measured (median of max over ranks; bars: fastest, slowest repeat)")
    ideal = ([step[0] * n[0] / x for x in n] if kind == "strong" else [step[0]] * len(n))
    ax.plot(n, ideal, "--", color="gray", label="ideal")
    if kind == "strong":
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    else:
        ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    save(fig, f"{kind}_time{suffix}.png")

    fig, ax = figure(title, "MPI ranks", "parallel efficiency", n)
    ax.plot(n, [p["efficiency"] for p in pts], "o-")
    ax.axhline(1.0, ls="--", color="gray")
    ax.set_ylim(0, max(1.15, 1.05 * max(p["efficiency"] for p in pts)))
    save(fig, f"{kind}_efficiency{suffix}.png")

    fig, ax = figure(title + ": breakdown", "MPI ranks", "ms (median over repeats)")
    _stacked(ax, range(len(n)), pts,
             "reduction and waiting beyond it (step - slowest local)")
    ax.set_xticks(list(range(len(n))), [str(v) for v in n])
    save(fig, f"{kind}_breakdown{suffix}.png")

    fig, ax = figure(title, "MPI ranks", "KV tokens per second (millions)", n)
    ax.plot(n, [p["tokens_per_s"] / 1e6 for p in pts], "o-")
    ax.set_ylim(bottom=0)                 # from zero: noise is not a cliff
    save(fig, f"{kind}_throughput{suffix}.png")


def _rest(plt, figure, save, points: List[Dict]) -> None:
    """The numerics study's errors and the sweeps' bars."""
    errors = [p for p in points if p["study"] == "numerics" and p["max_rel_err"] != "-"]
    if errors:
        fig, axes = plt.subplots(1, 2, figsize=(11, 6.0), sharey=True)
        ranks = sorted({p["ranks"] for p in errors})
        pairs = sorted({(p["reduce_schedule"], p["wire"]) for p in errors},
                       key=lambda rw: (rw[1], rw[0]))
        control = [float(p["control_rel_err"]) for p in errors if p["control_rel_err"] != "-"]
        wires = sorted({w for _, w in pairs})
        reduces = sorted({r for r, _ in pairs})
        colour = {w: f"C{i}" for i, w in enumerate(wires)}           # colour: the wire
        style = {r: (m, ls) for r, m, ls in zip(                     # marker: the schedule
            reduces, "osD^vx*+", ["-", "--", "-.", ":", "-", "--", "-.", ":"])}
        for ax, key, what in ((axes[0], "max_rel_err", "largest element"),
                              (axes[1], "err_p50", "median element")):
            for reduce, wire in pairs:
                pts = sorted((p for p in errors if (p["reduce_schedule"], p["wire"])
                              == (reduce, wire)), key=lambda p: p["ranks"])
                marker, line = style[reduce]
                ax.plot([p["ranks"] for p in pts], [float(p[key]) for p in pts],
                        marker=marker, ls=line, color=colour[wire], ms=4, lw=1,
                        label=f"{wire} wire, {reduce}")
            ax.axhline(2.0 ** -24, ls=":", color="gray", label="float32 rounding (2^-24)")
            if control:
                ax.axhline(max(control), ls="--", color="black",
                           label="untiled float32 attention")
            for wire in wires:                 # the check's pass rule, each wire's
                limit = WIRES.get(wire).tolerance + CONTROL_FACTOR * max(control, default=0)
                ax.axhline(limit, ls=(0, (6, 2)), lw=0.8, color=colour[wire],
                           label=f"{wire}: pass threshold {limit:.2g}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ranks, [str(x) for x in ranks])
            ax.set_xlabel("MPI ranks (partials merged)")
            ax.set_title(f"|O - O_float64| / max|O_float64|, {what}", fontsize=9)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("error against the float64 reference")
        axes[1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
        p0 = errors[0]
        fig.suptitle(f"numerics: S_kv = {p0['seq_len']}, h_kv={p0['heads_kv']}, "
                     f"d={p0['head_dim']}, T_q={p0['queries']}", fontsize=9)
        fig.text(0.01, 0.005, _footer(points, 0.0), fontsize=6, color="gray", va="bottom")
        save(fig, "numerics_error.png")

    for kind, field in SWEEP_FIELDS.items():
        pts = [p for p in points if p["study"] == kind]
        if not pts:
            continue
        if kind == "tile":                  # 256 before 1024, whatever order was asked
            pts.sort(key=lambda p: int(p["tile"]))
        fig, ax = figure(f"{kind} sweep at {pts[0]['ranks']} ranks, S_kv = "
                         f"{pts[0]['seq_len']}", field, "ms (median of max over ranks)")
        _stacked(ax, [str(p[field]) for p in pts], pts, "reduction beyond it")
        save(fig, f"{kind}_sweep.png")
