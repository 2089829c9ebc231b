"""Pattern-matching rewriters that turn Keras recurrent while-loops into ONNX LSTM/GRU/RNN nodes.

Installed as ``tf2onnx_rnn.rewriters``. One module per cell family (``lstm``, ``gru``,
``simple_rnn``), each with a ``KIND`` (a :class:`~.description.CellKind`: Keras name, ONNX op, scope
hint, state roles) and a ``match(view, skeleton)`` function. :func:`cell_matchers` finds them:
a new cell kind is a new module here, and nothing else changes.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil

__all__ = ["cell_matchers", "cell_kinds"]


@functools.lru_cache(maxsize=None)
def cell_matchers() -> tuple:
    """The cell modules of this package (each defines ``KIND`` and ``match``), by module name."""
    from .description import CellKind

    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "KIND", None), CellKind) and callable(getattr(module, "match", None)):
            found.append(module)
    return tuple(found)


def cell_kinds() -> tuple:
    """Every cell family's :class:`~.description.CellKind`."""
    return tuple(module.KIND for module in cell_matchers())
