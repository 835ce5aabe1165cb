"""A hardware profile for ``--predict``: the numbers of SPEC.md's cost model, read from
a TOML file and checked field by field. No MPI here.

Every number is in SI units; the schema (each field, its unit, what it costs) is
:data:`SCHEMA`. A profile is a file path, or a name: one of the user's
(:func:`user_dir`, where ``python -m gqa_mpi.probe`` writes ``host``), else one that
gqa_mpi ships (``gqa_mpi/profiles/NAME.toml``: ``example-npu``, the same with
engines that overlap ``example-npu-overlap``, ``nvlink4``, ``ib-ndr`` and
``xeon-16core-vm``, a probed machine). A missing, unknown, negative or non-numeric
field is refused in one line that names it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

PROFILES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "profiles")

SCHEMA: Dict[str, Dict[str, Tuple[str, str]]] = {
    "pe": {
        "call_s": ("s", "fixed cost of every tl call that has a cost"),
        "dot_flops_per_s": ("FLOP/s", "tl.dot of (M,K) x (K,N) costs 2*M*K*N flops"),
        "vector_elems_per_s": ("elements/s", "every other op, by the elements of its "
                                             "result (tl.max/tl.sum: of its operand)"),
        "mem_bytes_per_s": ("B/s", "tl.load / tl.store, the PE's memory"),
        "mem_latency_s": ("s", "added to every tl.load / tl.store"),
        "scratch_bytes": ("B", "the scratch high-water mark is held against it"),
    },
    "noc": {
        "latency_s": ("s", "intra_E/W/N/S: from the end of a send to the arrival"),
        "bytes_per_s": ("B/s", "intra_E/W/N/S: one link per ordered pair of neighbours"),
    },
    "inter": {
        "latency_s": ("s", "E/W between cubes: from the end of a send to the arrival"),
        "bytes_per_s": ("B/s", "E/W: one link per ordered pair of cubes' PEs"),
    },
    "cube": {
        "mem_bytes_per_s": ("B/s", "a cube's memory, shared: each of the n PEs that load "
                                   "or store in a step moves at most this over n"),
    },
}
"""``table -> field -> (unit, what it costs)``; and ``name``, a string, at the top."""

OPTIONAL = ("cube",)
"""Tables a profile may leave out: each an extension of the model, off without it."""

SWITCHES = {"pe": {"overlap": "true: a PE's engines (dma, matrix, vector) overlap, "
                              "each call issued call_s after the one before"}}
"""Fields a profile may leave out, true or false: each an extension, off without it."""

BY_DTYPE = ("dot_flops_per_s", "vector_elems_per_s")
"""Rates a profile may give per dtype, as an inline table with a ``default``:
``vector_elems_per_s = {default = 1.0e11, f16 = 2.0e11}``."""

DTYPES = ("f16", "f32", "bf16", "fp8e4m3", "fp8e5m2", "i32", "i1")
"""The dtype names a rate table takes (besides ``default``)."""

RATES = ("dot_flops_per_s", "vector_elems_per_s", "mem_bytes_per_s", "bytes_per_s")
"""Fields that divide: they must be positive, not only non-negative."""


@dataclass(frozen=True)
class Link:
    """One kind of link: a message of B bytes occupies it ``B / bytes_per_s`` and
    arrives ``latency_s`` after that."""

    latency_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class Profile:
    """SPEC's cost model's numbers (see :data:`SCHEMA`)."""

    name: str
    call_s: float
    dot_flops_per_s: Union[float, Dict[str, float]]
    vector_elems_per_s: Union[float, Dict[str, float]]
    mem_bytes_per_s: float
    mem_latency_s: float
    scratch_bytes: float
    noc: Link
    inter: Link
    path: str = ""
    cube_mem_bytes_per_s: Optional[float] = None
    """``[cube] mem_bytes_per_s``: the memory a cube's PEs share (None: not shared)."""
    overlap: bool = False
    """``[pe] overlap``: a PE's engines (dma, matrix, vector) overlap."""

    def link(self, direction: str) -> Link:
        """The link a message in ``direction`` travels on."""
        return self.inter if direction in ("E", "W") else self.noc

    def rate(self, field: str, dtype: Optional[str]) -> float:
        """``dot_flops_per_s`` or ``vector_elems_per_s`` for ``dtype``: the rate, or a
        rate table's entry for it, else its ``default``."""
        value = getattr(self, field)
        if isinstance(value, dict):
            return value.get(dtype, value["default"])
        return value


PROBED = "host"
"""The name the probe gives this machine's profile."""


def user_dir() -> str:
    """Where the user's profiles live (the probe writes there): ``$GQA_MPI_PROFILES``,
    else ``$XDG_CONFIG_HOME/gqa_mpi/profiles``, else ``~/.config/gqa_mpi/profiles``."""
    explicit = os.environ.get("GQA_MPI_PROFILES")
    if explicit:
        return explicit
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".config")
    return os.path.join(config, "gqa_mpi", "profiles")


def resolve(spec: str) -> str:
    """The file of a profile: a path as given, else a name, the user's before gqa_mpi's."""
    if os.path.exists(spec) or os.sep in spec or spec.endswith(".toml"):
        return os.path.abspath(spec)
    mine = os.path.join(user_dir(), f"{spec}.toml")
    return mine if os.path.isfile(mine) or spec == PROBED else \
        os.path.join(PROFILES_DIR, f"{spec}.toml")


