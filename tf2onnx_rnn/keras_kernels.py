"""Keras models traced and called as on a machine without a GPU, whatever devices TensorFlow sees.

Where TensorFlow lists a GPU, Keras 3 picks cuDNN's kernel for an LSTM or GRU layer whose
configuration cuDNN supports (its default activations, a bias, not unrolled, no recurrent dropout)
when the layer is traced: the graph holds one ``CudnnRNNV3`` op instead of the layer's while-loop
(``keras/src/backend/tensorflow/rnn.py``: ``cudnn_ok``, which asks ``_is_gpu_available``). cuDNN's
kernel takes right-padded masks only and outputs zeros at a masked step where Keras's own loop
carries the last output. tf_keras (and Keras 2) traces its loop either way, and registers its cuDNN
variant beside it in the graph for grappler to swap in on a GPU at run time
(``layers/rnn/gru_lstm_utils.py``: ``function_register``, from ``lstm_with_backend_selection`` and
``gru_with_backend_selection``); an eager call on a GPU runs cuDNN's.

:func:`cpu_kernels` makes both flavors compute as on a CPU while a model is traced for conversion
and while it is called as the reference of a check: Keras 3's probe answers no, tf_keras's cuDNN
variant is not registered (the traced call and its loop are the same; the variant is never called, and
building it and its gradients took about 0.7 s per LSTM or GRU layer, measured: the trace of a
Bidirectional LSTM, a GRU and an LSTM went from 5.8 s to 2.9 s), and calls run under
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
# tf_keras's and Keras 2's helpers that register an LSTM's or GRU's cuDNN variant in the graph being traced
_REGISTERING_MODULES = ("tf_keras.src.layers.rnn.gru_lstm_utils", "keras.src.layers.rnn.gru_lstm_utils")
_REGISTER = "function_register"


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


def _registering_modules() -> list:
    """tf_keras's and Keras 2's modules that register a layer's cuDNN variant, those already imported (the
    layers import them: a model holding such a layer has)."""
    return [sys.modules[name] for name in _REGISTERING_MODULES
            if callable(getattr(sys.modules.get(name), _REGISTER, None))]


@contextlib.contextmanager
def cpu_kernels(eager: bool = False):
    """Inside the block, Keras 3 picks its layers' own loops, not cuDNN's kernel, and tf_keras does not
    register its cuDNN variant beside its loop; with ``eager`` (a call of the model, not a trace),
    TensorFlow also places ops on the CPU, as tf_keras's eager choice of kernel reads the device."""
    import tensorflow as tf

    patched = [(module, _PROBE, module.__dict__[_PROBE], _no_gpu) for module in _keras3_rnn_modules()] + \
        [(module, _REGISTER, module.__dict__[_REGISTER], _not_registered) for module in _registering_modules()]
    for module, name, _, replacement in patched:
        setattr(module, name, replacement)
    try:
        with tf.device("/cpu:0") if eager else contextlib.nullcontext():
            yield
    finally:
        for module, name, original, _ in patched:
            setattr(module, name, original)


def _no_gpu() -> bool:
    return False


def _not_registered(function, *args, **kwargs) -> None:
    """tf_keras's ``function_register``, registering nothing (its callers do not read what it returns)."""
    return None


def gpu_visible() -> bool:
    """Whether TensorFlow lists a GPU on this machine."""
    import tensorflow as tf

    try:
        return bool(tf.config.list_logical_devices("GPU"))
    except Exception:  # noqa: BLE001 - TensorFlow's device listing raises its own kinds
        return False
