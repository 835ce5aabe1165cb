"""One frozen dataclass holding every knob of a run, checked on construction.

Every rank builds the same :class:`Config` from the same arguments, so an invalid
value raises the same :class:`ValueError` on every rank before any communication,
and all ranks leave together.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

WIRES = ("fp32", "kernel", "packed")
"""What one hop of the reduction carries (see :mod:`gqa_mpi.wire`)."""

REDUCES = ("chain", "tree", "mpi")
"""How the partials reach the root (see :mod:`gqa_mpi.reduce`)."""

KERNELS = ("auto", "fused", "numpy")
"""The local kernel (see :mod:`gqa_mpi.kernels`)."""

KV_DTYPES = ("float32", "float16")
"""How a rank holds its resident K and V."""

DEFAULT_GRID = (2, 4)


def tree_depth(size: int) -> int:
    """Message latencies of a binomial tree over ``size`` ranks: ``ceil(log2 size)``."""
    return (size - 1).bit_length()


@dataclass(frozen=True)
class Config:
    """Everything one decode step needs; invalid values raise ``ValueError``."""

    cubes: int
    """C, cubes in the inter-cube 1D chain."""
    pes: int
    """P, PEs per cube; ``rank = cube * P + pe``."""
    world_size: int
    """MPI ranks actually running; must equal ``C * P``."""
    grid: Tuple[int, int] = DEFAULT_GRID
    """PE grid of a cube as (rows, cols); PE ``pe`` sits at ``divmod(pe, cols)``."""
    seq_len: int = 32768
    """S_kv, KV tokens, split over all ranks."""
    heads_q: int = 32
    """h_q, query heads."""
    heads_kv: int = 8
    """h_kv, KV heads; must divide h_q (G = h_q / h_kv)."""
    head_dim: int = 128
    """d, dimension of one head."""
    queries: int = 1
    """T_q, query tokens of this decode step."""
    batch: int = 1
    """B, independent sequences."""
    batched: bool = False
    """Whether Q and O carry a batch axis, ``(B, T_q, h_q*d)``."""
    tile: int = 1024
    """TILE_S_KV, tokens per tile of the local sweep."""
    kernel: str = "auto"
    """Local kernel: 'auto' (fused if it loads, else numpy), 'fused' (C), 'numpy'."""
    kv_dtype: str = "float32"
    """Resident K and V: 'float32', or 'float16' (half the bytes; float32 arithmetic)."""
    softmax_scale: Optional[float] = None
    """Score multiplier; None means ``1/sqrt(d)``."""
    causal: bool = False
    """Query ``t`` sees keys ``0 .. S_kv - T_q + t``."""
    seed: int = 0
    """Seed of the generated inputs (ignored with ``inputs``)."""
    inputs: Optional[str] = None
    """Directory holding q.npy, k.npy, v.npy; None to generate."""
    wire: str = "fp32"
    """Hop format: 'fp32' (m, l, O as float32), 'kernel' (float16), 'packed'."""
    reduce: str = "chain"
    """Reduction schedule: 'chain' (the kernel's), 'tree' (binomial), 'mpi' (MPI.Reduce)."""
    output: Optional[str] = None
    """Where the root writes O (.npy); None to skip."""
    json: Optional[str] = None
    """Where the root writes the run record (JSON); None to skip."""
    check: bool = True
    """Check O on the root against a float64 reference."""
    kernel_faithful: bool = False
    """Reproduce the kernel's arithmetic and layout (SPEC defects 2-5), not exact attention."""
    trace: Optional[str] = None
    """Where the root writes a Chrome trace-event timeline; None to skip."""
    trace_tiles: bool = False
    """Put one trace event per tile of the local sweep in the timeline."""
    split: Optional[Tuple[int, ...]] = None
    """Tokens of each rank, in rank order; None for the balanced split."""
    allow_nonfinite: bool = False
    """Accept NaN or inf in input files instead of refusing them."""
    timeout: Optional[float] = None
    """Seconds after which a rank that has not finished aborts the whole job."""

    def __post_init__(self):
        def positive(name, value):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        rows, cols = self.grid
        positive("--grid rows", rows)
        positive("--grid columns", cols)
        for name in ("cubes", "pes", "seq_len", "heads_q", "heads_kv", "head_dim",
                     "queries", "batch", "tile"):
            positive("--" + name.replace("_", "-"), getattr(self, name))
        if self.pes > rows * cols:
            raise ValueError(f"--pes {self.pes} does not fit the {rows}x{cols} PE grid "
                             f"(P must be 1..{rows * cols}; use --grid to change it)")
        if self.cubes * self.pes != self.world_size:
            raise ValueError(f"--cubes {self.cubes} x --pes {self.pes} = "
                             f"{self.cubes * self.pes} ranks, but {self.world_size} "
                             f"are running (mpirun -n {self.cubes * self.pes})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (
                0 <= self.seed < 2 ** 63):
            raise ValueError(f"--seed must be an integer from 0 to 2**63-1, got {self.seed!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"--heads-q {self.heads_q} is not a multiple of "
                             f"--heads-kv {self.heads_kv}")
        if self.batch > 1 and not self.batched:
            raise ValueError(f"batch {self.batch} needs batched inputs")
        if self.softmax_scale is not None and not (
                math.isfinite(self.softmax_scale) and self.softmax_scale > 0):
            raise ValueError(f"--softmax-scale must be a positive finite number, "
                             f"got {self.softmax_scale!r}")
        if self.wire not in WIRES:
            raise ValueError(f"--wire must be one of {', '.join(WIRES)}, got {self.wire!r}")
        if self.timeout is not None and not (math.isfinite(self.timeout)
                                             and self.timeout > 0):
            raise ValueError(f"--timeout must be a positive number of seconds, "
                             f"got {self.timeout!r}")
        if self.trace_tiles and self.trace is None:
            raise ValueError("--trace-tiles adds tile events to the --trace timeline; "
                             "give --trace FILE.json too")
        if self.kernel not in KERNELS:
            raise ValueError(f"--kernel must be one of {', '.join(KERNELS)}, "
                             f"got {self.kernel!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, "
                             f"got {self.kv_dtype!r}")
        if self.reduce not in REDUCES:
            raise ValueError(f"--reduce must be one of {', '.join(REDUCES)}, "
                             f"got {self.reduce!r}")
        if self.reduce == "mpi" and self.wire == "kernel":
            raise ValueError("--reduce mpi hands MPI one packed float32 buffer; the "
                             "float16 wire (--wire kernel) needs --reduce chain or tree")
        if self.split is not None:
            if len(self.split) != self.n_ranks:
                raise ValueError(f"--split gives {len(self.split)} token counts for "
                                 f"{self.n_ranks} ranks")
            if min(self.split) < 0 or sum(self.split) != self.seq_len:
                raise ValueError(f"--split counts must be >= 0 and add up to S_kv = "
                                 f"{self.seq_len}; they add up to {sum(self.split)}")
        if self.kernel_faithful:
            self._check_faithful()

    def _check_faithful(self):
        """Refuse what the kernel itself cannot run, rather than hang or misbehave."""
        rows, cols = self.grid
        flag = "--kernel-faithful"
        if cols != 4:
            raise ValueError(f"{flag}: the kernel's PE grid has 4 columns, not {cols} "
                             f"(--grid {rows}x{cols})")
        if self.rows_used > 1 and self.pes % cols:
            last = self.pes - 1
            raise ValueError(
                f"{flag}: P={self.pes} leaves the last PE row short ({self.pes % cols} of "
                f"{cols}); the kernel gives every row the same length, so PE {last} "
                f"would wait forever for an intra_E neighbour that does not exist "
                f"(SPEC defect 1). Use P = 1..4 or 8, or drop {flag}")
        if self.seq_len < self.n_ranks:
            raise ValueError(
                f"{flag}: S_kv={self.seq_len} < C*P={self.n_ranks} leaves every rank an "
                f"empty slice, and the kernel computes tile 0 unconditionally "
                f"(SPEC defect 6); drop {flag} or use fewer ranks")
        if self.batch > 1:
            raise ValueError(f"{flag}: the kernel has no batch axis (batch {self.batch})")
        if self.split is not None:
            raise ValueError(f"{flag}: the kernel splits tokens itself; drop --split")
        if self.causal:
            raise ValueError(f"{flag}: the kernel has no causal mask; drop --causal")
        if self.softmax_scale is not None:
            raise ValueError(f"{flag}: the kernel applies no softmax scale "
                             f"(it uses plain tl.dot); drop --softmax-scale")

    # ---- derived values ----
    @property
    def n_ranks(self) -> int:
        return self.cubes * self.pes

    @property
    def group(self) -> int:
        """G, query heads per KV head."""
        return self.heads_q // self.heads_kv

    @property
    def scale(self) -> float:
        if self.kernel_faithful:
            return 1.0
        if self.softmax_scale is not None:
            return self.softmax_scale
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def rows_used(self) -> int:
        return -(-self.pes // self.grid[1])

    @property
    def cols_used(self) -> int:
        return min(self.grid[1], self.pes)

    @property
    def chain_depth(self) -> int:
        """Hops on the critical path of the chain.

        PE ``(row, col)`` is ``col + row`` hops from PE 0, and cube ``c`` is ``c`` more,
        so a full grid gives ``(cols-1) + (rows-1) + (C-1)`` (5 for 2 cubes of 2x4).
        With a short last row the farthest PE may be the end of the row above it.
        """
        cols = self.grid[1]
        return max(sum(divmod(pe, cols)) for pe in range(self.pes)) + self.cubes - 1

    @property
    def reduce_depth(self) -> Optional[int]:
        """Hops on the critical path of the chosen schedule (None: MPI decides)."""
        if self.reduce == "chain":
            return self.chain_depth
        if self.reduce == "tree":
            return tree_depth(self.n_ranks)
        return None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["grid"] = f"{self.grid[0]}x{self.grid[1]}"
        d["split"] = None if self.split is None else list(self.split)
        d.update(group=self.group, scale=self.scale, chain_depth=self.chain_depth,
                 reduce_depth=self.reduce_depth)
        return d


def default_topology(world: int, cubes: Optional[int], pes: Optional[int],
                     grid: Tuple[int, int] = DEFAULT_GRID) -> Tuple[int, int]:
    """Fill in ``(C, P)`` from the world size where the user left them out.

    With neither given, P is the largest divisor of the world size that fits the
    grid (16 ranks and a 2x4 grid give 2 cubes of 8 PEs; 12 give 2 cubes of 6).
    With one given, the other is the world size divided by it.
    """
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
