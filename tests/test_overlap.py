"""Engines that overlap (SPEC's ``[pe] overlap = true``): exact cases, each worked out
by hand in its comments. No MPI: the PEs run as threads."""
import json

import pytest

from gqa_mpi.dsl.predict import trace_events
from gqa_mpi.dsl.profile import from_dict

from test_predict import TABLES, c, predicted

OVERLAP = from_dict(dict(TABLES, pe=dict(TABLES["pe"], overlap=True)))
L = 1e-7                                     # mem_latency_s; memory 1e11 B/s, vector 1e11/s
# whole numbers, so that ties are exact: every call 1 s, a vector element 1 s, 2 bytes
# of memory 1 s, a noc byte 1 s and 1 s of latency
UNIT = from_dict(dict(name="unit", pe=dict(
    call_s=1.0, dot_flops_per_s=1.0, vector_elems_per_s=1.0, mem_bytes_per_s=2.0,
    mem_latency_s=0.0, scratch_bytes=1 << 20, overlap=True),
    noc=dict(latency_s=1.0, bytes_per_s=1.0), inter=dict(latency_s=1.0, bytes_per_s=1.0)))


def replayed(tmp_path, body, profile=OVERLAP, **grid):
    return predicted(tmp_path, body, profile, **grid)


def test_a_load_overlaps_an_independent_dot(tmp_path):
    p = replayed(tmp_path, """
        def k1_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            a = tl.zeros((2, 16), "f32")                # vector: issued c, ends c + 32/1e11
            b = tl.zeros((16, 4), "f32")                # vector: issued 2c, ends 2c + 64/1e11
            x = tl.load(k, shape=(4, 16), dtype="f16")  # dma: issued 3c, 1e-7 + 128/1e11
            y = tl.dot(a, b)                            # matrix: issued 4c, 256/1e12
        """)
    pe = p.pes[0]
    # the dot starts at its issue (a and b are ready), under the load, which ends last
    assert pe.spans[3] == pytest.approx((4 * c, 4 * c + 256 / 1e12), rel=1e-12)
    assert p.step_s == pytest.approx(3 * c + L + 128 / 1e11, rel=1e-12)
    assert pe.bound == "dma" and pe.split["memory_s"] == pytest.approx(L + 128 / 1e11)
    serial = replayed(tmp_path, """
        def k1_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            a = tl.zeros((2, 16), "f32")
            b = tl.zeros((16, 4), "f32")
            x = tl.load(k, shape=(4, 16), dtype="f16")
            y = tl.dot(a, b)
        """, profile=from_dict(TABLES))
    assert serial.step_s == pytest.approx(4 * c + 96 / 1e11 + L + 128 / 1e11 + 256 / 1e12,
                                          rel=1e-12)


def test_a_dependent_chain_cannot_overlap(tmp_path):
    p = replayed(tmp_path, """
        def k2_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            x = tl.load(k, shape=(4, 16), dtype="f16")  # dma: c .. c + 1e-7 + 128/1e11 = X
            y = tl.exp(x)                               # vector: X .. X + 64/1e11
            z = tl.sum(y)                               # vector: .. + 64/1e11 (its operand)
            tl.store(o, z)                              # dma: after z, 1e-7 + 8/1e11
        """)
    X = c + L + 128 / 1e11
    assert p.step_s == pytest.approx(X + 128 / 1e11 + L + 8 / 1e11, rel=1e-12)
    assert [w for w, _ in p.pes[0].why] == ["issue", "read", "read", "read"]


def test_a_copy_to_waits_for_an_earlier_reader_of_its_destination(tmp_path):
    p = replayed(tmp_path, """
        def k3_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            acc = tl.zeros((8,), "f16")          # vector: c .. c + 8/1e11
            tl.store(o, acc)                     # dma: 2c .. 2c + 1e-7 + 16/1e11 = S
            new = tl.full((8,), 2.0, "f16")      # vector: 3c .. 3c + 8/1e11
            tl.copy_to(acc, new)                 # vector: after the store read acc: S ..
            y = acc * 2.0                        # vector: reads the copy's acc
        """, T_q=1, h_q=1, d=16)
    S = 2 * c + L + 16 / 1e11
    pe = p.pes[0]
    assert pe.spans[3] == pytest.approx((S, S + 8 / 1e11), rel=1e-12)
    assert pe.why[3] == ("read", 1)              # the store, as a read of acc (after new)
    assert p.step_s == pytest.approx(S + 16 / 1e11, rel=1e-12)


