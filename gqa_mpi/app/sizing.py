"""How much memory a run will take, from its configuration alone. No MPI here.

Estimated before anything is allocated, so that a run that cannot fit is refused in
one line instead of ending in tracebacks from several ranks (or, with ``--check``,
losing the whole run after the compute). Python integers throughout: no overflow
whatever the sizes asked for.
"""
from __future__ import annotations

import os
from typing import Optional

from ..core.kernels import CHUNK

BASELINE = 96 << 20
"""Python, NumPy and MPI of one rank before any tensor (measured: 60-100 MiB)."""


def rank_bytes(cfg, tokens: int, root: bool) -> int:
    """Peak bytes of one rank holding ``tokens`` tokens of K and V.

    The resident slice, the chunk being converted, Q (raw and folded), the partial and
    the sweep's scratch; on the root also O, and with ``--check`` everything the float64
    reference and the float32 control hold (all of K and V, and the scores of one KV
    head at a time).
    """
    B, T_q, d = cfg.B, cfg.queries, cfg.head_dim
    h_q, h_kv, G = cfg.heads_q, cfg.heads_kv, cfg.group
    item = 2 if cfg.kv_dtype == "float16" else 4
    R = G * T_q
    width_kv = h_kv * d
    resident = 2 * B * (tokens + 16) * width_kv * item
    chunk = 2 * B * min(tokens, CHUNK) * width_kv * 4
    q = 3 * B * T_q * h_q * d * 4
    partial = 4 * B * h_kv * R * (d + 2) * 4
    tile = min(cfg.tile, max(tokens, 1))
    scratch = B * h_kv * R * tile * 4 + 2 * B * h_kv * tile * d * 4
    stream = B * cfg.steps * T_q * h_q * d * 4 if cfg.steps > 1 else 0   # every step's Q
    total = BASELINE + resident + chunk + q + partial + scratch + stream
    if root:
        total += 2 * B * T_q * h_q * d * 4                      # O, unfolded
        total += checked_steps(cfg) * 2 * B * T_q * h_q * d * 4  # kept O and Q, checked
                                                                # after the loop
        if cfg.check:
            S = cfg.final_len
            kv = 2 * B * S * width_kv
            total += kv * (4 + 8 + 4)                          # inputs, float64, float32 control
            total += 4 * B * T_q * G * S * 8                   # scores of one KV head, float64
            total += 2 * B * T_q * h_q * d * 8                 # reference and control outputs
    return total


def checked_steps(cfg) -> int:
    """How many steps the root checks (every ``check_every``-th and the last), counted."""
    if not cfg.check:
        return 0
    n = cfg.steps // cfg.check_every
    return n + (1 if cfg.steps % cfg.check_every else 0)


def available_bytes() -> Optional[int]:
    """MemAvailable of this host (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def advice(cfg, root_heavy: bool) -> str:
    """The flags that make a run smaller."""
    hints = []
    if root_heavy and cfg.check:
        hints.append("--no-check (the float64 check holds all of K and V on rank 0)")
    if cfg.steps > 1:
        hints.append(f"fewer --steps (the cache grows by {cfg.queries} token(s) a step, "
                     f"to {cfg.final_len})")
        if cfg.check:
            hints.append("a larger --check-every (rank 0 keeps each checked step's "
                         "output until the loop ends)")
    hints.append("more ranks (mpirun -n)")
    if cfg.kv_dtype != "float16":
        hints.append("--kv-dtype float16")
    return "; try " + ", ".join(hints)
