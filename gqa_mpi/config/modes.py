"""The two local steps a run can take, chosen once: :attr:`Config.mode
<gqa_mpi.config.config.Config.mode>`.

=========  ====================================================================
emulated   the emulation's own step: each rank sweeps its tokens in tiles, the
           partials reach rank 0 along a schedule (``--reduce``, ``--wire``)
source     the kernel's own file (``--kernel-source``): every rank calls it with
           gqa_mpi's ``tl``, and it does the sweep and the reduction itself
=========  ====================================================================

What the rest of a run needs to know of its mode is asked of the mode here: its
defaults, the options it refuses, the check's floor and queries. Nothing else tests
which mode a run is in; the layers that run the step (:mod:`gqa_mpi.mpi.step`) and
print it (:mod:`gqa_mpi.app.report`) look their implementation up by :attr:`name`.
No MPI here.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from ..step.dtypes import FLOATS, MEMORY, UNIT_ROUNDOFF

DEFAULT_TILE = 1024
"""TILE_S_KV of the local sweep, as in the kernel (a kernel's own file sets its own)."""

SOURCE_TOLERANCE = 1e-2
"""The check's floor for a ``--kernel-source`` run on float16 memory: the kernel's
memory, its operands and its messages are float16 (a relative rounding of 2**-11 an
operation, accumulated over the merges of a chain), and so is the O it stores.
Narrower memory scales it (:meth:`Source.tolerance`)."""
NARROW_SCALE_MAX = 8
"""The most narrower memory scales :data:`SOURCE_TOLERANCE` by: bfloat16's rounding
over float16's. float8's is coarser still, but no kernel computes in float8: its
operands are widened, and the check is against the values memory holds."""


class Emulated:
    """The emulation's own step (no ``--kernel-source``)."""

    name = "emulated"
    kv_dtype = "float32"
    """How K and V are held unless ``--kv-dtype`` or float16 input files say otherwise."""
    records_wire = True
    """The run record names the wire a hop carried."""
    kv_from_inputs = True
    """K and V are held as float16 input files hold them, unless ``--kv-dtype`` says."""

    @staticmethod
    def preflight(cfg) -> None:
        """Raise ValueError, on each rank, where the local step cannot run here:
        ``--kernel fused`` where the fused sweep does not load."""
        from ..step.sweeps import select
        select(cfg.kernel)

    @staticmethod
    def default_wire(cfg) -> str:
        """The wire a hop carries unless ``--wire`` says: the schedule's own."""
        return cfg.schedule.default_wire

    @staticmethod
    def refuse(cfg) -> None:
        """Raise ValueError for an option this mode cannot honour."""
        cfg.schedule.check_wire(cfg.wire_format, cfg.wire)
        for given, option in ((cfg.check_against != "exact",
                               f"--check-against {cfg.check_against}"),
                              (cfg.predict is not None, f"--predict {cfg.predict}"),
                              (cfg.kv_dtype not in FLOATS, f"--kv-dtype {cfg.kv_dtype}")):
            if given:
                raise ValueError(f"{option} is for the kernel's own file: give "
                                 f"--kernel-source FILE too")

    @staticmethod
    def tolerance(wire, m_rounding: float, kv_dtype: str = "float32") -> float:
        """The check's floor: the wire's threshold, plus what its rounding of ``m`` can
        do (a partial whose ``m`` arrives off by ``delta`` has all its weights scaled by
        ``e**delta``: O moves by at most about ``2 * delta * max|O|``)."""
        return wire.tolerance + 2 * m_rounding

    @staticmethod
    def held_queries(q: np.ndarray) -> np.ndarray:
        """The queries as the ranks hold them, which the check's reference takes."""
        return q

    @staticmethod
    def user_files(cfg) -> List[str]:
        """Files of the user's that the run reads, besides its inputs."""
        return []


class Source:
    """The kernel's own file (``--kernel-source FILE[:FUNCTION]``)."""

    name = "source"
    kv_dtype = "float16"
    """The kernel's memory holds K and V in float16 unless ``--kv-dtype`` says."""
    records_wire = False
    """Its messages are what its ``tl.send`` sends: no wire of gqa_mpi's."""
    kv_from_inputs = False
    """The kernel's memory holds K and V as ``--kv-dtype`` says, whatever the files hold."""

    @staticmethod
    def preflight(cfg) -> None:
        """Raise ValueError, on each rank, where the kernel's file does not load, or
        its kernel does not fit the grid (each rank loads it once and keeps it)."""
        from ..dsl import kernel_file
        fn, path = kernel_file.load(cfg.kernel_source)
        why = kernel_file.grid_problem(fn, path, cfg.grid)
        if why:
            raise ValueError(why)

    @staticmethod
    def default_wire(cfg) -> str:
        """The kernel's hops are float16."""
        return "kernel"

    @staticmethod
    def refuse(cfg) -> None:
        """Refuse, naming it, every option a kernel's own file cannot honour."""
        if not isinstance(cfg.kernel_source, str) or not cfg.kernel_source:
            raise ValueError(f"--kernel-source must be FILE or FILE:FUNCTION, got "
                             f"{cfg.kernel_source!r}")
        if cfg.predict is not None and (not isinstance(cfg.predict, str) or not cfg.predict):
            raise ValueError(f"--predict must be a profile's file or name, got "
                             f"{cfg.predict!r}")
        for given, option, why in (
                (cfg.reduce != "chain", f"--reduce {cfg.reduce}",
                 "the kernel's file does its own reduction"),
                (cfg.wire is not None, f"--wire {cfg.wire}",
                 "its messages carry what its tl.send sends"),
                (cfg.tile != DEFAULT_TILE, f"--tile {cfg.tile}",
                 "its file sets its own TILE_S_KV"),
                (cfg.kernel != "auto", f"--kernel {cfg.kernel}",
                 "the kernel's file is the local kernel"),
                (cfg.kv_dtype not in MEMORY, f"--kv-dtype {cfg.kv_dtype}",
                 f"a kernel's memory holds K and V as {', '.join(MEMORY)}"),
                (cfg.trace_tiles, "--trace-tiles", "its trace has a span per tl call"),
                (cfg.batched, "--batch", "the kernel's signature has no batch axis"),
                (cfg.causal, "--causal", "the kernel's signature has no mask")):
            if given:
                raise ValueError(f"--kernel-source runs the kernel's own file and cannot "
                                 f"honour {option} ({why}); drop {option.split()[0]}")
        if cfg.check_against == "kernel-model":
            for given, option, why in (
                    (cfg.steps > 1, "--steps", "the model is of one decode step"),
                    (cfg.split is not None, "--split", "the model reads SPEC's balanced "
                     "split"),
                    (cfg.kv_dtype != "float16", f"--kv-dtype {cfg.kv_dtype}",
                     "the model's memory is float16")):
                if given:
                    raise ValueError(f"--check-against kernel-model cannot follow {option} "
                                     f"({why}); drop {option} or check against exact")

    @staticmethod
    def tolerance(wire, m_rounding: float, kv_dtype: str = "float16") -> float:
        """The kernel's own rule, not a wire's: :data:`SOURCE_TOLERANCE`, times the
        memory dtype's rounding over float16's (at most :data:`NARROW_SCALE_MAX`): 1e-2
        for float16, 8e-2 for bfloat16 and float8."""
        scale = UNIT_ROUNDOFF[kv_dtype] / UNIT_ROUNDOFF["float16"]
        return SOURCE_TOLERANCE * min(NARROW_SCALE_MAX, max(1.0, scale))

    @staticmethod
    def held_queries(q: np.ndarray) -> np.ndarray:
        """The kernel's memory holds Q in float16."""
        return q.astype(np.float16).astype(np.float32)

    @staticmethod
    def user_files(cfg) -> List[str]:
        """The kernel's file is the user's too: an output may not overwrite it."""
        from ..dsl import kernel_file
        return [kernel_file.resolve(cfg.kernel_source)[0]]


def mode_of(kernel_source: Optional[str]):
    """The mode of a run: :class:`Source` with a kernel's file, else :class:`Emulated`."""
    return Emulated if kernel_source is None else Source
