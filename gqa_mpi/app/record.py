"""What a run produced, typed: per-rank statistics, the check, and the run record.

One :meth:`to_json` / :meth:`from_json` pair per type; the JSON file, the text
report, the study and the bench all read these. Only what was measured is stored:
summaries over ranks (min / median / max, totals) are computed from the per-rank
values when asked for. The JSON is strict (no NaN or Infinity literals: see
:func:`gqa_mpi.app.outputs.write_json`) and says its units.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Dict, List, Optional

import numpy as np

from ..check.judge import Comparison
from .. import __version__
from ..step.trace import STEP_PHASES
from ..config.config import Config

FORMAT = "gqa_mpi.run/3"
"""The record's format; bumped when a field changes meaning."""

PHASES = ("inputs", "local_attention", "reduce", "finalize", "kernel", "step", "total",
          "check")
"""Timed phases of a run, in order; ``step`` is local attention + reduce + finalize
(or ``kernel``, the kernel's own function, in a ``--kernel-source`` run), the decode
step proper from resident slices to the output. With several decode steps,
a rank's figure for a step phase is its median over the steps (the steady state).
``total`` runs from the inputs to the last step; ``check`` (every rank's share of the
float64 check, all checked steps) follows it."""


LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
"""This host's 1-minute load average when gqa_mpi's application was imported: before the
run's own work, which it can only have counted for its first second or so."""


def host_state() -> Dict:
    """``{cores, cpus, load}``: this host's logical CPUs, the ones this process may run
    on, and :data:`LOAD_AT_START`."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return dict(cores=os.cpu_count() or 1, cpus=cpus, load=LOAD_AT_START)


UNITS = dict(timings="s", bytes="B", peak_rss_mib="MiB", created="UTC, ISO 8601")


def _known(cls, d: Dict) -> Dict:
    return {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}


@dataclass
class RankStats:
    """What one rank measured during the step."""

    rank: int
    host: str
    place: str
    """``cube 1 / PE 5 (row 1, col 1)``."""
    start: int
    stop: int
    """Its tokens, ``[start, stop)``."""
    kernel: str
    """The local kernel that ran here."""
    timings: Dict[str, float]
    """Seconds per phase of the whole run (``inputs``, ``append`` with several steps,
    ``total``; and the step phases summed over the steps)."""
    messages: int
    bytes: int
    """What this rank sent during the reduction."""
    overflow: int
    m_rounding: float
    """What its sends lost on the wire: elements turned inf, largest change of m."""
    peak_rss_mib: float
    scores_nonfinite: bool
    """Some score of its sweep was NaN or +inf."""
    steps: List[Dict[str, float]] = field(default_factory=list)
    """Seconds of each step phase (``local_attention``, ``reduce``, ``finalize`` on the
    root), one entry per decode step."""
    held: int = 0
    """Tokens it holds at the end, after the last step's append."""
    cores: int = 0
    """Logical CPUs of its host (0: not recorded)."""
    cpus: List[int] = field(default_factory=list)
    """The CPUs it may run on (its affinity; a launcher that binds ranks narrows it)."""
    load: float = 0.0
    """Its host's 1-minute load average at the start (:data:`LOAD_AT_START`)."""
    source: Optional[Dict] = None
    """What the kernel's own function did here (``--kernel-source``), summed over the
    steps: ``k_rows``/``v_rows`` (distinct token rows of its slice it read, in the last
    step), ``loaded_bytes``, ``stored_bytes``, ``dot_flops``, ``calls``,
    ``scratch_peak`` and ``persistent`` (bytes), ``scratch_top`` (``[bytes, line,
    "shape dtype"]`` of the largest tensors alive at the high-water mark),
    ``sent``/``received`` (direction -> ``[messages, bytes]``), ``nonfinite`` (``[call,
    line, count]`` of the first calls that made inf or NaN from finite operands)."""

    @property
    def tokens(self) -> int:
        return self.stop - self.start

    def step_seconds(self) -> List[float]:
        """Seconds of each decode step proper: local attention + reduce + finalize."""
        return [sum(s.get(p, 0.0) for p in STEP_PHASES) for s in self.steps]

    def phase(self, name: str) -> float:
        """Seconds of a phase: its median over the steps for a step phase (and for
        ``step`` itself), the whole run's otherwise."""
        if name == "step":
            return float(np.median(self.step_seconds())) if self.steps else 0.0
        if name in STEP_PHASES and self.steps:
            return float(np.median([s.get(name, 0.0) for s in self.steps]))
        return self.timings.get(name, 0.0)

    def to_json(self) -> Dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Dict) -> "RankStats":
        return cls(**_known(cls, d))


