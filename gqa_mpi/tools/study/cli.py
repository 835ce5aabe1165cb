"""``python -m gqa_mpi.study``: the command line of :mod:`gqa_mpi.tools.study`."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from typing import Dict

from ...app.options import add_arguments
from ...config.config import Config, parse_grid, roles
from ...exits import SIGNAL, Exit, quiet_when_the_reader_leaves
from ...app.outputs import Interrupted, check_paths
from ...step.schedules import SCHEDULES
from ...step.wires import WIRES
from .. import study
from ..launcher import mpirun_command, plain
from .plan import KINDS, SWEEPS, StudyError, words
from .results import read_results, summarise

CONFIG_FIELDS = list(roles("study"))
"""The gqa_mpi options a study passes to every launch (typed and checked here): the
fields whose metadata says so."""

DEFAULTS = dict(kind="strong", ranks="1,2,4,8,16", seq_len=65536, tokens_per_rank=8192,
                tiles="256,512,1024,2048,4096", wires=",".join(WIRES.names()),
                reduces=",".join(SCHEDULES.names()), grids="2x4,1x8,4x2,8x1", repeats=3,
                timeout=600.0, out="study.csv", launcher=None, kernel_sources="")
"""The study's own defaults (S_kv too: 65536 rather than gqa_mpi's 32768)."""


def _load_config(path: str) -> Dict:
    try:
        with open(path, "rb") as f:
            if path.endswith(".json"):
                data = json.load(f)
            else:
                try:
                    import tomllib
                except ImportError:  # Python < 3.11
                    raise StudyError(f"{path}: TOML needs Python 3.11+; use a .json file")
                data = tomllib.load(f)
    except OSError as e:
        raise StudyError(f"--config {path}: {e.strerror}")
    except ValueError as e:
        raise StudyError(f"--config {path}: not valid {'JSON' if path.endswith('.json') else 'TOML'} ({e})")
    if not isinstance(data, dict):
        raise StudyError(f"--config {path}: the top level must be a table of options, not "
                         f"a {type(data).__name__}")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    unknown = set(data) - set(DEFAULTS) - set(CONFIG_FIELDS) - {"extra"}
    if unknown:
        raise StudyError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    return data


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gqa_mpi.study", description=plain(study.__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run (or resume) a study",
                       description="Run or resume a study; options default from "
                                   "--config, then from the values shown.",
                       argument_default=argparse.SUPPRESS)
    s = r.add_argument_group("the study")
    s.add_argument("--config", help="TOML or JSON file with any of these options")
    s.add_argument("--kind", choices=KINDS, help="what varies (default strong)")
    s.add_argument("--ranks", help="rank counts, e.g. 1,2,4,8,16; the sweeps use the "
                   "last (default 1,2,4,8,16)")
    s.add_argument("--tokens-per-rank", type=int, help="weak scaling: S_kv / ranks (8192)")
    for kind, (_, option, _) in SWEEPS.items():
        s.add_argument(f"--{option}", help=f"values of the {kind} sweep "
                       f"(default {DEFAULTS[option]})")
    s.add_argument("--kernel-sources", metavar="FILE,FILE,...",
                   help="strong and weak: the same points for each kernel file, each run "
                        "as --kernel-source (with --predict, their predicted steps are "
                        "plotted side by side)")
    s.add_argument("--repeats", type=int, help="runs per point; medians are reported (3)")
    s.add_argument("--timeout", type=float, help="seconds before a run is killed (600)")
    s.add_argument("--out", help="results CSV, appended to and resumed from (study.csv)")
    s.add_argument("--launcher", help="launch template with {n} for the rank count, e.g. "
                   "'srun -n {n} --mpi=pmi2' or 'mpiexec -f hosts -n {n}' "
                   "(default: mpirun -n {n} from this environment)")
    add_arguments(r, CONFIG_FIELDS, shown=dict(seq_len="65536, for strong scaling and "
                                                       "the sweeps"))
    r.add_argument("extra", nargs="*", default=[],
                   help="after --: more gqa_mpi options, e.g. -- --no-check")
    pl = sub.add_parser("plot", help="draw PNGs from a results CSV")
    pl.add_argument("csv")
    pl.add_argument("--out-dir", default=None, help="where the PNGs go (default: beside the CSV)")
    sm = sub.add_parser("summary", help="print the medians of a results CSV")
    sm.add_argument("csv")
    return p


def settings(given: Dict):
    """The study's options and its base Config, from defaults, --config and the line."""
    values = dict(DEFAULTS)
    from_file = _load_config(given["config"]) if given.get("config") else {}
    values.update(from_file)
    # an empty extra on the line (argparse's default) leaves the config file's
    values.update({k: v for k, v in given.items()
                   if k != "config" and not (k == "extra" and not v)})
    for one, many in (("wire", "wires"), ("reduce", "reduces")):
        if values.get("kind") == "numerics" and one in values and many not in given \
                and many not in from_file:
            values[many] = values[one]         # --wire bf16 narrows the numerics sweep
    extra = values.pop("extra", [])
    values["extra"] = shlex.split(extra) if isinstance(extra, str) else list(extra or [])
    kw = {k: values.pop(k) for k in CONFIG_FIELDS if k in values}
    sources = words(values.get("kernel_sources") or "")
    if sources and kw.get("kernel_source") is None:
        kw["kernel_source"] = sources[0]         # the base; each point takes its own
    try:
        if isinstance(kw.get("grid"), str):
            kw["grid"] = parse_grid(kw["grid"])
        base = Config(**kw)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise StudyError(str(e))
    args = argparse.Namespace(**values)
    check_study_args(args)
    args.kernel_sources = words(args.kernel_sources) if args.kernel_sources else []
    if args.kernel_sources and args.kind not in ("strong", "weak"):
        raise StudyError(f"--kernel-sources is for strong and weak studies, not --kind "
                         f"{args.kind}")
    if args.kind in SWEEPS:
        args.values = words(values[SWEEPS[args.kind][1]])
    else:
        args.values = None
    return args, base


