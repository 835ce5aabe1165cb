"""The chain travels on the design card's communicators, seen at the MPI level.

A PMPI interposer (``tests/pmpi/comm_log.c``, what a user would write) logs every
``MPI_Send``/``MPI_Recv`` with the name and topology of its communicator. Each chain
hop must go over the cube's communicator (2-D Cartesian ``rows x cols`` where the rows
are full, a distributed graph with a short last row) or the 1-D inter-cube Cartesian
one, to the neighbour SPEC's index rules name; none over the ``(C, P)`` communicator.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from gqa_mpi.step.wires import TAGS
from gqa_mpi.tools.launcher import mpirun, mpirun_command
from util import run_bounded, spec_schedule

pytestmark = pytest.mark.launch   # every test here starts processes

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"(send|recv) comm=(\S+) topo=(\w+) size=(\d+) dims=(\d+)x(\d+) "
                  r"peer=(-?\d+) tag=(\d+)")


@pytest.fixture(scope="module")
def interposer(tmp_path_factory):
    # the compiler of the MPI the tests launch with: beside the launcher, else on PATH
    mpicc = shutil.which("mpicc", path=os.path.dirname(mpirun())) or shutil.which("mpicc")
    if mpicc is None:
        pytest.skip("no mpicc to build the PMPI interposer")
    lib = tmp_path_factory.mktemp("pmpi") / "libcomm_log.so"
    subprocess.run([mpicc, "-shared", "-fPIC", "-o", str(lib),
                    os.path.join(HERE, "pmpi", "comm_log.c")], check=True, timeout=60)
    return str(lib)


def expected_hops(rank, C, P, cols=4):
    """``(op, communicator, topology, peer in it, tag)`` of each data message, from
    SPEC's index rules alone."""
    cube, pe = divmod(rank, P)
    out = []
    for op, direction, tensor in spec_schedule(rank, C, P, cols):
        step = {"intra_E": 1, "intra_W": -1, "intra_S": cols, "intra_N": -cols,
                "E": 1, "W": -1}[direction]
        if direction.startswith("intra"):
            full = P % cols == 0 or P < cols
            out.append((op, "gqa_mpi.cube", "cart" if full else "distgraph", pe + step,
                        TAGS[tensor]))
        else:
            out.append((op, "gqa_mpi.inter", "cart", cube + step, TAGS[tensor]))
    return out


GRIDS = [(2, 8), (2, 6), (4, 4), (3, 5)]
SCRIPT = """
import sys
import numpy as np
from mpi4py import MPI
from gqa_mpi import decode

world = MPI.COMM_WORLD
for C, P in GRIDS:
    # a separator in every rank's log: a message to itself on COMM_SELF, tag 999
    req = MPI.COMM_SELF.Isend(np.zeros(1), dest=0, tag=999)
    MPI.COMM_SELF.Recv(np.zeros(1), source=0, tag=999)
    req.Wait()
    comm = world.Split(0 if world.rank < C * P else MPI.UNDEFINED, world.rank)
    if comm != MPI.COMM_NULL:
        rng = np.random.default_rng(comm.rank)
        k = rng.standard_normal((16, 8), dtype=np.float32)
        decode(np.ones((1, 16), np.float32), k, k, heads_kv=1, comm=comm, cubes=C, pes=P)
        comm.Free()
    world.Barrier()
"""


def test_every_chain_hop_travels_on_its_directions_communicator(interposer, tmp_path):
    """2x8, 2x6, 4x4 and 3x5 in one launch of 16 ranks, each through gqa_mpi.decode."""
    logs = tmp_path / "logs"
    logs.mkdir()
    script = tmp_path / "grids.py"
    script.write_text(f"GRIDS = {GRIDS!r}\n" + SCRIPT)
    proc = run_bounded(mpirun_command(16, [sys.executable, str(script)]),
                       env=dict(os.environ, LD_PRELOAD=interposer, COMM_LOG_DIR=str(logs)))
    assert proc.returncode == 0, proc.stderr
    for rank in range(16):
        segments = [[]]
        for line in (logs / f"rank{rank}.log").read_text().splitlines():
            op, comm, topo, size, d0, d1, peer, tag = LINE.fullmatch(line).groups()
            if comm == "MPI_COMM_SELF" and tag == "999":
                if op == "recv":
                    segments.append([])
                continue
            segments[-1].append((op, comm, topo, int(size), (int(d0), int(d1)), int(peer),
                                 int(tag)))
        assert len(segments) == len(GRIDS) + 1, rank
        for (C, P), seen in zip(GRIDS, segments[1:]):
            check_grid(rank, C, P, seen)


def check_grid(rank, C, P, logged):
    rows, cols = -(-P // 4), min(4, P)
    seen = []
    for op, comm, topo, size, dims, peer, tag in logged:
        if not comm.startswith("gqa_mpi."):
            continue                             # MPI's own (collectives, start-up)
        if comm == "gqa_mpi.world":
            assert tag not in TAGS.values(), (rank, C, P)     # no chain data here
            continue
        seen.append((op, comm, topo, peer, tag))
        if comm == "gqa_mpi.cube":
            assert size == P and (topo != "cart" or dims == (rows, cols)), (rank, C, P)
        else:
            assert (topo, size, dims[0]) == ("cart", C, C), (rank, C, P)
    want = expected_hops(rank, C, P) if rank < C * P else []
    assert seen == want * 2, (rank, C, P, seen)      # the warm-up, then the step