def spread(values: List[float]) -> Dict[str, float]:
    """min / median / max of per-rank values."""
    a = np.asarray(values, dtype=np.float64)
    return dict(min=float(a.min()), median=float(np.median(a)), max=float(a.max()))


@dataclass
class RunRecord:
    """One run: its configuration, every rank's statistics, the root's verdicts."""

    config: Config
    ranks: List[RankStats]
    isa: str
    """The instruction set of the fused kernel on the root's host ('none': not built)."""
    kernel_note: Optional[str] = None
    """Why ``--kernel auto`` fell back to the NumPy sweep, if it did."""
    kernel_source: Optional[Dict[str, str]] = None
    """The kernel's own function that ran (``file``, ``function``), or None."""
    predicted: Optional[Dict] = None
    """With ``--predict``: SPEC's ``predicted`` object, the accelerator's time of the
    last step (``step_s``, ``last_pe``, ``fits_scratch``, ``pes`` with each PE's
    ``finish_s``, ``memory_s``, ``dot_s``, ``vector_s``, ``send_s``, ``wait_s``, the
    ``critical_path``; ``steps_s`` with several steps), replayed from the tl calls."""
    output_nonfinite: int = 0
    """NaN or inf elements of O."""
    inputs_checked_finite: bool = True
    """The inputs were generated, or files checked for NaN and inf."""
    checks: List[Comparison] = field(default_factory=list)
    """O against the float64 reference (the kernel's model with ``--check-against
    kernel-model``) at each checked step; empty with ``--no-check``."""
    checked_steps: List[int] = field(default_factory=list)
    """The steps ``checks`` are of."""
    vs_exact: Optional[Comparison] = None
    """Checks against the kernel model: how far the kernel's arithmetic lands from
    exact attention."""
    mpi_library: str = ""
    """The first line of the MPI library's version, or what ran the ranks in process."""
    in_process: bool = False
    """The ranks were threads of one process (``--in-process``), not MPI processes."""
    version: str = __version__
    created: str = ""
    written: Dict[str, str] = field(default_factory=dict)
    """Files the root wrote: ``output``, ``trace``, ``json``."""

    # ---- summaries, computed from the per-rank values
    @property
    def check(self) -> Optional[Comparison]:
        """The worst checked step (all must pass for it to pass); None if none was."""
        if not self.checks:
            return None
        worst = max(self.checks, key=lambda c: (not c.passed, c.max_rel_err))
        return Comparison(**dict(worst.to_json(), passed=all(c.passed for c in self.checks)))

    def timings(self) -> Dict[str, Dict[str, float]]:
        """min / median / max over ranks of each phase that ran (seconds; for the step
        phases, each rank's median over the steps)."""
        ran = [p for p in PHASES if p == "step" or any(p in r.timings for r in self.ranks)]
        return {p: spread([r.phase(p) for r in self.ranks]) for p in ran}

    def step_latency(self) -> List[float]:
        """Seconds of each decode step, as its slowest rank saw it."""
        return [max(s) for s in zip(*(r.step_seconds() for r in self.ranks))]

    def beyond_local(self) -> List[float]:
        """Seconds each step took beyond its slowest local sweep: what the reduction
        adds to the step (the ``reduce`` phase also holds a rank's wait for slower
        neighbours to finish their sweeps, which this leaves out)."""
        local = [max(s) for s in zip(*([st.get("local_attention", 0.0) for st in r.steps]
                                        for r in self.ranks))]
        return [t - lo for t, lo in zip(self.step_latency(), local)]

    def latency(self) -> Dict[str, float]:
        """p50 / p90 / p99 / max over the steps of :meth:`step_latency`."""
        lat = np.asarray(self.step_latency())
        return {f"p{q}": float(np.percentile(lat, q)) for q in (50, 90, 99)} | dict(
            max=float(lat.max()))

    @property
    def held(self) -> Dict[str, int]:
        """Fewest and most tokens a rank holds at the end (the placement's imbalance)."""
        return dict(min=min(r.held for r in self.ranks), max=max(r.held for r in self.ranks))

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.ranks)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.ranks)

    @property
    def overflow(self) -> int:
        return sum(r.overflow for r in self.ranks)

    @property
    def m_rounding(self) -> float:
        return max(r.m_rounding for r in self.ranks)

    @property
    def peak_rss_mib(self) -> Dict[str, float]:
        return spread([r.peak_rss_mib for r in self.ranks])

    @property
    def tokens(self) -> Dict[str, int]:
        return dict(min=min(r.tokens for r in self.ranks), max=max(r.tokens for r in self.ranks))

    @property
    def kernels(self) -> List[str]:
        return sorted({r.kernel for r in self.ranks})

    @property
    def hosts(self) -> List[str]:
        return sorted({r.host for r in self.ranks})

    @property
    def crowded(self) -> List[Dict]:
        """The hosts whose times are not one rank's on a core of its own: ``{host,
        ranks, cores, load, busy}`` of each host with more ranks than the cores they may
        run on, or already busy at the start (a load above the host's cores)."""
        out = []
        for host in self.hosts:
            mine = [r for r in self.ranks if r.host == host]
            cores, load = self._cores(mine), max(r.load for r in mine)
            busy = load > max(r.cores for r in mine)      # the whole host's load
            if cores and (len(mine) > cores or busy):
                out.append(dict(host=host, ranks=len(mine), cores=cores, load=load,
                                busy=busy))
        return out

    @staticmethod
    def _cores(ranks: List[RankStats]) -> int:
        """The cores some rank of one host may run on: the union of their affinities
        (a container's or a batch job's share), else the host's count (0: unknown)."""
        if all(r.cpus for r in ranks):
            return len(set().union(*(r.cpus for r in ranks)))
        return max(r.cores for r in ranks)

    @property
    def ranks_per_core(self) -> float:
        """The most ranks any host ran per core (0: not recorded)."""
        per = []
        for host in self.hosts:
            mine = [r for r in self.ranks if r.host == host]
            cores = self._cores(mine)
            if cores:
                per.append(len(mine) / cores)
        return max(per, default=0.0)

    @property
    def scores_nonfinite_ranks(self) -> List[int]:
        return [r.rank for r in self.ranks if r.scores_nonfinite]

    @property
    def passed(self) -> bool:
        """Nothing wrong: the check passed (or was skipped), no wire overflow, O finite."""
        return ((self.check is None or self.check.passed) and not self.overflow
                and not self.output_nonfinite)

    # ---- JSON
    def to_json(self) -> Dict:
        return dict(format=FORMAT, version=self.version, created=self.created,
                    mpi_library=self.mpi_library, units=UNITS,
                    config=self.config.to_json(),
                    checks=[c.to_json() for c in self.checks],
                    checked_steps=self.checked_steps,
                    vs_exact=None if self.vs_exact is None else self.vs_exact.to_json(),
                    isa=self.isa, kernel_note=self.kernel_note,
                    kernel_source=self.kernel_source, predicted=self.predicted,
                    in_process=self.in_process,
                    output_nonfinite=self.output_nonfinite,
                    inputs_checked_finite=self.inputs_checked_finite,
                    written=self.written, crowded=self.crowded,
                    ranks=[r.to_json() for r in self.ranks])

    @classmethod
    def from_json(cls, d: Dict) -> "RunRecord":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} run record (format {d.get('format')!r})")
        d = dict(d)
        d["config"] = Config.from_json(d["config"])
        d["ranks"] = [RankStats.from_json(r) for r in d["ranks"]]
        d["checks"] = [Comparison.from_json(c) for c in d.get("checks", [])]
        d["vs_exact"] = Comparison.from_json(d.get("vs_exact"))
        return cls(**_known(cls, d))

    @classmethod
    def load(cls, path: str) -> "RunRecord":
        """Read a record written by ``--json``."""
        with open(path) as f:
            return cls.from_json(json.load(f))
