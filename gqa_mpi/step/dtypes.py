"""The floating-point dtypes gqa_mpi holds and moves, named once. No MPI here.

``--kv-dtype``, the ``.npy`` inputs, the wires' formats and the kernel DSL's ``tl``
all read this table; the DSL spells the same dtypes ``"f16"``, ``"bf16"``, ...
bfloat16 and float8 are the ``ml_dtypes`` package's (the one JAX uses): NumPy dtypes
whose arithmetic computes in float32 and rounds once to the operands' dtype. Importing
``ml_dtypes`` takes most of a second, so it is imported the first time a narrow dtype
is asked for, never by a run that holds float16 or float32 only.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Dict, Iterator

import numpy as np


class Dtypes(Mapping):
    """Names to NumPy dtypes, the ``ml_dtypes`` ones resolved when first asked for."""

    def __init__(self, eager: Dict[str, np.dtype], narrow: Dict[str, str]):
        self._eager, self._narrow = dict(eager), dict(narrow)
        self._names = list(eager) + [n for n in narrow if n not in eager]

    def __getitem__(self, name: str) -> np.dtype:
        if name in self._eager:
            return self._eager[name]
        import ml_dtypes
        self._eager[name] = np.dtype(getattr(ml_dtypes, self._narrow[name]))
        return self._eager[name]

    def __contains__(self, name) -> bool:
        return name in self._names            # without importing ml_dtypes

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


FLOATS = {"float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
"""What the emulation may hold K and V as, and what an input file may hold."""

NARROW = {"bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3fn",
          "float8_e5m2": "float8_e5m2"}
"""The narrower floats a kernel's memory may hold K and V as (``--kernel-source``), by
their ``ml_dtypes`` names."""

MEMORY = Dtypes({"float16": FLOATS["float16"]}, NARROW)
"""What a kernel's memory may hold K and V as (``--kv-dtype`` with ``--kernel-source``)."""

DSL_NARROW = {"bf16": "bfloat16", "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}
"""The kernel DSL's names for the narrow ones, to their ``ml_dtypes`` names."""

DSL = Dtypes({"f16": FLOATS["float16"], "f32": FLOATS["float32"]}, DSL_NARROW)
"""The kernel DSL's names for the same dtypes."""

DSL_NAMES = {"float16": "f16", "float32": "f32", "bfloat16": "bf16",
             "float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2"}
"""A NumPy dtype's name to the DSL's name for it."""

UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8,
                 "float8_e4m3": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}
"""Half the gap between 1 and the next value, by the names of ``--kv-dtype``."""


def is_float(dt) -> bool:
    """Whether ``dt`` is a floating-point dtype (ml_dtypes' are NumPy's kind ``V``)."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name in DSL_NAMES
