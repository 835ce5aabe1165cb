"""``--kernel-source``: kernels run as written on MPI ranks, with their faults, deadlocks
and numerics reported in their terms. Where MPI is not the point, a test runs the
same grid in process (tests/test_in_process.py holds that run to the MPI one). The
reference kernel's tests run where ``../shared/reference/`` exists (as in CI) and skip
elsewhere."""
import json
import os
import textwrap

import numpy as np
import pytest

from util import in_process, launch

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "reference",
                                          "_gqa_attention_decode_long.py"))
needs_reference = pytest.mark.skipif(not os.path.exists(REFERENCE),
                                     reason=f"the reference kernel is not at {REFERENCE}")
SMALL = ["--heads-q", 4, "--heads-kv", 1, "--head-dim", 16]


def kernel(tmp_path, body):
    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def line(proc, head):
    return next(x for x in proc.stdout.splitlines() if x.startswith(head))


@pytest.mark.launch
def test_corrected_kernel_passes_and_its_trace_shows_every_call(tmp_path):
    """A real launch with --trace; the other grids, S_kv < C*P and the reference
    kernel's passing and overflowing cases run in-process in tests/test_mpi.py."""
    n, grid = 8, ["--cubes", 2]
    trace = tmp_path / "t.json"
    proc = launch(n, ["--kernel-source", "builtin:corrected", "--seq-len", 1501,
                      "--heads-q", 8, "--heads-kv", 2, "--head-dim", 16, "--queries", 2,
                      "--trace", trace] + grid)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert line(proc, "check").endswith("PASSED")
    assert "(0 never read)" in line(proc, "read")
    events = json.loads(trace.read_text())["traceEvents"]
    calls = [e for e in events if e.get("cat") == "tl"]
    assert {"tl.load", "tl.dot", "tl.send"} <= {e["name"] for e in calls}
    assert all(isinstance(e["args"]["line"], int) for e in calls)
    assert any(e["ph"] == "C" and e["name"] == "scratch" for e in events)
    sends = [e for e in events if e.get("cat") == "message" and e["args"]["op"] == "send"]
    assert sends and all(e["args"]["comm"] in ("gqa_mpi.cube", "gqa_mpi.inter")
                         for e in sends)
    assert sum(e["ph"] == "s" for e in events) == len(sends)          # one arrow each


