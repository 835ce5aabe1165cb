"""Progress lines: silent for short runs, plain lines in a log, one rewritten line on
a terminal."""
import io

from gqa_mpi.app.progress import LOG_EVERY, Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


def run(stream, clock, enabled=True, seconds_per_unit=1.0, units=60):
    p = Progress(stream, enabled=enabled, clock=clock)
    p.stage("inputs", "tokens")
    for i in range(units):
        clock.now += seconds_per_unit
        p.update(i + 1, units)
    p.end()
    return stream.getvalue()


def test_a_short_run_prints_nothing():
    assert run(io.StringIO(), Clock(), seconds_per_unit=0.01, units=100) == ""


def test_a_log_gets_whole_lines_without_control_characters():
    text = run(io.StringIO(), Clock())
    lines = text.splitlines()
    assert lines and all(line.startswith("progress  inputs: ") for line in lines)
    assert "\r" not in text and "\x1b" not in text
    assert len(lines) <= 60 / LOG_EVERY + 2                       # no flood
    assert lines[-1] == "progress  inputs: done in 60.0 s"
    assert "tokens (" in lines[0]


def test_a_terminal_gets_one_line_rewritten():
    text = run(Tty(), Clock())
    assert text.count("\r") > 10 and text.count("\n") == 1 and text.endswith("\n")
    assert "progress  inputs: done in 60.0 s" in text


def test_other_ranks_print_nothing():
    assert run(io.StringIO(), Clock(), enabled=False) == ""
