"""Two "hosts" on one machine: network namespaces joined by a veth pair.

16 ranks, 8 per host (one cube each), launched by MPICH's Hydra through a launcher
script that enters the right namespace, with TCP forced (``UCX_TLS=tcp,self``). The
inter-cube hop must cross the veth link, and the result must match the reference.
Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``).
"""
import json
import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

from gqa_mpi.tools.launcher import is_open_mpi, mpirun

from util import open_mpi
from whole_reference import attention_reference

from util import random_inputs, write_inputs

pytestmark = pytest.mark.launch   # every test here starts processes

RSH = """#!/bin/sh
# Hydra calls: <this script> HOST COMMAND...; run COMMAND inside HOST's namespace.
host=$1; shift
case $host in
  {ip_a}) ns={ns_a};;
  {ip_b}) ns={ns_b};;
  *) echo "unknown host $host" >&2; exit 1;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""


def sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts(tmp_path):
    if shutil.which("ip") is None:
        pytest.skip("no 'ip' command (iproute2) to make network namespaces")
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = f"gqa-a-{tag}", f"gqa-b-{tag}"
    dev_a, dev_b = f"gqa{tag}a", f"gqa{tag}b"
    ip_a, ip_b = "10.77.0.1", "10.77.0.2"
    probe = sh("ip", "netns", "add", ns_a)
    if probe.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {probe.stderr.strip()}")
    try:
        steps = [("ip", "netns", "add", ns_b),
                 ("ip", "link", "add", dev_a, "type", "veth", "peer", "name", dev_b),
                 ("ip", "link", "set", dev_a, "netns", ns_a),
                 ("ip", "link", "set", dev_b, "netns", ns_b),
                 ("ip", "-n", ns_a, "addr", "add", f"{ip_a}/24", "dev", dev_a),
                 ("ip", "-n", ns_b, "addr", "add", f"{ip_b}/24", "dev", dev_b)]
        for ns, dev in ((ns_a, dev_a), (ns_b, dev_b)):
            steps += [("ip", "-n", ns, "link", "set", "lo", "up"),
                      ("ip", "-n", ns, "link", "set", dev, "up")]
        for step in steps:
            res = sh(*step)
            assert res.returncode == 0, f"{' '.join(step)}: {res.stderr}"
        rsh = tmp_path / "netns-rsh"
        rsh.write_text(RSH.format(ip_a=ip_a, ip_b=ip_b, ns_a=ns_a, ns_b=ns_b))
        rsh.chmod(0o755)
        hosts = tmp_path / "hosts"
        hosts.write_text(f"{ip_a}:8\n{ip_b}:8\n")
        yield dict(ns=ns_a, dev=dev_a, rsh=str(rsh), hosts=str(hosts))
    finally:                               # tear down even when the test failed
        for ns in (ns_a, ns_b):
            sh("ip", "netns", "del", ns)   # deleting a namespace deletes its veth end


def rx_bytes(ns, dev):
    """Bytes host A has received over its end of the link."""
    out = sh("ip", "-n", ns, "-s", "-j", "link", "show", dev)
    return json.loads(out.stdout)[0]["stats64"]["rx"]["bytes"]


def launch_command(library, hosts):
    """MPICH's Hydra (-launcher-exec) or Open MPI's mpirun (plm_rsh_agent), each entering
    the host's namespace through the rsh script, with traffic forced onto TCP."""
    if library == "mpich":
        if is_open_mpi():
            pytest.skip("the default launcher is Open MPI's, not MPICH's Hydra")
        return [mpirun(), "-f", hosts["hosts"], "-launcher", "rsh", "-launcher-exec",
                hosts["rsh"], "-iface", hosts["dev"], "-n", "16", "-genv", "UCX_TLS",
                "tcp,self"]
    prefix = open_mpi()
    if prefix is None:
        pytest.skip("no Open MPI beside the default MPI (apt-get install openmpi-bin)")
    net = "10.77.0.0/24"
    return prefix + ["--mca", "plm_rsh_agent", hosts["rsh"], "--host",
                     "10.77.0.1:8,10.77.0.2:8", "--mca", "pml", "ob1", "--mca", "btl",
                     "tcp,self", "--mca", "btl_tcp_if_include", net, "--mca",
                     "oob_tcp_if_include", net, "-n", "16"]


@pytest.mark.parametrize("library", ["mpich", "openmpi"])
def test_sixteen_ranks_on_two_hosts(two_hosts, tmp_path, library):
    rng = np.random.default_rng(12)
    q, k, v = random_inputs(rng, S=20000, h_q=32, h_kv=8, d=128)
    d = write_inputs(tmp_path / "in", q, k, v)
    o = tmp_path / "o.npy"
    before = rx_bytes(two_hosts["ns"], two_hosts["dev"])
    cmd = (["ip", "netns", "exec", two_hosts["ns"]] + launch_command(library, two_hosts)
           + [sys.executable, "-m", "gqa_mpi", "--cubes", "2", "--pes", "8",
              "--inputs", d, "--output", str(o)])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crossed = rx_bytes(two_hosts["ns"], two_hosts["dev"]) - before
    hop = 4 * (32 + 32 + 32 * 128)         # m, l, O of the inter-cube hop W, float32
    assert crossed > hop, f"only {crossed} bytes reached host A from host B"
    ref = attention_reference(q, k, v, h_kv=8)
    np.testing.assert_allclose(np.load(o), ref, atol=1e-6 * np.abs(ref).max())
