"""Kernels in the DSL that ship with gqa_mpi (run with --kernel-source builtin:NAME)."""
