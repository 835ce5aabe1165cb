"""A launcher of one MPI starting an mpi4py that loaded another is caught in one line."""
import pytest

from gqa_mpi.mpi import launch_check as lc

pytestmark = pytest.mark.launch   # every test here starts processes

MPICH = "MPICH Version: 5.0.2"
OPENMPI = "Open MPI v4.1.4, package: Debian OpenMPI"


@pytest.mark.parametrize("env,want", [
    ({}, None),
    ({"PMI_SIZE": "16", "PMI_RANK": "3"}, ("MPICH's mpiexec (Hydra)", 16, 3, "mpich")),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"},
     ("Open MPI's mpirun", 4, 0, "openmpi")),
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "7"}, ("SLURM's srun", 8, 7, None)),
])
def test_the_launchers_variables_are_read(env, want):
    got = lc.launch(env)
    assert (got and tuple(got)[:4]) == want or got is want


def test_open_mpis_launcher_over_mpich_is_refused_before_mpi_init():
    got = lc.launch({"OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_RANK": "0"})
    why = lc.before_init(got, MPICH)
    assert "cannot start" in why and "MPICH Version: 5.0.2" in why and "16" in why
    assert lc.before_init(got, OPENMPI) is None
    assert lc.before_init(lc.launch({"PMI_SIZE": "4"}), MPICH) is None


def test_a_world_of_one_under_a_launcher_of_many_names_both_libraries():
    hydra = lc.launch({"PMI_SIZE": "16", "PMI_RANK": "0"})
    why = lc.after_init(hydra, OPENMPI, 1)
    assert "one of 16 processes by MPICH's mpiexec" in why and "Open MPI v4.1.4" in why
    assert "MPI4PY_MPIABI=mpich" in why
    assert lc.after_init(hydra, OPENMPI, 16) is None
    assert lc.after_init(lc.launch({"PMI_SIZE": "1"}), MPICH, 1) is None
    srun = lc.after_init(lc.launch({"SLURM_STEP_NUM_TASKS": "4"}), MPICH, 1)
    assert "srun --mpi=pmi2" in srun


def test_only_the_process_numbered_0_speaks():
    assert lc.speaks(None) and lc.speaks(lc.launch({"PMI_SIZE": "2", "PMI_RANK": "0"}))
    assert not lc.speaks(lc.launch({"PMI_SIZE": "2", "PMI_RANK": "1"}))
    assert lc.family(MPICH) == "mpich" and lc.family(OPENMPI) == "openmpi"


@pytest.mark.launch
def test_both_directions_for_real(tmp_path):
    """Open MPI's mpirun over the mpich wheel's MPICH, and MPICH's mpiexec over an
    mpi4py that loaded Open MPI: one line each, exit 2 (where Open MPI is installed)."""
    import os
    import sys
    from gqa_mpi.tools.launcher import mpirun
    from util import open_mpi
    from util import run_bounded
    prefix = open_mpi()
    if prefix is None:
        pytest.skip("no Open MPI beside the default MPI (apt-get install openmpi-bin)")
    gqa = [sys.executable, "-m", "gqa_mpi", "--seq-len", "100"]
    # Open MPI's own mpirun, mpi4py left to load the mpich wheel's library
    cmd = [prefix[0], *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           "--oversubscribe", "-n", "2", *gqa]
    proc = run_bounded(cmd, timeout=60)
    assert proc.returncode == 2 and "which that launcher cannot start" in proc.stderr, \
        proc.stderr
    assert proc.stderr.count("gqa_mpi: error:") == 1
    proc = run_bounded([mpirun(), "-n", "2", *gqa], timeout=60,
                       env=dict(os.environ, MPI4PY_MPIABI="openmpi"))
    assert proc.returncode == 2 and "sees a world of 1" in proc.stderr, proc.stderr
    assert proc.stderr.count("gqa_mpi: error:") == 1 and "Open MPI" in proc.stderr
