"""Running a study: one launch per point and repeat, each row recorded at once; a
timeout per launch, and nothing left running or half-written when the study is
stopped."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from typing import Dict, Optional

from ...exits import Exit
from ...app.outputs import Interrupted
from ...app.record import RunRecord
from .plan import Point, launch_command, plan, words
from .results import append_row, read_results, row_from_record, summarise


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Progress on stderr: runs done, elapsed, time left. On a terminal one bar,
    rewritten in place; in a log (stderr a file or a pipe) a whole line a launch, with
    no control characters."""

    def __init__(self, total: int, done: int, stream=None):
        self.total, self.done = total, done
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", None) and self.stream.isatty())
        self.start, self.new = time.monotonic(), 0

    def show(self, what: str) -> None:
        elapsed = time.monotonic() - self.start
        left = "?" if not self.new else _fmt(elapsed / self.new * (self.total - self.done))
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"elapsed {_fmt(elapsed)} left ~{left}  ")
        if self.tty:
            self.stream.write(f"\r{line}{what[:60]:<60}")
        else:
            self.stream.write(f"{line}{what}\n")
        self.stream.flush()

    def end(self) -> None:
        """The last bar's line ends (a log's lines end already)."""
        if self.tty:
            self.stream.write("\n")

    def step(self) -> None:
        self.done += 1
        self.new += 1


def _die_with_parent() -> None:
    """In the launch's process: get SIGTERM when the study dies, even by kill -9, so
    that no launch runs on forever without it (Linux; elsewhere a no-op)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _end(proc: subprocess.Popen) -> None:
    """End a launch and every rank under it: SIGTERM, then SIGKILL after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _record_prefix(out: str) -> str:
    """Where the launches of a study write their run records: beside its CSV, hidden."""
    directory, name = os.path.split(os.path.abspath(out))
    return os.path.join(directory, f".{name}.run-")


def run_point(point: Point, repeat: int, launcher: Optional[str], timeout: float,
              out: str) -> Dict:
    """One launch of one point; a row for the CSV whatever happened."""
    json_path = f"{_record_prefix(out)}{os.getpid()}-{time.time_ns()}.json"
    cmd = launch_command(launcher, point.ranks, point.argv(json_path))
    row = dict(point.columns(), run_id=point.run_id, repeat=repeat,
               finished_at="", host=os.uname().nodename)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(proc)
        return dict(row, status="timeout", wall_s=time.monotonic() - t0,
                    error=f"no result after {timeout:g} s")
    except BaseException:       # SIGTERM/SIGINT to the study: end the launch, record nothing
        _end(proc)
        if os.path.exists(json_path):
            os.unlink(json_path)
        raise
    wall = time.monotonic() - t0
    try:
        if proc.returncode not in (0, 1) or not os.path.exists(json_path):
            last = [s for s in err.splitlines() if s.strip()][-1:] or [f"exit {proc.returncode}"]
            return dict(row, status="failed", wall_s=wall, error=last[0][:300])
        out = row_from_record(point, repeat, RunRecord.load(json_path), wall)
        if proc.returncode == 1:
            out.update(status="check_failed")
        return out
    finally:
        if os.path.exists(json_path):
            os.unlink(json_path)


def run_study(args, base) -> int:
    """Run (or resume) the study ``args`` describes around the config ``base``."""
    points = plan(args.kind, base, args.ranks, args.tokens_per_rank, args.values,
                  tuple(args.extra), words(args.reduces), words(args.wires),
                  getattr(args, "kernel_sources", None))
    runs = [(p, r) for p in points for r in range(args.repeats)]
    done = {(r["run_id"], int(r["repeat"])) for r in read_results(args.out, repair=True)
            if r["status"] == "ok"}
    for stale in glob.glob(glob.escape(_record_prefix(args.out)) + "*.json"):
        os.unlink(stale)          # left by a study of this CSV killed with -9
    todo = [(p, r) for p, r in runs if (p.run_id, r) not in done]
    print(f"study {args.kind}: {len(points)} point(s) x {args.repeats} repeat(s) = "
          f"{len(runs)} run(s); {len(runs) - len(todo)} already in {args.out}, "
          f"{len(todo)} to go", file=sys.stderr)
    progress = Progress(len(runs), len(runs) - len(todo))
    failures = 0

    def interrupted(signum, frame):
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupted)
    for point, repeat in todo:
        progress.show(f"ranks={point.ranks} S_kv={point.config.seq_len} "
                      f"{args.kind} repeat {repeat + 1}")
        row = run_point(point, repeat, args.launcher, args.timeout, args.out)
        blocked = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)   # a row is written whole
        try:
            append_row(args.out, row)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        failures += row["status"] != "ok"
        progress.step()
        if row["status"] != "ok":
            sys.stderr.write(f"{chr(10) if progress.tty else ''}  {row['status']}: "
                             f"ranks={point.ranks} {row.get('error', '')}\n")
    progress.show("done")
    progress.end()
    summarise(read_results(args.out), sys.stdout)
    return Exit.FAILED if failures else Exit.PASSED
