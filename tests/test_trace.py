"""Per-rank timings and the Chrome trace-event document (no MPI)."""
from gqa_mpi.step.trace import Recorder, chrome_trace, flows


def two_ranks():
    """Rank 1 sends m then l to rank 0, twice each; rank 0 receives them."""
    send, recv = Recorder(1, events=True), Recorder(0, events=True)
    for origin in (send, recv):
        origin.start()
    for _ in range(2):
        for tensor in "ml":
            send.message("send", "intra_W", 0, tensor, 64, 0.0 + send.origin, 0.001 + send.origin)
            recv.message("recv", "intra_E", 1, tensor, 64, 0.002 + recv.origin,
                         0.003 + recv.origin)
    return [recv.events, send.events]


def test_recorder_times_phases_and_keeps_events_only_when_asked():
    rec = Recorder(3)
    with rec.phase("local_attention", tile=8):
        pass
    with rec.phase("local_attention"):
        pass
    with rec.span("send intra_W", "chain"):
        pass
    assert set(rec.timings) == {"local_attention"} and rec.events is None
    traced = Recorder(3, events=True, tiles=True)
    with traced.phase("reduce"):
        traced.tile(0, 0, 16, traced.origin, traced.origin + 1e-3)
    assert [e["name"] for e in traced.events] == ["tile 0", "reduce"]
    assert all(e["pid"] == 3 and e["ph"] == "X" and e["dur"] >= 0 for e in traced.events)


def test_flows_pair_the_kth_send_with_the_kth_receive():
    events = two_ranks()
    arrows = flows(events)
    starts = [a for a in arrows if a["ph"] == "s"]
    ends = {a["id"]: a for a in arrows if a["ph"] == "f"}
    assert len(starts) == len(ends) == 4
    for s in starts:
        f = ends[s["id"]]
        assert (s["pid"], f["pid"]) == (1, 0) and f["bp"] == "e"
        assert s["ts"] < f["ts"]                         # each end inside its slice
        assert s["name"] == f["name"] and s["name"].endswith("1->0")
    assert len({s["id"] for s in starts}) == 4


def test_chrome_trace_names_every_rank_and_draws_the_arrows():
    doc = chrome_trace(two_ranks(), ["cube 0 / PE 0 (row 0, col 0)", "cube 0 / PE 1 (row 0, col 1)"])
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names == ["rank 0: cube 0 / PE 0 (row 0, col 0)", "rank 1: cube 0 / PE 1 (row 0, col 1)"]
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 8
    assert sum(e["ph"] in "sf" for e in doc["traceEvents"]) == 8
    assert doc["displayTimeUnit"] == "ms"


def test_unmatched_messages_draw_no_arrow():
    recv_only = [[e for e in two_ranks()[0]], []]
    assert flows(recv_only) == []


def test_events_share_one_time_axis_and_arrows_go_forward():
    """Each rank offsets its clock by rank 0's wall time at the start, and an arrow
    leaves at its send's start and lands at its receive's end."""
    from gqa_mpi.step.trace import Recorder, flows
    import time
    wall = time.time()
    a, b = Recorder(0, events=True), Recorder(1, events=True)
    a.start(wall)
    time.sleep(0.01)
    b.start(wall)                  # started 10 ms later, on the same time axis
    t = time.perf_counter()
    a.message("send", "intra_W", 1, "m", 4, t, t + 1e-4)
    b.message("recv", "intra_E", 0, "m", 4, t, t + 1e-4)
    assert abs(b.events[0]["ts"] - a.events[0]["ts"]) < 2e3  # one instant, one time
    lone = Recorder(1, events=True)
    lone.start()                   # its own origin: the same instant 10 ms earlier
    lone.message("recv", "intra_E", 0, "m", 4, t, t + 1e-4)
    assert a.events[0]["ts"] - lone.events[0]["ts"] > 9e3
    s, f = flows([a.events, b.events])
    assert s["ts"] == a.events[0]["ts"] and f["ts"] > s["ts"]
    assert b.events[0]["ts"] <= f["ts"] <= b.events[0]["ts"] + b.events[0]["dur"]


def test_a_paused_recorder_keeps_timings_but_no_events():
    from gqa_mpi.step.trace import Recorder
    rec = Recorder(0, events=True)
    rec.paused = True
    with rec.phase("local_attention"):
        pass
    rec.counter("scratch", 1)
    assert rec.events == [] and "local_attention" in rec.timings and rec.last
