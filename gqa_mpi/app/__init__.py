"""The application: what a user configures, runs and reads.

==========  ===================================================================
options     the command line and its help, generated from core.config.Config
decode      ``gqa_mpi.Decoder`` and ``decode``: steps and appends on arrays the ranks
            hold (the library API; the command line's loop runs on it)
collective  what the ranks do together: agree on their inputs, wait, gather the record
run         one command-line run: inputs, the loop, the check, record, outputs, report
cli         ``python -m gqa_mpi``: parsing and refusals
check       the check in one place: chunks dealt to every rank, partials folded on
            rank 0 as buffers, the comparison and its pass rule
record      typed per-rank statistics and the run record (JSON)
report      the lines rank 0 prints
outputs     atomic writes that never destroy what the user owns
sizing      memory estimates, before anything is allocated
==========  ===================================================================
"""
