"""Launch the MPI tests for real: ``mpirun -n 16 python -m pytest --with-mpi -m mpi``."""
import os
import subprocess
import sys

from gqa_mpi.tools.launcher import mpirun_command

HERE = os.path.dirname(os.path.abspath(__file__))


def test_sixteen_rank_suite():
    cmd = mpirun_command(16, [sys.executable, "-m", "pytest", "--with-mpi", "-m", "mpi",
                              "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-x",
                              os.path.join(HERE, "test_mpi.py")])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(HERE))
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, tail
