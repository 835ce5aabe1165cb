"""``launch/slurm.sbatch`` under a real SLURM, submitted with ``sbatch`` as a user would.

Needs a running SLURM (``.ci/slurm-up`` starts one on this machine: slurmctld and
slurmd on localhost, 16 CPUs declared); skipped, saying why, where there is none. Only
the knobs the script documents change: ``--nodes``/``--ntasks-per-node`` on the
command line (one node here: one slurmd cannot emulate two nodes), and ``SEQ_LEN``,
``SRUN_MPI``, ``GQA_ARGS`` in the environment.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.launch   # every test here starts processes

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "launch", "slurm.sbatch")
pytestmark = pytest.mark.launch


@pytest.fixture(scope="module")
def slurm():
    if shutil.which("sbatch") is None:
        pytest.skip("no SLURM here (sbatch not found; .ci/slurm-up starts one)")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "UP" not in ping.stdout:
        pytest.skip(f"SLURM is installed but its controller is not up: {ping.stdout.strip()}")


def venv_path():
    """PATH as a user who activated this venv has it (the script runs the ``python`` on
    PATH, as its comments say): this interpreter's directory first, so that the suite
    run as ``.venv/bin/python -m pytest`` submits the same python as an activated one."""
    return os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


def submit(tmp_path, env, tasks=8):
    out = subprocess.run(["sbatch", "--parsable", "--nodes=1", f"--ntasks-per-node={tasks}",
                          f"--chdir={tmp_path}", SCRIPT], capture_output=True, text=True,
                         timeout=30, env=dict(os.environ, PATH=venv_path(), **env))
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while True:
        show = subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                              text=True, timeout=30).stdout
        state = re.search(r"JobState=(\w+)", show).group(1)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        assert time.monotonic() < deadline, f"job {job} still {state} after 120 s"
        time.sleep(0.5)
    code = re.search(r"ExitCode=(\d+):", show).group(1)
    log = (tmp_path / f"gqa_mpi-{job}.out").read_text()
    return job, state, int(code), log


def test_the_batch_script_runs_checks_and_passes(slurm, tmp_path):
    job, state, code, log = submit(tmp_path, dict(SEQ_LEN="20000", SRUN_MPI="pmi2",
                                                  GQA_ARGS="--check"))
    assert (state, code) == ("COMPLETED", 0), log
    assert "topology  C=1 cubes x P=8 PEs = 8 ranks" in log
    assert re.search(r"^check .* PASSED$", log, re.M), log
    assert (tmp_path / f"gqa_mpi-{job}.json").exists()


def test_a_bad_flag_fails_the_job(slurm, tmp_path):
    _, state, got, log = submit(tmp_path, dict(SEQ_LEN="1000", SRUN_MPI="pmi2",
                                               GQA_ARGS="--no-such-flag"), tasks=2)
    assert (state, got) == ("FAILED", 2), log
    assert "unrecognized arguments: --no-such-flag" in log


def test_a_kernel_fault_fails_the_job(slurm, tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text("def bad_kernel(q, k, v, o, T_q, S_kv, h_q, h_kv, d, C, P, *, tl):\n"
                      "    tl.load(k, shape=(S_kv + 1, h_kv * d), dtype='f16')\n")
    _, state, got, log = submit(tmp_path, dict(SEQ_LEN="1000", SRUN_MPI="pmi2",
                                               GQA_ARGS=f"--kernel-source {kernel}"), tasks=2)
    # MPI_Abort(5): srun's --kill-on-bad-exit then kills the step, so SLURM records
    # the kill (137) rather than 5; the job fails and the line is in its log
    assert state == "FAILED" and got != 0, log
    assert "kernel fault on rank 0" in log and "runs past the end of K" in log


def test_srun_without_the_libraries_pmi_is_caught(slurm, tmp_path):
    """srun --mpi=none: every task would be a world of one; one line says so, exit 2."""
    proc = subprocess.run(["srun", "-n", "2", "--mpi=none", "--kill-on-bad-exit=1",
                           "python", "-m", "gqa_mpi", "--seq-len", "100"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=dict(os.environ, PATH=venv_path()))
    assert proc.returncode == 2, proc.stderr
    assert "started as one of 2 processes by SLURM's srun" in proc.stderr
    assert proc.stderr.count("gqa_mpi: error:") == 1
