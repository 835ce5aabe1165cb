"""How much memory a run will take, from its configuration alone. No MPI here.

Estimated before anything is allocated, so that a run that cannot fit is refused in
one line instead of ending in tracebacks from several ranks (or, with ``--check``,
losing the whole run after the compute). Python integers throughout: no overflow
whatever the sizes asked for.
"""
from __future__ import annotations

import os
from typing import Optional

from ..config import loop
from ..config.inputs import GEN_BLOCK
from ..step.sweeps import CHUNK
from ..step.dtypes import FLOATS, MEMORY
from ..check.streamed import SUB_BYTES, chunk_tokens, modelled

BASELINE = 96 << 20
"""Python, NumPy and MPI of one rank before any tensor (measured: 60-100 MiB)."""


def rank_bytes(cfg, tokens: int, root: bool) -> int:
    """Peak bytes of one rank holding ``tokens`` tokens of K and V.

    The resident slice, the chunk being converted, Q (raw and folded), the partial and
    the sweep's scratch; with ``--check`` the check's share (:func:`check_bytes`),
    which does not grow with ``S_kv``; on the root also O, and the outputs of the
    checked steps it keeps until the loop ends.
    """
    B, T_q, d = cfg.B, cfg.queries, cfg.head_dim
    h_q, h_kv, G = cfg.heads_q, cfg.heads_kv, cfg.group
    item = (FLOATS.get(cfg.kv_dtype) or MEMORY[cfg.kv_dtype]).itemsize
    R = G * T_q
    width_kv = h_kv * d
    resident = 2 * B * (tokens + 16) * width_kv * item
    chunk = 2 * B * min(tokens, CHUNK) * width_kv * 4
    q = 3 * B * T_q * h_q * d * 4
    partial = 4 * B * h_kv * R * (d + 2) * 4
    tile = min(cfg.tile, max(tokens, 1))
    scratch = B * h_kv * R * tile * 4 + 2 * B * h_kv * tile * d * 4
    stream = B * cfg.steps * T_q * h_q * d * 4 if cfg.steps > 1 else 0   # every step's Q
    block = GEN_BLOCK * width_kv * 4 if cfg.inputs is None else 0  # drawn whole, then cut
    total = BASELINE + resident + chunk + block + q + partial + scratch + stream
    if cfg.check:
        total += check_bytes(cfg, root)
    if root:
        total += 2 * B * T_q * h_q * d * 4                      # O, unfolded
        # each checked step's O, kept until the loop ends (the check follows it)
        total += checked_steps(cfg) * B * T_q * h_q * d * 4
    return total


def check_bytes(cfg, root: bool) -> int:
    """Peak bytes the streamed check adds to one rank (every rank takes part).

    One chunk of K and V as read, the generator's block, the buffers of one float64
    piece and its float32 twin, the float16 rounding's scratch, the scores of a sub-chunk, and
    the partials; on the root also the partial it receives and the references it
    compares with. Nothing here grows with ``S_kv``.
    """
    B, T_q, d, h_q = cfg.B, cfg.queries, cfg.head_dim, cfg.heads_q
    width = cfg.heads_kv * d
    n = chunk_tokens(B, width)
    sub = min(n, max(1, SUB_BYTES // (2 * B * width * 8)))
    rows = 2 * B * n * width * 4
    block = GEN_BLOCK * width * 4 if cfg.inputs is None else 0   # a block cut in two
    float64 = 2 * B * sub * width * (8 + 4) + B * sub * width * 4  # buffers, rounding
    scores = 3 * B * T_q * h_q * sub * 8
    partial = B * T_q * h_q * (d + 2) * 8
    total = rows + block + float64 + scores + 6 * partial
    if modelled(cfg):      # the kernel's reading of a chunk: float16, and its scores
        total += 2 * B * n * width * 2 + 2 * (n * width // d + cfg.tile) * T_q * cfg.group * 8
    if root:
        total += 2 * partial + 3 * B * T_q * h_q * d * 8    # received; references
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


def advice(cfg) -> str:
    """The flags that make a run smaller."""
    hints = []
    if cfg.steps > 1:
        hints.append(f"fewer --steps (the cache grows by {cfg.queries} token(s) a step, "
                     f"to {loop.final_len(cfg)})")
        if cfg.check:
            hints.append("a larger --check-every (rank 0 keeps each checked step's "
                         "output until the loop ends)")
    hints.append("more ranks (mpirun -n)")
    if cfg.kv_dtype == "float32":
        hints.append("--kv-dtype float16")
    return "; try " + ", ".join(hints)
