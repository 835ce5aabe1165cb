"""Which of the fused kernel's instruction-set paths sweeps a slice fastest here? The
bench's ``paths`` table.

The same source is compiled for AVX-512, AVX2 and portable C, and the default (``auto``)
picks per CPU (on a Zen 4, per call: ``_fused.c``). This times one sweep of the same
resident K and V on every path the CPU has, the paths taken in turn within each round
(the order reversed every other round, so that a slow spell hits all of them), best of
the rounds, and gives each over ``auto``: below 1.0 a path is faster than the default.
The portable C path is left out unless asked for: it is the correct fallback, not a
contender. With ``heads`` > 1 the default also runs sweeping that many KV heads at
once (``auto_xN``): the same results, with more streams of K and V in flight. With
``asking`` the default also runs with the sweep's asking for lines ahead pinned to each
way given (``auto_<way>``; ``_fused.asking``, ``_fused.ASKINGS``): the same results, an
A/B of the prefetch against this core's default in one run.
"""
from __future__ import annotations

import time
from typing import Dict, List, Sequence

import numpy as np

from ..core import kernels

PATHS = ("auto", "avx512", "avx2")
"""The paths timed, where this CPU has them (``generic`` on request)."""

def _restore():
    """A call that puts back the path and the asking chosen now (``auto``'s Zen 4 name
    included)."""
    from .. import _fused
    now, asking = _fused.isa(), _fused.asking()

    def restore():
        _fused.use("auto" if now == "avx512+avx2" else now)
        _fused.asking(asking)
    return restore


def available(names=PATHS) -> List[str]:
    """The paths of ``names`` this CPU runs as asked (one it lacks falls to a lower one,
    which is then left out), ``auto`` first; the path chosen before stays chosen."""
    from .. import _fused
    found, restore = ["auto"], _restore()
    try:
        for name in names:
            if name not in found and _fused.use(name) == name:
                found.append(name)
    finally:
        restore()
    return found


def paths_table(tokens: int, groups: List[int], h_kv: int, d: int, rounds: int,
                names=PATHS, heads: int = 1, asking: Sequence[str] = ()) -> List[Dict]:
    """Per K/V dtype and G: each path's best sweep time over ``rounds`` interleaved
    rounds, in seconds, and its ratio to ``auto``'s; with ``heads`` > 1 also the default
    path sweeping that many KV heads at once (``auto_xN``; ``_fused.sweep``'s ``heads``),
    and for each way of ``asking`` (of ``_fused.ASKINGS``) the default path with the asking
    pinned (``auto_<way>``). The path and the asking chosen before stay chosen."""
    from .. import _fused
    before = _fused.asking()
    runs = [(p, p, 0, before) for p in available(names)]
    if heads > 1:
        runs.append((f"auto_x{heads}", "auto", heads, before))
    runs += [(f"auto_{way}", "auto", 0, way) for way in asking]
    labels = [label for label, *_ in runs]
    rng = np.random.default_rng(0)
    k32, v32 = (rng.standard_normal((1, tokens, h_kv * d), dtype=np.float32) for _ in "kv")
    rows, restore = [], _restore()
    try:
        for dtype in ("float32", "float16"):
            k, v = kernels.make_resident(kernels.FusedKernel,
                                         lambda n, i, j: {"k": k32, "v": v32}[n][:, i:j],
                                         tokens, 1, h_kv, d, dtype)
            for G in groups:
                q = (rng.standard_normal((1, h_kv, G, d)) * d ** -0.5).astype(np.float32)

                def sweep(path, n, way):
                    _fused.use(path)
                    _fused.asking(way)
                    m = np.full((1, h_kv, G), -np.inf, np.float32)
                    l, O = np.zeros((1, h_kv, G), np.float32), np.zeros((1, h_kv, G, d), np.float32)
                    t0 = time.perf_counter()
                    _fused.sweep(q, k, v, m, l, O, 0, tokens, 1024, None, 0, n)
                    return time.perf_counter() - t0

                for _, path, n, way in runs:   # once untimed: the first call pays for its start
                    sweep(path, n, way)
                _fused.use("auto")
                _fused.asking(before)
                ran = _fused.runs(G, dtype == "float16")
                best = {label: float("inf") for label in labels}
                for r in range(rounds):
                    for label, path, n, way in (runs if r % 2 == 0 else runs[::-1]):
                        best[label] = min(best[label], sweep(path, n, way))
                rows.append(dict(kv_dtype=dtype, G=G, tokens=tokens, auto=ran,
                                 **{f"{p}_s": best[p] for p in labels},
                                 **{f"{p}_over_auto": best[p] / best["auto"] for p in labels}))
    finally:
        restore()
    return rows


def print_paths(rows: List[Dict]) -> None:
    """The table, with how to read it."""
    paths = [k[:-2] for k in rows[0] if k.endswith("_s")]
    print(f"the fused sweep on each instruction-set path, 1 thread, {rows[0]['tokens']} tokens: "
          f"each path's best ms over\n  rounds that take the paths in turn; X/auto: the path "
          f"over the default (auto; 'auto ran':\n  the loops it ran; auto_xN: the default "
          f"sweeping N KV heads at once; auto_WAY: the default\n  asking for lines ahead "
          f"that way); below 1.00 the path is faster than the default")
    ms = {p: max(10, len(p) + 3) for p in paths}
    over = {p: max(11, len(p) + 5) for p in paths if p != "auto"}
    print(f"{'K/V':>7} {'G':>3} {'auto ran':>11} "
          + " ".join(f"{p + ' ms':>{w}}" for p, w in ms.items()) + " "
          + " ".join(f"{p + '/auto':>{w}}" for p, w in over.items()))
    for r in rows:
        print(f"{r['kv_dtype']:>7} {r['G']:>3} {r['auto']:>11} "
              + " ".join(f"{r[p + '_s'] * 1e3:>{w}.2f}" for p, w in ms.items()) + " "
              + " ".join(f"{r[p + '_over_auto']:>{w}.3f}" for p, w in over.items()))
