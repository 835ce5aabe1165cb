"""Command line: ``mpirun -n 16 python -m gqa_mpi [options]``.

Only rank 0 prints. A user mistake is one line on stderr and exit code 2 on every
rank; any other exception on any rank aborts the whole job (``comm.Abort``).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import List, Optional

# One rank plays one PE on one core: BLAS gets one thread unless the user says otherwise.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from mpi4py import MPI  # noqa: E402

from . import __version__  # noqa: E402
from .config import DEFAULT_GRID, KERNELS, KV_DTYPES, REDUCES, WIRES, Config, default_topology
from .inputs import InputError, inspect_inputs
from . import faults, sizing, watchdog
from .driver import rank_tokens
from .kernels import select as select_kernel
from .outputs import Interrupted, check_paths, npy_bytes
from .run import run

EXIT_USAGE = 2
EXIT_CRASH = 4
"""A rank failed unexpectedly (a bug, or a lost node) and the job was aborted."""

DESCRIPTION = """\
Emulate one decode step of the accelerator's long-context GQA kernel on MPI.

Every MPI rank plays one PE of one cube (rank = cube * P + pe) and holds a
contiguous slice of the KV cache. It sweeps its slice in tiles with an online
softmax, then the partials (m, l, O) flow to rank 0 along the kernel's chain:
leftward along each PE row (intra_W), up column 0 (intra_N), then westward from
cube to cube (W). Rank 0 normalises, checks O against a float64 reference and
prints a report. Exit code: 0 passed, 1 check failed or output not finite, 2 bad
input or an output that cannot be written, 3 --timeout, 4 a rank failed unexpectedly
and the job was aborted, 128+N killed by signal N.
"""

EPILOG = """\
examples:
  mpirun -n 16 python -m gqa_mpi                      2 cubes x 8 PEs, default problem
  mpirun -n 12 python -m gqa_mpi --cubes 2 --pes 6    short last PE row (2x4 grid)
  mpirun -n 8 python -m gqa_mpi --seq-len 100000 --queries 4 --causal
  mpirun -n 4 python -m gqa_mpi --inputs DIR --output o.npy --json run.json
  mpirun -n 16 python -m gqa_mpi --trace t.json       timeline for ui.perfetto.dev
  mpirun -n 16 python -m gqa_mpi --kernel-faithful    the kernel's own arithmetic
  python -m gqa_mpi                                    one rank (C = P = 1)

--inputs DIR reads q.npy (T_q, h_q*d) and k.npy, v.npy (S_kv, h_kv*d), or 3-D with
a leading batch axis, float16 or float32; --head-dim splits the widths into heads.
"""


class UsageError(Exception):
    """A user mistake: printed as one line by rank 0, exit code 2 on every rank."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and prints on rank 0 only."""

    def error(self, message):
        raise UsageError(message)

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


def _grid(text: str):
    try:
        rows, cols = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 2x4, got {text!r}")
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"rows and columns must be positive, got {text!r}")
    return rows, cols


