"""Converted models trained in onnxruntime's training API, against TensorFlow.

Runs only where onnxruntime's training build is installed (CI's training environment,
``.ci/training-requirements.txt``); skipped elsewhere. Each model (LSTM, GRU in both modes,
SimpleRNN, Bidirectional, masked, in Keras 3 and tf_keras, weights and biases randomized; the Keras 3
LSTM and GRU models also as exported on a GPU machine, their layers cuDNN ops) is
converted with ``target="training"``, its artifacts written by
:func:`tf2onnx_rnn.write_training_artifacts` (MSE loss, SGD), and:

- one training step's gradients equal ``tf.GradientTape``'s on the same loss (relative 1e-5);
- after a few SGD steps in onnxruntime, the trained model (exported for inference) gives the
  outputs of the Keras model after the same steps taken in TensorFlow (1e-5), and the held gates
  have not moved.

Which ONNX element is which Keras weight (for the gradients) is found by value: every weight is drawn at random, so
each Keras value is unique, and the conversion copies each into the ONNX model exactly (reordered
and transposed); the held gates and held biases are not Keras weights.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

pytest.importorskip("onnxruntime.training", reason="needs onnxruntime's training build (the training slice)")

import onnxruntime  # noqa: E402

import parity  # noqa: E402
import tf2onnx_rnn  # noqa: E402
from tf2onnx_rnn.training import held_parameters  # noqa: E402

FEATURES, UNITS, BATCH, TIME = 3, 4, 3, 5
LEARNING_RATE, STEPS = 0.05, 3
MODELS = ("lstm", "gru", "gru_reset_before", "simple_rnn", "bidirectional_lstm", "masked_gru",
          "masked_bidirectional_simple_rnn")


def build(flavor: str, name: str):
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    h = K.layers.Masking(0.0)(x) if name.startswith("masked") else x
    kind = name.removeprefix("masked_").removeprefix("bidirectional_")
    layer = {"lstm": lambda: K.layers.LSTM(UNITS, return_sequences=True),
             "gru": lambda: K.layers.GRU(UNITS),
             "gru_reset_before": lambda: K.layers.GRU(UNITS, reset_after=False, go_backwards=True),
             "simple_rnn": lambda: K.layers.SimpleRNN(UNITS, return_sequences=True)}[kind]()
    h = (K.layers.Bidirectional(layer) if "bidirectional" in name else layer)(h)
    model = K.Model(x, K.layers.Dense(2)(h))
    rng = np.random.default_rng(zlib.crc32(f"{flavor}/{name}".encode()))
    for weight in model.weights:  # unique, nonzero values: the mapping to ONNX goes by value
        weight.assign((rng.uniform(0.05, 0.6, weight.shape) * rng.choice([-1, 1], weight.shape)).astype(np.float32))
    return model


def batch(name: str, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, TIME, FEATURES)).astype(np.float32)
    if name.startswith("masked"):  # full, post-padded, pre-padded with a hole
        x[1, 3:] = 0.0
        x[2, :2] = 0.0
        x[2, 3] = 0.0
    model_outputs = 2
    y = rng.standard_normal((BATCH, TIME, model_outputs) if name in ("lstm", "simple_rnn", "bidirectional_lstm",
                                                                      "masked_bidirectional_simple_rnn")
                            else (BATCH, model_outputs)).astype(np.float32)
    return x, y


class Trainer:
    """A converted model in onnxruntime's training API (``exported``: converted from the model exported on a
    GPU machine, whose LSTM and GRU layers are cuDNN ops, rather than from the live model)."""

    def __init__(self, model, directory: str, exported: bool = False):
        from onnxruntime.training.api import CheckpointState, Module, Optimizer

        if exported:
            import tensorflow as tf

            import cudnn_graphs

            path = cudnn_graphs.export_on_gpu_machine(model, os.path.basename(directory))
            assert cudnn_graphs.cudnn_ops(tf.saved_model.load(path).signatures["serve"].graph.as_graph_def())
            self.proto = tf2onnx_rnn.convert_saved_model(path, target="training")
            assert not [n for n in self.proto.graph.node if n.op_type in ("Loop", "Scan")]
        else:
            self.proto = tf2onnx_rnn.convert_keras(model, target="training")
        tf2onnx_rnn.write_training_artifacts(self.proto, directory, loss="mse", optimizer="sgd")
        self.state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
        self.module = Module(os.path.join(directory, "training_model.onnx"), self.state,
                             os.path.join(directory, "eval_model.onnx"))
        self.optimizer = Optimizer(os.path.join(directory, "optimizer_model.onnx"), self.module)
        self.optimizer.set_learning_rate(LEARNING_RATE)
        self.initial = self.parameters()

    def parameters(self) -> dict:
        return {name: np.array(p.data) for name, p in self.state.parameters}

    def gradients(self, x, y) -> dict:
        self.module.train()
        self.module.lazy_reset_grad()
        self.module(x, y)
        return {name: np.array(p.grad) for name, p in self.state.parameters if p.requires_grad}

    def step(self, x, y) -> None:
        self.gradients(x, y)
        self.optimizer.step()


def keras_positions(model) -> dict:
    """float32 value -> the Keras weight elements ((weight index, flat index), ...) an ONNX element
    holding it copies: each element's own value, and for a GRU with ``reset_after`` the sum of its
    input and recurrent bias of one gate (the conversion adds those of the update and reset gates)."""
    positions = {}
    for index, weight in enumerate(model.weights):
        values = np.asarray(weight)
        for flat, value in enumerate(values.ravel()):
            assert value not in positions, "two Keras weights share a value: the mapping would be ambiguous"
            positions[value] = ((index, flat),)
        if values.ndim == 2 and values.shape[0] == 2:  # a reset_after GRU's [input, recurrent] biases
            width = values.shape[1]
            for column in range(width):
                positions.setdefault(values[0, column] + values[1, column], ((index, column), (index, width + column)))
    return positions


def onnx_gradients_as_keras(model, initial: dict, gradients: dict) -> list:
    """The ONNX gradients summed onto the Keras weights each element copies; every Keras weight
    element must be found."""
    positions = keras_positions(model)
    summed = [np.zeros(np.shape(w), np.float64) for w in model.weights]
    found = [np.zeros(np.shape(w), bool) for w in model.weights]
    for name, grad in gradients.items():
        for value, g in zip(initial[name].ravel(), grad.ravel()):
            for index, flat in positions.get(value, ()):
                summed[index].reshape(-1)[flat] += g
                found[index].reshape(-1)[flat] = True
    missing = [model.weights[i].name for i, f in enumerate(found) if not f.all()]
    assert not missing, f"Keras weights not found among the ONNX model's trained parameters: {missing}"
    return summed


def tensorflow_gradients(model, x, y) -> list:
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=False) - y))
    return [np.asarray(g) for g in tape.gradient(loss, model.weights)]


# the models whose layers Keras 3 takes cuDNN's kernel for where TensorFlow lists a GPU
CUDNN_MODELS = ("lstm", "gru", "bidirectional_lstm", "masked_gru")
PARAMS = [pytest.param(f, n, False, id=f"{f}-{n}") for f in parity.FLAVORS for n in MODELS] + [
    pytest.param("keras3", n, True, id=f"keras3-{n}-exported_on_a_gpu_machine", marks=parity.only_keras3)
    for n in CUDNN_MODELS]


@pytest.mark.parametrize("flavor, name, exported", PARAMS)
def test_gradients_equal_tensorflow(flavor, name, exported, tmp_path):
    model = build(flavor, name)
    trainer = Trainer(model, str(tmp_path), exported)
    trainable = [n for n, p in trainer.state.parameters if p.requires_grad]
    assert not set(held_parameters(trainer.proto)) & set(trainable)
    x, y = batch(name, 1)
    expected = tensorflow_gradients(model, x, y)
    actual = onnx_gradients_as_keras(model, trainer.initial, trainer.gradients(x, y))
    for weight, want, got in zip(model.weights, expected, actual):
        scale = max(float(np.max(np.abs(want))), 1e-12)
        assert float(np.max(np.abs(got - want))) <= 1e-5 * scale, (weight.name, want, got)


@pytest.mark.parametrize("flavor, name, exported", PARAMS)
def test_sgd_steps_equal_tensorflow(flavor, name, exported, tmp_path):
    model = build(flavor, name)
    trainer = Trainer(model, str(tmp_path), exported)
    batches = [batch(name, seed) for seed in range(2, 2 + STEPS)]
    for x, y in batches:
        trainer.step(x, y)
    trained = trainer.parameters()
    for held in held_parameters(trainer.proto):
        np.testing.assert_array_equal(trained[held], trainer.initial[held], err_msg=f"held {held} moved")
    moved = max(float(np.max(np.abs(trained[n] - trainer.initial[n]))) for n in trainer.initial)
    assert moved > 1e-3, "training moved nothing"
    for x, y in batches:  # the same steps in TensorFlow
        for weight, gradient in zip(model.weights, tensorflow_gradients(model, x, y)):
            weight.assign(np.asarray(weight) - LEARNING_RATE * gradient)
    x = batch(name, 99)[0]
    stepped_in_tensorflow = np.asarray(model(x, training=False))
    # the trained model, exported for inference, gives what the model stepped in TensorFlow gives
    path = str(tmp_path / "trained.onnx")
    trainer.module.export_model_for_inferencing(path, [o.name for o in trainer.proto.graph.output])
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (trained_output,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(trained_output, stepped_in_tensorflow, atol=1e-5, rtol=0)


def test_the_command_line_writes_the_artifacts_and_the_model(tmp_path):
    """--training-artifacts converts in the training form and writes artifacts onnxruntime loads."""
    import subprocess
    import sys

    from onnxruntime.training.api import CheckpointState, Module

    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
    output, artifacts = tmp_path / "model.onnx", tmp_path / "artifacts"
    done = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--saved-model",
                           os.path.join(examples, "lstm_gru_savedmodel"), "--output", str(output),
                           "--training-artifacts", str(artifacts), "--training-optimizer", "sgd"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "wrote training artifacts checkpoint, eval_model.onnx, optimizer_model.onnx, training_model.onnx" in \
        done.stdout, done.stdout
    assert output.exists()
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"))
    assert module.input_names()[-1] == "target"
