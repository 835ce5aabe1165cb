"""The MPI side: communicators, executing a schedule, the decode step, the watchdog.

===========  =================================================================
topology     the (C, P) communicator, the cube's and inter-cube ones, link(direction)
exchange     runs a schedule's steps: messages, merges, the traffic they cost
step         one decode step on one rank, in the kernel's order (emulated or source)
source       the kernel's own function as a rank's local step (--kernel-source)
watchdog     ``--timeout``: ends a stuck job and names the rank it waits for
tl_link      ``tl.send``/``tl.recv`` for --kernel-source, and its deadlock watch
launch_check a launcher of another MPI than mpi4py's, caught around MPI_Init
faults       test-only fault injection
===========  =================================================================
"""
