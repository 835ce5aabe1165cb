"""The layout shows the layers: the step's arithmetic <- the DSL <- config <- the check's
references (all NumPy only) <- mpi <- app <- tools."""
import ast
import pathlib
import subprocess
import sys

import gqa_mpi
import pytest

PACKAGE = pathlib.Path(gqa_mpi.__file__).parent
ORDER = ["step", "dsl", "config", "check", "mpi", "app", "tools"]
NUMPY_ONLY = ["step", "dsl", "config", "check"]


def imported_layers(path: pathlib.Path):
    """The gqa_mpi layers a module imports (relative or absolute imports)."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(PACKAGE).parts
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[:-node.level]) + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("gqa_mpi"):
                base = node.module.split(".")[1:]
            else:
                continue
            names = [a.name for a in node.names]
            layer = base[0] if base else (names[0] if len(names) == 1 else None)
            found.add(layer)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gqa_mpi."):
                    found.add(a.name.split(".")[1])
    return found & set(ORDER)


def test_each_layer_imports_only_the_layers_below_it():
    for layer in ORDER:
        for path in (PACKAGE / layer).rglob("*.py"):
            above = set(ORDER[ORDER.index(layer) + 1:])
            assert not imported_layers(path) & above, path


@pytest.mark.launch
def test_core_loads_no_mpi():
    code = ("import sys, gqa_mpi.step.attention, gqa_mpi.step.sweeps, "
            "gqa_mpi.step.schedules, gqa_mpi.step.wires, gqa_mpi.step.grid, "
            "gqa_mpi.check.kernel_model, gqa_mpi.step.partition, gqa_mpi.check.reference, "
            "gqa_mpi.config.inputs, gqa_mpi.step.trace, gqa_mpi.check.streamed, "
            "gqa_mpi.app.progress; "
            "assert 'mpi4py' not in sys.modules, 'core imported mpi4py'; "
            "import gqa_mpi; assert 'mpi4py' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.launch
def test_the_tools_start_no_mpi():
    """The bench and the study launch mpirun; an MPI initialised in them (a singleton)
    leaves its launcher's variables to the children, and Open MPI's mpirun then exits
    1 without a word."""
    code = ("import sys, gqa_mpi.tools.bench, gqa_mpi.tools.study.cli, gqa_mpi.app.sizing, "
            "gqa_mpi.app.outputs, gqa_mpi.app.record; "
            "assert 'mpi4py.MPI' not in sys.modules, 'a tool imported mpi4py.MPI'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_numpy_layers_are_numpy_only():
    for layer in NUMPY_ONLY:
        for path in (PACKAGE / layer).rglob("*.py"):
            text = path.read_text()
            assert "mpi4py" not in text and "from ..mpi" not in text, path


def test_app_makes_no_mpi_call_of_its_own():
    """MPI lives in mpi/: app/ imports no mpi4py and calls no communicator method; it
    reaches MPI through mpi/'s functions with plain arguments."""
    calls = {"Send", "Recv", "bcast", "gather", "allgather", "allreduce", "Split", "Abort",
             "Ibarrier", "Barrier", "send", "recv"}
    for path in (PACKAGE / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
                assert not any(n.startswith("mpi4py") for n in names), path
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in calls, (path, node.lineno, node.func.attr)
