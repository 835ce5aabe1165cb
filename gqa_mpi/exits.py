"""The exit codes of every gqa_mpi command, in one place. No MPI here.

The command line's help, the README and every ``sys.exit``/``MPI_Abort`` take them
from :class:`Exit`; a launcher passes the code of the rank that ended the job.
"""
from __future__ import annotations

import enum
import functools
import os
import signal
import sys


class Exit(enum.IntEnum):
    """What a run's exit code says."""

    PASSED = 0
    """The run finished and its check passed (or was skipped) with a finite O."""
    FAILED = 1
    """The check failed, O is not finite, or a wire overflowed."""
    USAGE = 2
    """A user mistake: a bad option or input, or an output that cannot be written."""
    TIMEOUT = 3
    """``--timeout`` expired; the watchdog named the ranks it waited for."""
    CRASH = 4
    """A rank failed unexpectedly (a bug, or a lost node) and the job was aborted."""
    FAULT = 5
    """The kernel under test (``--kernel-source``) faulted: a bad access or message, a
    deadlock, or an exception of its own."""


SIGNAL = 128
"""A rank killed by signal N exits ``SIGNAL + N``."""

WORDS = {Exit.PASSED: "passed", Exit.FAILED: "check failed or output not finite",
         Exit.USAGE: "bad input or an output that cannot be written",
         Exit.TIMEOUT: "--timeout", Exit.CRASH: "a rank failed unexpectedly and the job "
         "was aborted", Exit.FAULT: "the kernel under test (--kernel-source) faulted"}


def describe() -> str:
    """``0 passed, 1 ..., 128+N killed by signal N``: the help's sentence."""
    return ", ".join(f"{int(code)} {WORDS[code]}" for code in Exit) + \
        f", {SIGNAL}+N killed by signal N"


def quiet_when_the_reader_leaves(main):
    """``main`` that stops quietly where its output's reader went away (``| head``):
    the rest of the output is dropped and the exit is ``SIGNAL + SIGPIPE``, as a
    command killed by the signal would give, not a traceback."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return SIGNAL + signal.SIGPIPE
    return wrapped