def _size(text: str) -> int:
    try:
        return sizing.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _counts(text: str):
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m gqa_mpi", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gqa_mpi {__version__}")
    t = p.add_argument_group("topology (C x P must equal the number of MPI ranks)")
    t.add_argument("--cubes", type=int, metavar="C",
                   help="cubes in the inter-cube chain (default: from the world size)")
    t.add_argument("--pes", type=int, metavar="P",
                   help="PEs per cube, 1..rows*cols of the grid (default: the largest "
                        "divisor of the world size that fits the grid; 16 ranks -> 8)")
    t.add_argument("--grid", type=_grid, default=DEFAULT_GRID, metavar="RxC",
                   help="PE grid of one cube, rows x columns (default 2x4); a cube's "
                        "last row may be short")
    g = p.add_argument_group("problem (generated unless --inputs is given)")
    g.add_argument("--seq-len", type=int, metavar="S_KV",
                   help="KV tokens, split over all ranks (default 32768)")
    g.add_argument("--heads-q", type=int, metavar="H_Q", help="query heads (default 32)")
    g.add_argument("--heads-kv", type=int, metavar="H_KV",
                   help="KV heads; must divide --heads-q (default 8)")
    g.add_argument("--head-dim", type=int, default=128, metavar="D",
                   help="dimension of one head (default 128)")
    g.add_argument("--queries", type=int, metavar="T_Q",
                   help="query tokens of this decode step (default 1)")
    g.add_argument("--batch", type=int, metavar="B",
                   help="sequences; given, Q and O carry a batch axis (default: none)")
    g.add_argument("--seed", type=int, default=0, help="seed of the generated inputs "
                   "(the same seed gives the same tensors at any rank count)")
    g.add_argument("--inputs", metavar="DIR",
                   help="read q.npy, k.npy, v.npy from DIR instead of generating")
    g.add_argument("--allow-nonfinite", action="store_true",
                   help="accept NaN or inf in --inputs files (refused by default, "
                        "with the first location)")
    t.add_argument("--split", type=_counts, metavar="N0,N1,...",
                   help="tokens held by each rank, in rank order, adding up to S_kv "
                        "(default: balanced, the first S_kv %% n ranks take one more)")
    a = p.add_argument_group("attention")
    a.add_argument("--tile", type=int, default=1024, metavar="TOKENS",
                   help="tokens per tile of the local sweep (default 1024)")
    a.add_argument("--kernel", choices=KERNELS, default="auto",
                   help="local kernel: fused = the C kernel built at install (one pass per "
                        "tile, AVX-512/AVX2/portable C picked from the CPU); numpy = the "
                        "reference tile sweep on BLAS; auto = fused if it loads, else "
                        "numpy with a note (default auto)")
    a.add_argument("--kv-dtype", choices=KV_DTYPES,
                   help="how each rank holds its K and V slice: float16 halves the bytes "
                        "streamed and the memory held, as on the accelerator; arithmetic "
                        "stays float32 (default: float16 if k.npy is float16, else float32)")
    a.add_argument("--softmax-scale", type=float, metavar="X",
                   help="score multiplier (default 1/sqrt(head-dim))")
    a.add_argument("--causal", action="store_true",
                   help="query t sees keys 0 .. S_kv - T_q + t")
    a.add_argument("--wire", choices=WIRES,
                   help="what a hop carries: fp32 = m, l, O as three float32 messages "
                        "(default); kernel = the same in float16, as the kernel does "
                        "(overflow is detected and reported); packed = one float32 "
                        "message per hop")
    a.add_argument("--reduce", choices=REDUCES, default="chain",
                   help="how partials reach rank 0: chain = the kernel's row chain, "
                        "column bridge and inter-cube chain (default); tree = binomial "
                        "tree, ceil(log2 n) hops; mpi = MPI.Reduce with the merge as a "
                        "user-defined operator")
    a.add_argument("--kernel-faithful", action="store_true",
                   help="reproduce the kernel's arithmetic instead of exact attention: "
                        "no softmax scale, tail tokens dropped, K and Q read by its "
                        "reshapes, float16 operands and wire (SPEC defects 2-5); the "
                        "report says how far that lands from exact attention")
    o = p.add_argument_group("output")
    o.add_argument("--output", metavar="FILE.npy",
                   help="root writes O here (layout of Q, float32), atomically")
    o.add_argument("--json", metavar="FILE",
                   help="root writes the run record here: config, check, per-phase "
                        "timings (min/median/max over ranks), traffic, memory")
    o.add_argument("--trace", metavar="FILE.json",
                   help="root writes a Chrome trace-event timeline (open it in "
                        "https://ui.perfetto.dev): phases, chain steps and every message")
    o.add_argument("--trace-tiles", action="store_true",
                   help="with --trace: one event per tile of the local sweep too")
    o.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check O against a float64 reference on the root; the root "
                        "then holds all of K and V (default: --check)")
    o.add_argument("--quiet", action="store_true", help="print nothing but errors")
    o.add_argument("--max-memory", type=_size, metavar="SIZE",
                   help="memory the ranks of one host may use together, e.g. 64G; a run "
                        "estimated to need more is refused before it allocates anything "
                        "(default: the host's available memory)")
    o.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="abort the whole job if a rank has not finished after SECONDS "
                        "(a watchdog for batch jobs: a stuck rank cannot hold the "
                        "allocation); default: no limit")
    return p


def _root_checks(args) -> tuple:
    """What only the root looks at first: the input files' headers.

    Returns ``(problem, error)``; the caller broadcasts it so all ranks agree.
    """
    problem = None
    try:
        if args.inputs is not None:
            if args.head_dim < 1:
                return None, f"--head-dim must be a positive integer, got {args.head_dim}"
            problem = inspect_inputs(args.inputs, args.head_dim)
    except InputError as e:
        return None, str(e)
    return problem, None


def _output_checks(cfg: Config) -> Optional[str]:
    """Why the root's outputs cannot be written safely (see :mod:`gqa_mpi.outputs`)."""
    inputs = ([os.path.join(cfg.inputs, f"{t}.npy") for t in "qkv"]
              if cfg.inputs is not None else [])
    shape = (cfg.batch, cfg.queries, cfg.heads_q * cfg.head_dim)
    return check_paths({"--output": cfg.output, "--json": cfg.json, "--trace": cfg.trace},
                       inputs, {"--output": npy_bytes(shape)})


