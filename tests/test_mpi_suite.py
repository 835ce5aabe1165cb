"""Launch the MPI tests for real: ``mpirun -n 16 python -m pytest --with-mpi -m mpi``,
under the MPI the install brought (the mpich wheel) and, where the system has it, under
Open MPI too (Debian's openmpi-bin, with mpi4py told to load it)."""
import os
import sys

import pytest

from gqa_mpi.tools.launcher import mpirun_command

from util import open_mpi
from util import run_bounded

pytestmark = pytest.mark.launch   # every test here starts processes

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = [sys.executable, "-m", "pytest", "--with-mpi", "-m", "mpi", "-q", "-rs", "-p",
         "no:cacheprovider", "-p", "no:hypothesispytest", "-x",
         os.path.join(HERE, "test_mpi.py")]


@pytest.mark.parametrize("library", ["default", "openmpi"])
def test_sixteen_rank_suite(library, tmp_path):
    suite = SUITE + ["--basetemp", str(tmp_path / "ranks")]   # each rank one below it
    if library == "default":
        cmd = mpirun_command(16, suite)
    else:
        prefix = open_mpi()
        if prefix is None:
            pytest.skip("no Open MPI beside the default MPI (apt-get install openmpi-bin)")
        cmd = prefix + ["-n", "16"] + suite
    proc = run_bounded(cmd, timeout=300, cwd=os.path.dirname(HERE))
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout, tail
    # no test may skip, but the reference kernel's where ../shared/reference is absent
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("no ../shared/reference" in line for line in skips), tail
    if library == "openmpi":
        assert "Open MPI" in run_bounded(prefix + ["-n", "1", sys.executable, "-c",
                                                   "from mpi4py import MPI; print(MPI."
                                                   "Get_library_version())"]).stdout
