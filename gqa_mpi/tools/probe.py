"""``mpirun -n N python -m gqa_mpi.probe``: write the ``host`` profile of this machine,
the numbers of the cost model (docs/predict.md) as gqa_mpi's own run of a kernel on N
ranks meets them.

Every rank measures at the same time, as the ranks of a run compute at the same time
(so the memory bandwidth and the clock a core keeps when all of them are busy are in
the numbers); the profile takes the median over the ranks, each the best of
``--repeats``:

- ``pe.mem_bytes_per_s``: a streaming read of a buffer far larger than the caches, by
  rank 0 alone (the others wait); ``[cube] mem_bytes_per_s``: the same read by every
  rank at once, the median rank's rate times a cube's PEs (``--cube-pes``, default the
  2x4 grid's 8, or the ranks if fewer): what a cube gets when every core reads;
  ``pe.mem_latency_s``: a dependent chain of reads over it (a random cycle), less the
  same chain over a buffer that fits in the L1 cache (the interpreter's own cost);
- ``pe.call_s``: what a kernel's ``tl`` call costs beyond its arithmetic: the corrected
  kernel's tile on one-element shapes, recorded as under ``--predict``, over its calls
  that have a cost (so the views, scopes and Python between the calls count);
  ``pe.dot_flops_per_s``: ``tl.dot`` of ``(G, d) x (d, tile)`` with float32 operands and
  with float16 ones, less ``call_s``: a table by dtype;
  ``pe.vector_elems_per_s``: the elements per second of the vector calls a tile of the
  corrected kernel makes most of, per result dtype: float32 (a ``(tile, d)`` slice
  widened from float16, its transpose, an ``exp`` of the scores, the scores less their
  row maxima, a row broadcast) and float16 (the same slice narrowed, its transpose, the
  ``exp``, the broadcast), all their elements over all their time;
- ``pe.scratch_bytes``: the core's L2 cache, where the system says;
- ``noc`` and ``inter``: half the round trip of a ping-pong between ranks 0 and 1 on
  the cube's communicator (``intra_E``) and on the inter-cube one (``E``): 8 bytes for
  the latency, 4 MiB for the bandwidth.

The profile says in its comments what measured it, where and when.
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from typing import Dict  # noqa: E402

import numpy as np  # noqa: E402

from ..dsl.profile import PROBED, Link, Profile, to_toml, user_dir  # noqa: E402
from ..exits import Exit  # noqa: E402
from .bench import best_of as best  # noqa: E402


def bandwidth(repeats: int) -> float:
    """Streaming read bandwidth of one core, B/s."""
    big = np.ones(64 << 20, np.float32)                        # 256 MiB
    return big.nbytes / min(best(lambda: np.dot(big, big), repeats),
                            best(lambda: big.view(np.int64).sum(), repeats))


def memory(repeats: int) -> Dict[str, float]:
    """Streaming read bandwidth (every rank at once) and the latency of a dependent
    read, one core."""

    def chase(n: int, steps: int) -> float:
        order = np.random.default_rng(0).permutation(n)
        nxt = np.empty(n, np.int64)
        nxt[order] = np.roll(order, -1)                         # one cycle through all
        chain = nxt.tolist() if n <= 1 << 12 else nxt           # small: Python list
        def walk():
            i = 0
            for _ in range(steps):
                i = chain[i]
        return best(walk, repeats) / steps
    latency = max(0.0, chase(32 << 20, 200_000) - chase(1 << 10, 200_000))
    return dict(together_bytes_per_s=bandwidth(repeats), mem_latency_s=latency)


def call_cost(repeats: int) -> float:
    """What a kernel's ``tl`` call costs beyond its arithmetic: the corrected kernel's
    tile on one token of one-element heads, with the calls recorded (as under
    ``--predict``), over the calls in it that have a cost. The views, scopes and the
    kernel's own Python between the calls are in it, as in a run."""
    from ..dsl.tl import Backend
    from ..kernels.corrected import Partial
    tl = Backend(0, 0, [(n, np.zeros((1, 1), np.float16), 2, 0) for n in "QKVO"],
                 record=True)
    part = Partial(tl.pointer("Q"), tl.pointer("K"), tl.pointer("V"), 1, 0, 1, 1, 1, 1, 1,
                   tl=tl)
    k, v = tl.pointer("K"), tl.pointer("V")

    def tile():
        with tl.scratch_scope():
            part.tile(*part.load(k, v, 0, 1))
    before = len(tl.monitor.calls)
    tile()
    calls = len(tl.monitor.calls) - before
    return best(tile, repeats, 200) / calls


def backend_rates(repeats: int, G: int = 8, d: int = 128, tile: int = 1024) -> Dict:
    """The tl backend's per-call cost and its dot and vector rates on a tile's shapes."""
    from ..dsl.tl import Backend
    tl = Backend(0, 0, [(n, np.zeros((tile, d), np.float16), 2 * d, 0) for n in "QKVO"])
    call = call_cost(repeats)
    k16 = tl.load(tl.pointer("K"), (tile, d), "f16")
    k32 = tl.cast(k16, "f32")
    dots, vectors = {}, {}
    for dt, k in (("f32", k32), ("f16", k16)):
        q = tl.full((G, d), 0.5, dt)
        kt = tl.trans(k)
        dot = best(lambda: tl.dot(q, kt), repeats, 50)
        dots[dt] = 2 * G * d * tile / max(dot - call, 1e-12)
        scores = tl.full((G, tile), -1.0, dt)
        row = tl.full((G,), 0.5, dt)
        other = k16 if dt == "f32" else k32          # widened to f32, or narrowed to f16
        ops = [(lambda: tl.cast(other, dt), tile * d), (lambda: tl.trans(k), tile * d),
               (lambda: tl.exp(scores), G * tile), (lambda: scores - row, G * tile)]
        seconds = sum(max(best(fn, repeats, 20) - call, 1e-12) for fn, _ in ops)
        vectors[dt] = sum(n for _, n in ops) / seconds
    return dict(call_s=call, dot_flops_per_s=dots, vector_elems_per_s=vectors)


