"""The typed run record and its strict JSON (no MPI)."""
import json

import pytest

from gqa_mpi.config.config import Config
from gqa_mpi.app.outputs import write_json
from gqa_mpi.app.record import FORMAT, Comparison, RankStats, RunRecord


def stats(rank, local, reduce, **kw):
    base = dict(rank=rank, host=f"node{rank // 2}", place=f"cube 0 / PE {rank}", start=rank * 10,
                stop=rank * 10 + 10, kernel="fused", timings=dict(
                    inputs=0.5, local_attention=local, reduce=reduce, total=1.0),
                messages=3, bytes=96, overflow=0, m_rounding=0.0, peak_rss_mib=100.0 + rank,
                scores_nonfinite=False, held=10)
    base.update(kw)
    base.setdefault("steps", [{p: base["timings"][p] for p in ("local_attention", "reduce",
                                                              "finalize") if p in base["timings"]}])
    return RankStats(**base)


def record(**kw):
    ranks = [stats(0, 0.2, 0.05, messages=0, bytes=0, timings=dict(
                 inputs=0.5, local_attention=0.2, reduce=0.05, finalize=0.01, total=1.0)),
             stats(1, 0.3, 0.01), stats(2, 0.1, 0.02, overflow=2, m_rounding=0.01),
             stats(3, 0.4, 0.0, scores_nonfinite=True)]
    return RunRecord(config=Config(seq_len=40, wire="fp32").placed(4), ranks=ranks,
                     isa="avx2", **kw)


def test_summaries_are_computed_not_stored():
    rec = record()
    tm = rec.timings()
    assert list(tm) == ["inputs", "local_attention", "reduce", "finalize", "step", "total"]
    assert tm["local_attention"] == dict(min=0.1, median=0.25, max=0.4)
    assert tm["step"]["max"] == pytest.approx(0.4) and tm["finalize"]["min"] == 0.0
    assert (rec.messages, rec.bytes, rec.overflow, rec.m_rounding) == (9, 288, 2, 0.01)
    assert rec.tokens == dict(min=10, max=10) and rec.hosts == ["node0", "node1"]
    assert rec.scores_nonfinite_ranks == [3] and not rec.passed          # the overflow
    assert "timings" not in json.dumps({k: v for k, v in rec.to_json().items()
                                        if k != "ranks" and k != "units"})


def test_several_steps_give_steady_state_medians_and_latency_percentiles():
    steps = [dict(local_attention=0.1 * (i + 1), reduce=0.01) for i in range(5)]
    rec = RunRecord(config=Config(steps=5).placed(2), isa="none", ranks=[
        stats(0, 0, 0, steps=steps), stats(1, 0, 0, steps=steps[::-1], held=12)])
    assert rec.step_latency() == pytest.approx([0.51, 0.41, 0.31, 0.41, 0.51])
    lat = rec.latency()
    assert lat["p50"] == pytest.approx(0.41) and lat["max"] == pytest.approx(0.51)
    assert rec.timings()["local_attention"]["max"] == pytest.approx(0.3)    # median step
    assert rec.held == dict(min=10, max=12)


def test_json_round_trip_is_strict_and_says_its_units(tmp_path):
    inf = Comparison(max_abs_err=float("inf"), max_rel_err=float("inf"), tolerance=1e-4,
                     floor=1e-4, control_rel_err=None, finite=False, nonfinite=3,
                     passed=False)
    rec = record(checks=[inf], checked_steps=[0], mpi_library="MPICH Version: 5", created="2026-12-03T09:00:00Z",
                 written=dict(json="r.json"))
    path = tmp_path / "r.json"
    write_json(str(path), rec.to_json())
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    raw = json.loads(text)
    assert raw["format"] == FORMAT and raw["units"]["timings"] == "s"
    assert raw["version"] and raw["ranks"][1]["host"] == "node0"
    back = RunRecord.load(str(path))
    assert back == rec                                 # null read back as inf
    assert back.config.layout.size == 4
    # a dependent default is recorded as what ran
    assert Config.from_json(Config(reduce="mpi").to_json()).wire == "packed"


def test_a_record_of_another_format_is_refused():
    with pytest.raises(ValueError, match="not a gqa_mpi.run"):
        RunRecord.from_json(dict(format="something/1"))


def test_beyond_local_is_the_step_past_its_slowest_sweep():
    a = [dict(local_attention=0.3, reduce=0.05), dict(local_attention=0.1, reduce=0.25)]
    b = [dict(local_attention=0.2, reduce=0.12), dict(local_attention=0.3, reduce=0.02)]
    rec = RunRecord(config=Config(steps=2).placed(2), isa="none",
                    ranks=[stats(0, 0, 0, steps=a), stats(1, 0, 0, steps=b)])
    assert rec.beyond_local() == pytest.approx([0.35 - 0.3, 0.35 - 0.3])


def test_ranks_that_share_cores_are_named_in_the_record_and_the_report(tmp_path):
    """Two hosts of 2 ranks each: one host with 1 core (2 ranks a core), one with 4
    cores but a load of 6 at the start; the record and the report say both, and a
    host with a core per rank and no load says nothing."""
    from gqa_mpi.app.report import format_report
    rec = record()
    for r in rec.ranks:                     # node0: ranks 0, 1; node1: ranks 2, 3
        r.cores, r.load = (1, 0.2) if r.host == "node0" else (4, 6.0)
    assert rec.crowded == [dict(host="node0", ranks=2, cores=1, load=0.2, busy=False),
                           dict(host="node1", ranks=2, cores=4, load=6.0, busy=True)]
    assert rec.ranks_per_core == 2.0
    text = format_report(rec)
    assert ("note      node0: 2 rank(s) on 1 core(s): the times below are of shared cores, "
            "not of one rank on a core of its own") in text
    assert "node1: 2 rank(s) on 4 core(s), already busy at the start (load 6.0)" in text
    path = tmp_path / "r.json"
    write_json(str(path), rec.to_json())
    assert json.loads(path.read_text())["crowded"][0]["host"] == "node0"
    for r in rec.ranks:
        r.cores, r.load = 4, 0.5
    assert rec.crowded == [] and "rank(s) on" not in format_report(rec)
    for r in rec.ranks:          # bound to cores 0 and 1 of a 64-core host: 1 a core
        r.cores, r.load, r.cpus = 64, 0.5, [r.rank % 2]
    assert rec.crowded == [] and rec.ranks_per_core == 1.0
    for r in rec.ranks:          # both ranks of a host allowed the same one core
        r.cpus = [7]
    assert [h["cores"] for h in rec.crowded] == [1, 1] and rec.ranks_per_core == 2.0
