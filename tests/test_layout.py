"""The package's shape: folders by role, imports one way, no import cycle.

Read from the source files (every ``import`` and ``from ... import``, those inside functions too;
not those only type checkers read), so nothing is imported to check it. A package's ``__init__``
importing its own submodules (a registry finding them) is not an edge: it is how a package holds
its parts.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tf2onnx_rnn")
REWRITERS = os.path.join(ROOT, "rewriters")  # installed as tf2onnx_rnn.rewriters
TOP_LEVEL_REWRITERS = {"__init__", "pipeline", "description", "outcome", "rows", "runtimes", "obstacles"}
# the rewriter package's layers, lowest first: a module may import its own layer and those before it
# (``__init__`` is the registry of cell families, which the readers ask)
# (the written model's graph toolkit is the lowest: the table's obstacles read written models with it)
LAYERS = (("description", "outcome", "runtimes", "obstacles", "written.graph"), ("cells",), ("__init__",),
          ("readers",), ("emit",), ("written",), ("rows", "pipeline"))


def _modules() -> dict:
    """Dotted name -> file, for tf2onnx_rnn and its rewriters."""
    found = {}
    for base, prefix in ((PACKAGE, "tf2onnx_rnn"), (REWRITERS, "tf2onnx_rnn.rewriters")):
        for folder, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not (base == PACKAGE and d == "rewriters")]
            relative = os.path.relpath(folder, base)
            parts = [prefix] + ([] if relative == "." else relative.split(os.sep))
            for name in files:
                if name.endswith(".py"):
                    found[".".join(parts + ([] if name == "__init__.py" else [name[:-3]]))] = os.path.join(folder, name)
    return found


def _imports(name: str, path: str, modules: dict) -> set:
    """The package's modules that ``name`` imports (not under ``if TYPE_CHECKING:``, which never runs)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for node in _nodes(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names)
    return {target for target in targets if target in modules and target != name
            and not (path.endswith("__init__.py") and target.startswith(name + "."))}


def _nodes(tree):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_package_has_no_import_cycle():
    graph, cycles = _graph(), []
    state: dict = {}

    def visit(name: str, trail: list) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_rewriters_import_one_way():
    """The rewriters import nothing of the package above them, and their layers only downwards."""
    graph = _graph()
    prefix = "tf2onnx_rnn.rewriters."

    def layer(name: str) -> int:
        parts = name[len(prefix):].split(".") if name.startswith(prefix) else ["__init__"]
        return next(index for index, members in enumerate(LAYERS) if ".".join(parts[:2]) in members
                    or parts[0] in members)

    wrong = []
    for name, targets in graph.items():
        if not (name == prefix[:-1] or name.startswith(prefix)):
            continue
        for target in targets:
            if not target.startswith(prefix[:-1]):
                wrong.append(f"{name} imports {target}, above the rewriters")
            elif layer(target) > layer(name):
                wrong.append(f"{name} imports {target}, a later layer")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_rewriters_folder_shows_its_roles():
    entries = {entry[:-3] if entry.endswith(".py") else entry for entry in os.listdir(REWRITERS)
               if entry != "__pycache__"}
    folders = {entry for entry in entries if os.path.isdir(os.path.join(REWRITERS, entry))}
    assert folders == {"cells", "readers", "emit", "written"}
    assert entries - folders == TOP_LEVEL_REWRITERS
    assert all(os.path.isfile(os.path.join(REWRITERS, folder, "__init__.py")) for folder in folders)


def test_the_check_sees_an_edge():
    """The reader of imports finds a module's relative imports, those inside functions included."""
    graph = _graph()
    assert "tf2onnx_rnn.verify" in graph["tf2onnx_rnn.sources.tflite"]  # imported inside a method
    assert "tf2onnx_rnn.rewriters.cells.body" in graph["tf2onnx_rnn.rewriters.readers.skeleton"]
    assert "tf2onnx_rnn.rewriters.description" in graph["tf2onnx_rnn.rewriters.cells.lstm"]
