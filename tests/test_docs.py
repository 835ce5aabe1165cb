"""The docs are tested: the options page is the parser's own help, and every
``console`` block of the README and docs/ runs, its output matching the sample's
stable lines.

A ``console`` block holds commands (lines starting ``$ ``), each followed by what it
prints. A sample line is stable unless it holds ``...``; on both sides, numbers with a
point or an exponent and numbers of a unit (ms, s, MiB, ...) are masked, so timings,
errors and memory do not count, and the stable lines must appear in the output in
their order. The commands run in a scratch directory where ``docs/`` is the repo's,
with ``python`` and ``mpirun`` those of this Python. Other fenced blocks (installs,
cluster submissions, measurements that need 16 real cores, the test suite itself)
are not run.

``GQA_MPI_REGEN_DOCS=1 python -m pytest tests/test_docs.py`` rewrites the generated
part of docs/options.md from the parser.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
OPTIONS = ROOT / "docs" / "options.md"
PYTHON = "Python %d.%d" % sys.version_info[:2]
BEGIN, END = "<!-- BEGIN: python -m gqa_mpi --help, on {} -->", "<!-- END -->"
WIDTH = "100"


def console_blocks():
    """(page, first line, [(command, [sample lines])]) of every console block."""
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```console":
                indent = len(lines[i]) - len(lines[i].lstrip())      # a block in a list
                start, i, runs = i + 1, i + 1, []
                while lines[i].strip() != "```":
                    line = lines[i][indent:]
                    if line.startswith("$ "):
                        runs.append((line[2:], []))
                    elif runs:
                        runs[-1][1].append(line)
                    i += 1
                yield page.relative_to(ROOT), start, runs
            i += 1


BLOCKS = list(console_blocks())
MASK = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+|\d+(?= ?(?:ms|s|us|ns|MiB|KiB|"
                  r"GiB|MB|GB|GB/s|%)\b)")


def masked(line: str) -> str:
    return " ".join(MASK.sub("#", line).split())


def missing(sample, output):
    """The first stable sample line not found (in order) in ``output``, else None."""
    got = [masked(x) for x in output.splitlines()]
    at = 0
    for line in sample:
        if "..." in line or not line.strip():
            continue
        want = masked(line)
        while at < len(got) and got[at] != want:
            at += 1
        if at == len(got):
            return line
        at += 1
    return None


def test_every_page_has_its_block_found():
    assert len(BLOCKS) >= 10
    assert all(runs for _, _, runs in BLOCKS)


@pytest.mark.launch
@pytest.mark.parametrize("page,line,runs", BLOCKS, ids=[f"{p}:{n}" for p, n, _ in BLOCKS])
def test_console_block_runs_and_prints_its_sample(page, line, runs, tmp_path):
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               COLUMNS=WIDTH, OPENBLAS_NUM_THREADS="1")
    for command, sample in runs:
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        assert proc.returncode == 0, (f"{page}:{line}: `{command}` exited "
                                      f"{proc.returncode}:\n{proc.stdout}")
        gone = missing(sample, proc.stdout)
        assert gone is None, (f"{page}:{line}: `{command}` printed no line like\n  {gone}\n"
                              f"it printed:\n{proc.stdout}")


def generated_help() -> str:
    env = dict(os.environ, COLUMNS=WIDTH)
    proc = subprocess.run([sys.executable, "-m", "gqa_mpi", "--help"], env=env, text=True,
                          capture_output=True, timeout=60, check=True)
    return f"{BEGIN.format(PYTHON)}\n```\n{proc.stdout.rstrip()}\n```\n{END}"


@pytest.mark.launch
def test_the_options_page_is_the_parsers_help():
    """argparse lays help out a little differently from one Python to the next, so the
    page says which Python wrote it, and another Python only checks it is there."""
    text = OPTIONS.read_text()
    head = BEGIN.split("{}")[0]
    a, b = text.index(head), text.index(END) + len(END)
    fresh = generated_help()
    if os.environ.get("GQA_MPI_REGEN_DOCS"):
        OPTIONS.write_text(text[:a] + fresh + text[b:])
        text = OPTIONS.read_text()
        b = text.index(END) + len(END)
    written_on = text[a + len(head):text.index(" -->", a)]
    if written_on != PYTHON:
        pytest.skip(f"docs/options.md was generated on {written_on}, this is {PYTHON}")
    assert text[a:b] == fresh, (
        "docs/options.md differs from `python -m gqa_mpi --help`: run "
        "GQA_MPI_REGEN_DOCS=1 python -m pytest tests/test_docs.py")


def test_the_masking_keeps_what_is_stable():
    assert missing(["time  step 1.2 ms, total 3 s"], "time step 9.87 ms, total 12 s") is None
    assert missing(["check ... PASSED"], "anything") is None
    assert missing(["a 16 ranks"], "a 15 ranks") == "a 16 ranks"
    assert missing(["x", "y"], "y\nx") == "y"          # in order


def test_the_library_page_shows_the_example_it_runs():
    example = (ROOT / "docs" / "examples" / "decode.py").read_text()
    assert example in (ROOT / "docs" / "library.md").read_text()


def test_no_help_shows_docstring_markup():
    """``--help`` is for a terminal: no RST literals or roles (``:mod:`x```)."""
    import re
    from gqa_mpi.app.cli import build_parser as cli
    from gqa_mpi.tools.bench import build_parser as bench
    from gqa_mpi.tools.study.cli import build_parser as study
    for build in (cli, bench, study):
        parser = build()
        texts = [parser.format_help()] + [
            sub.format_help() for action in parser._actions
            if isinstance(action, __import__("argparse")._SubParsersAction)
            for sub in action.choices.values()]
        for text in texts:
            assert "``" not in text and not re.search(r":\w+:`", text), text


def test_the_docs_and_help_stand_on_their_own():
    """A user's clone has no ../shared: no page and no --help sends them there, or to a
    SPEC they do not have; the kernel's file is the user's KERNEL.py, said once where."""
    from gqa_mpi.app.cli import build_parser
    from gqa_mpi.tools.bench import build_parser as bench
    from gqa_mpi.tools.study.cli import build_parser as study
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    for name, build in (("--help", build_parser), ("bench", bench), ("study", study)):
        texts[name] = build().format_help()
    for name, text in texts.items():
        assert "../shared" not in text and "SPEC" not in text, name
    assert "`KERNEL.py` is your copy of the kernel's file" in texts["docs/kernel-source.md"]


def test_the_readme_install_gives_every_command_it_and_launch_show():
    """The README's one install line brings what its commands and launch/'s scripts
    need: mpirun (mpich), pytest (test) and matplotlib for `study plot` (study)."""
    install = next(line for line in (ROOT / "README.md").read_text().splitlines()
                   if line.startswith("pip install"))
    extras = set(install.split("[", 1)[1].split("]", 1)[0].split(","))
    scripts = " ".join(p.read_text() for p in (ROOT / "launch").iterdir())
    assert {"mpich", "test"} <= extras
    assert "study plot" not in scripts or "study" in extras


def test_the_vocabulary_table_is_the_backends_own():
    """docs/kernel-source.md's table is tl's VOCABULARY, row for row, and VOCABULARY
    names every call of the backend's (the runner's own helpers aside)."""
    from gqa_mpi.dsl.tl import CALLS, VOCABULARY, Backend
    own = {n for n in dir(Backend) if not n.startswith("_")} - {"pointer", "region", "fault"}
    assert own == CALLS
    with open(os.path.join(ROOT, "docs", "kernel-source.md")) as f:
        page = f.read()
    for group, (names, cost) in VOCABULARY.items():
        row = (f"| {group} | {' '.join(f'`{n}`' for n in names)} | "
               f"{cost.replace('|', chr(92) + '|')} |")
        assert row in page, row
