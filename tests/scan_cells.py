"""Recurrences no ONNX node names, for the Scan form's tests: Keras's own layers with activations
ONNX's recurrent nodes lack, and hand-written ``RNN(cell)`` cells with sub-layers, several states of
several sizes and constants, each written once against the Keras module ``K`` (Keras 3 or tf_keras).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

UNITS = 4
FEATURES = 3
CONSTANT_FEATURES = 2  # the constant input of the cell that reads one


def _ops(K):
    import tensorflow as tf

    ops = getattr(K, "ops", None)
    if ops is not None:
        return ops.matmul, ops.tanh, ops.sigmoid, ops.relu, lambda v: ops.concatenate(v, axis=-1)
    return tf.matmul, tf.tanh, tf.sigmoid, tf.nn.relu, lambda v: tf.concat(v, axis=-1)


def _layer_normalised_elman(K, units):
    """tanh(LayerNormalization(x W + h U + b)): an Elman cell normalising its pre-activation."""
    matmul, tanh, *_ = _ops(K)

    class LayerNormalisedElman(K.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.units, self.state_size = units, units
            self.norm = K.layers.LayerNormalization(epsilon=1e-3)

        def build(self, input_shape):
            self.kernel = self.add_weight(name="kernel", shape=(int(input_shape[-1]), units))
            self.recurrent = self.add_weight(name="recurrent", shape=(units, units))
            self.bias = self.add_weight(name="bias", shape=(units,))
            self.norm.build((None, units))
            self.built = True

        def call(self, inputs, states):
            h = states[0] if isinstance(states, (list, tuple)) else states
            new = tanh(self.norm(matmul(inputs, self.kernel) + matmul(h, self.recurrent) + self.bias))
            return new, [new]

    return LayerNormalisedElman(name="ln_elman_cell")


def _dense_input(K, units):
    """relu(Dense(x) + h U) * sigmoid(h V): a cell with a Dense sub-layer on its input."""
    matmul, _, sigmoid, relu, _ = _ops(K)

    class DenseInput(K.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.units, self.state_size = units, units
            self.dense = K.layers.Dense(units)

        def build(self, input_shape):
            self.dense.build(input_shape)
            self.recurrent = self.add_weight(name="recurrent", shape=(units, units))
            self.gate = self.add_weight(name="gate", shape=(units, units))
            self.built = True

        def call(self, inputs, states):
            h = states[0] if isinstance(states, (list, tuple)) else states
            new = relu(self.dense(inputs) + matmul(h, self.recurrent)) * sigmoid(matmul(h, self.gate))
            return new, [new]

    return DenseInput(name="dense_input_cell")


def _three_states(K, units):
    """Three states of two sizes (h and c of ``units``, a memory of twice that), an output of its own."""
    matmul, tanh, sigmoid, _, concat = _ops(K)

    class ThreeStates(K.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.units, self.state_size, self.output_size = units, [units, units, 2 * units], units

        def build(self, input_shape):
            f = int(input_shape[-1])
            self.w = self.add_weight(name="w", shape=(f, 2 * units))
            self.u = self.add_weight(name="u", shape=(4 * units, 2 * units))
            self.b = self.add_weight(name="b", shape=(2 * units,))
            self.built = True

        def call(self, inputs, states):
            h, c, m = states
            z = matmul(inputs, self.w) + matmul(concat([h, c, m]), self.u) + self.b
            gate, cand = sigmoid(z[:, :units]), tanh(z[:, units:])
            c_new = gate * c + (1.0 - gate) * cand
            m_new = 0.9 * m + 0.1 * concat([c_new, h])
            h_new = tanh(c_new) * sigmoid(m_new[:, :units])
            return h_new, [h_new, c_new, m_new]

    return ThreeStates(name="three_states_cell")


def _with_constants(K, units):
    """tanh(x W + h U + k V): a cell reading a constant input ``k`` at every step (tf_keras's
    ``constants``)."""
    matmul, tanh, *_ = _ops(K)

    class WithConstants(K.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.units, self.state_size = units, units

        def build(self, input_shape):
            self.w = self.add_weight(name="w", shape=(FEATURES, units))
            self.u = self.add_weight(name="u", shape=(units, units))
            self.v = self.add_weight(name="v", shape=(CONSTANT_FEATURES, units))
            self.built = True

        def call(self, inputs, states, constants):
            h = states[0]
            new = tanh(matmul(inputs, self.w) + matmul(h, self.u) + matmul(constants[0], self.v))
            return new, [new]

    return WithConstants(name="constants_cell")


@dataclass(frozen=True)
class Design:
    """One recurrence: ``layer(K, **kwargs)`` makes the recurrent layer; ``loop_matmuls``: MatMuls that
    must stay in each step (the recurrent ones, those reading one state made one: the input's are hoisted);
    ``constants``: the cell reads a
    constant input (tf_keras's ``constants``)."""

    name: str
    layer: Callable
    loop_matmuls: int
    constants: bool = False

    @property
    def id(self) -> str:
        return self.name


def _builtin(kind: str, activation: str):
    return lambda K, **kwargs: getattr(K.layers, kind)(UNITS, activation=activation, **kwargs)


def _cell(make):
    def layer(K, **kwargs):
        cell = make(K, UNITS)
        # a Bidirectional copies its layer through its config: the cell's class must be found by name
        K.saving.register_keras_serializable(package="scan_cells")(type(cell))
        return K.layers.RNN(cell, **kwargs)

    return layer


DESIGNS = (
    Design("simple_rnn_gelu", _builtin("SimpleRNN", "gelu"), 1),
    Design("lstm_selu", _builtin("LSTM", "selu"), 1),
    Design("gru_silu", _builtin("GRU", "silu"), 1),
    Design("ln_elman", _cell(_layer_normalised_elman), 1),
    Design("dense_input", _cell(_dense_input), 1),  # h @ U and h @ V: one MatMul, split
    Design("three_states", _cell(_three_states), 1),
)
CONSTANTS = Design("constants", _cell(_with_constants), 1, constants=True)


def randomize(model, seed: int, scale: float = 0.5) -> None:
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * scale).astype(w.dtype) for w in model.get_weights()])


def masked_batch(batch_time: tuple, seed: int, features: int = FEATURES) -> np.ndarray:
    """Rows full, post-padded, pre-padded, holed and empty (then full again): zeros where masked."""
    batch, time = batch_time
    x = np.random.default_rng(seed).standard_normal((batch, time, features)).astype(np.float32)
    patterns = [slice(0, 0), slice(time // 2, None), slice(0, time // 2), slice(1, 2), slice(0, None)]
    for row in range(batch):
        x[row, patterns[row % len(patterns)]] = 0.0
    return x
