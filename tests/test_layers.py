"""The layout shows the layers: core (NumPy only) <- mpi <- app <- tools."""
import ast
import pathlib
import subprocess
import sys

import gqa_mpi

PACKAGE = pathlib.Path(gqa_mpi.__file__).parent
ORDER = ["core", "mpi", "app", "tools"]


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


def test_core_loads_no_mpi():
    code = ("import sys, gqa_mpi.core, gqa_mpi.core.attention, gqa_mpi.core.kernels, "
            "gqa_mpi.core.schedules, gqa_mpi.core.wires, gqa_mpi.core.grid, "
            "gqa_mpi.core.kernel_model, gqa_mpi.core.partition, gqa_mpi.core.reference, "
            "gqa_mpi.core.inputs, gqa_mpi.core.trace, gqa_mpi.core.streamed, "
            "gqa_mpi.core.progress; "
            "assert 'mpi4py' not in sys.modules, 'core imported mpi4py'; "
            "import gqa_mpi; assert 'mpi4py' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


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


def test_core_modules_are_numpy_only():
    for path in (PACKAGE / "core").rglob("*.py"):
        text = path.read_text()
        assert "mpi4py" not in text and "from ..mpi" not in text, path
