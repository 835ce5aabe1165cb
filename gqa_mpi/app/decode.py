"""``gqa_mpi.Decoder`` and ``gqa_mpi.decode``: distributed decode steps on arrays the
ranks already hold; the command line's loop runs on the same :class:`Decoder`.

Every rank of ``comm`` passes the same Q and its own consecutive run of KV tokens
(rank 0 the first, any lengths, empty ones too); the partials reach rank 0 along the
chosen schedule and rank 0 gets O. Every rank gets the run record::

    from mpi4py import MPI
    import numpy as np
    from gqa_mpi import decode

    rng = np.random.default_rng(0)                  # the same Q on every rank
    q = rng.standard_normal((1, 32 * 64), dtype=np.float32)
    mine = np.random.default_rng(MPI.COMM_WORLD.rank)
    k, v = (mine.standard_normal((1000, 8 * 64), dtype=np.float32) for _ in "kv")
    result = decode(q, k, v, heads_kv=8)            # any Config field as a keyword
    if MPI.COMM_WORLD.rank == 0:
        print(result.output.shape, result.record.timings()["step"]["max"])

The command line is built on it (:mod:`gqa_mpi.app.run`).
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, fields, replace
from typing import Callable, Dict, Optional

import numpy as np

from ..config.config import Config, roles
from ..step.partition import token_range
from ..dsl.profile import load as load_profile
from ..mpi import watchdog
from ..mpi.step import Rank
from ..mpi.topology import Topology
from .outputs import write_json
from ..dsl.predict import predict_steps, trace_events
from ..mpi import collective, inprocess
from ..mpi.collective import agree, agree_on, fingerprint
from ..step.trace import chrome_trace
from .record import RankStats, RunRecord, host_state


@dataclass
class Decoded:
    """What :func:`decode` gives each rank."""

    output: Optional[np.ndarray]
    """O in the layout of Q (float32) on rank 0; None elsewhere."""
    record: RunRecord
    """The run record, the same on every rank (its ``check`` is None: the arrays are
    the caller's, so is their check)."""
    trace: Optional[Dict] = None
    """On rank 0 with ``trace`` set: the Chrome trace-event document."""


def _rows(a, name: str):
    """``a`` as ``(B, tokens, width)``: arrays, or lazy rows with ``shape`` and ``[:, i:j]``."""
    if isinstance(a, np.ndarray) or not hasattr(a, "shape"):
        a = np.asarray(a)
    dtype = getattr(a, "dtype", None)
    if dtype is not None and np.dtype(dtype) not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{name} must hold real numbers in float16 or float32 (float64 is "
                         f"held as float32), got {dtype}")
    if len(a.shape) not in (2, 3):
        raise ValueError(f"{name} must be (tokens, width) or (batch, tokens, width), "
                         f"got shape {tuple(a.shape)}")
    return a[None] if len(a.shape) == 2 else a


CLI_ONLY = roles("cli")
"""Config fields that mean nothing to arrays the caller holds (the command line's)."""
FROM_ARRAYS = ("seq_len", "heads_q", "queries", "batch", "split")
"""Config fields the library reads off the arrays: their shapes and each rank's length."""
LIBRARY = tuple(f for f in roles("library") if f not in FROM_ARRAYS)
"""Config fields the library takes as keywords."""


def _integer(value, name: str):
    """An int from any integer type (``np.int64(2)``), or ValueError."""
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def problem_config(q: np.ndarray, k, lengths, *, heads_kv=None, head_dim=None,
                   **options) -> Config:
    """The Config of arrays: shapes from Q and K, the split from each rank's length."""
    unknown = sorted(set(options) - {f.name for f in fields(Config)})
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; the library's options "
                         f"are: {', '.join(LIBRARY)}")
    given = sorted(set(options) & set(FROM_ARRAYS))
    if given:
        raise ValueError(f"{', '.join(given)}: read off the arrays (Q's and K's shapes, each "
                         f"rank's length of K), not given as options")
    given = sorted(set(options) & set(CLI_ONLY))
    if given:
        raise ValueError(f"{', '.join(given)}: the command line's, not the library's (the "
                         f"arrays are yours: O and the record come back, the check is "
                         f"yours)")
    heads_kv, head_dim = _integer(heads_kv, "heads_kv"), _integer(head_dim, "head_dim")
    if not sum(lengths):
        raise ValueError(f"every rank passed 0 tokens of K and V; the cache needs at "
                         f"least one ({len(lengths)} ranks)")
    width = k.shape[-1]
    if heads_kv is None and head_dim is None:
        raise ValueError("give heads_kv= (or head_dim=): the width of K, "
                         f"{width}, is h_kv * d")
    for given, name in ((heads_kv, "heads_kv"), (head_dim, "head_dim")):
        if given is not None and (not isinstance(given, int) or given < 1 or width % given):
            raise ValueError(f"{name}={given!r} does not divide the width of K, {width}")
    head_dim = head_dim or width // heads_kv
    heads_kv = heads_kv or width // head_dim
    if heads_kv * head_dim != width or q.shape[-1] % head_dim:
        raise ValueError(f"K's width {width} is not heads_kv * head_dim = {heads_kv} x "
                         f"{head_dim}, or Q's width {q.shape[-1]} is not a multiple of it")
    seq_len = sum(lengths)
    balanced = [b - a for a, b in (token_range(seq_len, len(lengths), r)
                                   for r in range(len(lengths)))]
    return Config(check=False, seq_len=seq_len, heads_q=q.shape[-1] // head_dim, heads_kv=heads_kv,
                  head_dim=head_dim, queries=q.shape[-2],
                  batch=q.shape[0] if q.ndim == 3 else None,
                  split=None if list(lengths) == balanced else tuple(lengths), **options)