def configure(comm: MPI.Comm, argv: Optional[List[str]]) -> tuple:
    """Parse, check and agree on the configuration; raise UsageError on every rank."""
    args = build_parser().parse_args(argv)
    try:
        faults.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    faults.inject("start", comm.rank)
    watchdog.phase("configuration")
    watchdog.rendezvous(comm, "start-up")
    with watchdog.waiting("rank 0 (reading input headers)"):
        problem, error = comm.bcast(_root_checks(args) if comm.rank == 0 else None, root=0)
    if error:
        raise UsageError(error)
    dims = dict(seq_len=args.seq_len, heads_q=args.heads_q, heads_kv=args.heads_kv,
                queries=args.queries, batch=args.batch)
    kv_dtype = args.kv_dtype
    if problem is not None:
        problem = dict(problem)
        kv_dtype = kv_dtype or problem.pop("kv_dtype")
        for key, value in dims.items():
            if value is not None and value != problem[key]:
                flag = "--" + key.replace("_", "-")
                raise UsageError(f"{flag} {value} does not match the inputs, which "
                                 f"have {key.replace('_', '-')} {problem[key]}")
        fields = problem
    else:
        fields = {k: v for k, v in dims.items() if v is not None}
        fields["batched"] = args.batch is not None
    try:
        cubes, pes = default_topology(comm.size, args.cubes, args.pes, args.grid)
        cfg = Config(cubes=cubes, pes=pes, world_size=comm.size, grid=args.grid,
                     head_dim=args.head_dim, tile=args.tile, kernel=args.kernel,
                     kv_dtype=kv_dtype or "float32",
                     softmax_scale=args.softmax_scale, causal=args.causal, seed=args.seed,
                     inputs=args.inputs, output=args.output, json=args.json,
                     check=args.check, kernel_faithful=args.kernel_faithful,
                     wire=args.wire or ("kernel" if args.kernel_faithful else "fp32"),
                     trace=args.trace, trace_tiles=args.trace_tiles,
                     reduce=args.reduce, split=args.split,
                     allow_nonfinite=args.allow_nonfinite, timeout=args.timeout,
                     **fields)
        select_kernel(cfg.kernel)          # --kernel fused where it cannot load: one line
    except ValueError as e:
        raise UsageError(str(e)) from None
    with watchdog.waiting("rank 0 (checking output paths)"):
        error = comm.bcast(_output_checks(cfg) if comm.rank == 0 else None, root=0)
    if error:
        raise UsageError(error)
    error = _memory_check(comm, cfg, args.max_memory)
    if error:
        raise UsageError(error)
    return cfg, args


def _memory_check(comm: MPI.Comm, cfg: Config, limit: Optional[int]) -> Optional[str]:
    """Refuse, on every rank, a run whose ranks on some host would not fit its memory.

    Each rank estimates its own peak from the configuration (:mod:`gqa_mpi.sizing`);
    the ranks of one host add theirs up and compare with ``--max-memory`` or the
    host's available memory.
    """
    start, stop = rank_tokens(cfg, comm.rank)
    mine = sizing.rank_bytes(cfg, stop - start, comm.rank == 0)
    watchdog.rendezvous(comm, "the memory estimate")
    return _memory_verdict(comm, cfg, limit, mine)


def _memory_verdict(comm, cfg, limit, mine):
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    total = node.allreduce(mine)
    root_here = node.allreduce(int(comm.rank == 0))
    error = None
    if node.rank == 0:
        have = limit or sizing.available_bytes()
        if have is not None and total > have:
            what = "--max-memory allows" if limit else "the host has available"
            root = (f", rank 0 alone {sizing.fmt(mine)} with the float64 check"
                    if root_here and comm.rank == 0 and cfg.check else "")
            error = (f"this run needs about {sizing.fmt(total)} on {MPI.Get_processor_name()} "
                     f"({node.size} rank(s){root}) but {what} only {sizing.fmt(have)}"
                     + sizing.advice(cfg, bool(root_here)))
    node.Free()
    return next((e for e in comm.allgather(error) if e), None)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m gqa_mpi`` and ``gqa-mpi``; returns the exit code."""
    comm = MPI.COMM_WORLD
    seconds = watchdog.early_timeout(argv)
    if seconds:
        watchdog.arm(comm, seconds)   # covers configuration, the run and shut-down
    try:
        try:
            cfg, args = configure(comm, argv)
        except UsageError as e:
            if comm.rank == 0:
                print(f"gqa_mpi: error: {e}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        try:
            return run(comm, cfg, quiet=args.quiet)
        except InputError as e:  # raised on every rank alike (see driver.refuse_nonfinite)
            if comm.rank == 0:
                print(f"gqa_mpi: error: {e}", file=sys.stderr, flush=True)
            return EXIT_USAGE
    except SystemExit:
        raise
    except Interrupted as e:  # SIGTERM/SIGINT while writing: the write cleaned up
        sys.stderr.write(f"gqa_mpi: rank {comm.rank}: interrupted by {e} while writing an "
                         f"output; no partial file was left\n")
        sys.stderr.flush()
        if comm.size > 1:
            comm.Abort(128 + e.signum)
        return 128 + e.signum
    except BaseException:
        abort(comm)
    finally:
        watchdog.phase("shut-down (MPI_Finalize)")


def abort(comm: MPI.Comm) -> None:
    """Print this rank's traceback once, then end every rank of the job."""
    sys.stderr.write(f"gqa_mpi: rank {comm.rank}: unexpected error, aborting all "
                     f"{comm.size} ranks (exit code {EXIT_CRASH})\n{traceback.format_exc()}")
    sys.stderr.flush()
    comm.Abort(EXIT_CRASH)