@needs_reference
def test_reference_kernel_fails_on_random_gqa_and_agrees_with_its_model(capsys, tmp_path):
    """In process (its O is the MPI run's, tests/test_in_process.py)."""
    # 5003 tokens on 4 ranks: slices of 1251, 1251, 1251, 1250, of which the kernel
    # reads 1250 (where the model once dropped the cache's tail instead)
    args = ["--seq-len", 5003, "--heads-q", 8, "--heads-kv", 2, "--head-dim", 32]
    src, model = tmp_path / "src.npy", tmp_path / "model.npy"
    proc = in_process(capsys, 4, ["--kernel-source", REFERENCE, "--softmax-scale", 1,
                                  "--output", src] + args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert line(proc, "check").endswith("FAILED")
    # with h_kv = 2 the reshape reads only half of each rank's row block
    assert "K 2500 of S_kv=5003 tokens (2503 never read)" in line(proc, "read")
    held = in_process(capsys, 4, ["--kernel-source", REFERENCE, "--softmax-scale", 1,
                                  "--check-against", "kernel-model", "--output", model] + args)
    assert held.returncode == 0, held.stdout + held.stderr
    assert line(held, "check").endswith("PASSED")
    assert "differs from exact attention (scale 1)" in line(held, "exact")
    assert np.array_equal(np.load(src), np.load(model))       # the same kernel, run twice


@needs_reference
def test_reference_kernel_short_row_is_a_fault_not_a_hang(capsys):
    proc = in_process(capsys, 6, ["--kernel-source", REFERENCE, "--seq-len", 1200] + SMALL)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "tl.recv(dir='intra_E'): PE 5 of cube" in proc.stderr
    assert "would wait here forever" in proc.stderr
    assert "_gqa_attention_decode_long.py:" in proc.stderr


FAULTS = {
    "out of bounds": ("""
        def oob_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            x = tl.load(k, shape=(S_kv, h_kv * d), dtype="f16")
        """, "runs past the end of K", ":3)"),
    "byte count": ("""
        def size_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            if pe == 1:
                tl.send(dir="intra_W", src=tl.zeros((3,), "f32"))
            if pe == 0:
                tl.recv(dir="intra_E", shape=(3,), dtype="f16")
        """, "expects 6 bytes (shape (3,) f16), but the message sent has 12 bytes", ":7)"),
    "own exception": ("""
        def boom_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) == 1:
                {}["nope"]
        """, "KeyError: 'nope'", "line 4, in boom_kernel"),
    "deadlock": ("""
        def dead_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            other = "intra_E" if pe % 2 == 0 else "intra_W"
            y = tl.recv(dir=other, shape=(4,), dtype="f32")
            tl.send(dir=other, src=y)
        """, "rank 1 (cube 0, PE 1) waits in tl.recv(dir='intra_W') at", "k.py:5"),
    "never received": ("""
        def lost_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) == 1:
                tl.send(dir="intra_W", src=tl.zeros((4,), "f32"))
        """, "1 message(s) sent with tl.send were never received", ""),
    "a call tl lacks, reached at run time": ("""
        def dyn_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            return getattr(tl, "no" + "such")
        """, "tl.nosuch: gqa_mpi's tl has no such call", ":3)"),
    "the kernel's own exits": ("""
        import sys
        def quits_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            if pe == 1:
                sys.exit(3)
            if pe == 0:
                raise KeyboardInterrupt
        """, "KeyboardInterrupt", "line 6, in quits_kernel"),   # both ranks' exits
}


@pytest.mark.launch
@pytest.mark.parametrize("name", ["own exception", "deadlock"])
def test_a_fault_is_one_report_and_exit_5_on_every_rank(tmp_path, name):
    """On MPI ranks: one rank's fault ends the job (MPI_Abort), and the deadlock watch;
    every case of FAULTS runs in process in tests/test_in_process.py, the same report."""
    body, says, where = FAULTS[name]
    proc = launch(2, ["--kernel-source", kernel(tmp_path, body), "--seq-len", 64] + SMALL,
                  timeout=30)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert says in proc.stderr and where in proc.stderr
    assert "Traceback" not in proc.stderr                 # a report, never our traceback
    assert "gqa_mpi/" not in proc.stderr.split("error:", 1)[1]   # only the kernel's frames


def test_a_fault_in_a_decode_loop_names_its_step(capsys, tmp_path):
    """--steps 5 with a kernel that reads past K once the cache holds 67 tokens: the
    report names the step and its S_kv, and so does the kernel's own exception (in
    process: the report is the MPI run's)."""
    body = """
        def late_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if S_kv == 67:
                tl.load(k, shape=(S_kv, h_kv * d), dtype="f16")
            if S_kv == 68:
                raise KeyError("late")
        """
    path = kernel(tmp_path, body)
    proc = in_process(capsys, 2, ["--kernel-source", path, "--seq-len", 64, "--steps", 5]
                      + SMALL)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "in decode step 3 (S_kv=67): " in proc.stderr and "runs past the end of K" in proc.stderr
    head = proc.stderr.index("problem   B=1 T_q=1 S_kv=64")          # what ran, first
    assert head < proc.stderr.index("topology  C=1 cubes x P=2") < proc.stderr.index("fault")
    proc = in_process(capsys, 1, ["--kernel-source", path, "--seq-len", 68] + SMALL)
    assert proc.returncode == 5 and "raised on rank 0 (cube 0, PE 0):" in proc.stderr


@pytest.mark.launch
def test_a_fault_every_rank_hits_ends_the_job_without_mpi_abort(tmp_path):
    """Every rank reads past K: rank 0 hears from them all, reports once, and every rank
    leaves through MPI_Finalize with exit 5: no MPI_Abort, so no launcher's abort line
    after the report."""
    body, says, _ = FAULTS["out of bounds"]
    proc = launch(4, ["--kernel-source", kernel(tmp_path, body), "--seq-len", 64] + SMALL,
                  timeout=60)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert says in proc.stderr and "the same fault on 3 more rank(s): 1, 2, 3" in proc.stderr
    assert "Abort" not in proc.stderr and "BAD TERMINATION" not in proc.stdout + proc.stderr


@pytest.mark.launch
def test_every_rank_of_a_16_rank_deadlock_leaves_with_5(tmp_path):
    """MPICH's launcher reported the SIGKILL of the other ranks (exit 9) now and then
    when the job was aborted on another communicator than the world's."""
    body = """
        def dead_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            if tl.program_id(axis=0) == 1:
                tl.recv(dir="intra_W", shape=(4,), dtype="f32")
        """
    proc = launch(16, ["--kernel-source", kernel(tmp_path, body), "--seq-len", 1600] + SMALL,
                  timeout=60)                  # 20 of 20 by hand; one keeps the suite short
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "kernel deadlock" in proc.stderr


SPIN = """
    def spin_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
        if tl.program_id(axis=0) == 1:
            while True:
                pass
        tl.recv(dir="intra_E", shape=(4,), dtype="f32")
    """
"""PE 1 spins, PE 0 waits for it: only --timeout ends the run."""


@pytest.mark.launch
def test_timeout_names_the_spinning_rank_not_the_ones_waiting_on_it(tmp_path):
    proc = launch(2, ["--kernel-source", kernel(tmp_path, SPIN), "--seq-len", 64, "--timeout",
                      2] + SMALL, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rank 1 is stuck in the kernel under test" in proc.stderr, proc.stderr
    assert "rank 0 is stuck" not in proc.stderr      # it waits in tl.recv: not stuck


@pytest.mark.launch
def test_an_input_file_with_a_long_header_is_read_by_every_rank(tmp_path):
    """A valid .npy whose header is 20-65 KB passed rank 0's check, then every rank's
    own np.load refused it."""
    import struct
    rng = np.random.default_rng(0)
    arrays = dict(q=rng.standard_normal((1, 64)), k=rng.standard_normal((100, 16)),
                  v=rng.standard_normal((100, 16)))
    for name, a in arrays.items():
        a = a.astype(np.float32)
        head = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (a.shape,)
        head += " " * (30000 - len(head) - 10 - 1) + "\n"
        with open(tmp_path / f"{name}.npy", "wb") as f:
            f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", len(head)) + head.encode())
            f.write(a.tobytes())
    proc = launch(2, ["--inputs", tmp_path, "--head-dim", 16])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_here(capsys, *argv):
    from util import run_cli
    return run_cli(capsys, *argv)


@pytest.mark.parametrize("body,extra,words", [
    ("def two_kernel(q, k, *, tl):\n    pass\n", [], "cannot take SPEC's arguments"),
    (None, ["--grid", "1x8", "--pes", 1], "assumes the card's PE grid of 4 columns"),
])
def test_what_a_kernel_cannot_run_is_refused_at_start_up(capsys, tmp_path, body, extra, words):
    from util import assert_refused
    source = kernel(tmp_path, body) if body else "builtin:corrected"
    assert_refused(*run_here(capsys, "--kernel-source", source, *extra), words)


def test_a_kernel_files_top_level_runs_once_and_a_deliberate_inf_is_no_numerics_line(
        capsys, tmp_path):
    body = """
        print("TOP LEVEL")
        def once_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            m = tl.full((4,), float("-inf"), "f32")
        """
    code, out, err = run_here(capsys, "--kernel-source", kernel(tmp_path, body), "--seq-len",
                              64, *SMALL, "--no-check")
    assert code == 0, out + err
    assert out.count("TOP LEVEL") == 1 and "numerics" not in out


@pytest.mark.launch
def test_a_fault_every_rank_hits_is_reported_once_with_the_ranks_counted(tmp_path):
    body = """
        def oob_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            x = tl.load(k, shape=(S_kv, h_kv * d), dtype="f16")
        """
    proc = launch(4, ["--kernel-source", kernel(tmp_path, body), "--seq-len", 64] + SMALL,
                  timeout=30)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    faults = [x for x in proc.stderr.splitlines() if "kernel fault on rank" in x]
    assert len(faults) == 1 and "kernel fault on rank 0" in faults[0], proc.stderr
    assert "the same fault on 3 more rank(s): 1, 2, 3" in proc.stderr


def test_the_numerics_line_names_each_rank_once(capsys, tmp_path):
    body = """
        def hot_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            for _ in range(3):
                x = tl.exp(tl.full((4,), 20.0, "f16"))        # e^20 > 65504, three times
        """
    code, out, err = run_here(capsys, "--kernel-source", kernel(tmp_path, body), "--seq-len",
                              64, *SMALL, "--no-check")
    assert "numerics  inf or NaN first made by tl.exp at line 4 on rank(s) 0\n" in out, out


@pytest.mark.launch
def test_narrow_memory_runs_end_to_end_and_the_report_says_what_memory_holds():
    proc = launch(2, ["--kernel-source", "builtin:corrected", "--kv-dtype", "float8_e4m3",
                      "--seq-len", 500] + SMALL)
    assert proc.returncode == 0, proc.stderr
    assert "(memory: K and V float8_e4m3, Q and O float16)" in line(proc, "kernel")
    check = line(proc, "check")
    assert "tolerance 0.08" in check and "float8_e4m3 values" in check and check.endswith(
        "PASSED")
