"""The floating-point dtypes gqa_mpi holds and moves, named once. No MPI here.

``--kv-dtype``, the ``.npy`` inputs, the wires' formats and the kernel DSL's ``tl``
all read this table; the DSL spells the same dtypes ``"f16"``, ``"bf16"``, ...
bfloat16 and float8 are the ``ml_dtypes`` package's (the one JAX uses): NumPy dtypes
whose arithmetic computes in float32 and rounds once to the operands' dtype.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOATS = {"float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
"""What the emulation may hold K and V as, and what an input file may hold."""

NARROW = {"bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
          "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}
"""The narrower floats a kernel's memory may hold K and V as (``--kernel-source``)."""

MEMORY = dict(float16=FLOATS["float16"], **NARROW)
"""What a kernel's memory may hold K and V as (``--kv-dtype`` with ``--kernel-source``)."""

DSL = {"f16": FLOATS["float16"], "f32": FLOATS["float32"], "bf16": NARROW["bfloat16"],
       "fp8e4m3": NARROW["float8_e4m3"], "fp8e5m2": NARROW["float8_e5m2"]}
"""The kernel DSL's names for the same dtypes."""

DSL_NAMES = {dt: name for name, dt in DSL.items()}


def is_float(dt) -> bool:
    """Whether ``dt`` is a floating-point dtype (ml_dtypes' are NumPy's kind ``V``)."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt in DSL_NAMES


def unit_roundoff(dt) -> float:
    """Half the gap between 1 and the next value of ``dt``."""
    return float(ml_dtypes.finfo(dt).eps) / 2
