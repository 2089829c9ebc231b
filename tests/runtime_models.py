"""The runtime tests' Keras models (22 of them, in both flavors) and their conversions in every form, shared
by the tests that run them (``test_runtime_targets``, ``test_runtime_claims``, the PyTorch claims), once per
process or, where ``TF2ONNX_RNN_SHARED_MODELS`` names a folder, once per folder."""
from __future__ import annotations

import os

import numpy as np
import onnx

import parity
from tf2onnx_rnn import ConversionError, convert_keras
from tf2onnx_rnn.rewriters.runtimes import BY_KEY

BATCH, TIME, FEATURES, UNITS = 3, 7, 5, 6  # batch unlike time
TARGETS = ("iree", "tvm", "ncnn", "rknn")
# every form the report vouches for: the default and portable forms at a fixed shape and with the model's own
# (dynamic batch) signature, and each target's form (onnxruntime's at a fixed shape)
FORMS = ("default", "portable", "default-dynamic", "portable-dynamic", "onnxruntime") + TARGETS


def model(K, name: str, seed: int):
    layers = K.layers
    x = K.Input(step_shape(name), name="x")
    if name == "lstm":
        y = layers.LSTM(UNITS, return_sequences=True)(x)
    elif name == "gru_reset_before":
        y = layers.GRU(UNITS, return_sequences=True, reset_after=False)(x)
    elif name == "gru":
        y = layers.GRU(UNITS, return_sequences=True)(x)
    elif name == "simple_rnn":
        y = layers.SimpleRNN(UNITS, return_sequences=True)(x)
    elif name == "go_backwards":
        y = layers.LSTM(UNITS, go_backwards=True)(x)
    elif name == "bidirectional_concat":
        y = layers.Bidirectional(layers.LSTM(UNITS, return_sequences=True))(x)
    elif name == "bidirectional_gru_sum":
        y = layers.Bidirectional(layers.GRU(UNITS, return_sequences=True), merge_mode="sum")(x)
    elif name == "bidirectional_mul_ave":  # two merge modes, stacked
        h = layers.Bidirectional(layers.SimpleRNN(UNITS, return_sequences=True), merge_mode="mul")(x)
        y = layers.Bidirectional(layers.GRU(UNITS, reset_after=False), merge_mode="ave")(h)
    elif name == "bidirectional_none":  # no merge: each direction an output of its own
        y = layers.Bidirectional(layers.LSTM(UNITS, return_sequences=True), merge_mode=None)(x)
    elif name == "states_returned":
        y = layers.LSTM(UNITS, return_sequences=True, return_state=True)(x)
    elif name == "stack_states":
        seq, h, c = layers.LSTM(UNITS, return_sequences=True, return_state=True)(x)
        y = layers.GRU(UNITS)(seq, initial_state=h)
    elif name == "masked":
        y = layers.LSTM(UNITS, return_sequences=True)(layers.Masking(0.0)(x))
    elif name == "masked_bidirectional_gru":
        y = layers.Bidirectional(layers.GRU(UNITS, return_sequences=True))(layers.Masking(0.0)(x))
    elif name == "gelu_scan":
        y = layers.SimpleRNN(UNITS, activation="gelu", return_sequences=True)(x)
    elif name == "stacked_cells":
        y = layers.RNN(layers.StackedRNNCells([layers.LSTMCell(UNITS), layers.GRUCell(UNITS)]),
                       return_sequences=True)(x)
    elif name == "conv_lstm":
        y = layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True)(x)
    elif name == "hard_sigmoid":  # a Keras 2 era stack: hard_sigmoid gates, GRU reset_after=False
        h = layers.LSTM(UNITS, recurrent_activation="hard_sigmoid", return_sequences=True)(x)
        y = layers.GRU(UNITS, recurrent_activation="hard_sigmoid", reset_after=False, return_sequences=True)(h)
    elif name == "bidirectional_hard_sigmoid":
        y = layers.Bidirectional(layers.LSTM(UNITS, recurrent_activation="hard_sigmoid", return_sequences=True))(x)
    elif name == "relu_linear":
        h = layers.SimpleRNN(UNITS, activation="relu", return_sequences=True)(x)
        y = layers.LSTM(UNITS, activation="linear", return_sequences=True)(h)
    elif name == "conv_lstm_last":  # its last output: the Scan form pads a full-length output with an empty one
        y = layers.ConvLSTM2D(3, 3, padding="same")(x)
    elif name == "softsign_elu":
        h = layers.GRU(UNITS, activation="softsign", return_sequences=True)(x)
        y = layers.SimpleRNN(UNITS, activation="elu", return_sequences=True)(h)
    elif name == "skip_stack":  # a stack whose first sequence is also read batch-major beside the second's
        h = layers.LSTM(UNITS, return_sequences=True)(x)
        y = layers.Concatenate()([x, h, layers.GRU(UNITS, return_sequences=True)(h)])
    model = K.Model(x, list(y) if isinstance(y, (list, tuple)) else y)
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.5, tuple(weight.shape)).astype(np.float32))
    return model


