"""The application: what a user configures, runs and reads. No MPI call of its own
(:mod:`gqa_mpi.mpi.collective` has them, with plain arguments).

==========  ===================================================================
options     the command line and its help, generated from config.Config
decode      ``gqa_mpi.Decoder`` and ``decode``: steps and appends on arrays the ranks
            hold (the library API; the command line's loop runs on it); the record
run         one command-line run: inputs, the loop, the check, record, outputs, report
cli         ``python -m gqa_mpi``: parsing and refusals
check       the check's references of the kept steps, dealt to every rank and folded
            on rank 0 (the verdict: check.judge)
record      typed per-rank statistics and the run record (JSON)
report      the lines rank 0 prints
outputs     atomic writes that never destroy what the user owns
progress    progress lines of a long run
sizing      memory estimates, before anything is allocated
==========  ===================================================================
"""