def test_a_late_message_delays_only_its_consumers(tmp_path):
    p = replayed(tmp_path, """
        def k4_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) == 1:
                x = tl.full((4,), 1.0, "f32")            # vector: c .. c + 4/1e11
                tl.send(dir="intra_W", src=x)            # link: 2c .. 2c + 16/1e10, +1e-7
            else:
                m = tl.recv(dir="intra_E", shape=(4,), dtype="f32")   # ready at arrival A
                y = tl.load(k, shape=(4, 16), dtype="f16")  # dma: 2c .. 2c + 1e-7 + 128/1e11
                z = m * 2.0                              # vector: A .. A + 4/1e11
        """, P=2, S=32)
    A = 2 * c + 16 / 1e10 + 1e-7
    pe0 = p.pes[0]
    assert pe0.spans[1] == pytest.approx((2 * c, 2 * c + L + 128 / 1e11), rel=1e-12)
    assert pe0.spans[2] == pytest.approx((A, A + 4 / 1e11), rel=1e-12)
    assert p.step_s == pytest.approx(A + 4 / 1e11, rel=1e-12) and p.last.rank == 0
    assert pe0.split["wait_s"] == pytest.approx(A - c, rel=1e-12)
    (hop,) = p.critical_path()
    assert (hop["from_rank"], hop["to_rank"]) == (1, 0)
    assert hop["sent_s"] == pytest.approx(2 * c + 16 / 1e10, rel=1e-12)


TIE = """
    def k5_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
        if tl.program_id(axis=0) == 1:
            x = tl.zeros((1,), "f32")                    # vector: 1 .. 2
            tl.send(dir="intra_W", src=x)                # link: 2 .. 6, arrives at 7
        else:
            m = tl.recv(dir="intra_E", shape=(1,), dtype="f32")    # issued 1, ready 7
            x = tl.load(k, shape=(5,), dtype="f16")      # dma: 2 .. 2 + 10/2 = 7
            y = {}                                       # vector: both ready at 7
"""


@pytest.mark.parametrize("expr, hops", [("m + x", 1), ("x + m", 0)])
def test_the_critical_path_through_a_tie_takes_the_first_operand(tmp_path, expr, hops):
    """y's start, 7, is set by m (the message's) and by x (the load's) at once: the
    first operand wins, so the path goes back through the message or stays home."""
    p = replayed(tmp_path, TIE.format(expr), profile=UNIT, P=2, S=32)
    assert p.step_s == 12.0 and p.pes[1].finish == 6.0       # y: 7 .. 7 + 5
    assert len(p.critical_path()) == hops
    if hops:
        assert p.critical_path()[0]["waited_s"] == 6.0


def test_the_trace_splits_a_pe_into_its_engines_and_the_json_names_the_bound(tmp_path):
    p = replayed(tmp_path, TIE.format("m + x"), profile=UNIT, P=2, S=32)
    names = {e["args"]["name"] for e in trace_events(p) if e["ph"] == "M"} - {
        "predicted on unit"}
    assert names == {f"rank {r} {e}" for r in (0, 1) for e in ("dma", "matrix", "vector",
                                                                "link")}
    out = p.to_json(0)
    json.dumps(out)
    assert out["overlap"] is True and out["pes"][0]["bound"] == "dma"    # 5 s of dma, 5 of vector
    assert out["pes"][0]["busy_s"] == dict(dma=5.0, matrix=0.0, vector=5.0, link=0.0)


def test_a_profile_with_overlap_is_checked_and_round_trips(tmp_path):
    import tomllib
    from gqa_mpi.dsl.profile import to_toml
    with pytest.raises(ValueError, match="pe.overlap must be true or false, got 'yes'"):
        from_dict(dict(TABLES, pe=dict(TABLES["pe"], overlap="yes")))
    assert from_dict(tomllib.loads(to_toml(OVERLAP))).overlap is True
    assert from_dict(TABLES).overlap is False


def test_the_report_says_the_engines_overlap_and_which_bound_the_last_pe(tmp_path):
    from types import SimpleNamespace
    from gqa_mpi.app.report import _predicted_lines
    p = replayed(tmp_path, TIE.format("m + x"), profile=UNIT, P=2, S=32)
    record = SimpleNamespace(predicted=p.to_json(0), ranks=[SimpleNamespace(
        place="cube 0 / PE 0"), SimpleNamespace(place="cube 0 / PE 1")])
    head, path = _predicted_lines(record)
    assert head.startswith("predicted step 12 s on unit (engines overlap); last PE rank 0, "
                           "cube 0 / PE 0: bound by dma (5 s busy of 12 s); busy memory 5 s")
    assert path.startswith("critical  1 hop(s) to rank 0: rank 1 -intra_W")
