"""Keras models traced and called as on a machine without a GPU, whatever devices TensorFlow sees.

Where TensorFlow lists a GPU, Keras 3 picks cuDNN's kernel for an LSTM or GRU layer whose
configuration cuDNN supports (its default activations, a bias, not unrolled, no recurrent dropout)
when the layer is traced: the graph holds one ``CudnnRNNV3`` op instead of the layer's while-loop
(``keras/src/backend/tensorflow/rnn.py``: ``cudnn_ok``, which asks ``_is_gpu_available``). cuDNN's
kernel takes right-padded masks only and outputs zeros at a masked step where Keras's own loop
carries the last output. tf_keras traces its loop either way (grappler swaps in its cuDNN function at
run time), but an eager call on a GPU runs cuDNN's.

:func:`cpu_kernels` makes both flavors compute as on a CPU while a model is traced for conversion
and while it is called as the reference of a check: Keras 3's probe answers no, and calls run under
``tf.device("/cpu:0")`` (tf_keras's eager choice reads the device). The converted model then has the
same native nodes, the same report and the same exactness for every mask on any machine, and is
checked against the computation it converts.
"""
from __future__ import annotations

import contextlib
import importlib
import sys

# Keras 3's TensorFlow recurrent backend, where its GPU probe lives (the path of Keras 3.0 and 3.1 second)
_KERAS3_RNN_MODULES = ("keras.src.backend.tensorflow.rnn", "keras.backend.tensorflow.rnn")
_PROBE = "_is_gpu_available"


def _keras3_rnn_modules() -> list:
    """Keras 3's TensorFlow recurrent backend modules that hold the GPU probe (none without Keras 3, or on
    another backend: importing the TensorFlow backend is left to Keras)."""
    keras = sys.modules.get("keras")
    if keras is None or not str(getattr(keras, "__version__", "")).startswith("3"):
        return []
    found = []
    for name in _KERAS3_RNN_MODULES:
        if name.rsplit(".", 1)[0] not in sys.modules and name not in sys.modules:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, _PROBE, None)):
            found.append(module)
    return found


@contextlib.contextmanager
def cpu_kernels(eager: bool = False):
    """Inside the block, Keras 3 picks its layers' own loops, not cuDNN's kernel; with ``eager`` (a call
    of the model, not a trace), TensorFlow also places ops on the CPU, as tf_keras's eager choice of
    kernel reads the device."""
    import tensorflow as tf

    patched = [(module, module.__dict__[_PROBE]) for module in _keras3_rnn_modules()]
    for module, _ in patched:
        setattr(module, _PROBE, _no_gpu)
    try:
        with tf.device("/cpu:0") if eager else contextlib.nullcontext():
            yield
    finally:
        for module, probe in patched:
            setattr(module, _PROBE, probe)


def _no_gpu() -> bool:
    return False


def gpu_visible() -> bool:
    """Whether TensorFlow lists a GPU on this machine."""
    import tensorflow as tf

    try:
        return bool(tf.config.list_logical_devices("GPU"))
    except Exception:  # noqa: BLE001 - TensorFlow's device listing raises its own kinds
        return False