class Decoder:
    """A serving loop's view of the distributed cache: each rank's slice is loaded once,
    then :meth:`step` (O on rank 0) and :meth:`append` as many times as the caller
    wants. Every method is called by every rank of ``comm``, and a ``ValueError`` is
    raised on every rank alike::

        with Decoder(q, k, v, heads_kv=8) as dec:     # this rank's k, v
            for token in range(100):
                o = dec.step(q)                       # O on rank 0, None elsewhere
                dec.append(k_new, v_new)              # this rank's new tokens, maybe none
            record = dec.record()

    Parameters
    ----------
    q : (T_q, h_q*d) or (B, T_q, h_q*d)
        Queries of the shape every step takes, the same on every rank.
    k, v : (S_local, h_kv*d) or (B, S_local, h_kv*d)
        This rank's tokens: rank r holds the run after rank r-1's. float16 or float32.
    config : Config, optional
        Everything else; by default built from the shapes, each rank's length and
        ``options``. With a config, each rank's length must be ``config.tokens(rank)``.
    comm : MPI communicator, default ``MPI.COMM_WORLD``
        Its ranks play the PEs: ``C x P`` must equal its size.
    **options
        :class:`~gqa_mpi.config.config.Config` fields: ``heads_kv`` (or ``head_dim``),
        ``tile``, ``kernel``, ``reduce``, ``wire``, ``cubes``, ``pes``, ``causal``, ...
    """

    def __init__(self, q, k, v, config: Optional[Config] = None, *, comm=None, **options):
        if not inprocess.owns(comm):      # MPI initialised here where nobody has yet
            world = collective.world()    # (the caller's comm may be its COMM_WORLD)
            comm = world if comm is None else comm
        timeout = options.get("timeout", getattr(config, "timeout", None))
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
                and 0 < timeout < float("inf"):
            watchdog.arm(comm, timeout)       # before any communication: a rank that
        try:                                  # never comes is named, not waited for
            self._open(comm, q, k, v, config, options)
        except BaseException:
            watchdog.disarm()
            raise

    def _open(self, comm, q, k, v, config, options) -> None:
        # rank 0 counts the ranks that make the call, so a timeout names the one that
        # never came, not only the ones that waited for it
        watchdog.rendezvous(comm, "the library call")
        error = None
        try:
            q = np.asarray(q)
            if q.dtype.kind not in "fiu":
                raise ValueError(f"q must hold real numbers, got {q.dtype}")
            q = q.astype(np.float32, copy=False)
            q3 = _queries(q)
            k, v = _rows(k, "k"), _rows(v, "v")
            if tuple(k.shape) != tuple(v.shape):
                raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
        except ValueError as e:
            error = f"rank {comm.rank}: {e}"
        agree(comm, error)
        lengths = collective.everyone(comm, k.shape[1])     # every rank has passed agree
        error = cfg = None
        try:
            if config is None:
                config = problem_config(q, k, lengths, **options)
            elif options:
                try:
                    config = replace(config, **options)
                except TypeError as e:
                    raise ValueError(f"unknown option: {e}") from None
            cfg = config.placed(comm.size)
            want = [b - a for a, b in map(cfg.tokens, range(comm.size))]
            if lengths != want:
                raise ValueError(f"the ranks hold {lengths} tokens, but the config splits "
                                 f"them as {want}")
            if cfg.steps != 1:
                raise ValueError("steps= is the command line's generated loop (python -m "
                                 "gqa_mpi --steps N); a library loop calls step() N times")
            if cfg.predict is not None:        # read now: rank 0 replays at the end
                load_profile(cfg.predict)
        except ValueError as e:
            error = str(e)
        agree(comm, error)
        agree_on(comm, dict(config=cfg.to_json(), q=fingerprint(q3),
                             kv=(str(k.dtype), k.shape[0], k.shape[2])))
        self._start(comm, cfg, q3, k, v)

    @classmethod
    def from_config(cls, comm, cfg: Config, q, k, v,
                    progress: Optional[Callable[[int, int], None]] = None) -> "Decoder":
        """A loop on inputs already checked against a placed ``cfg`` (the command
        line's: ``k`` and ``v`` may be lazy rows, generated or memory-mapped);
        ``progress(done, total)`` hears how many of this rank's tokens are loaded."""
        self = cls.__new__(cls)
        self._start(comm, cfg, q, k, v, progress)
        self.trusted = True           # its queries are drawn the same on every rank
        return self

    def _start(self, comm, cfg: Config, q, k, v, progress=None) -> None:
        self.cfg, self.comm = cfg, comm
        self.q_shape = tuple(np.shape(q))
        self.trusted = False
        self.closed = False
        self.steps = 0
        self.tokens = cfg.seq_len
        """Tokens in the cache, all ranks together."""
        self.nonfinite = 0
        self.topo = Topology(comm, cfg.layout)
        try:
            self.rank = Rank.load(cfg, self.topo, q, k, v, progress)
        except BaseException:
            self.topo.free()
            raise

    def step(self, q=None) -> Optional[np.ndarray]:
        """One decode step over the cache as it stands; O ``(like q)`` on rank 0.

        ``q``: this step's queries, shaped like those given first (by default those),
        the same on every rank; a ``ValueError`` on every rank otherwise."""
        self._refuse_closed("step")
        q3 = None if q is None else self._step_queries(q)
        output = self.rank.step(self.steps, q3, self.tokens)
        self.steps += 1
        if output is not None:
            self.nonfinite += int(np.count_nonzero(~np.isfinite(output)))
        return output

    def append(self, k, v) -> None:
        """Add this rank's new tokens ``(n, h_kv*d)`` (``n`` may be 0) to its slice."""
        self._refuse_closed("append")
        error = None
        try:
            k, v = _rows(k, "k"), _rows(v, "v")
            width = self.cfg.heads_kv * self.cfg.head_dim
            if tuple(k.shape) != tuple(v.shape) or k.shape[0] != self.cfg.B \
                    or k.shape[2] != width:
                raise ValueError(f"new k {tuple(k.shape)} and v {tuple(v.shape)} must both "
                                 f"be ({self.cfg.B}, n, {width})")
        except ValueError as e:
            error = f"rank {self.comm.rank}: {e}"
        agree(self.comm, error)
        counts = collective.everyone(self.comm, k.shape[1])
        if self.cfg.causal and any(counts[:-1]):
            agree(self.comm, "with causal=True new tokens go to the last rank (the mask "
                              f"takes the cache as one run); the ranks give {counts}")
        if k.shape[1]:
            self.rank.append(np.asarray(k), np.asarray(v))
        self.tokens += sum(counts)

    def record(self, write_trace: bool = True):
        """``(RunRecord, trace)``: every rank's statistics, the same record on every
        rank; the Chrome trace document on rank 0 with ``trace`` set (and written
        there, atomically, unless ``write_trace`` is false: the command line writes
        it with its other outputs)."""
        self._refuse_closed("record")
        record, trace = gather_record(self.cfg, self.topo, self.rank, self.nonfinite)
        if trace is not None and write_trace:
            write_json(self.cfg.trace, trace)
        return record, trace

    def _refuse_closed(self, call: str) -> None:
        if self.closed:
            raise ValueError(f"Decoder.{call}() after the decoder was closed (its `with` "
                             f"block ended, or close() was called): make a new Decoder")

    def _step_queries(self, q) -> np.ndarray:
        """``q`` as ``(B, T_q, h_q*d)``, checked against the first queries' shape and,
        unless the caller is the command line, against every other rank's."""
        error, q3 = None, None
        try:
            q3 = _queries(q)
            if q3.shape != self.q_shape:
                raise ValueError(f"step(q) takes queries shaped like the first ones, "
                                 f"{self.q_shape}, got {q3.shape}")
        except ValueError as e:
            error = f"rank {self.comm.rank}: {e}"
        if self.trusted:
            if error:
                raise ValueError(error)
            return q3
        agree(self.comm, error)
        agree_on(self.comm, dict(q=fingerprint(q3)))
        return q3

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.topo.free()
            watchdog.disarm()

    def __enter__(self) -> "Decoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _queries(q) -> np.ndarray:
    q = np.asarray(q, dtype=np.float32)
    if q.ndim not in (2, 3):
        raise ValueError(f"q must be (T_q, width) or (B, T_q, width), got {q.shape}")
    return q if q.ndim == 3 else q[None]


