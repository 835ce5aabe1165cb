"""Progress lines for long runs: what rank 0 is doing, readable in a batch log.

A run's first :data:`DELAY` seconds print nothing, so short runs stay as they were.
After that each stage (inputs, steps, check) says how far it is, at most every
:data:`TTY_EVERY` seconds on a terminal (one line, rewritten with a carriage return)
and every :data:`LOG_EVERY` seconds otherwise (whole lines, no control characters,
so that a SLURM or PBS log reads as text). Once the run has passed the delay, each
stage also ends with a line giving its time. No MPI here.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

DELAY = 3.0
"""Seconds into the run before the first progress line."""
TTY_EVERY = 0.5
LOG_EVERY = 10.0


class Progress:
    """Progress of the stages of one run, on ``stream`` (stderr by default)."""

    def __init__(self, stream: Optional[TextIO] = None, enabled: bool = True,
                 delay: float = DELAY, clock: Callable[[], float] = time.monotonic):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.every = TTY_EVERY if self.tty else LOG_EVERY
        self.delay = delay
        self.clock = clock
        self.origin = clock()
        self.name = ""
        self.unit = ""
        self.started = self.origin
        self.shown: Optional[float] = None

    def stage(self, name: str, unit: str) -> None:
        """Start stage ``name`` (``inputs``, ``steps``, ``check``), counted in ``unit``."""
        self.end()
        self.name, self.unit = name, unit
        self.started = self.clock()
        self.shown = None

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` units of the current stage are done."""
        if not self.enabled:
            return
        now = self.clock()
        if done >= total or now - self.origin < self.delay:
            return                                  # the stage's end says it is done
        if self.shown is not None and now - self.shown < self.every:
            return
        pct = 100 * done // max(total, 1)
        self._write(f"progress  {self.name}: {done}/{total} {self.unit} ({pct}%), "
                    f"{now - self.started:.1f} s", final=False)
        self.shown = now

    def end(self) -> None:
        """Close the current stage: a line with its time once the run is long."""
        now = self.clock()
        if self.enabled and self.name and now - self.origin >= self.delay:
            self._write(f"progress  {self.name}: done in {now - self.started:.1f} s",
                        final=True)
        self.name, self.shown = "", None

    def _write(self, line: str, final: bool) -> None:
        if self.tty:
            # one line, rewritten; padded so that a shorter line hides a longer one
            self.stream.write("\r" + line.ljust(72) + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
