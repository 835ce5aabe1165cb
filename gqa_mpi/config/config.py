"""Every knob of a run, declared once: :class:`Config` is checked on construction; the
command line and its help are generated from its fields (:mod:`gqa_mpi.app.options`).
No MPI here.

Each field carries its group (``problem``, ``layout``, ``algorithm``, ``outputs``), how
its text is read and written (``parse``/``format``, :func:`opt`); its docstring is its
help. Each field also says where it belongs (:func:`roles`): whether the library takes
it or only the command line, whether a scaling study sweeps it, whether it can change a
run's result (a study's key and CSV columns), and whether ``--help`` shows it first or
among the advanced options. Choices come from the type (``Literal``) or from a registry
(schedules, wires), read when the parser is built. Dependent defaults live here:
``wire=None`` means the schedule's own wire; ``kv_dtype=None`` float32, or float16 for a
``--kernel-source`` run (the kernel's memory); ``cubes``/``pes`` left out are filled
from the number of ranks by :meth:`Config.placed`.

Every rank builds the same :class:`Config` from the same arguments, so an invalid
value raises the same :class:`ValueError` on every rank before any communication,
and all ranks leave together.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Dict, List, Literal, Optional, Tuple, get_args, get_type_hints

from ..step.dtypes import FLOATS, MEMORY
from ..step.grid import Grid
from ..step.partition import Placement, rank_tokens
from ..step.schedules import SCHEDULES, Schedule
from ..step.wires import WIRES, Wire
from .modes import DEFAULT_TILE, Emulated, mode_of

def opt(default, group: str, *, metavar: Optional[str] = None, parse=None, format=str,
        choices=None, shown: Optional[str] = None, common: bool = False,
        library: bool = True, study: Optional[bool] = None, result: Optional[bool] = None):
    """A config field: its default, its group, how its text is read and written, and
    where it belongs.

    ``parse`` turns the option's text into the value (raising ValueError);
    ``format`` is its inverse, for JSON and command lines; ``choices`` is the registry
    of the accepted names (read when the parser is built, each entry's help joining the
    option's); ``shown`` is the default as the help prints it, for dependent defaults.
    ``common``: ``--help`` lists it among the options most runs use (the rest are
    advanced); ``library``: :class:`gqa_mpi.Decoder` takes it (not only the command
    line); ``study``: a scaling study passes it to its launches (default: the problem
    and algorithm groups); ``result``: it can change a run's result, so it is part of a
    study point's key (default: all but the outputs group).
    """
    return field(default=default, metadata=dict(
        group=group, metavar=metavar, parse=parse, format=format, choices=choices,
        shown=shown, common=common, library=library,
        study=group in ("problem", "algorithm") if study is None else study,
        result=group != "outputs" if result is None else result))


def parse_grid(text: str) -> Tuple[int, int]:
    """``"2x4"`` -> ``(2, 4)``."""
    try:
        rows, cols = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"expected ROWSxCOLS such as 2x4, got {text!r}") from None
    return rows, cols


def format_grid(grid: Tuple[int, int]) -> str:
    return f"{grid[0]}x{grid[1]}"


def parse_counts(text: str) -> Tuple[int, ...]:
    """``"3,0,5"`` -> ``(3, 0, 5)``."""
    try:
        return tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def format_counts(counts: Tuple[int, ...]) -> str:
    return ",".join(map(str, counts))


def parse_size(text: str) -> int:
    """``"64G"``, ``"512M"``, ``"1.5T"`` or plain bytes -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"expected a size such as 64G or 512M, got {text!r}")
    unit = (m.group(2) or "B").upper()[0]
    value = float(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30,
                                 "T": 1 << 40}[unit]
    if value < 1:
        raise ValueError(f"a memory size must be at least 1 byte, got {text!r}")
    return int(value)


KERNELS = ("auto", "fused", "numpy")
"""``--kernel`` choices, the local sweep: auto is fused where it loads, else numpy."""

KV_DTYPES = tuple(dict.fromkeys([*FLOATS, *MEMORY]))
"""What ``--kv-dtype`` takes: the emulation's :data:`gqa_mpi.step.dtypes.FLOATS`, a
kernel's memory's :data:`~gqa_mpi.step.dtypes.MEMORY`."""


