"""The application: what a user configures, runs and reads.

=======  ===================================================================
options  the command line and its help, generated from core.config.Config
decode   ``gqa_mpi.Decoder`` and ``decode``: steps and appends on arrays the ranks
         hold (the library API; the command line's loop runs on it)
run      one command-line run: inputs, the loop, checks, outputs, report
kernel_source  ``--kernel-source``: the kernel's own file on every rank
cli      ``python -m gqa_mpi``: parsing, refusals, exit codes
references  the float64 references, chunks dealt to every rank, folded on rank 0
check    the check's pass rule
record   typed per-rank statistics and the run record (JSON)
report   the lines rank 0 prints
outputs  atomic writes that never destroy what the user owns
sizing   memory estimates, before anything is allocated
=======  ===================================================================
"""
