"""The MPI side: every MPI call of gqa_mpi is made here (or, in process, its stand-in).

============  ================================================================
topology      the (C, P) communicator, the cube's and inter-cube ones, link(direction)
exchange      runs a schedule's steps: messages, merges, the traffic they cost
step          one rank across decode steps: its slice resident, its local step, appends
local         the interface of a local step (resident, queries, step, append, stats)
emulated      the emulation's local step: the sweep, then the schedule
source        the kernel's own function as the local step (--kernel-source)
tl_link       ``tl.send``/``tl.recv`` for --kernel-source, and its deadlock watch
collective    what ranks do together around a run: agree, to and from the root, the
              check's fold, the ranks of a host, waiting without spinning
inprocess     ``--in-process``: every rank a thread of one process, with stand-ins for
              mpi4py's communicators (no MPI)
watchdog      ``--timeout``: ends a stuck job and names the rank it waits for
launch_check  a launcher of another MPI than mpi4py's, caught around MPI_Init
faults        test-only fault injection
============  ================================================================
"""
