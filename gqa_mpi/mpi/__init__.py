"""The MPI side: communicators, executing a schedule, the decode step, the watchdog.

===========  =================================================================
topology     the Cartesian communicator over (cube, pe) and each rank's neighbours
exchange     runs a schedule's steps: messages, merges, the traffic they cost
step         one decode step on one rank, in the kernel's order
watchdog     ``--timeout``: ends a stuck job and names the rank it waits for
===========  =================================================================
"""
