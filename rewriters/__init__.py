"""Pattern-matching rewriters that turn Keras recurrent while-loops into ONNX LSTM/GRU/RNN nodes.

Installed as ``tf2onnx_rnn.rewriters``. A folder per role, imports running one way (each layer
imports only those above it in this list):

- :mod:`.description` (the typed records every stage hands on) and :mod:`.outcome` (the report's
  vocabulary);
- ``cells/``: one module per cell family (``lstm``, ``gru``, ``simple_rnn``), each with a ``KIND``
  (a :class:`~.description.CellKind`: Keras name, ONNX op, scope hint, state roles, step equation)
  and a ``match(view, skeleton)`` function, and what they read a cell through: the body view
  (``body``, its affine reading ``affine``), activations named by their values, small subgraphs
  evaluated, ONNX's equations;
- ``readers/``: what finds a layer's passes: loop bodies (``skeleton``, ``adapt``), stacked cells,
  unrolled chains, TFLite loops and fused ops;
- ``emit/``: the one emitter, its wirings (mask forms, states) and the nodes' planning;
- :mod:`.rows` (the report's rows) and :mod:`.pipeline` (the driver: tf2onnx's ``custom_rewriter``).

:func:`cell_matchers` finds the cell families: a new cell kind is a new module in ``cells/`` (or in
a folder added to this package's path), and nothing else changes. Such a module may import what a
cell module needs by the package's short names (``from .body import BodyView``, ``from .skeleton
import Skeleton``, ``from .gru import step``): :data:`CELL_API` maps them to their modules, which
:func:`cell_matchers` makes importable before it imports the cell modules.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
import sys

__all__ = ["CELL_API", "cell_matchers", "cell_kinds"]

# what a cell module imports, by the short name it has at the package's top: the module it is
CELL_API = {"body": "cells.body", "activations": "cells.activations", "equations": "cells.equations",
            "evaluate": "cells.evaluate", "lstm": "cells.lstm", "gru": "cells.gru", "simple_rnn": "cells.simple_rnn",
            "skeleton": "readers.skeleton"}


@functools.lru_cache(maxsize=None)
def cell_matchers() -> tuple:
    """The cell family modules (each defines ``KIND`` and ``match``): those of ``cells/``, then any in
    folders added to this package's path, each group by module name."""
    from . import cells
    from .description import CellKind

    for short, module in CELL_API.items():  # before a cell module in an added folder imports them
        sys.modules.setdefault(f"{__name__}.{short}", importlib.import_module(f"{__name__}.{module}"))
    found = []
    for package in (cells, sys.modules[__name__]):
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
            if info.ispkg:
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            if isinstance(getattr(module, "KIND", None), CellKind) and callable(getattr(module, "match", None)):
                found.append(module)
    return tuple(found)


def cell_kinds() -> tuple:
    """Every cell family's :class:`~.description.CellKind`."""
    return tuple(module.KIND for module in cell_matchers())