def l2_bytes() -> int:
    """This core's L2 cache, else 1 MiB."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            text = f.read().strip().upper()
        return int(text.rstrip("KM")) * (1 << 20 if text.endswith("M") else 1 << 10)
    except (OSError, ValueError):
        return 1 << 20


def ping_pong(comm, peer: int, nbytes: int, repeats: int, rounds: int) -> float:
    """Half the round trip of ``nbytes`` between ranks 0 and ``peer`` of ``comm``."""
    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(rounds):
            if comm.rank == 0:
                comm.Send(buf, dest=peer)
                comm.Recv(buf, source=peer)
            elif comm.rank == peer:
                comm.Recv(buf, source=0)
                comm.Send(buf, dest=0)
        times.append((time.perf_counter() - t0) / rounds / 2)
    return min(times)


def links(world, repeats: int) -> Dict[str, Link]:
    """``noc`` and ``inter`` from ping-pongs on a cube's and the inter-cube communicator."""
    from ..step.grid import Grid
    from ..mpi.topology import Topology
    out = {}
    for name, grid, direction in (("noc", Grid(1, world.size, 4), "intra_E"),
                                  ("inter", Grid(world.size, 1, 4), "E")):
        topo = Topology(world, grid)
        link = topo.link(direction) if topo.rank == 0 else topo.link(
            "intra_W" if direction == "intra_E" else "W")
        comm = link.comm
        peer = 1
        small = ping_pong(comm, peer, 8, repeats, 2000)
        large = ping_pong(comm, peer, 4 << 20, repeats, 20)
        out[name] = Link(latency_s=small, bytes_per_s=(4 << 20) / max(large - small, 1e-12))
        topo.free()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gqa_mpi.probe", description=(__doc__ or "")
                                .replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None,
                   help="where to write the profile (default: NAME.toml in your profiles "
                        "directory, $GQA_MPI_PROFILES or ~/.config/gqa_mpi/profiles, which "
                        "--predict NAME reads)")
    p.add_argument("--name", default=PROBED, help="the profile's name (default host)")
    p.add_argument("--repeats", type=int, default=5, help="best of N (default 5)")
    p.add_argument("--cube-pes", type=int, default=8,
                   help="PEs of a cube, for [cube] mem_bytes_per_s (default 8, the 2x4 grid)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.cube_pes < 1:
        p.error("--repeats and --cube-pes must be at least 1")
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if world.size < 2:
        if world.rank == 0:
            print("gqa_mpi: error: the probe measures messages between two ranks: run "
                  "`mpirun -n 2 python -m gqa_mpi.probe`", flush=True)
        return Exit.USAGE
    out = args.out or os.path.join(user_dir(), f"{args.name}.toml")
    say = (lambda text: print(f"probe: {text}", flush=True)) if world.rank == 0 else \
        (lambda text: None)
    say(f"{world.size} ranks; messages on a cube's and the inter-cube communicator")
    net = links(world, args.repeats)
    world.Barrier()
    say("rank 0 alone: its memory's read bandwidth")
    alone = bandwidth(args.repeats) if world.rank == 0 else 0.0
    world.Barrier()
    say("every rank at once: its memory's read bandwidth and latency, then the tl "
        "backend's call cost and dot and vector rates (float32 and float16)")
    mine = dict(memory(args.repeats), **backend_rates(args.repeats))
    every = world.gather(mine, root=0)
    if world.rank == 0:
        def median(key):
            if isinstance(mine[key], dict):
                rates = {dt: float(np.median([e[key][dt] for e in every])) for dt in mine[key]}
                return dict(default=rates["f32"], **rates)
            return float(np.median([e[key] for e in every]))
        pe = {k: median(k) for k in mine if k != "together_bytes_per_s"}
        cube = median("together_bytes_per_s") * min(args.cube_pes, world.size)
        prof = Profile(name=args.name, scratch_bytes=float(l2_bytes()), noc=net["noc"],
                       inter=net["inter"], mem_bytes_per_s=alone,
                       cube_mem_bytes_per_s=cube, **pe)
        from .. import __version__
        library = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()
        head = (f"# {args.name}: written by `python -m gqa_mpi.probe` (gqa_mpi "
                f"{__version__}) on {platform.node()}, {platform.processor() or platform.machine()}, "
                f"{os.cpu_count()} cores, {world.size} ranks measuring at once, {library}, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
                f"# What gqa_mpi's own run of a kernel meets here (see the probe's help), "
                f"not an accelerator's figures.\n")
        from ..app.outputs import atomic_write
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        atomic_write(out, lambda f: f.write(head + to_toml(prof)), mode="w")
        print(to_toml(prof).rstrip(), flush=True)
        say(f"wrote {out}; predict with it: --predict {out if args.out else args.name}")
    world.Barrier()
    return Exit.PASSED
