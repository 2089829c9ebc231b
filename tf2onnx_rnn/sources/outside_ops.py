"""Which TensorFlow ops reach outside the process, and which ops a graph will execute.

A SavedModel is a program: loading it runs its initializers, and running a signature runs every
stateful op the signature holds, file writes and prints included. Before either happens, the ops
that would run are read from the graph (functions included, without running anything) and
checked against TensorFlow's own op registry: an op the registry marks stateful reaches outside
the process unless it comes from one of TensorFlow's op libraries that keep to the process's
memory (variables, random generators, control flow and calls, lists, tensor arrays, queues,
in-memory tables). An op the registry does not know (a custom op) cannot be vouched for either.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Iterable, Optional

from ..errors import ConversionError
from . import TRUST

# TensorFlow's op libraries whose stateful ops keep to the process's memory
_MEMORY_LIBRARIES = frozenset({
    "array_ops", "control_flow_ops", "data_flow_ops", "functional_ops", "list_ops", "lookup_ops", "map_ops",
    "math_ops", "nn_ops", "random_ops", "resource_variable_ops", "state_ops", "stateful_random_ops",
    "stateless_random_ops", "stateless_random_ops_v2", "random_index_shuffle_ops", "logging_ops",
})
# ops of those libraries that do reach outside: files read into a table, a call on another process,
# printing (Assert, in the same library, only checks)
_REACHING_OUT = {"InitializeTableFromTextFile": "reads a file", "InitializeTableFromTextFileV2": "reads a file",
                 "RemoteCall": "calls another process", "Print": "prints", "PrintV2": "prints, to a file if asked",
                 "Timestamp": "reads the clock"}
# what the other libraries' ops do, for messages
_LIBRARY_WORDS = {"io_ops": "reads or writes files", "summary_ops": "writes summary files", "script_ops": "runs Python",
                  "collective_ops": "the network", "sendrecv_ops": "the network", "filesystem_ops": "files",
                  "debug_ops": "writes debug data", "checkpoint_ops": "reads checkpoint files",
                  "dataset_ops": "files or the network", "experimental_dataset_ops": "files or the network"}
# ops that read the SavedModel's own variables while it loads (the loader runs them itself)
RESTORING = frozenset({"RestoreV2", "Restore", "RestoreSlice", "MergeV2Checkpoints"})
# ops whose attributes name the functions they call
_FUNCTION_ATTRS = ("f", "body", "cond", "then_branch", "else_branch", "branches")


@functools.lru_cache(maxsize=None)
def _libraries() -> dict:
    """Op name -> the TensorFlow op library (its generated wrapper module) that defines it."""
    import tensorflow.python.ops as ops_package

    found = {}
    for info in pkgutil.iter_modules(ops_package.__path__):
        if not info.name.startswith("gen_"):
            continue
        try:
            module = importlib.import_module(f"{ops_package.__name__}.{info.name}")
        except Exception:  # noqa: BLE001 - a library this build does not have
            continue
        for name, value in vars(module).items():
            if callable(value) and name[:1].isupper():
                found.setdefault(name, info.name[len("gen_"):])
    return found


def reaching_out(op: str) -> str:
    """What ``op`` does outside the process ("" when it keeps to the process's memory or is stateless)."""
    from tensorflow.python.framework import op_def_registry

    definition = op_def_registry.get(op)
    if definition is None:
        return "a custom op TensorFlow does not describe"
    if op in _REACHING_OUT:
        return _REACHING_OUT[op]
    if not definition.is_stateful:
        return ""
    library = _libraries().get(op, "")
    if library in _MEMORY_LIBRARIES:
        return ""
    return _LIBRARY_WORDS.get(library, f"stateful, from {library or 'an unknown library'}")


def outside(ops: Iterable[str], allowed: Iterable[str] = ()) -> dict:
    """The ops of ``ops`` that reach outside the process (but ``allowed``), each with what it does."""
    allowed = set(allowed)
    return {op: what for op in sorted(set(ops)) if op not in allowed for what in [reaching_out(op)] if what}


def executed_ops(graph_def, roots: Optional[Iterable[str]] = None, functions_called: Iterable[str] = ()) -> set:
    """The op types a graph executes: the nodes ``roots`` (node or tensor names; None: every node)
    depend on, and every node of every function they call (and of ``functions_called``), transitively."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    nodes = {n.name: n for n in graph_def.node}
    pending = list(nodes) if roots is None else list(roots)
    seen, called, ops = set(), set(functions_called), set()
    while pending:
        name = pending.pop().lstrip("^").split(":")[0]
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        pending.extend(node.input)
        if node.op in functions:  # a function called as an op
            called.add(node.op)
        else:
            ops.add(node.op)
            called |= _called(node)
    return ops | _function_ops(functions, called)


def _called(node) -> set:
    """The functions a node's attributes name (a call's ``f``, a loop's body and condition...)."""
    names = set()
    for key in _FUNCTION_ATTRS:
        if key in node.attr:
            value = node.attr[key]
            names |= {value.func.name} | {f.name for f in value.list.func}
    return {name for name in names if name}


def _function_ops(functions: dict, called: set) -> set:
    ops, pending, seen = set(), list(called), set()
    while pending:
        name = pending.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in functions[name].node_def:
            if node.op in functions:  # a function called as an op
                pending.append(node.op)
                continue
            ops.add(node.op)
            pending.extend(_called(node))
    return ops


def refuse_outside(found: dict, doing: str) -> None:
    """Raise :class:`ConversionError` when ``found`` (op -> what it does) is not empty: ``doing``
    (what would run them) names the ops, and the opt-in."""
    if found:
        ops = ", ".join(f"{op} ({what})" for op, what in found.items())
        raise ConversionError(f"{doing} ops that reach outside TensorFlow: {ops}. If you trust the model, "
                              f"convert it with {TRUST}")
