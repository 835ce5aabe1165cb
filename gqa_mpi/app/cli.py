"""Command line: ``mpirun -n 16 python -m gqa_mpi [options]``.

Only rank 0 prints. A user mistake is one line on stderr and exit code 2 on every
rank; any other exception on any rank aborts the whole job (``comm.Abort``).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import traceback
from typing import List, Optional

# One rank plays one PE on one core: BLAS gets one thread unless the user says otherwise.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from ..mpi import launch_check  # noqa: E402  (before mpi4py.MPI: defers MPI_Init)
from ..mpi import collective  # noqa: E402

from .. import __version__  # noqa: E402
from ..config import loop  # noqa: E402
from ..config.config import Config  # noqa: E402
from ..config.modes import mode_of  # noqa: E402
from ..config.inputs import InputError, inspect_inputs  # noqa: E402
from ..dsl.profile import load as load_profile  # noqa: E402
from ..exits import SIGNAL, Exit, describe  # noqa: E402
from ..mpi import faults, inprocess, watchdog  # noqa: E402
from ..mpi.tl_link import KernelExit  # noqa: E402
from . import sizing  # noqa: E402
from .options import add_arguments  # noqa: E402
from .outputs import Interrupted, check_paths, npy_bytes  # noqa: E402
from .run import run  # noqa: E402

DESCRIPTION = f"""\
Emulate decode steps of the accelerator's long-context GQA kernel on MPI.

Every MPI rank plays one PE of one cube (rank = cube * P + pe) and holds a
contiguous slice of the KV cache. It sweeps its slice in tiles with an online
softmax, then the partials (m, l, O) flow to rank 0 along the kernel's chain:
leftward along each PE row (intra_W), up column 0 (intra_N), then westward from
cube to cube (W). Rank 0 normalises. With --kernel-source, the kernel's own file
does all of that through gqa_mpi's tl instead. Every rank then computes a share of
a float64 reference straight from the inputs, rank 0 checks O against it and prints
a report (and, in a run longer than 3 s, progress lines on stderr).

{textwrap.fill("Exit code: " + describe() + ".", 80)}

The options most runs use come first; the advanced ones follow by topic.
"""

EPILOG = """\
examples:
  mpirun -n 16 python -m gqa_mpi                      2 cubes x 8 PEs, default problem
  mpirun -n 12 python -m gqa_mpi --cubes 2 --pes 6    short last PE row (2x4 grid)
  mpirun -n 8 python -m gqa_mpi --seq-len 100000 --queries 4 --causal
  mpirun -n 4 python -m gqa_mpi --inputs DIR --output o.npy --json run.json
  mpirun -n 16 python -m gqa_mpi --trace t.json       timeline for ui.perfetto.dev
  mpirun -n 16 python -m gqa_mpi --kernel-source KERNEL.py --softmax-scale 1
                                                      the kernel's own file, run as written
  mpirun -n 16 python -m gqa_mpi --kernel-source KERNEL.py --check-against kernel-model
                                                      ... held to its intended arithmetic
  mpirun -n 16 python -m gqa_mpi --kernel-source builtin:corrected --steps 5
                                                      the kernel with its six defects fixed,
                                                      five decode steps
  mpirun -n 16 python -m gqa_mpi --steps 20 --placement round-robin --reduce allgather
                                                      a decode loop, vLLM-style
  python -m gqa_mpi                                    one rank (C = P = 1)

--inputs DIR reads q.npy (T_q, h_q*d) and k.npy, v.npy (S_kv, h_kv*d), or 3-D with
a leading batch axis, float16 or float32; --head-dim splits the widths into heads.
"""


class UsageError(Exception):
    """A user mistake: printed as one line by rank 0, exit code 2 on every rank."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and prints where ``speaks`` (rank 0)."""

    speaks = True

    def error(self, message):
        raise UsageError(message)

    def _print_message(self, message, file=None):
        if self.speaks:
            super()._print_message(message, file)


RETIRED = {
    "--kernel-faithful": "--kernel-faithful is retired: run the kernel itself with "
                         "--kernel-source FILE, and add --check-against kernel-model to hold "
                         "it to the float64 model of its arithmetic",
}
"""Options that are gone, and what to do instead (refused in one line)."""


