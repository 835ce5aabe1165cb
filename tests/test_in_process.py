"""``--in-process`` and ``gqa_mpi.in_process``: every PE a thread of this process, no
MPI; the same run, report, faults and O as on MPI ranks. Most run here, in pytest's
process; those that launch a process say why."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_kernel_source import FAULTS, SMALL, SPIN, kernel
from util import launch, refused, run_cli
from whole_reference import attention_reference

HERE = os.path.dirname(os.path.abspath(__file__))
EVERY_CALL = os.path.join(HERE, "kernels", "every_call.py")
TRITON_FA = os.path.join(HERE, "kernels", "triton_fa.py")


def here(capsys, *argv):
    """``python -m gqa_mpi --in-process argv`` in this process: (code, out, err)."""
    return run_cli(capsys, "--in-process", *argv)


def lines(out, head):
    return [x for x in out.splitlines() if x.startswith(head)]


@pytest.mark.parametrize("kernel_source,C,P,S", [(f"builtin:{k}", *grid) for k, grids in (
    ("corrected", [(1, 1, 3001), (2, 8, 3001), (2, 6, 3001), (3, 5, 3001), (2, 8, 10)]),
    ("tree", [(2, 6, 3001), (3, 5, 3001), (2, 8, 10), (16, 1, 3001)]),
    ("pipelined", [(2, 6, 3001), (3, 5, 3001), (2, 8, 10), (16, 1, 3001)]),
    ("prefetch", [(1, 1, 3001), (2, 6, 3001), (2, 8, 10)]),      # the corrected chain
    ("flash2", [(1, 1, 3001), (3, 5, 3001), (2, 8, 10)]))
    for grid in grids] + [(EVERY_CALL, 2, 8, 3001), (TRITON_FA, 2, 6, 3001)])
def test_shipped_kernels_and_every_name_of_the_vocabulary_pass_on_every_grid(
        capsys, tmp_path, kernel_source, C, P, S):
    """The shipped kernels, tests/kernels/every_call.py (every call of tl's VOCABULARY:
    test_tl holds it to that) and triton_fa.py (``tl.dot(p, v, acc)``, load hints),
    against float64 exact attention: full and
    short rows, an S_kv that is no multiple of C*P, fewer tokens than ranks, a line of
    16 cubes. In process, whose O is the MPI run's bit for bit (the launch test below
    holds it to that)."""
    record = tmp_path / "r.json"
    code, out, err = here(capsys, "--kernel-source", kernel_source, "--cubes", C, "--pes", P,
                          "--seq-len", S, "--heads-q", 8, "--heads-kv", 2, "--head-dim", 16,
                          "--queries", 2, "--quiet", "--json", record)
    assert code == 0, out + err
    r = json.loads(record.read_text())
    assert r["in_process"] and r["checks"][0]["passed"], r["checks"]
    assert sum(x["source"]["k_rows"] for x in r["ranks"]) == S       # every token read
    assert r["checks"][0]["max_rel_err"] < 2e-3                       # float16 O


def test_the_emulated_step_runs_in_process_on_every_schedule(capsys):
    for reduce in ("chain", "tree", "mpi", "allgather", "alltoall", "pipelined-chain"):
        code, out, err = here(capsys, "--cubes", 2, "--pes", 3, "--seq-len", 999,
                              "--reduce", reduce)
        assert code == 0 and lines(out, "check")[0].endswith("PASSED"), (reduce, out + err)


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_fault_is_one_report_and_exit_5(capsys, tmp_path, name):
    """test_kernel_source's faults, in process: the report MPI ranks give (its MPI
    tests launch the abort of one rank's fault and the deadlock)."""
    body, says, where = FAULTS[name]
    code, out, err = here(capsys, "--kernel-source", kernel(tmp_path, body), "--cubes", 1,
                          "--pes", 2, "--seq-len", 64, *SMALL)
    assert code == 5, out + err
    assert says in err and where in err
    assert "Traceback" not in err                 # a report, never our traceback
    assert "gqa_mpi/" not in err.split("error:", 1)[1]   # only the kernel's frames


def test_device_print_in_process_reaches_rank_0_by_pe_in_program_order(capsys, tmp_path):
    body = """
        def show_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            tl.device_print("first", pe)
            tl.device_print("then", tl.full((2,), 0.5, "f32"))
        """
    code, out, err = here(capsys, "--kernel-source", kernel(tmp_path, body), "--cubes", 1,
                          "--pes", 3, "--seq-len", 48, *SMALL)
    assert [x for x in out.splitlines() if x.startswith("[rank")] == [
        f"[rank {r}: cube 0 / PE {r}] {what}" for r in range(3)
        for what in (f"first {r}", "then [0.5, 0.5]")], out + err


def test_an_abbreviation_argparse_takes_runs_in_process_too(capsys):
    code, out, err = run_cli(capsys, "--in-proc", "--cubes", 1, "--pes", 2, "--seq-len", 100)
    assert code == 0 and lines(out, "note      in process: the 2 PEs"), out + err


