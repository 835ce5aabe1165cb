"""Faults: a killed, raising or stuck rank ends the whole job, named, with nothing left
running and no output file damaged."""
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from gqa_mpi.exits import Exit
from gqa_mpi.tools.launcher import gqa_command

import util
from util import launch, read_json

pytestmark = pytest.mark.launch   # every test here starts processes


MARK = util.marker(5_000_000)


def leftovers():
    return util.leftovers(MARK)


def assert_no_leftovers(within=10.0, but=()):
    util.assert_no_leftovers(MARK, within, but)


# ---------------------------------------------------------------- faults

def test_leftover_probe_sees_a_live_run():
    proc = subprocess.Popen(gqa_command(2, ["--seq-len", "200000", "--seed", MARK, "--quiet"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftovers()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert_no_leftovers()


@pytest.mark.parametrize("point", ["local_attention", "reduce"])
def test_sigkill_mid_run_ends_the_job(point):
    proc = launch(4, ["--seq-len", 50000, "--seed", MARK, "--quiet"], timeout=60,
                  env={"GQA_MPI_FAULT": f"kill:3:{point}"})
    ended = time.time()
    killed = float(re.search(r"injecting fault kill at \w+, t=([\d.]+)", proc.stderr).group(1))
    assert proc.returncode != 0
    assert ended - killed < 10, f"job outlived the killed rank by {ended - killed:.1f} s"
    assert_no_leftovers()


def test_exception_on_one_rank_aborts_all_and_is_printed_once():
    t0 = time.monotonic()
    proc = launch(8, ["--seq-len", 20000, "--seed", MARK], timeout=60,
                  env={"GQA_MPI_FAULT": "raise:5:reduce"})
    assert proc.returncode == Exit.CRASH, proc.stderr      # not 1 (failed) or 2 (usage)
    assert time.monotonic() - t0 < 30
    assert proc.stderr.count("RuntimeError: injected fault") == 1, proc.stderr
    assert "gqa_mpi: rank 5: unexpected error, aborting all 8 ranks" in proc.stderr
    assert_no_leftovers()


WATCHDOG_CASES = {  # fault: words naming the stuck rank
    "hang:6:reduce": "rank 6 is stuck in reduce after 2 s",
    "stop:2:local_attention": "for rank 2 (intra_",              # named by a neighbour
    "stop:3:start": "for rank(s) 3 to reach start-up",         # named by rank 0
    "stop:0:start": "for rank 0 to see every rank reach start-up",
}


@pytest.mark.parametrize("fault", sorted(WATCHDOG_CASES))
def test_the_watchdog_ends_the_job_and_names_the_stuck_rank(fault):
    """A rank that hangs names itself; one frozen by SIGSTOP (its watchdog cannot run)
    is named by whoever waits for it, also before the configuration is agreed."""
    t0 = time.monotonic()
    proc = launch(8, ["--seq-len", 2000, "--seed", MARK, "--timeout", 2], timeout=60,
                  env={"GQA_MPI_FAULT": fault})
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 2 + 20
    assert WATCHDOG_CASES[fault] in proc.stderr, proc.stderr
    assert "(--timeout); aborting all 8 ranks" in proc.stderr
    assert_no_leftovers()


def test_the_stuck_ranks_own_line_is_never_lost():
    """The stuck rank names itself and ends the job at once; its line must reach the
    launcher's stderr before MPI_Abort ends the forwarding (it was missing once in six
    runs). Two runs, each with the line."""
    for _ in range(2):
        proc = launch(4, ["--seq-len", 4096, "--seed", MARK, "--timeout", 2], timeout=60,
                      env={"GQA_MPI_FAULT": "hang:2:local_attention"})
        assert proc.returncode == 3, proc.stderr
        assert "rank 2 is stuck in local_attention after 2 s" in proc.stderr, proc.stderr


def test_the_watchdog_covers_shut_down_under_a_stopped_launcher():
    """Work done, then the launcher is frozen: MPI_Finalize cannot complete, and the
    ranks still leave within the timeout (they do not wait for the launcher forever)."""
    proc = subprocess.Popen(gqa_command(4, ["--seq-len", "2000", "--seed", MARK, "--timeout", "5"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("traffic"):
                break
        os.kill(proc.pid, signal.SIGSTOP)
        assert_no_leftovers(within=20, but={proc.pid})     # every rank is gone
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait()


@pytest.mark.parametrize("kind", ["kill", "raise"])
def test_interrupted_write_keeps_the_old_file(tmp_path, kind):
    o, j = tmp_path / "o.npy", tmp_path / "r.json"
    old = np.arange(12, dtype=np.float32)
    np.save(o, old)
    j.write_text('{"old": true}')
    proc = launch(2, ["--seq-len", 1000, "--output", o, "--json", j], timeout=60,
                  env={"GQA_MPI_FAULT": f"{kind}:0:write"})
    assert proc.returncode != 0
    np.testing.assert_array_equal(np.load(o), old)        # old file, whole
    assert read_json(j) == {"old": True}