def _names(directory: str) -> List[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(f[:-5] for f in os.listdir(directory) if f.endswith(".toml"))


def shipped() -> List[str]:
    """The names of the profiles at hand: the user's (``host`` once probed) and those
    gqa_mpi ships."""
    return sorted(set(_names(user_dir())) | set(_names(PROFILES_DIR)))


def load(spec: str) -> Profile:
    """Read and check a profile; ValueError with one line naming what is wrong."""
    path = resolve(spec)
    where = f"--predict {spec}"
    if not os.path.isfile(path):
        names = ", ".join(shipped()) or "none"
        if spec == PROBED:
            raise ValueError(f"{where}: this machine has not been probed yet: run `mpirun "
                             f"-n N python -m gqa_mpi.probe` (it writes {path}), or name "
                             f"another profile: {names}")
        raise ValueError(f"{where}: no such file {path} (shipped profiles: {names})")
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        raise ValueError(f"{where}: reading TOML needs Python 3.11 or later") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"{where}: {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{where}: {path} is not valid TOML ({e})") from None
    except RecursionError:     # arrays or tables nested deeper than the reader's stack
        raise ValueError(f"{where}: {path} nests arrays or tables too deeply to be a "
                         f"profile") from None
    return from_dict(data, f"{where} ({path})", path)


def from_dict(data: Dict, where: str = "profile", path: str = "") -> Profile:
    """A :class:`Profile` from the TOML's tables, checked."""
    unknown = sorted(set(data) - set(SCHEMA) - {"name"})
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (the fields are name, "
                         f"{', '.join(f'[{t}]' for t in SCHEMA)})")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: name must be a non-empty string, got {name!r}")
    values: Dict[str, Dict[str, float]] = {}
    for table, fields in SCHEMA.items():
        got = data.get(table)
        if got is None and table in OPTIONAL:
            continue
        if not isinstance(got, dict):
            raise ValueError(f"{where}: missing table [{table}] (with "
                             f"{', '.join(fields)})")
        switches = SWITCHES.get(table, {})
        extra = sorted(set(got) - set(fields) - set(switches))
        if extra:
            raise ValueError(f"{where}: unknown field {table}.{extra[0]} (the fields of "
                             f"[{table}] are {', '.join([*fields, *switches])})")
        values[table] = {}
        for field in switches:
            if field in got and not isinstance(got[field], bool):
                raise ValueError(f"{where}: {table}.{field} must be true or false, got "
                                 f"{got[field]!r}")
            if got.get(field):
                values[table][field] = True
        for field, (unit, _) in fields.items():
            if field not in got:
                raise ValueError(f"{where}: missing field {table}.{field} ({unit})")
            value = got[field]
            if isinstance(value, dict) and field in BY_DTYPE:
                bad = sorted(set(value) - set(DTYPES) - {"default"})
                if bad or "default" not in value:
                    raise ValueError(
                        f"{where}: {table}.{field} as a table needs a default and takes "
                        f"the dtypes {', '.join(DTYPES)}; "
                        + (f"{bad[0]!r} is none of them" if bad else "it has no default"))
                values[table][field] = {k: _number(v, f"{table}.{field}.{k}", unit,
                                                   True, where) for k, v in value.items()}
                continue
            values[table][field] = _number(value, f"{table}.{field}", unit, field in RATES,
                                           where)
    cube = values.get("cube", {}).get("mem_bytes_per_s")
    return Profile(name=name, **values["pe"], noc=Link(**values["noc"]),
                   inter=Link(**values["inter"]), path=path, cube_mem_bytes_per_s=cube)


def _number(value, name: str, unit: str, rate: bool, where: str) -> float:
    """A profile's number, checked: finite, non-negative, and positive for a rate."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ValueError(f"{where}: {name} must be a finite number ({unit}), got {value!r}")
    if value < 0 or (rate and value == 0):
        need = "positive" if rate else "non-negative"
        raise ValueError(f"{where}: {name} must be {need} ({unit}), got {value!r}")
    return float(value)


def to_toml(p: Profile, comments: Dict[str, str] = None) -> str:
    """The TOML text of a profile (what the probe writes), with a comment per field."""
    comments = comments or {}
    lines = [f'name = "{p.name}"']
    for table, fields in SCHEMA.items():
        if table == "cube" and p.cube_mem_bytes_per_s is None:
            continue
        lines.append(f"\n[{table}]")
        for field, (unit, what) in fields.items():
            value = (getattr(p, field) if table == "pe" else p.cube_mem_bytes_per_s
                     if table == "cube" else getattr(getattr(p, table), field))
            note = comments.get(f"{table}.{field}", f"{unit}: {what}")
            text = ("{" + ", ".join(f"{k} = {v:.9g}" for k, v in value.items()) + "}"
                    if isinstance(value, dict) else f"{value:.9g}")
            lines.append(f"{field:<19}= {text:<14} # {note}")
        for field, what in SWITCHES.get(table, {}).items():
            if getattr(p, field):
                lines.append(f"{field:<19}= {'true':<14} # {what}")
    return "\n".join(lines) + "\n"
