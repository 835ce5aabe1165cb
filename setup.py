"""Build the fused kernel (gqa_mpi._fused); everything else is declared in setup.cfg.

The extension is optional: where it cannot be compiled, the install still succeeds
and gqa_mpi runs the NumPy sweep, saying so in one line.
"""
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Compile an extension's C files side by side, one per core: the sweep's three
    instruction-set units are most of an install's time, and setuptools compiles the
    files of an extension one after the other."""

    def build_extension(self, ext):
        compile_one = self.compiler.compile
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

        def compile_all(sources, **kw):
            with ThreadPoolExecutor(max(1, min(len(sources), cores or 1))) as pool:
                return [o for objs in pool.map(lambda s: compile_one([s], **kw), sources) for o in objs]

        self.compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            del self.compiler.compile


HERE = "gqa_mpi/"
setup(cmdclass={"build_ext": BuildExt}, ext_modules=[Extension(
    "gqa_mpi._fused",
    # the longest units first
    sources=[HERE + f for f in ("_sweep_avx512.c", "_sweep_generic.c", "_sweep_avx2.c", "_fused.c")],
    depends=[HERE + f for f in ("_fused.h", "_simd.h", "_sweep.h")],
    # -g0: Python's CFLAGS ask for debug info, a quarter of the compile's time, and it
    # changes no instruction of the kernel
    extra_compile_args=["-O3", "-g0", "-std=gnu11", "-Wno-unused-function"], optional=True)])
