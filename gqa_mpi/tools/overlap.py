"""Does this core hide a stream's reads under its flops? The bench's ``overlap`` table.

The fused sweep can reach ``max(read, flops)`` only where the core overlaps the two.
This measures that on a loop far simpler than the sweep (:func:`gqa_mpi._fused.stream`):
the bytes of a slice's K and V, read once in address order, each vector widened to
float32 as the sweep widens it, with G FMAs per element (what G query rows cost per
element of K and V), on the sweep's instruction set:

- ``read``: the stream with no FMAs (each vector added once);
- ``loops``: the same work over the first :data:`WRAP` bytes again and again, in cache;
- ``stream``: the work over the whole buffer, from memory.

Each of the stream and the read is the fastest over prefetch distances :data:`AHEAD`
(the table says which).
``stream / max(read, loops)`` is 1.0 where the core overlaps them perfectly and
``(read + loops) / max`` where they add. ``stream / limit`` is the stream over
``bench local``'s limit for the same bytes and flops. The loop does only what the sweep
cannot leave out (every byte read once, widened, G FMAs per element), so it is the
reference for the sweep's ``fused/limit``: a sweep near it is as close to the limit as
this core takes the same work, in the simplest loop. It is not a bound: a cleverer loop
may do better.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

WRAP = 256 * 1024
"""Bytes the in-cache loop reads again and again: within any core's L2."""

AHEAD = (0, 4096, 65536, 262144)
"""Prefetch distances tried, in bytes; 0 leaves it to the hardware prefetchers."""


def overlap_table(tokens: int, groups: List[int], h_kv: int, d: int, repeats: int,
                  best_of: Callable[[Callable[[], object], int], float],
                  honest_read: Callable[[List[np.ndarray]], float], rate: float) -> List[Dict]:
    """Per K/V dtype and G: the read, the loops and the stream, in seconds, over the
    bytes of K and V for ``tokens`` tokens of ``h_kv`` heads of ``d``; and the stream
    over ``bench local``'s limit for the same bytes and flops: ``max(honest_read(the
    bytes), the flops at rate FLOP/s)``."""
    from .. import _fused
    bad = [g for g in groups if g not in (1, 2, 4, 8, 16)]
    if bad:
        raise ValueError(f"--groups: the probe takes G of 1, 2, 4, 8 or 16, not {bad[0]}")
    elements = 2 * tokens * h_kv * d
    rows = []
    for dtype in ("float32", "float16"):
        es = np.dtype(dtype).itemsize
        if elements * es % 512 or elements * es < WRAP:
            raise ValueError(f"--tokens: {tokens} tokens of K and V are {elements * es} bytes; "
                             f"the probe needs a multiple of 512, at least {WRAP}")
        buf = np.random.default_rng(0).standard_normal(elements, dtype=np.float32).astype(dtype)

        def streamed(g):
            """(seconds, ahead) of the fastest prefetch distance"""
            return min((best_of(lambda a=a: _fused.stream(buf, g, ahead=a), repeats), a)
                       for a in AHEAD)

        read, read_ahead = streamed(0)
        fastest = honest_read([buf])
        for g in groups:
            loops = best_of(lambda: _fused.stream(buf, g, wrap=WRAP), repeats)
            stream, ahead = streamed(g)
            top = max(read, loops)
            limit = max(fastest, 2 * g * elements / rate)
            rows.append(dict(kv_dtype=dtype, G=g, bytes=elements * es, read_s=read,
                             read_ahead=read_ahead, loops_s=loops, stream_s=stream,
                             stream_ahead=ahead, stream_over_max=stream / top,
                             sum_over_max=(read + loops) / top, limit_s=limit,
                             stream_over_limit=stream / limit))
    return rows


def print_overlap(rows: List[Dict], isa: str) -> None:
    """The table, with how to read it."""
    print(f"overlap probe, 1 thread, on {isa}: a stream of the K and V bytes with G FMAs per "
          f"element\n  read: no FMAs; loops: the same work in cache (the first {WRAP // 1024} "
          f"KiB again and again);\n  stream: the work from memory; ahead: the prefetch "
          f"distance that was fastest (-: none).\n  stream/max is 1.00 where the core hides "
          f"the smaller of read and loops under the larger,\n  and sum/max where the two add. "
          f"limit: bench local's for these bytes and flops (max of the\n  fastest read and the "
          f"flops at peak sgemm). stream/limit: this loop, which does only the\n  sweep's "
          f"reads, widening and FMAs, against that limit: a reference for fused/limit")
    print(f"{'K/V':>7} {'G':>2} {'MB':>6} {'read ms':>8} {'ahead':>5} {'loops ms':>8} "
          f"{'stream ms':>9} {'ahead':>5} {'stream/max':>10} {'sum/max':>7} {'limit ms':>8} "
          f"{'stream/limit':>12}")
    for r in rows:
        print(f"{r['kv_dtype']:>7} {r['G']:>2} {r['bytes'] / 1e6:>6.1f} {r['read_s'] * 1e3:>8.2f} "
              f"{_kib(r['read_ahead']):>5} {r['loops_s'] * 1e3:>8.2f} "
              f"{r['stream_s'] * 1e3:>9.2f} {_kib(r['stream_ahead']):>5} "
              f"{r['stream_over_max']:>10.2f} {r['sum_over_max']:>7.2f} "
              f"{r['limit_s'] * 1e3:>8.2f} {r['stream_over_limit']:>12.2f}")


def _kib(ahead: int) -> str:
    """A prefetch distance for the table: ``-`` for none (the hardware's alone)."""
    return f"{ahead // 1024}K" if ahead else "-"
