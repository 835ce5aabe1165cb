"""Kernel fidelity through real launches: the trace file, and the reference kernel
against exact attention and against the float64 model of its arithmetic."""
import json
import os

import numpy as np
import pytest

from whole_reference import attention_reference

from util import launch, read_json, spec_kernel_model, write_inputs


@pytest.mark.launch
def test_trace_file_opens_and_shows_the_chain(tmp_path):
    t = tmp_path / "t.json"
    proc = launch(16, ["--seq-len", 4096, "--trace", t])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(t.read_text())
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert "rank 13: cube 1 / PE 5 (row 1, col 1)" in names and len(names) == 16
    msgs = [e for e in events if e.get("cat") == "message"]
    assert len(msgs) == 2 * 3 * 15                       # each message seen by both ends
    for e in msgs:
        assert {"op", "dir", "peer", "tensor", "bytes"} <= set(e["args"])
        assert e["ph"] == "X" and e["dur"] >= 0
    # rank 0 receives from intra_E (1), intra_S (4) and E (8), in that order
    got = [(e["args"]["dir"], e["args"]["peer"]) for e in msgs
           if e["pid"] == 0 and e["args"]["tensor"] == "m"]
    assert got == [("intra_E", 1), ("intra_S", 4), ("E", 8)]
    # Perfetto draws the chain: an arrow from each send to its receive
    starts = [e for e in events if e["ph"] == "s"]
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == 3 * 15
    assert {(s["pid"], ends[s["id"]]["pid"]) for s in starts if s["name"].startswith("m ")} == {
        (e["pid"], e["args"]["peer"]) for e in msgs if e["args"]["op"] == "send"}
    # every rank's share of the check, after its steps, on the same time axis
    checks = {e["pid"]: e for e in events if e["name"] == "check" and e.get("cat") == "phase"}
    last = {e["pid"]: e["ts"] + e["dur"] for e in events
            if e.get("cat") == "phase" and e["name"] != "check"}
    assert sorted(checks) == list(range(16))
    assert all(checks[r]["ts"] >= last[r] and checks[r]["dur"] > 0 for r in checks)


REFERENCE = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                          "reference", "_gqa_attention_decode_long.py"))
needs_reference = pytest.mark.skipif(not os.path.exists(REFERENCE),
                                     reason=f"the reference kernel is not at {REFERENCE}")


@pytest.mark.launch
@needs_reference
def test_reference_kernel_equals_exact_on_symmetric_inputs(tmp_path):
    """T_q = 1, h_kv = 1, S_kv a multiple of C*P, each slice one symmetric d x d block
    (so the kernel's reshape of K is its transpose): no defect shows."""
    rng = np.random.default_rng(0)
    d, n, h_q = 8, 4, 4
    S = n * d
    blocks = rng.integers(-4, 5, size=(S // d, d, d)) / 8
    k = (blocks + blocks.transpose(0, 2, 1)).reshape(S, d).astype(np.float16)
    v = (rng.integers(-8, 9, size=(S, d)) / 4).astype(np.float16)
    q = (rng.integers(-4, 5, size=(1, h_q * d)) / 4).astype(np.float16)
    o = tmp_path / "o.npy"
    proc = launch(n, ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", d,
                      "--kernel-source", REFERENCE, "--softmax-scale", 1, "--output", o])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exact = attention_reference(q, k, v, h_kv=1, scale=1.0)
    np.testing.assert_allclose(np.load(o), exact, atol=1e-2 * np.abs(exact).max())


@pytest.mark.launch
@needs_reference
def test_reference_kernel_equals_its_model_and_differs_from_exact_attention(tmp_path):
    rng = np.random.default_rng(1)
    d, h_q, h_kv, T_q, n = 16, 8, 2, 2, 4
    S = n * 50 + 3                                         # 3 tail tokens dropped
    q = (rng.standard_normal((T_q, h_q * d)) / 4).astype(np.float32)
    k = rng.standard_normal((S, h_kv * d)).astype(np.float32)
    v = rng.standard_normal((S, h_kv * d)).astype(np.float32)
    o, j = tmp_path / "o.npy", tmp_path / "r.json"
    proc = launch(n, ["--inputs", write_inputs(tmp_path / "in", q, k, v), "--head-dim", d,
                      "--kernel-source", REFERENCE, "--check-against", "kernel-model",
                      "--softmax-scale", 1, "--output", o, "--json", j])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = np.load(o)
    model = spec_kernel_model(q, k, v, h_kv=h_kv, n=n, tile=1024)
    exact = attention_reference(q, k, v, h_kv=h_kv, scale=1.0)
    assert np.abs(got - model).max() < 1e-2 * np.abs(model).max()
    assert np.abs(got - exact).max() > 0.1                 # the defects are visible
    rec = read_json(j)
    assert rec["vs_exact"]["max_abs_err"] == pytest.approx(np.abs(got - exact).max(),
                                                                   rel=1e-3)
    check = next(x for x in proc.stdout.splitlines() if x.startswith("check"))
    assert "model of the reference kernel's arithmetic: PASSED" in check
    assert "exact     the kernel's arithmetic differs from exact attention" in proc.stdout


def test_kernel_faithful_is_retired_in_one_line(capsys):
    from gqa_mpi.app import cli
    assert cli.main(["--kernel-faithful"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--kernel-source FILE" in err, err