def check_study_args(args) -> None:
    """Raise StudyError (one line) for arguments that cannot make a study."""
    try:
        args.ranks = [int(x) for x in words(args.ranks)]
    except ValueError:
        raise StudyError(f"--ranks {args.ranks!r}: expected rank counts such as 1,2,4,8,16")
    if not args.ranks or min(args.ranks) < 1:
        raise StudyError(f"--ranks {args.ranks!r}: every rank count must be at least 1")
    if not (isinstance(args.repeats, int) and not isinstance(args.repeats, bool)
            and args.repeats >= 1):
        raise StudyError(f"--repeats must be positive (a whole number), got {args.repeats!r}")
    if not (isinstance(args.timeout, (int, float)) and not isinstance(args.timeout, bool)
            and 0 < args.timeout < float("inf")):
        raise StudyError(f"--timeout must be positive (seconds), got {args.timeout!r}")
    if args.kind == "weak" and not (isinstance(args.tokens_per_rank, int)
                                    and not isinstance(args.tokens_per_rank, bool)
                                    and args.tokens_per_rank >= 1):
        raise StudyError(f"--tokens-per-rank must be positive (a whole number), got "
                         f"{args.tokens_per_rank!r}")
    if args.kind not in KINDS:
        raise StudyError(f"--kind must be one of {', '.join(KINDS)}, got {args.kind!r}")
    why = check_paths({"--out": args.out})
    if why:
        raise StudyError(why)
    launcher = shlex.split(args.launcher.replace("{n}", "1")) if args.launcher else None
    if launcher and not shutil.which(launcher[0]):
        raise StudyError(f"--launcher: {launcher[0]!r} is not a command found on PATH")
    if not launcher:
        try:
            mpirun_command(1, [])
        except FileNotFoundError as e:
            raise StudyError(str(e))


@quiet_when_the_reader_leaves
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("plot", "summary"):
        why = (f"{args.csv}: no such results file" if not os.path.exists(args.csv) else
               f"{args.csv}: not a regular file" if not os.path.isfile(args.csv) else None)
        try:
            if why:
                raise StudyError(why)
            if args.command == "summary":
                summarise(read_results(args.csv), sys.stdout)
                return Exit.PASSED
            from .plots import plot
            out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.csv))
            for path in plot(args.csv, out_dir):
                print(path)
            return Exit.PASSED
        except StudyError as e:
            print(f"gqa_mpi.study: error: {e}", file=sys.stderr)
            return Exit.USAGE
    from .runner import run_study
    out = getattr(args, "out", DEFAULTS["out"])
    try:
        settings_, base = settings({k: v for k, v in vars(args).items() if k != "command"})
        out = settings_.out
        return run_study(settings_, base)
    except StudyError as e:
        print(f"gqa_mpi.study: error: {e}", file=sys.stderr)
        return Exit.USAGE
    except Interrupted as e:
        print(f"\ngqa_mpi.study: interrupted by {e}: the launch in flight was ended and "
              f"not recorded; finished runs are in {out}, run the same command to "
              f"resume", file=sys.stderr)
        return SIGNAL + e.signum
