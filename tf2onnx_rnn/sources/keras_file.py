"""A Keras model file as a source: ``.keras`` (Keras 3) or ``.h5`` (Keras 3 or Keras 2), loaded
and then converted as a live Keras model.
"""
from __future__ import annotations

import os

from ..errors import ConversionError, first_line, param
from . import Frozen, Source
from .keras_model import KerasModel


class KerasFile(Source):
    """A Keras model file, loaded once (after TensorFlow's import), then a :class:`KerasModel`."""

    kind = "keras_file"
    options = ()

    def __init__(self, path: str):
        self.path = path
        self._model = None

    def check(self) -> None:
        check_keras_file(self.path)

    @property
    def model(self) -> KerasModel:
        if self._model is None:
            self._model = KerasModel(load_keras_file(self.path))
        return self._model

    def prepared(self, options):
        return self.model.prepared(options)

    def freeze(self, options) -> Frozen:
        return self.model.freeze(options)

    def verify(self, model_proto, tolerance: float):
        return self.model.verify(model_proto, tolerance)


KERAS_EXTENSIONS = (".keras", ".h5", ".hdf5")
HDF5_EXTENSIONS = (".h5", ".hdf5")


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


def load_keras_file(path: str):
    """Load a Keras model file with ``keras`` (Keras 3, or Keras 2 in TensorFlow 2.15); an .h5
    file that fails gets a second try with tf_keras where it is installed."""
    check_keras_file(path)
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many kinds for unreadable files
        first_error = error
    if not path.lower().endswith(HDF5_EXTENSIONS):
        raise ConversionError(f"cannot load Keras model {path}: {first_line(first_error)}") from first_error
    try:
        import tf_keras
    except ImportError:
        raise ConversionError(f"cannot load Keras model {path} with Keras {keras.__version__} "
                              f"({first_line(first_error)}), and tf_keras is not installed to try") from first_error
    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as error:  # as above
        raise ConversionError(f"cannot load Keras model {path}: Keras {keras.__version__}: "
                              f"{first_line(first_error)}; tf_keras: {first_line(error)}") from error
