"""``python -m gqa_mpi.study``: scaling studies, one real launch per point, resumable.

A study is a list of points; each point is one ``mpirun`` (or ``srun``, or your own
launcher) of ``python -m gqa_mpi --json ...``, repeated ``--repeats`` times. Every
finished run is appended to one CSV at once (flushed and synced), so a killed study
keeps every finished run, and the same command run again skips them and continues.
A per-run timeout stops one hung launch from stalling the study.

Kinds of study:

========  ========================================================================
strong    fixed S_kv (``--seq-len``), ranks from ``--ranks`` (1,2,4,8,16 by default)
weak      fixed tokens per rank (``--tokens-per-rank``), S_kv = that x ranks
tile      one rank count (the last of ``--ranks``), tile widths from ``--tiles``
wire      one rank count, wire formats from ``--wires`` (default: every wire)
reduce    one rank count, schedules from ``--reduces`` (default: every schedule,
          each with its own default wire unless ``--wire`` is given)
grid      one rank count, PE grids from ``--grids`` (e.g. 2x4,1x8,4x2)
numerics  every rank count x schedule (``--reduces``) x wire it carries
          (``--wires``) on one problem: the error against float64, plotted
========  ========================================================================

Every point is a ``python -m gqa_mpi`` configuration: the problem and algorithm
options below are gqa_mpi's own, checked before the first launch. The same options
can come from a TOML or JSON file (``--config``), keys spelled as the options
(``seq-len`` or ``seq_len``); the command line wins. ``plot`` draws PNGs
from a results CSV (needs matplotlib: ``pip install -e ".[study]"``).
"""
