"""What a Keras model file carries, read from its stored config before anything is deserialized.

A ``.keras`` file keeps its model config as JSON (``config.json`` in the zip archive); an ``.h5``
file keeps it in the ``model_config`` attribute. Reading either runs nothing. In it:

- **code**: a ``Lambda`` layer's function (marshalled Python bytecode, or a named Python function
  that would be looked up and called), and Keras 3's ``__lambda__`` objects (bytecode anywhere a
  function is taken);
- **classes and functions from other modules**: an object whose ``module`` is not Keras's own
  (a custom layer, activation, initializer...). Loading needs the class itself, and some Keras
  versions import the module named in the file to find it, which runs that module's code.
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Iterator, Optional

_KERAS_PACKAGES = ("keras", "keras_hub", "keras_cv", "keras_nlp", "tf_keras", "tensorflow", "builtins")
# Keras 3's markers for values that are data, not classes (a tensor, an array, bytes, a slice...)
_DATA_MARKERS = frozenset({"__tensor__", "__numpy__", "__bytes__", "__typespec__", "__ellipsis__", "__slice__",
                           "__tuple__"})


def stored_config(path: str) -> Optional[dict]:
    """The model config a Keras file stores, as JSON (None when the file keeps none)."""
    if path.lower().endswith((".h5", ".hdf5")):
        import h5py

        with h5py.File(path, "r") as stored:
            text = stored.attrs.get("model_config")
        if text is None:
            return None
        return json.loads(text.decode() if isinstance(text, bytes) else text)
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():
            return None
        return json.loads(archive.read("config.json"))


def _objects(node, layer: str = "") -> Iterator[tuple]:
    """Every serialized object in a config (a dict with a ``class_name``), with the name of the
    layer it belongs to."""
    if isinstance(node, dict):
        if "class_name" in node:
            config = node.get("config")
            name = config.get("name") if isinstance(config, dict) else None
            layer = name if isinstance(name, str) else layer
            yield node, layer
        for value in node.values():
            yield from _objects(value, layer)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value, layer)


def carried_code(config: dict) -> list:
    """What in ``config`` is Python code that loading (or calling) the model would run, one phrase
    each: ``layer 'double' (Lambda: marshalled Python bytecode)``."""
    found: dict = {}  # layer -> what it carries (a Lambda layer's function is listed once, as the layer's)
    for obj, layer in _objects(config):
        what = _code_of(obj)
        if what:
            found.setdefault(layer, f"layer {layer!r} ({what})" if layer else what)
    return list(found.values())


def _code_of(obj: dict) -> str:
    class_name = obj.get("class_name")
    if class_name == "__lambda__":
        return "a lambda: marshalled Python bytecode"
    if class_name != "Lambda":
        return ""
    config = obj.get("config") or {}
    function = config.get("function")
    if config.get("function_type") == "lambda" or (isinstance(function, dict)
                                                    and function.get("class_name") == "__lambda__"):
        return "Lambda: marshalled Python bytecode"
    if isinstance(function, dict):
        return f"Lambda: the Python function {function.get('module')}.{function.get('config')}"
    return f"Lambda: the Python function {config.get('module')}.{function}" if function else "Lambda"


def foreign_objects(config: dict, known=lambda name: False) -> list:
    """Classes and functions of ``config`` from a module that is not Keras's own and that
    ``known(name)`` (the registered name, or the class name) does not provide: ``(name, module)``."""
    found = []
    for obj, _ in _objects(config):
        class_name, module = obj.get("class_name"), obj.get("module")
        if not isinstance(module, str) or class_name in _DATA_MARKERS or class_name == "__lambda__":
            continue
        if module.split(".")[0] in _KERAS_PACKAGES:
            continue
        name = obj.get("config") if class_name == "function" else class_name
        registered = obj.get("registered_name") or name
        if not (known(registered) or known(name)):
            found.append((str(name), module))
    return list(dict.fromkeys(found))


def keras_json_backend() -> Optional[str]:
    """The backend ``keras.json`` names (Keras's own lookup: ``KERAS_HOME``, else ``~/.keras``)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as stream:
            backend = json.load(stream).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, str) else None
