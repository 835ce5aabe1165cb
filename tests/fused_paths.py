"""Every instruction-set path of the fused sweep, for the tests: ``gqa_mpi._fused`` runs
only the best one the CPU has, so the others are compiled here (once per session, from
the package's own C files and ``sweep_paths.c``) and called through ctypes with the
module's arguments."""
import ctypes
import os
import subprocess
import sysconfig

import numpy as np

from gqa_mpi.step import sweeps

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, os.pardir, "gqa_mpi")
NEEDS = {"generic": (), "avx2": ("avx2", "fma", "f16c"), "avx512": ("avx512f", "avx512vl")}
"""The CPU flags (/proc/cpuinfo's) each path needs."""


def cpu_paths():
    """The paths this CPU runs, read from /proc/cpuinfo (generic only off x86)."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo")
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    return [name for name, needs in NEEDS.items() if all(f in flags for f in needs)]


class SweepArgs(ctypes.Structure):
    """``_fused.h``'s ``sweep_args``."""
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("half", ctypes.c_int)] + [(n, ctypes.c_ssize_t) for n in ("R", "d", "lo", "hi", "tile")] \
        + [(n, ctypes.c_void_p) for n in ("row_hi", "m", "l", "O", "scratch")]


def build(out_dir):
    """Compile the paths into ``out_dir``; the library loaded."""
    lib = os.path.join(out_dir, "sweep_paths.so")
    units = [os.path.join(PACKAGE, f"_sweep_{p}.c") for p in NEEDS] + [os.path.join(HERE, "sweep_paths.c")]
    objs = []
    procs = []
    for unit in units:
        obj = os.path.join(out_dir, os.path.basename(unit) + ".o")
        procs.append(subprocess.Popen(
            ["cc", "-c", "-fPIC", "-O3", "-std=gnu11", "-I", PACKAGE, "-I",
             sysconfig.get_paths()["include"], unit, "-o", obj]))
        objs.append(obj)
    for p in procs:
        assert p.wait(timeout=300) == 0, "compiling the sweep's paths failed"
    subprocess.run(["cc", "-shared", *objs, "-o", lib, "-lm"], check=True, timeout=120)
    return ctypes.CDLL(lib)


class Path:
    """One path, called as ``_fused.sweep`` is: every KV head of q, k, v in turn."""

    def __init__(self, lib, name):
        self.name, self.fn = name, getattr(lib, f"run_{name}")

    def sweep(self, q, k, v, m, l, O, lo, hi, tile, row_hi):
        B, H, R, d = q.shape
        S = v.shape[2]
        tile = min(tile, S) if S else 1
        if not (hi > lo and R and d):
            return
        scratch = sweeps.aligned(8 * 128 + 2 * R * d + 2 * R, np.float32)
        a = SweepArgs(half=int(v.dtype == np.float16), R=R, d=d, lo=lo, hi=hi, tile=tile,
                      row_hi=None if row_hi is None else row_hi.ctypes.data,
                      scratch=scratch.ctypes.data)
        for b in range(B):
            for h in range(H):
                a.q, a.k, a.v = q[b, h].ctypes.data, k[b, h].ctypes.data, v[b, h].ctypes.data
                a.m, a.l, a.O = m[b, h].ctypes.data, l[b, h].ctypes.data, O[b, h].ctypes.data
                self.fn(ctypes.byref(a))