def decode(q, k, v, config: Optional[Config] = None, *, comm=None, **options) -> Decoded:
    """One distributed decode step: :class:`Decoder` with one :meth:`~Decoder.step`.

    Parameters are :class:`Decoder`'s; a ``ValueError`` is raised on every rank alike.
    """
    with Decoder(q, k, v, config, comm=comm, **options) as dec:
        output = dec.step()
        record, trace = dec.record()
    return Decoded(output, record, trace)


def gather_record(cfg: Config, topo: Topology, rank: Rank, output_nonfinite: int):
    """``(record, trace)``: every rank's statistics on rank 0 as a :class:`RunRecord`,
    then the record on every rank; the trace document on rank 0 when asked for.
    ``output_nonfinite``: the NaN and inf elements of the root's outputs."""
    rank.finish()
    traffic = rank.traffic
    start, stop = cfg.tokens(topo.rank)
    mine = RankStats(rank=topo.rank, host=collective.host_name(topo.comm),
                     place=topo.place.describe(), start=start, stop=stop,
                     kernel=rank.local.name, source=rank.local.stats(),
                     timings=rank.recorder.timings, messages=traffic.messages,
                     bytes=traffic.bytes, overflow=traffic.loss.overflow,
                     m_rounding=traffic.loss.m_rounding, peak_rss_mib=rank.peak_rss_mib,
                     scores_nonfinite=rank.scores_nonfinite, steps=rank.steps, held=rank.count,
                     **host_state())
    watchdog.rendezvous(topo.comm, "the gathering of results")
    stats = collective.to_root(topo.comm, mine, "every rank (the gathering of results)")
    events = (collective.to_root(topo.comm, rank.recorder.events)
              if cfg.trace is not None else None)
    calls = collective.to_root(topo.comm, rank.local.calls) if cfg.predict is not None else None
    record = trace = None
    if topo.is_root:
        record = RunRecord(config=cfg, ranks=stats, isa=rank.local.isa,
                           kernel_note=rank.local.note, kernel_source=rank.local.source,
                           output_nonfinite=output_nonfinite,
                           mpi_library=collective.library_version(topo.comm),
                           in_process=inprocess.owns(topo.comm),
                           created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        replayed = None
        if calls is not None:
            try:        # rank 0 alone replays: a failure must not leave the others waiting
                record.predicted, replayed = predict_steps(
                    calls, cfg.layout, load_profile(cfg.predict),
                    max(s.source["scratch_peak"] for s in stats))
            except (ValueError, OSError) as e:
                record.predicted = dict(profile=cfg.predict, error=str(e))
        if events is not None:
            trace = chrome_trace(events, [s.place for s in stats])
            if replayed is not None:
                trace["traceEvents"] += trace_events(replayed)
    return collective.from_root(topo.comm, record, "rank 0 (the run record)"), trace
