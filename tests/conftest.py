"""Fail fast under MPI: the first failing test on any rank aborts every rank.

Without this, one rank's failed assertion leaves the others waiting in a
collective and the whole ``mpirun`` hangs until its timeout.
"""
import sys



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


def pytest_configure(config):
    pytest_runtest_logreport.config = config


def pytest_ignore_collect(collection_path, config):
    """A plain run leaves test_mpi.py to test_mpi_suite.py, which launches it under mpirun."""
    if collection_path.name == "test_mpi.py" and not config.getoption("--with-mpi", default=False):
        return True
    return None
