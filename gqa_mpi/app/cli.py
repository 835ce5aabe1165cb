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
from ..mpi import faults, watchdog  # noqa: E402
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
    """argparse that raises instead of exiting, and prints on rank 0 only."""

    def error(self, message):
        raise UsageError(message)

    def _print_message(self, message, file=None):
        if collective.world().rank == 0:
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


def build_parser() -> argparse.ArgumentParser:
    """The command line: one option per :class:`~gqa_mpi.config.config.Config` field."""
    p = _Parser(prog="python -m gqa_mpi", description=DESCRIPTION, epilog=EPILOG,
                usage="mpirun -n N python -m gqa_mpi [options]",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gqa_mpi {__version__}")
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
    given = vars(build_parser().parse_args(argv))     # only the options on the line
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
    why = launch_check.initialize()
    if why:
        launch_check.refuse(why)
        return Exit.USAGE
    comm = collective.world()
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
