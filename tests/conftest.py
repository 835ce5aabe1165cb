"""Fail fast under MPI: the first failing test on any rank aborts every rank.

Without this, one rank's failed assertion leaves the others waiting in a
collective and the whole ``mpirun`` hangs until its timeout.
"""
import os
import sys
import tempfile

import pytest

# Open MPI's PMIx tries munge first, and where munge is installed but its daemon is not
# running (SLURM installed and down, say) every mpirun waits 2.3 s for it; the tests'
# launches are on one host, where PMIx's native security is all there is to check.
os.environ.setdefault("PMIX_MCA_psec", "^munge")


def pytest_runtest_logreport(report):
    if report.failed and report.when in ("setup", "call"):
        config = getattr(pytest_runtest_logreport, "config", None)
        if config is not None and config.getoption("--with-mpi", default=False):
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
            if comm.size > 1:
                sys.stderr.write(f"\nrank {comm.rank}: {report.nodeid} failed; "
                                 f"aborting all ranks\n{report.longreprtext}\n")
                sys.stderr.flush()
                comm.Abort(1)


@pytest.hookimpl(tryfirst=True)   # before pytest's tmp_path plugin reads --basetemp
def pytest_configure(config):
    pytest_runtest_logreport.config = config
    if config.getoption("--with-mpi", default=False):
        _basetemp_per_rank(config)


def _basetemp_per_rank(config):
    """Under mpirun each rank gets its own temporary tree, ``<--basetemp>/rank<r>``:
    sixteen pytest sessions sharing pytest's numbered tree race when they clean it at
    exit, and one rank's FileNotFoundError then fails a launch whose tests all passed."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        return
    root = config.option.basetemp or os.path.join(
        tempfile.gettempdir(), f"pytest-mpi-{getattr(os, 'getuid', lambda: 'user')()}")
    os.makedirs(root, exist_ok=True)
    config.option.basetemp = os.path.join(root, f"rank{comm.rank}")


def pytest_ignore_collect(collection_path, config):
    """A plain run leaves test_mpi.py to test_mpi_suite.py, which launches it under mpirun."""
    if collection_path.name == "test_mpi.py" and not config.getoption("--with-mpi", default=False):
        return True
    return None