@dataclass(frozen=True)
class Config:
    """Everything one decode step needs; invalid values raise ``ValueError``."""

    # ---- layout
    cubes: Optional[int] = opt(None, "layout", metavar="C", shown="from the world size",
                               common=True)
    """cubes in the inter-cube chain"""
    pes: Optional[int] = opt(None, "layout", metavar="P", shown=(
        "the largest divisor of the world size that fits the grid; 16 ranks -> 8"),
        common=True)
    """PEs per cube, 1..rows*cols of the grid; rank = cube * P + pe"""
    grid: Tuple[int, int] = opt((2, 4), "layout", metavar="RxC", parse=parse_grid,
                                format=format_grid, study=True)
    """PE grid of one cube, rows x columns; PE pe sits at divmod(pe, cols) and a
    cube's last row may be short"""
    split: Optional[Tuple[int, ...]] = opt(None, "layout", metavar="N0,N1,...",
                                           parse=parse_counts, format=format_counts,
                                           shown="balanced, the first "
                                           "S_kv % n ranks take one more")
    """tokens held by each rank, in rank order, adding up to S_kv"""
    placement: Placement = opt(Placement(None), "layout", metavar="POLICY",
                               parse=Placement.parse, library=False,
                               study=True)
    """with --steps: which rank takes each new token i of the cache: contiguous (the
    last rank, as Tree Attention), round-robin (rank i mod n, as vLLM's interleave) or
    blocks:B (rank (i // B) mod n, as Helix)"""

    # ---- problem
    seq_len: int = opt(32768, "problem", metavar="S_KV", common=True)
    """S_kv, KV tokens, split over all ranks"""
    heads_q: int = opt(32, "problem", metavar="H_Q", common=True)
    """h_q, query heads"""
    heads_kv: int = opt(8, "problem", metavar="H_KV", common=True)
    """h_kv, KV heads; must divide h_q (G = h_q / h_kv)"""
    head_dim: int = opt(128, "problem", metavar="D", common=True)
    """d, the dimension of one head"""
    queries: int = opt(1, "problem", metavar="T_Q", common=True)
    """T_q, query tokens of each decode step"""
    steps: int = opt(1, "problem", metavar="N", common=True, library=False)
    """decode steps; after each, T_q new tokens of K and V (generated from the seed,
    independent of the rank count) are appended to the cache by --placement"""
    batch: Optional[int] = opt(None, "problem", metavar="B", shown="one sequence, no "
                               "batch axis")
    """B, independent sequences; given, Q and O carry a batch axis (B, T_q, h_q*d)"""
    softmax_scale: Optional[float] = opt(None, "problem", metavar="X", shown="1/sqrt(d)")
    """score multiplier"""
    causal: bool = opt(False, "problem")
    """query t sees keys 0 .. S_kv - T_q + t"""
    seed: int = opt(0, "problem", library=False)
    """seed of the generated inputs (the same seed gives the same tensors at any rank
    count)"""
    inputs: Optional[str] = opt(None, "problem", metavar="DIR", shown="generate",
                                common=True, library=False, study=False)
    """read q.npy, k.npy, v.npy from DIR instead of generating"""
    allow_nonfinite: bool = opt(False, "problem", library=False, study=False)
    """accept NaN or inf in --inputs files (refused by default, with the first
    location)"""

    # ---- algorithm
    tile: int = opt(DEFAULT_TILE, "algorithm", metavar="TOKENS")
    """TILE_S_KV, tokens per tile of the local sweep"""
    kernel: Literal[KERNELS] = opt("auto", "algorithm")
    """local kernel: fused = the C kernel built at install (one pass per tile,
    AVX-512/AVX2/portable C picked from the CPU); numpy = the reference tile sweep on
    BLAS; auto = fused if it loads, else numpy with a note"""
    kv_dtype: Optional[Literal[KV_DTYPES]] = opt(None, "algorithm", shown=(
        f"float16 if k.npy is float16 or with --kernel-source, else {Emulated.kv_dtype}"))
    """how each rank holds its K and V slice: float16 halves the bytes streamed and
    the memory held, as on the accelerator; arithmetic stays float32. With
    --kernel-source: what the kernel's memory holds K and V as, float16, bfloat16,
    float8_e4m3 or float8_e5m2 (Q and O stay float16; the check is exact attention of
    the values memory holds)"""
    reduce: str = opt("chain", "algorithm", choices=SCHEDULES)
    """how partials reach rank 0"""
    wire: Optional[str] = opt(None, "algorithm", choices=WIRES, shown=(
        "the schedule's own: packed for mpi, else fp32"))
    """what one hop of the reduction carries"""
    kernel_source: Optional[str] = opt(None, "algorithm", metavar="FILE[:FUNCTION]",
                                       shown="none: the emulation's own kernel",
                                       common=True)
    """run the kernel's own source as each step's local step instead: every rank loads
    FILE (any extension: your copy of the kernel's file) and calls FUNCTION (default: the
    one whose name ends in _kernel) as f(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q,
    h_kv, d_head, C, P, *, tl) with a tl backed by NumPy and MPI; faults, deadlocks and
    scratch are reported in the kernel's terms (exit 5 on a fault). gqa_mpi ships a
    corrected kernel: --kernel-source builtin:corrected (docs/kernel-source.md)"""
    predict: Optional[str] = opt(None, "algorithm", metavar="PROFILE", shown="none",
                                 common=True)
    """with --kernel-source: predict the accelerator's time of each step by replaying
    every PE's tl calls through the cost model of docs/predict.md with PROFILE's numbers
    (a TOML file, or a shipped profile: example-npu, or host once `python -m
    gqa_mpi.probe` wrote it)"""

    # ---- outputs
    output: Optional[str] = opt(None, "outputs", metavar="FILE.npy", shown="none",
                                common=True, library=False)
    """rank 0 writes O here (layout of Q, float32), atomically"""
    json: Optional[str] = opt(None, "outputs", metavar="FILE", shown="none", common=True,
                              library=False)
    """rank 0 writes the run record here: config, check, per-rank timings, traffic,
    memory, hosts, MPI library"""
    trace: Optional[str] = opt(None, "outputs", metavar="FILE.json", shown="none",
                               common=True)
    """rank 0 writes a Chrome trace-event timeline (open it in https://ui.perfetto.dev):
    phases (each rank's share of the check too), chain steps, every message and an arrow
    from each send to its receive, on one time axis for all ranks; with --steps, the
    first 20 steps"""
    trace_tiles: bool = opt(False, "outputs")
    """with --trace: one event per tile of the local sweep too"""
    check: bool = opt(True, "outputs", library=False, result=True)
    """check O against a float64 reference that every rank computes a share of, a chunk
    of K and V at a time (its memory does not grow with S_kv), folded on rank 0"""
    check_every: int = opt(1, "outputs", metavar="K", library=False, result=True)
    """with --steps: check every K-th step against the cache as it stands (the last
    step is always checked)"""
    check_against: Literal["exact", "kernel-model"] = opt(
        "exact", "outputs", library=False, result=True)
    """what a --kernel-source run's O is checked against: exact = float64 attention as
    specified (with the run's --softmax-scale); kernel-model = a float64 model of the
    reference kernel's own arithmetic (no scale, its split and reshapes: its defects 2-5
    of docs/kernel-source.md), within float16 rounding, with how far it lands from exact
    attention beside it"""
    quiet: bool = opt(False, "outputs", library=False)
    """print nothing but errors"""
    max_memory: Optional[int] = opt(None, "outputs", metavar="SIZE", parse=parse_size,
                                    shown="the host's available memory", library=False)
    """memory the ranks of one host may use together, e.g. 64G; a run estimated to need
    more is refused before it allocates anything"""
    timeout: Optional[float] = opt(None, "outputs", metavar="SECONDS", shown="no limit")
    """abort the whole job if a rank has not finished after SECONDS (a watchdog for
    batch jobs: a stuck rank cannot hold the allocation)"""

    def __post_init__(self):
        # a library caller may give the placement as its text: it is parsed once, here
        object.__setattr__(self, "placement", Placement.parse(self.placement))
        if self.kv_dtype is None:
            object.__setattr__(self, "kv_dtype", self.mode.kv_dtype)

        def positive(name, value, optional=False):
            if optional and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                                 f"got {value!r}")

        rows, cols = self.grid
        positive("grid rows", rows)
        positive("grid columns", cols)
        for name in ("seq_len", "heads_q", "heads_kv", "head_dim", "queries", "tile", "steps",
                     "check_every"):
            positive(name, getattr(self, name))
        for name in ("cubes", "pes", "batch", "max_memory"):
            positive(name, getattr(self, name), optional=True)
        if self.pes is not None and self.pes > rows * cols:
            raise ValueError(f"--pes {self.pes} does not fit the {rows}x{cols} PE grid "
                             f"(P must be 1..{rows * cols}; use --grid to change it)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (
                0 <= self.seed < 2 ** 63):
            raise ValueError(f"--seed must be an integer from 0 to 2**63-1, got {self.seed!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"--heads-q {self.heads_q} is not a multiple of "
                             f"--heads-kv {self.heads_kv}")
        for name in ("softmax_scale", "timeout"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float))
                                          and math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive finite "
                                 f"number, got {value!r}")
        if self.trace_tiles and self.trace is None:
            raise ValueError("--trace-tiles adds tile events to the --trace timeline; "
                             "give --trace FILE.json too")
        for name in ("kernel", "kv_dtype", "check_against"):
            choices = get_args(get_args(_HINTS[name])[0]) if name == "kv_dtype" else \
                get_args(_HINTS[name])
            if getattr(self, name) not in choices:
                raise ValueError(f"--{name.replace('_', '-')} must be one of "
                                 f"{', '.join(choices)}, got {getattr(self, name)!r}")
        if self.wire is not None:
            WIRES.get(self.wire)
        self.mode.refuse(self)
        if self.split is not None and (min(self.split, default=0) < 0
                                       or sum(self.split) != self.seq_len):
            raise ValueError(f"--split counts must be >= 0 and add up to S_kv = "
                             f"{self.seq_len}; they add up to {sum(self.split)}")
        if self.steps > 1 and self.inputs is not None:
            raise ValueError("--steps generates the tokens it appends; it cannot follow "
                             "--inputs files (run one step on them, or drop --inputs)")
        if self.steps > 1 and self.causal and not self.placement.contiguous:
            raise ValueError(f"--causal masks the newest keys, which --placement "
                             f"{self.placement} spreads over the ranks; use --placement "
                             f"contiguous with --causal")
        if self.is_placed:
            if self.split is not None and len(self.split) != self.n_ranks:
                raise ValueError(f"--split gives {len(self.split)} token counts for "
                                 f"{self.n_ranks} ranks")

    # ---- placing on a number of ranks
    @property
    def is_placed(self) -> bool:
        return self.cubes is not None and self.pes is not None

    def placed(self, world: int) -> "Config":
        """This config on ``world`` ranks: C and P filled in where left out, and
        checked against the world size."""
        cubes, pes = default_topology(world, self.cubes, self.pes, self.grid)
        if cubes * pes != world:
            raise ValueError(f"--cubes {cubes} x --pes {pes} = {cubes * pes} ranks, but "
                             f"{world} are running (mpirun -n {cubes * pes})")
        return replace(self, cubes=cubes, pes=pes)

    # ---- derived values
    @property
    def n_ranks(self) -> int:
        return self.layout.size

    @property
    def layout(self) -> Grid:
        """The placed grid of cubes and PEs."""
        if not self.is_placed:
            raise ValueError("the config is not placed on a number of ranks yet")
        return Grid(self.cubes, self.pes, self.grid[1])

    @property
    def B(self) -> int:
        """Sequences (1 without a batch axis)."""
        return 1 if self.batch is None else self.batch

    @property
    def batched(self) -> bool:
        """Whether Q and O carry a batch axis."""
        return self.batch is not None

    @property
    def group(self) -> int:
        """G, query heads per KV head."""
        return self.heads_q // self.heads_kv

    @property
    def scale(self) -> float:
        if self.softmax_scale is not None:
            return self.softmax_scale
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def mode(self):
        """The local step this run takes (:mod:`gqa_mpi.config.modes`): the emulation's,
        or the kernel's own file with ``--kernel-source``. The one place that decides."""
        return mode_of(self.kernel_source)

    @property
    def schedule(self) -> Schedule:
        return SCHEDULES.get(self.reduce)

    @property
    def wire_format(self) -> Wire:
        """The wire a hop carries: the one asked for, or the dependent default."""
        return WIRES.get(self.wire if self.wire is not None else self.mode.default_wire(self))

    def tokens(self, rank: int) -> Tuple[int, int]:
        """``[start, stop)`` of ``rank``'s tokens under the configured split."""
        return rank_tokens(self.seq_len, self.n_ranks, rank, self.split)

    def describe(self) -> List[str]:
        """What ran, as the report's first lines: the problem and the topology (also
        above a kernel fault's report)."""
        grid = self.layout
        scale = "1/sqrt(d)" if self.softmax_scale is None else f"{self.scale:g}"
        source = f"generated (seed {self.seed})" if self.inputs is None else f"from {self.inputs}"
        return [f"problem   B={self.B} T_q={self.queries} S_kv={self.seq_len} "
                f"h_q={self.heads_q} h_kv={self.heads_kv} (G={self.group}) d={self.head_dim} "
                f"scale={scale} causal={'yes' if self.causal else 'no'}; inputs {source}",
                f"topology  C={self.cubes} cubes x P={self.pes} PEs = {self.n_ranks} ranks; "
                f"PE grid {self.grid[0]}x{self.grid[1]} ({grid.rows_used} row(s) x "
                f"{grid.cols_used} col(s) used)"]

    # ---- serialisation
    def to_json(self) -> Dict:
        """Every field as JSON: each through its ``format`` (grid ``2x4``, split
        ``3,0,5``, placement ``blocks:B``), as on the command line, and the wire as it
        resolves. :meth:`from_json` also reads a split written as a list."""
        d = {f.name: _text(f, getattr(self, f.name)) for f in fields(self)}
        if self.mode.records_wire:
            d["wire"] = self.wire_format.name
        return d

    @classmethod
    def from_json(cls, d: Dict) -> "Config":
        """The inverse of :meth:`to_json` (unknown keys are left out)."""
        kw = {}
        for f in fields(cls):
            if f.name in d:
                value, parse = d[f.name], f.metadata.get("parse")
                if parse and isinstance(value, str):
                    value = parse(value)
                kw[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**kw)

    def to_argv(self) -> List[str]:
        """The command-line options that give this config (those off their default)."""
        argv = []
        dependent = dict(kv_dtype=replace(self, kv_dtype=None).kv_dtype)
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default or value == dependent.get(f.name, f.default):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else f"--no-{flag[2:]}")
            else:
                argv += [flag, f.metadata["format"](value)]
        return argv


