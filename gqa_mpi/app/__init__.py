"""The application: what a user configures, runs and reads.

=======  ===================================================================
config   every option, declared once; generates the command line
decode   ``gqa_mpi.decode``: one step on arrays the ranks hold (the library API)
run      one command-line run: inputs, decode, check, outputs, report
cli      ``python -m gqa_mpi``: parsing, refusals, exit codes
check    the float64 check and its pass rule
record   typed per-rank statistics and the run record (JSON)
report   the lines rank 0 prints
outputs  atomic writes that never destroy what the user owns
sizing   memory estimates, before anything is allocated
=======  ===================================================================
"""
