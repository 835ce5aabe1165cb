"""A study's points: one base :class:`~gqa_mpi.config.config.Config` and, per point, a
rank count and ``dataclasses.replace`` of it. No launching here."""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, fields, replace
from typing import Dict, List, Optional, Tuple

from ...config.config import Config, parse_grid, roles
from ...step.schedules import SCHEDULES
from ...step.wires import WIRES
from ..launcher import mpirun_command

KINDS = ("strong", "weak", "tile", "wire", "reduce", "grid", "numerics")
SWEEPS = {"tile": ("tile", "tiles", int), "wire": ("wire", "wires", str),
          "reduce": ("reduce", "reduces", str), "grid": ("grid", "grids", parse_grid)}
"""Sweep kind -> (the Config field it varies, the study option listing the values,
how one value is read)."""


class StudyError(Exception):
    """A study that cannot go on as asked: printed as one line, exit 2."""


def words(text) -> List[str]:
    """``"a,b"`` or a list (from a TOML or JSON file) -> ``["a", "b"]``."""
    if isinstance(text, (list, tuple)):
        return [str(x).strip() for x in text]
    return [x.strip() for x in str(text).split(",") if x.strip()]


@dataclass(frozen=True)
class Point:
    """One experiment: ``ranks`` ranks running ``config`` (plus raw ``extra`` options)."""

    study: str
    ranks: int
    config: Config
    extra: Tuple[str, ...] = ()

    def columns(self) -> Dict:
        """What the CSV records about the point: :data:`POINT_KEYS`, each Config field
        as its text (``cubes``/``pes`` as asked; the record's placement fills them)."""
        c = self.config
        out = dict(study=self.study, ranks=self.ranks, tokens_per_rank=c.seq_len // self.ranks,
                   extra=shlex.join(self.extra))
        for f in fields(Config):
            if f.name in RESULT_FIELDS:
                value = c.to_json()[f.name]
                out[COLUMN.get(f.name, f.name)] = "" if value is None else value
        out["batch"] = c.B
        return out

    @property
    def run_id(self) -> str:
        """A stable name: what makes two runs the same experiment (every column of
        :data:`POINT_KEYS` but the derived ``tokens_per_rank``)."""
        cols = self.columns()
        return "|".join(f"{k}={cols[k]}" for k in POINT_KEYS if k != "tokens_per_rank")

    def argv(self, json_path: str) -> List[str]:
        """``python -m gqa_mpi`` options of one launch, writing its record to ``json_path``."""
        return replace(self.config, json=json_path, quiet=True).to_argv() + list(self.extra)


RESULT_FIELDS = roles("result")
"""The Config fields that can change a run's result (their metadata says so: all but
where outputs go, what is printed and the guards ``--max-memory`` and ``--timeout``).
A new option is in the key (and the CSV) without anyone listing it."""
COLUMN = {"reduce": "reduce_schedule"}
"""CSV names that differ from the field's (kept from the first studies' files)."""
POINT_KEYS = (("study", "ranks", "tokens_per_rank")
              + tuple(COLUMN.get(name, name) for name in RESULT_FIELDS) + ("extra",))
"""The columns that say what a point is: its key, in this order."""


def numerics(base: Config, ranks: List[int], reduces: List[str], wires: List[str],
             extra: Tuple[str, ...]) -> List[Point]:
    """Every rank count x schedule x wire it carries, on one fixed problem."""
    try:
        pairs = [(s, w) for s in map(SCHEDULES.get, reduces) for w in map(WIRES.get, wires)
                 if s.accepts(w)]
    except ValueError as e:
        raise StudyError(str(e))
    if not pairs:
        raise StudyError(f"no schedule of --reduces {','.join(reduces)} carries a wire of "
                         f"--wires {','.join(wires)}")
    return [Point("numerics", n, replace(base, reduce=s.name, wire=w.name), extra)
            for n in ranks for s, w in pairs]


def plan(kind: str, base: Config, ranks: List[int], tokens_per_rank: int,
         values: Optional[List[str]] = None, extra: Tuple[str, ...] = (),
         reduces: Optional[List[str]] = None, wires: Optional[List[str]] = None,
         kernels: Optional[List[str]] = None) -> List[Point]:
    """The study's points, in run order (without repeats); each one checked as it will
    be placed, so that a point gqa_mpi would refuse is refused here, before any launch."""
    if kind == "numerics":
        if not base.check or "--no-check" in extra:
            raise StudyError("a numerics study records the check's errors; drop --no-check")
        points = numerics(base, ranks, reduces or [], wires or [], extra)
    elif kind in ("strong", "weak"):
        try:
            bases = [replace(base, kernel_source=k) for k in kernels] if kernels else [base]
        except ValueError as e:
            raise StudyError(f"--kernel-sources: {e}")
        points = [Point(kind, n, b if kind == "strong"
                        else replace(b, seq_len=tokens_per_rank * n), extra)
                  for b in bases for n in ranks]
    else:
        name, option, read = SWEEPS[kind]
        try:
            parsed = [read(v) for v in values or []]
        except Exception:
            raise StudyError(f"--{option} {','.join(values or [])!r}: not a list of "
                             f"{name} values")
        points = []
        for value in parsed:
            try:
                points.append(Point(kind, ranks[-1], replace(base, **{name: value}), extra))
            except ValueError as e:
                raise StudyError(f"--{option} {value}: {e}")
    for p in points:
        try:
            p.config.placed(p.ranks)
        except ValueError as e:
            raise StudyError(f"{kind} point at {p.ranks} ranks: {e}")
    return points


def launch_command(launcher: Optional[str], n: int, argv: List[str]) -> List[str]:
    """``mpirun -n N python -m gqa_mpi ...`` or the user's template with ``{n}``."""
    tail = [sys.executable, "-m", "gqa_mpi", *argv]
    if not launcher:
        return mpirun_command(n, tail)
    return shlex.split(launcher.replace("{n}", str(n))) + tail
