"""What the ranks do together around a run: agree on what they were given (every rank
raises the same error, so all leave together), wait for the root without spinning, and
gather every rank's statistics into the run record on rank 0."""
from __future__ import annotations

import time
import zlib
from typing import Dict, Optional

import numpy as np
from mpi4py import MPI

from ..core import inputs
from ..core.config import Config
from ..core.kernels import isa
from ..core.predict import predict_steps, trace_events
from ..core.profile import load as load_profile
from ..core.trace import chrome_trace
from ..mpi import watchdog
from ..mpi.step import Rank
from ..mpi.topology import Topology
from .record import RankStats, RunRecord


def agree(comm: MPI.Comm, error: Optional[str]) -> None:
    """Raise the first rank's error on every rank, so that all leave together."""
    with watchdog.waiting(f"all {comm.size} ranks to make the same library call"):
        errors = [e for e in comm.allgather(error) if e]
    if errors:
        raise ValueError(errors[0])


def fingerprint(q: np.ndarray):
    """Q as the ranks compare it: shape, dtype and a checksum of its bytes."""
    q = np.ascontiguousarray(q)
    return (q.shape, str(q.dtype), zlib.crc32(q.view(np.uint8).reshape(-1)))


def agree_on(comm: MPI.Comm, mine: Dict) -> None:
    """Raise the same ValueError on every rank unless every rank passed the same
    ``mine`` (the configuration, Q, the dtype and width of K and V), naming the first
    rank that differs from rank 0 and what differs."""
    with watchdog.waiting(f"all {comm.size} ranks to make the same library call"):
        every = comm.allgather(mine)
    for rank, theirs in enumerate(every):
        if theirs == every[0]:
            continue
        keys = sorted(k for k in mine if theirs[k] != every[0][k])
        if "config" in keys:
            a, b = every[0]["config"], theirs["config"]
            what = ", ".join(f"{f}={b[f]!r} where rank 0 has {a[f]!r}"
                             for f in sorted(a) if a[f] != b.get(f))
        elif "q" in keys:
            what = (f"a different q (shape {theirs['q'][0]}, checksum {theirs['q'][2]:#x}; "
                    f"rank 0: shape {every[0]['q'][0]}, checksum {every[0]['q'][2]:#x})")
        else:
            what = f"k, v of dtype {theirs['kv'][0]} where rank 0 has {every[0]['kv'][0]}"
        raise ValueError(f"the ranks disagree: rank {rank} passed {what}; every rank must "
                         f"pass the same options, the same q and K/V of one dtype")


def wait_for_root(comm: MPI.Comm) -> None:
    """Hold every rank until the root is done, sleeping rather than busy-polling.

    MPI ranks spin while they wait; on an oversubscribed machine the spinning ranks
    would steal the cores the root needs for its float64 check.
    """
    req = comm.Ibarrier()
    if comm.rank == 0:
        req.Wait()
    while not req.Test():
        time.sleep(0.005)


def refuse_nonfinite(comm: MPI.Comm, tensors) -> None:
    """Raise the same InputError on every rank if any rank's inputs hold NaN or inf."""
    mine = None
    for name, array, offset in tensors:
        mine = mine or inputs.first_nonfinite(name, array, offset)
    with watchdog.waiting("all ranks (input check)"):
        found = [m for m in comm.allgather(mine) if m]
    if found:
        raise inputs.InputError(f"{found[0]} (pass --allow-nonfinite to accept it)")


def gather_record(cfg: Config, topo: Topology, rank: Rank, output_nonfinite: int):
    """``(record, trace)``: every rank's statistics on rank 0 as a :class:`RunRecord`,
    then the record on every rank; the trace document on rank 0 when asked for.
    ``output_nonfinite``: the NaN and inf elements of the root's outputs."""
    rank.finish()
    traffic = rank.traffic
    start, stop = cfg.tokens(topo.rank)
    source = rank.source.stats() if rank.source is not None else None
    mine = RankStats(rank=topo.rank, host=MPI.Get_processor_name(),
                     place=topo.place.describe(), start=start, stop=stop,
                     kernel=rank.source.name if source else rank.kernel.name,
                     source=source, timings=rank.recorder.timings,
                     messages=traffic.messages, bytes=traffic.bytes,
                     overflow=traffic.loss.overflow, m_rounding=traffic.loss.m_rounding,
                     peak_rss_mib=rank.peak_rss_mib, scores_nonfinite=rank.scores_nonfinite,
                     steps=rank.steps, held=rank.count)
    watchdog.rendezvous(topo.comm, "the gathering of results")
    stats = topo.comm.gather(mine, root=0)
    events = (topo.comm.gather(rank.recorder.events, root=0)
              if cfg.trace is not None else None)
    calls = (topo.comm.gather(rank.source.calls, root=0)
             if source is not None and cfg.predict is not None else None)
    record = trace = None
    if topo.is_root:
        record = RunRecord(
            config=cfg, ranks=stats, isa=isa() if source is None else "tl",
            kernel_note=rank.kernel_note,
            kernel_source=None if source is None else dict(file=rank.source.path,
                                                           function=rank.source.name),
            output_nonfinite=output_nonfinite, mpi_library=MPI.Get_library_version().strip().splitlines()[0].strip(),
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
    with watchdog.waiting("rank 0 (the run record)"):
        record = topo.comm.bcast(record, root=0)
    return record, trace
