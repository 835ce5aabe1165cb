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

import pytest

from gqa_mpi.core.wires import TAGS
from util import launch, spec_schedule

pytestmark = pytest.mark.launch
HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"(send|recv) comm=(\S+) topo=(\w+) size=(\d+) dims=(\d+)x(\d+) "
                  r"peer=(-?\d+) tag=(\d+)")


@pytest.fixture(scope="module")
def interposer(tmp_path_factory):
    mpicc = shutil.which("mpicc")
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


@pytest.mark.parametrize("C,P", [(2, 8), (2, 6), (4, 4), (3, 5)])
def test_every_chain_hop_travels_on_its_directions_communicator(interposer, tmp_path, C, P):
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = launch(C * P, ["--cubes", C, "--pes", P, "--seq-len", 256, "--heads-q", 2,
                          "--heads-kv", 1, "--head-dim", 8, "--no-check", "--quiet"],
                  env={"LD_PRELOAD": interposer, "COMM_LOG_DIR": str(logs)})
    assert proc.returncode == 0, proc.stderr
    rows, cols = -(-P // 4), min(4, P)
    for rank in range(C * P):
        seen = []
        for line in (logs / f"rank{rank}.log").read_text().splitlines():
            op, comm, topo, size, d0, d1, peer, tag = LINE.fullmatch(line).groups()
            if not comm.startswith("gqa_mpi."):
                continue                         # MPI's own (collectives, start-up)
            if comm == "gqa_mpi.world":
                assert int(tag) not in TAGS.values(), (rank, line)  # no chain data here
                continue
            seen.append((op, comm, topo, int(peer), int(tag)))
            if comm == "gqa_mpi.cube":
                assert int(size) == P
                if topo == "cart":
                    assert (int(d0), int(d1)) == (rows, cols)
            else:
                assert (topo, int(size), int(d0)) == ("cart", C, C)
        want = expected_hops(rank, C, P)
        assert seen == want * 2, (rank, seen)         # the warm-up, then the step