def test_in_process_refuses_in_one_line(capsys, monkeypatch):
    refused(capsys, "--in-process", "--kernel-source", "nosuch.py", words="no such file")
    refused(capsys, "--in-process", "--cubes", 40, "--pes", 40, words="at most 1024")
    refused(capsys, "--in-process", "--cubes", 0, words="must be a positive integer")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    refused(capsys, "--in-process", words="runs every PE in this one process")


def test_the_library_runs_ranks_in_process():
    """``in_process(n, fn)``: ``fn(comm)`` on n threads; decode on each rank's slice
    against float64 attention; one rank's ValueError raised in the caller."""
    from gqa_mpi import decode, in_process
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 8 * 16)).astype(np.float32)
    k, v = (rng.standard_normal((800, 2 * 16)).astype(np.float16) for _ in "kv")

    def each(comm):
        mine = slice(comm.rank * 100, comm.rank * 100 + 100)
        return decode(q, k[mine], v[mine], comm=comm, heads_kv=2,
                      kernel_source="builtin:corrected")
    got = in_process(8, each)
    assert got[1].output is None and got[0].record.in_process
    ref = attention_reference(q.astype(np.float16), k, v, h_kv=2)
    assert np.abs(got[0].output - ref).max() / np.abs(ref).max() < 2e-3
    with pytest.raises(ValueError, match="differ in shape"):
        in_process(3, lambda comm: decode(q, k, v[:3], comm=comm, heads_kv=2))
    with pytest.raises(ValueError, match="number of ranks"):
        in_process(0, each)


def test_in_process_topology_is_the_grids():
    """The in-process Create_cart, Sub, Shift and distributed graph give every rank
    SPEC's neighbours, short last rows included."""
    from gqa_mpi import in_process
    from gqa_mpi.mpi.inprocess import MPI
    from gqa_mpi.mpi.topology import Topology
    from gqa_mpi.step.grid import Grid
    for C, P in ((2, 8), (2, 6), (3, 5)):
        grid = Grid(C, P, 4)
        got = in_process(C * P, lambda comm: Topology(comm, grid).neighbours)
        for rank, theirs in enumerate(got):
            for direction, other in theirs.items():
                want = grid.neighbour(rank, direction)
                assert other == (MPI.PROC_NULL if want is None else want), (rank, direction)


@pytest.mark.launch
def test_in_process_gives_the_mpi_runs_o_bit_for_bit_and_its_report(capsys, tmp_path):
    """A real launch of the kernel calling every name, against the same grid in
    process: O byte for byte, the check, the prediction and the report's lines."""
    args = ["--kernel-source", EVERY_CALL, "--cubes", 2, "--pes", 4, "--seq-len", 1501,
            "--heads-q", 8, "--heads-kv", 2, "--head-dim", 16, "--queries", 2,
            "--predict", "example-npu"]
    mpi = launch(8, args + ["--output", tmp_path / "m.npy", "--json", tmp_path / "m.json"])
    assert mpi.returncode == 0, mpi.stdout + mpi.stderr
    code, out, err = here(capsys, *args, "--output", tmp_path / "t.npy", "--json",
                          tmp_path / "t.json")
    assert code == 0, out + err
    assert (tmp_path / "m.npy").read_bytes() == (tmp_path / "t.npy").read_bytes()
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "mt")
    assert a["checks"] == b["checks"] and a["predicted"] == b["predicted"]
    assert [r["source"] for r in a["ranks"]] == [r["source"] for r in b["ranks"]]
    assert (a["in_process"], b["in_process"]) == (False, True)
    same = ("problem", "topology", "kernel", "read", "scratch", "traffic", "predicted",
            "critical", "check")
    assert [x for x in mpi.stdout.splitlines() if x.startswith(same)] == \
        [x for x in out.splitlines() if x.startswith(same)]


def python_m(args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "gqa_mpi", "--in-process"]
                          + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.mark.launch
def test_breakpoint_in_a_kernel_stops_in_the_debugger(tmp_path):
    """A process of its own: pdb reads the commands from stdin."""
    body = """
        def bp_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):
            pe = tl.program_id(axis=0)
            x = tl.load(k, shape=(2, 4), dtype=tl.float16)
            if pe == 1:
                breakpoint()
            tl.store(o, tl.zeros((1, 4), tl.float16))
        """
    proc = python_m(["--kernel-source", kernel(tmp_path, body), "--cubes", 1, "--pes", 2,
                     "--seq-len", 64, "--head-dim", 4, "--heads-q", 1, "--heads-kv", 1,
                     "--no-check"], input="p pe\np x.shape\nc\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(Pdb) 1\n(Pdb) (2, 4)\n" in proc.stdout, proc.stdout


@pytest.mark.launch
def test_timeout_in_process_names_the_spinning_pe_and_the_waiting_one(tmp_path):
    """A process of its own: the spinning thread cannot be stopped, only left."""
    proc = python_m(["--kernel-source", kernel(tmp_path, SPIN), "--cubes", 1, "--pes", 2,
                     "--seq-len", 64, "--timeout", 1] + SMALL)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "rank 1 is stuck in the kernel under test" in proc.stderr
    assert "rank 0 has waited 1 s for rank 1's message" in proc.stderr
