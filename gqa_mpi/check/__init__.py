"""The check: float64 references of a step and the pass rule. NumPy only, never MPI
(:mod:`gqa_mpi.mpi.collective` folds the ranks' shares on rank 0).

============  ==================================================================
reference     exact float64 GQA attention, whole or a chunk at a time with its merge
streamed      the check's chunks and their partials, straight from the inputs
kernel_model  the reference kernel's own reads and its float64 model (the
              reference of ``--check-against kernel-model``)
judge         the comparison, the tolerance and the verdict
============  ==================================================================
"""