def _text(f, value):
    """A field's value as JSON holds it: numbers, booleans and None as they are, the
    rest through the field's ``format``."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return f.metadata["format"](value)


def default_topology(world: int, cubes: Optional[int], pes: Optional[int],
                     grid: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """Fill in ``(C, P)`` from the world size where the user left them out.

    With neither given, P is the largest divisor of the world size that fits the
    grid (16 ranks and a 2x4 grid give 2 cubes of 8 PEs; 12 give 2 cubes of 6).
    With one given, the other is the world size divided by it. ``grid``: Config's
    default where not given.
    """
    grid = grid or Config.grid
    if cubes is None and pes is None:
        pes = max(p for p in range(1, min(world, grid[0] * grid[1]) + 1) if world % p == 0)
    if cubes is None:
        if pes < 1 or world % pes:
            raise ValueError(f"--pes {pes} does not divide the {world} running ranks")
        cubes = world // pes
    if pes is None:
        if cubes < 1 or world % cubes:
            raise ValueError(f"--cubes {cubes} does not divide the {world} running ranks")
        pes = world // cubes
    return cubes, pes


_HINTS = get_type_hints(Config)


def roles(role: str) -> Tuple[str, ...]:
    """The names of the fields that have ``role`` (see :func:`opt`): ``library`` (the
    library API takes them), ``cli`` (the command line's only), ``study`` (a study
    passes them on), ``result`` (they can change a run's result), ``common`` (shown
    first by ``--help``)."""
    if role == "cli":
        return tuple(f.name for f in fields(Config) if not f.metadata["library"])
    return tuple(f.name for f in fields(Config) if f.metadata[role])
