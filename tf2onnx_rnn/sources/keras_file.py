"""A Keras model file as a source: ``.keras`` (Keras 3) or ``.h5`` (Keras 3 or Keras 2), loaded
and then converted as a live Keras model.

Other people's files are untrusted. Before anything is deserialized the stored config is read
(:mod:`.keras_config`): a file that carries Python code (a ``Lambda`` layer's function) is refused
unless the user trusts it (``safe_mode=False``, Keras's own name; ``--no-safe-mode``), and so is a
class or function from a module the process does not provide (``custom_objects``). Keras 3 loads
every file on TensorFlow, whatever backend the user's environment names
(:func:`use_tensorflow_backend`): a ``.keras`` file is backend-neutral.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from typing import Optional

from ..errors import ConversionError, first_line, param
from . import TRUST, Frozen, Source
from .keras_config import carried_code, foreign_objects, keras_json_backend, stored_config
from .keras_model import KerasModel

KERAS_EXTENSIONS = (".keras", ".h5", ".hdf5")
HDF5_EXTENSIONS = (".h5", ".hdf5")


class KerasFile(Source):
    """A Keras model file, loaded once (after TensorFlow's import), then a :class:`KerasModel`."""

    kind = "keras_file"
    options = ("safe_mode", "custom_objects")

    def __init__(self, path: str, safe_mode: bool = True, custom_objects=None):
        """``custom_objects``: name -> class or function, or the Python files and modules defining them
        (imported when the file is loaded)."""
        self.path, self.safe_mode, self.custom_objects = path, safe_mode, custom_objects
        self._model = None

    def check(self) -> None:
        check_keras_file(self.path)
        if self.custom_objects is not None and not isinstance(self.custom_objects, dict):
            for source in self.custom_objects:
                if source.endswith(".py") and not os.path.isfile(source):
                    raise ConversionError(f"{param('custom_objects')}: no such Python file: {source}")

    @property
    def model(self) -> KerasModel:
        if self._model is None:
            objects = self.custom_objects
            if objects is not None and not isinstance(objects, dict):
                objects = custom_objects_from(objects)
            loaded = load_keras_file(self.path, self.safe_mode, objects)
            self._model = KerasModel(loaded, safe_mode=self.safe_mode)
        return self._model

    def prepared(self, options):
        return self.model.prepared(options)

    def freeze(self, options) -> Frozen:
        return self.model.freeze(options)

    def verify(self, model_proto, tolerance: float, values: bool = True):
        return self.model.verify(model_proto, tolerance, values)


def check_keras_file(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` looks like a Keras model file."""
    import zipfile

    if not os.path.exists(path):
        raise ConversionError(f"no such Keras file: {path}")
    if os.path.isdir(path):
        raise ConversionError(f"{param('keras_file')} needs a .keras or .h5 file, got a directory: {path} "
                              f"(use {param('saved_model')} for a SavedModel)")
    if not path.lower().endswith(KERAS_EXTENSIONS):
        raise ConversionError(f"{param('keras_file')} needs a .keras or .h5 file, got: {path}")
    if path.lower().endswith(HDF5_EXTENSIONS):
        import h5py

        if not h5py.is_hdf5(path):
            raise ConversionError(f"not an HDF5 file: {path}")
    elif not zipfile.is_zipfile(path):
        raise ConversionError(f"not a .keras model archive (a .keras file is a zip archive): {path}")


def check_stored_config(path: str, safe_mode: bool = True, custom_objects: Optional[dict] = None) -> None:
    """Refuse, before anything is deserialized, a file whose config carries Python code (unless
    ``safe_mode`` is off) or names classes and functions from modules the process does not provide."""
    try:
        config = stored_config(path) or {}
    except (OSError, ValueError, KeyError):  # Keras reads the same config: it can build nothing from it either
        return
    code = carried_code(config)
    if code and safe_mode:
        raise ConversionError(f"{path} carries Python code that loading and converting it would run: "
                              f"{'; '.join(code)}. If you trust the file, convert it with {TRUST}")
    known = set(custom_objects or {})
    foreign = foreign_objects(config, lambda name: name in known or _registered(name))
    if foreign:
        name, module = foreign[0]
        raise ConversionError(f"{path} uses {name!r} from the module {module!r}, which is not Keras's own: "
                              f"{_provide(name)}")


def _provide(name: str) -> str:
    return (f"give the Python file or module that defines it as {param('custom_objects')} (in Python: "
            f"keras.models.load_model(path, custom_objects={{{name!r}: ...}}), then convert_keras(model))")


def _registered(name: str) -> bool:
    import keras

    saving = getattr(keras, "saving", None)
    return bool(saving is not None and saving.get_registered_object(name) is not None)


def load_keras_file(path: str, safe_mode: bool = True, custom_objects: Optional[dict] = None):
    """Load a Keras model file with ``keras`` (Keras 3, or Keras 2 in TensorFlow 2.15); an .h5
    file that fails gets a second try with tf_keras where it is installed. What the file carries is
    checked first (:func:`check_stored_config`)."""
    check_keras_file(path)
    check_stored_config(path, safe_mode, custom_objects)
    import keras

    loader = keras
    if keras.__version__.startswith("2.") and "tf_keras" in sys.modules and not path.lower().endswith(HDF5_EXTENSIONS):
        # Keras 2's .keras loader never returns once tf_keras, its fork, is imported in the same process
        # (TensorFlow 2.15, any functional model: its nest calls loop); tf_keras reads the same format
        loader = sys.modules["tf_keras"]
    try:
        return loader.models.load_model(path, compile=False, safe_mode=safe_mode, custom_objects=custom_objects)
    except Exception as error:  # Keras raises many kinds for unreadable files
        first_error = error
    if not path.lower().endswith(HDF5_EXTENSIONS):
        raise _load_error(path, first_error) from first_error
    try:
        import tf_keras
    except ImportError:
        raise ConversionError(f"cannot load Keras model {path} with Keras {keras.__version__} "
                              f"({first_line(first_error)}), and tf_keras is not installed to try") from first_error
    try:
        return tf_keras.models.load_model(path, compile=False, custom_objects=custom_objects)
    except Exception as error:  # as above
        unknown = _unknown_name(error) or _unknown_name(first_error)
        if unknown:
            raise _load_error(path, error) from error
        raise ConversionError(f"cannot load Keras model {path}: Keras {keras.__version__}: "
                              f"{first_line(first_error)}; tf_keras: {first_line(error)}") from error


_UNKNOWN = re.compile(r"(?:Unknown [a-z ]+|Could not locate (?:class|function))[: ]+'([^']+)'")


def _unknown_name(error: BaseException) -> Optional[str]:
    match = _UNKNOWN.search(str(error))
    return match.group(1) if match else None


def _load_error(path: str, error: BaseException) -> ConversionError:
    unknown = _unknown_name(error)
    if unknown:
        return ConversionError(f"{path} uses {unknown!r}, which this Keras does not know (a custom class or "
                               f"function): {_provide(unknown)}")
    if "safe_mode" in str(error):
        return ConversionError(f"Keras refuses to load {path} in safe mode ({first_line(error)}); if you trust "
                               f"the file, convert it with {TRUST}")
    return ConversionError(f"cannot load Keras model {path}: {first_line(error)}")


def custom_objects_from(sources) -> dict:
    """The classes and functions defined in each Python file or module named (each imported: code the
    user names, and so trusts), by name."""
    found = {}
    for source in sources:
        module = _imported(source)
        for name, value in vars(module).items():
            if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == module.__name__:
                found[name] = value
    return found


def _imported(source: str):
    try:
        if source.endswith(".py") or os.sep in source:
            if not os.path.isfile(source):
                raise ConversionError(f"{param('custom_objects')}: no such Python file: {source}")
            name = "tf2onnx_rnn_custom_objects_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(source))[0])
            spec = importlib.util.spec_from_file_location(name, source)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(source)
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's own module failed to import
        raise ConversionError(f"{param('custom_objects')}: cannot import {source}: {type(error).__name__}: "
                              f"{first_line(error)}") from error


def use_tensorflow_backend() -> str:
    """Make Keras 3 load on TensorFlow in this process, whatever ``KERAS_BACKEND`` or ``keras.json``
    names (a file is backend-neutral; the conversion reads TensorFlow graphs). Returns a one-line
    note when that overrides the user's setting, else "". Keras picks its backend at first import,
    so this must run before it."""
    configured = os.environ.get("KERAS_BACKEND") or keras_json_backend() or "tensorflow"
    if "keras" in sys.modules:
        backend = _backend_in_use()
        if backend not in (None, "tensorflow"):
            raise ConversionError(f"Keras was imported with the {backend} backend before the conversion: "
                                  "convert in a process that uses the tensorflow backend")
        return ""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if configured == "tensorflow":
        return ""
    return f"note: loading on Keras's tensorflow backend (this environment names {configured})"


def _backend_in_use() -> Optional[str]:
    backend = getattr(sys.modules["keras"], "backend", None)
    name = getattr(backend, "backend", None)
    return name() if callable(name) else None