# (each model's weights are seeded by its place here: new models go last)
MODELS = ("lstm", "gru", "gru_reset_before", "simple_rnn", "go_backwards", "bidirectional_concat",
          "bidirectional_gru_sum", "stack_states", "masked", "masked_bidirectional_gru", "gelu_scan",
          "stacked_cells", "conv_lstm", "bidirectional_mul_ave", "bidirectional_none", "states_returned",
          "conv_lstm_last", "hard_sigmoid", "bidirectional_hard_sigmoid", "relu_linear", "softsign_elu", "skip_stack")
MASKED = ("masked", "masked_bidirectional_gru")
_CONVERTED: dict = {}


def step_shape(name: str) -> tuple:
    """(time, the shape of one step) of the model's input."""
    return (TIME, 4, 4, 2) if name.startswith("conv_lstm") else (TIME, FEATURES)


def inputs(name: str) -> np.ndarray:
    """A batch unlike the time length; a masked model's rows full, post-padded, pre-padded, holed and empty
    (5 of them), the pre-padded one third: a runtime taking one row at a time (ncnn) gets it alone."""
    if name in MASKED:
        x = np.random.default_rng(7).normal(size=(5,) + step_shape(name)).astype(np.float32)
        x[1, 5:] = 0
        x[2, :2] = 0
        x[3, 2] = x[3, 4] = 0
        x[4] = 0
        return x
    return np.random.default_rng(7).normal(size=(BATCH,) + step_shape(name)).astype(np.float32)


def seed(name: str) -> int:
    return 11 + MODELS.index(name)


def converted(flavor: str, name: str, form: str):
    """(the input, the Keras model's outputs, the model in ``form`` or the ConversionError), once per process;
    where ``TF2ONNX_RNN_SHARED_MODELS`` names a folder, once per folder: CI's runtimes slice runs the models
    its main suite converted. A form (:data:`FORMS`) is a target (``default``: none) at the input's fixed
    shape, or with ``-dynamic`` the model's own signature (its batch dynamic)."""
    key = (flavor, name, form)
    if key not in _CONVERTED:
        _CONVERTED[key] = _shared(key) or _converted(*key)
    return _CONVERTED[key]


def _converted(flavor: str, name: str, form: str):
    import tensorflow as tf

    target, dynamic = form.removesuffix("-dynamic"), form.endswith("-dynamic")
    keras_model = model(parity.keras_module(flavor), name, seed(name))
    x = inputs(name)
    if target in BY_KEY and BY_KEY[target].batch_one:  # ncnn: one row at a time, the pre-padded masked one
        x = x[2:3]
    want = [np.asarray(o) for o in tf.nest.flatten(keras_model(x, training=False))]
    try:
        signature = None if dynamic else [tf.TensorSpec(x.shape, tf.float32, name="x")]
        proto = convert_keras(keras_model, input_signature=signature, target=None if target == "default" else target)
    except ConversionError as error:
        proto = error
    folder = os.environ.get("TF2ONNX_RNN_SHARED_MODELS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, "-".join((flavor, name, form)))
        arrays = {"x": x, **{f"want{k}": w for k, w in enumerate(want)}}
        arrays["refused"] = np.array(str(proto) if isinstance(proto, ConversionError) else "")
        if not isinstance(proto, ConversionError):
            onnx.save(proto, stem + ".onnx")
        np.savez(stem + ".partial.npz", **arrays)
        os.replace(stem + ".partial.npz", stem + ".npz")  # the model's file first, then its arrays: whole or absent
    return x, want, proto


def _shared(key: tuple):
    folder = os.environ.get("TF2ONNX_RNN_SHARED_MODELS")
    stem = os.path.join(folder, "-".join(key)) if folder else ""
    if not folder or not os.path.exists(stem + ".npz"):
        return None
    stored = np.load(stem + ".npz")
    want = [stored[f"want{k}"] for k in range(len(stored.files) - 2)]
    refused = str(stored["refused"])
    return stored["x"], want, ConversionError(refused) if refused else onnx.load(stem + ".onnx")