class _Retired(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(RETIRED[option_string])


IN_PROCESS = "--in-process"


def build_parser(speaks: bool = True) -> argparse.ArgumentParser:
    """The command line: one option per :class:`~gqa_mpi.config.config.Config` field,
    and how the ranks run (``--in-process``). ``speaks``: this rank prints help."""
    p = _Parser(prog="python -m gqa_mpi", description=DESCRIPTION, epilog=EPILOG,
                usage="mpirun -n N python -m gqa_mpi [options]",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.speaks = speaks
    p.add_argument("--version", action="version", version=f"gqa_mpi {__version__}")
    p.add_argument(IN_PROCESS, action="store_true", default=argparse.SUPPRESS, help=(
        "run every PE as a thread of this one process, without mpirun or MPI: C x P "
        "threads (--cubes, default 2, times --pes, default a full cube of --grid), "
        "their links in-process queues, so that breakpoint() in a --kernel-source "
        "file stops in the debugger. The report, record, check, faults and "
        "prediction are those of the MPI run of the same grid, O bit for bit; the "
        "times are of threads that share one interpreter"))
    add_arguments(p, common_first=True)
    for flag in RETIRED:
        p.add_argument(flag, action=_Retired)
    return p


def _root_checks(given: dict) -> tuple:
    """What only the root looks at first: the input files' headers.

    Returns ``(problem, error)``; the caller broadcasts it so all ranks agree.
    """
    problem = None
    try:
        if given.get("inputs") is not None:
            d = given.get("head_dim", Config.head_dim)
            if d < 1:
                return None, f"--head-dim must be a positive integer, got {d}"
            problem = inspect_inputs(given["inputs"], d)
    except InputError as e:
        return None, str(e)
    return problem, None


def _profile_check(cfg: Config) -> Optional[str]:
    """Why ``--predict``'s profile cannot be used (read by the root, which replays)."""
    if cfg.predict is None:
        return None
    try:
        load_profile(cfg.predict)
    except ValueError as e:
        return str(e)
    return None


def _output_checks(cfg: Config) -> Optional[str]:
    """Why the root's outputs cannot be written safely (see :mod:`gqa_mpi.app.outputs`)."""
    inputs = ([os.path.join(cfg.inputs, f"{t}.npy") for t in "qkv"]
              if cfg.inputs is not None else [])
    inputs += cfg.mode.user_files(cfg)           # the kernel's file is an input too
    shape = (cfg.B, cfg.queries, cfg.heads_q * cfg.head_dim)
    return check_paths({"--output": cfg.output, "--json": cfg.json, "--trace": cfg.trace},
                       inputs, {"--output": npy_bytes(shape)})


def configure(comm, argv: Optional[List[str]]) -> Config:
    """Parse, check and agree on the configuration; raise UsageError on every rank."""
    given = vars(build_parser(comm.rank == 0).parse_args(argv))   # the options given
    given.pop("in_process", None)                # how the ranks run, not what they do
    try:
        faults.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    faults.inject("start", comm.rank)
    watchdog.phase("configuration")
    watchdog.rendezvous(comm, "start-up")
    problem, error = collective.root_decides(comm, lambda: _root_checks(given),
                                             "rank 0 (reading input headers)")
    if error:
        raise UsageError(error)
    if problem is not None:        # the files say the problem; flags may only agree
        kv_dtype = problem.pop("kv_dtype")
        if mode_of(given.get("kernel_source")).kv_from_inputs:
            given.setdefault("kv_dtype", kv_dtype)
        for key, value in problem.items():
            if key in given and given[key] != value:
                name = key.replace("_", "-")
                have = "no batch axis (2-D files)" if value is None else f"{name} {value}"
                raise UsageError(f"--{name} {given[key]} does not match the inputs, which "
                                 f"have {have}")
        given.update(problem)
    try:
        cfg = Config(**given).placed(comm.size)
    except ValueError as e:
        raise UsageError(str(e)) from None
    error = collective.root_decides(comm, lambda: _output_checks(cfg) or _profile_check(cfg),
                                    "rank 0 (checking output paths)")
    if error:
        raise UsageError(error)
    try:
        error = None
        cfg.mode.preflight(cfg)      # on every rank: the fused sweep loads, the file loads
    except ValueError as e:
        error = str(e)
    error = collective.first_error(comm, error, "every rank (loading the local step)")
    if error:
        raise UsageError(error)
    error = _memory_check(comm, cfg)
    if error:
        raise UsageError(error)
    return cfg


def _memory_check(comm, cfg: Config) -> Optional[str]:
    """Refuse, on every rank, a run whose ranks on some host would not fit its memory.

    Each rank estimates its own peak from the configuration (:mod:`gqa_mpi.app.sizing`);
    the ranks of one host add theirs up and compare with ``--max-memory`` or the
    host's available memory.
    """
    start, stop = cfg.tokens(comm.rank)
    held = stop - start + loop.appended(cfg, comm.rank, cfg.steps - 1)   # the cache grows
    mine = sizing.rank_bytes(cfg, held, comm.rank == 0)
    watchdog.rendezvous(comm, "the memory estimate")
    return _memory_verdict(comm, cfg, cfg.max_memory, mine)


def _memory_verdict(comm, cfg, limit, mine):
    host = collective.per_host(comm, mine)
    error = None
    if host is not None:
        name, ranks, total = host
        have = limit or sizing.available_bytes()
        if have is not None and total > have:
            what = "--max-memory allows" if limit else "the host has available"
            error = (f"this run needs about {sizing.fmt(total)} on {name} ({ranks} rank(s)) "
                     f"but {what} only {sizing.fmt(have)}" + sizing.advice(cfg))
    return collective.first_error(comm, error, "every rank (the memory estimate)")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m gqa_mpi`` and ``gqa-mpi``; returns the exit code."""
    if _in_process_asked(sys.argv[1:] if argv is None else argv):
        return in_process(argv)
    why = launch_check.initialize()
    if why:
        launch_check.refuse(why)
        return Exit.USAGE
    return rank_main(collective.world(), argv)


def _in_process_asked(args: List[str]) -> bool:
    """Whether ``args`` has ``--in-process``, or a prefix of it that argparse would
    take for it (``--in-proc``; ``--in`` is also ``--inputs``'s), before any parsing."""
    return any(len(a) > len("--in") and IN_PROCESS.startswith(a) for a in args)


def in_process(argv: Optional[List[str]]) -> int:
    """``--in-process``: :func:`rank_main` on a thread per PE of this process."""
    try:
        given = vars(build_parser().parse_args(argv))
        size = _in_process_size(given)
    except UsageError as e:
        if launch_check.speaks(launch_check.launch()):
            print(f"gqa_mpi: error: {e}", file=sys.stderr, flush=True)
        return Exit.USAGE
    return inprocess.main(size, rank_main, argv)


def _in_process_size(given: dict) -> int:
    """C x P of ``--in-process``: --cubes (2) times --pes (a full cube of --grid);
    refused under a launcher, which would start a whole run in every process."""
    got = launch_check.launch()
    if got is not None and got.size > 1:
        raise UsageError(f"{IN_PROCESS} runs every PE in this one process, but "
                         f"{got.launcher} started {got.size} of them: run it without "
                         f"the launcher (python -m gqa_mpi {IN_PROCESS} ...)")
    rows, cols = given.get("grid", Config.grid)
    cubes, pes = given.get("cubes", 2), given.get("pes", rows * cols)
    for name, value in (("cubes", cubes), ("pes", pes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"--{name} must be a positive integer, got {value}")
    if cubes * pes > MAX_THREADS:
        raise UsageError(f"{IN_PROCESS} with --cubes {cubes} x --pes {pes} = "
                         f"{cubes * pes} threads: at most {MAX_THREADS} run in one "
                         f"process; run larger grids on MPI (mpirun -n {cubes * pes})")
    return cubes * pes


MAX_THREADS = 1024
"""The most PEs ``--in-process`` runs as threads of one process."""


def rank_main(comm, argv: Optional[List[str]]) -> int:
    """One rank's run of the command line on ``comm``; its exit code."""
    seconds = watchdog.early_timeout(argv)
    if seconds:
        watchdog.arm(comm, seconds)   # covers configuration, the run and shut-down
    try:
        try:
            cfg = configure(comm, argv)
        except UsageError as e:
            if comm.rank == 0:
                print(f"gqa_mpi: error: {e}", file=sys.stderr, flush=True)
            return Exit.USAGE
        try:
            return run(comm, cfg)
        except InputError as e:  # raised on every rank alike (see run.refuse_nonfinite)
            if comm.rank == 0:
                print(f"gqa_mpi: error: {e}", file=sys.stderr, flush=True)
            return Exit.USAGE
        except KernelExit:       # every rank's kernel faulted, and rank 0 reported it
            return Exit.FAULT
    except SystemExit:
        raise
    except (Interrupted, KeyboardInterrupt) as e:  # SIGTERM/SIGINT; a write cleans up
        signum = getattr(e, "signum", signal.SIGINT)
        sys.stderr.write(f"gqa_mpi: rank {comm.rank}: interrupted by "
                         f"{signal.Signals(signum).name}; no partial output file was left\n")
        sys.stderr.flush()
        if comm.size > 1:
            collective.abort(comm, SIGNAL + signum)
        return SIGNAL + signum
    except BaseException:
        abort(comm)
    finally:
        watchdog.phase("shut-down (MPI_Finalize)")


def abort(comm) -> None:
    """Print this rank's traceback once, then end every rank of the job."""
    watchdog.say_and_abort(comm, f"gqa_mpi: rank {comm.rank}: unexpected error, aborting "
                                 f"all {comm.size} ranks (exit code {int(Exit.CRASH)})\n"
                                 f"{traceback.format_exc()}", Exit.CRASH)
