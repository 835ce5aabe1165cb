"""The interface of a rank's local step: what it holds, what it does each decode step,
and what the run record says of it. Its implementations:
:class:`~gqa_mpi.mpi.emulated.EmulatedStep` and :class:`~gqa_mpi.mpi.source.SourceStep`."""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np


class LocalStep:
    """What one rank runs each decode step, and what the run record says of it.

    Parameters of every implementation: ``(cfg, topo, recorder)``. Attributes: ``name``
    (the record's ``kernel``), ``isa``, ``note`` (why the local sweep fell back),
    ``source`` (the record's ``kernel_source``: file and function, or None), ``calls``
    (each step's recorded ``tl`` calls, for ``--predict``), ``traffic`` and
    ``scores_nonfinite`` (summed over the steps).
    """

    note: Optional[str] = None
    source: Optional[Dict] = None

    def resident(self, q_in: np.ndarray, rows: Callable, count: int, room: int) -> None:
        """Hold Q ``(B, T_q, h_q*d)`` and the slice's ``count`` tokens, ``rows(name, i,
        j)`` giving tokens ``i:j`` of ``"k"`` or ``"v"``, with room for ``room``."""
        raise NotImplementedError

    def queries(self, q_in: np.ndarray) -> None:
        """Take this step's queries ``(B, T_q, h_q*d)``."""
        raise NotImplementedError

    def step(self, index: int, total: int, start: int, count: int) -> Optional[np.ndarray]:
        """Decode step ``index`` over the first ``count`` resident tokens (global rows
        from ``start``) of a cache of ``total``; O (layout of Q) on the root."""
        raise NotImplementedError

    def append(self, k_rows: np.ndarray, v_rows: np.ndarray, count: int) -> None:
        """Write new tokens ``(B, n, h_kv*d)`` after the first ``count``."""
        raise NotImplementedError

    def stats(self) -> Optional[Dict]:
        """What the record keeps of this rank's local step beyond its timings."""
        return None
