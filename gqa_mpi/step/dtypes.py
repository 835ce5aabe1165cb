"""The floating-point dtypes gqa_mpi holds and moves, named once. No MPI here.

``--kv-dtype``, the ``.npy`` inputs, the wires' formats and the kernel DSL's ``tl``
all read this table; the DSL spells the same dtypes ``"f16"`` and ``"f32"``.
"""
from __future__ import annotations

import numpy as np

FLOATS = {"float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
"""What a rank may hold K and V as, and what an input file may hold."""

DSL = {"f16": FLOATS["float16"], "f32": FLOATS["float32"]}
"""The kernel DSL's names for the same dtypes."""

DSL_NAMES = {dt: name for name, dt in DSL.items()}
