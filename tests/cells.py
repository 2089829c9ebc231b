"""Hand-written recurrent cells for ``RNN(cell)``: near-misses of LSTM, GRU and SimpleRNN (cells that
resemble a standard one but compute another function) and three standard formulas written by hand.
Shared by the near-miss tests and the fuzz. Each cell is written once, against the Keras module
``K`` (Keras 3 or tf_keras); :func:`cell_layer` makes it a ``K.layers.Layer``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

import helpers

UNITS = 4  # the units every cell is written for (one cell has one constant per unit)


# -- the cells -----------------------------------------------------------------------------------

class _Ops:
    """The few ops the cells use: ``K.ops`` in Keras 3, TensorFlow's in tf_keras."""

    def __init__(self, K):
        import tensorflow as tf

        ops = getattr(K, "ops", None)
        if ops is not None:
            self.matmul, self.tanh, self.sigmoid = ops.matmul, ops.tanh, ops.sigmoid
            self.mean = lambda v: ops.mean(v, axis=-1, keepdims=True)
            self.sqrt, self.split = ops.sqrt, lambda v, n: ops.split(v, n, axis=-1)
            self.clip, self.relu = ops.clip, ops.relu
        else:
            self.matmul, self.tanh, self.sigmoid = tf.matmul, tf.tanh, tf.sigmoid
            self.mean = lambda v: tf.reduce_mean(v, axis=-1, keepdims=True)
            self.sqrt, self.split = tf.sqrt, lambda v, n: tf.split(v, n, axis=-1)
            self.clip, self.relu = tf.clip_by_value, tf.nn.relu


@dataclass(frozen=True)
class Cell:
    """One hand-written cell: its weights' shapes (from F and U), its states, and one step."""

    name: str
    family: str  # the Keras kind it resembles: its matcher's reason is the report's
    weights: Callable[[int, int], dict]  # (features, units) -> {weight name: shape}
    step: Callable  # (ops, weights, x, states) -> (output, new states)
    standard: Optional[str] = None  # the ONNX op a hand-written standard cell must become
    what: str = ""
    input_scale: float = 1.0  # inputs are standard normal times this

    @property
    def states(self) -> int:
        return helpers.STATE_COUNT[self.family]

    @property
    def layer_name(self) -> str:
        """The RNN layer's name, with the family's scope in it (the report's hint)."""
        scope = helpers.SCOPE_NAME[self.family]
        return self.name if self.name.startswith(scope) else f"{scope}_{self.name}"


def _simple_weights(f, u):
    return {"kernel": (f, u), "recurrent_kernel": (u, u), "bias": (u,)}


def _pre(o, w, x, h):
    """``x @ W + h @ U + b``, a simple cell's pre-activation."""
    return o.matmul(x, w["kernel"]) + o.matmul(h, w["recurrent_kernel"]) + w["bias"]


def _standard_simple(o, w, x, states):
    h = o.tanh(_pre(o, w, x, states[0]))
    return h, [h]


def _standard_linear(o, w, x, states):
    h = o.matmul(x, w["kernel"]) + o.matmul(states[0], w["recurrent_kernel"])
    return h, [h]


def _scaled_state(o, w, x, states):
    h = o.tanh(_pre(o, w, x, states[0])) * 1.5
    return h, [h]


def _half_tanh(o, w, x, states):
    h = 0.5 * o.tanh(_pre(o, w, x, states[0]))
    return h, [h]


def _bias_after_activation(o, w, x, states):
    h = o.tanh(_pre(o, w, x, states[0])) + w["after"]
    return h, [h]


def _leaky_integrator(o, w, x, states):
    a = 0.7
    h = a * states[0] + (1.0 - a) * o.tanh(_pre(o, w, x, states[0]))
    return h, [h]


def _layer_normalised(o, w, x, states):
    v = _pre(o, w, x, states[0])
    centred = v - o.mean(v)
    normed = centred / o.sqrt(o.mean(centred * centred) + 1e-3) * w["gamma"] + w["beta"]
    h = o.tanh(normed)
    return h, [h]


def _skip_term(o, w, x, states):
    h = o.tanh(_pre(o, w, x, states[0])) + o.matmul(x, w["skip"])
    return h, [h]


_PER_UNIT = np.array([0.5, 1.0, 1.5, 2.0], np.float32)  # one value per unit (UNITS = 4)


def _unit_scale(o, w, x, states):
    h = o.tanh(_pre(o, w, x, states[0])) * _PER_UNIT
    return h, [h]


def _uniform_unit_scale(o, w, x, states):
    h = o.tanh(_pre(o, w, x, states[0])) * np.full(UNITS, 1.5, np.float32)
    return h, [h]


def _clipped_linear(o, w, x, states):
    h = o.clip(_pre(o, w, x, states[0]), -20.0, 20.0)
    return h, [h]


def _capped_relu(o, w, x, states):
    h = o.clip(o.relu(_pre(o, w, x, states[0])), 0.0, 30.0)
    return h, [h]


def _lstm_weights(f, u):
    return {"kernel": (f, 4 * u), "recurrent_kernel": (u, 4 * u), "bias": (4 * u,)}


def _lstm_gates(o, w, x, h):
    """Keras's i, f, c~, o pre-activations."""
    return o.split(o.matmul(x, w["kernel"]) + o.matmul(h, w["recurrent_kernel"]) + w["bias"], 4)


def _lstm_peephole(o, w, x, states):
    h, c = states
    zi, zf, zc, zo = _lstm_gates(o, w, x, h)
    i = o.sigmoid(zi + c * w["peep_i"])
    f = o.sigmoid(zf + c * w["peep_f"])
    c_new = f * c + i * o.tanh(zc)
    h_new = o.sigmoid(zo + c_new * w["peep_o"]) * o.tanh(c_new)
    return h_new, [h_new, c_new]


def _lstm_linear_output(o, w, x, states):
    h, c = states
    zi, zf, zc, zo = _lstm_gates(o, w, x, h)
    c_new = o.sigmoid(zf) * c + o.sigmoid(zi) * o.tanh(zc)
    h_new = o.sigmoid(zo) * c_new
    return h_new, [h_new, c_new]


def _gru_weights(f, u):
    return {"kernel": (f, 3 * u), "recurrent_kernel": (u, 3 * u), "input_bias": (3 * u,),
            "recurrent_bias": (3 * u,)}


def _gru_parts(o, w, x, h, gate=None):
    """Keras's reset_after=True GRU: (z, r, x part of hh, h part of hh), gates z, r, h; the gates'
    activation is ``gate`` (sigmoid unless given)."""
    gate = gate or o.sigmoid
    xz, xr, xh = o.split(o.matmul(x, w["kernel"]) + w["input_bias"], 3)
    hz, hr, hh = o.split(o.matmul(h, w["recurrent_kernel"]) + w["recurrent_bias"], 3)
    return gate(xz + hz), gate(xr + hr), xh, hh


def _standard_gru(o, w, x, states):
    h = states[0]
    z, r, xh, hh = _gru_parts(o, w, x, h)
    candidate = o.tanh(xh + r * hh)
    h_new = z * h + (1.0 - z) * candidate
    return h_new, [h_new]


def _gru_gentle_hard_sigmoid(o, w, x, states):
    """Keras's GRU with gates clip(0.02 v + 0.5, 0, 1): linear on [-25, 25]."""
    h = states[0]
    z, r, xh, hh = _gru_parts(o, w, x, h, gate=lambda v: o.clip(0.02 * v + 0.5, 0.0, 1.0))
    candidate = o.tanh(xh + r * hh)
    h_new = z * h + (1.0 - z) * candidate
    return h_new, [h_new]


def _gru_swapped_update(o, w, x, states):
    h = states[0]
    z, r, xh, hh = _gru_parts(o, w, x, h)
    candidate = o.tanh(xh + r * hh)
    h_new = z * candidate + (1.0 - z) * h
    return h_new, [h_new]


def _gru_reset_on_input(o, w, x, states):
    h = states[0]
    z, r, xh, hh = _gru_parts(o, w, x, h)
    candidate = o.tanh(r * xh + hh)
    h_new = z * h + (1.0 - z) * candidate
    return h_new, [h_new]


CELLS = (
    Cell("standard_simple", "SimpleRNN", _simple_weights, _standard_simple, standard="RNN",
         what="tanh(x W + h U + b), SimpleRNNCell by hand"),
    Cell("standard_gru", "GRU", _gru_weights, _standard_gru, standard="GRU",
         what="Keras's GRU formula by hand, reset_after=True"),
    Cell("standard_linear", "SimpleRNN", lambda f, u: {"kernel": (f, u), "recurrent_kernel": (u, u)}, _standard_linear,
         standard="RNN", what="x W + h U, no bias and no activation: SimpleRNN(activation='linear', use_bias=False) "
         "by hand, ONNX's RNN with the identity Affine(alpha=1, beta=0)"),
    Cell("scaled_state", "SimpleRNN", _simple_weights, _scaled_state, what="tanh(x W + h U + b) * 1.5"),
    Cell("half_tanh", "SimpleRNN", _simple_weights, _half_tanh, what="0.5 * tanh(x W + h U + b)"),
    Cell("bias_after_activation", "SimpleRNN", lambda f, u: {**_simple_weights(f, u), "after": (u,)},
         _bias_after_activation, what="tanh(x W + h U + b) + c"),
    Cell("unit_scale", "SimpleRNN", _simple_weights, _unit_scale,
         what="tanh(x W + h U + b) * [0.5, 1, 1.5, 2], a constant per unit"),
    Cell("uniform_unit_scale", "SimpleRNN", _simple_weights, _uniform_unit_scale,
         what="tanh(x W + h U + b) * [1.5, 1.5, 1.5, 1.5], the same constant for every unit"),
    Cell("leaky_integrator", "SimpleRNN", _simple_weights, _leaky_integrator,
         what="0.7 h + 0.3 tanh(x W + h U + b)"),
    Cell("layer_normalised", "SimpleRNN", lambda f, u: {**_simple_weights(f, u), "gamma": (u,), "beta": (u,)},
         _layer_normalised, what="tanh(layer_norm(x W + h U + b))"),
    Cell("skip_term", "SimpleRNN", lambda f, u: {**_simple_weights(f, u), "skip": (f, u)}, _skip_term,
         what="tanh(x W + h U + b) + x V"),
    Cell("clipped_linear", "SimpleRNN", _simple_weights, _clipped_linear, input_scale=40.0,
         what="clip(x W + h U + b, -20, 20), the identity on [-20, 20]"),
    Cell("capped_relu", "SimpleRNN", _simple_weights, _capped_relu, input_scale=40.0,
         what="min(relu(x W + h U + b), 30), relu on [-inf, 30]"),
    Cell("lstm_peephole", "LSTM",
         lambda f, u: {**_lstm_weights(f, u), "peep_i": (u,), "peep_f": (u,), "peep_o": (u,)},
         _lstm_peephole, what="LSTM with c feeding i, f and o"),
    Cell("lstm_linear_output", "LSTM", _lstm_weights, _lstm_linear_output,
         what="LSTM with h = o * c (no activation on c)"),
    Cell("gru_swapped_update", "GRU", _gru_weights, _gru_swapped_update,
         what="GRU with h = z * hh + (1 - z) * h"),
    Cell("gru_reset_on_input", "GRU", _gru_weights, _gru_reset_on_input,
         what="GRU whose candidate is tanh(r * (x W + bx) + h U + bh)"),
    Cell("gru_gentle_hard_sigmoid", "GRU", _gru_weights, _gru_gentle_hard_sigmoid, input_scale=40.0,
         what="GRU with gates clip(0.02 v + 0.5, 0, 1), linear on [-25, 25]"),
)
STANDARD = tuple(cell for cell in CELLS if cell.standard)


def cell_layer(K, cell: Cell, units: int, **kwargs):
    """An instance of ``cell`` as a ``K.layers.Layer`` subclass (Keras 3 or tf_keras); ``kwargs``
    go to the layer (say, its dtype)."""
    ops = _Ops(K)

    class HandWrittenCell(K.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.state_size = [units] * cell.states if cell.states > 1 else units

        def build(self, input_shape):
            features = int(input_shape[-1])
            self.w = {name: self.add_weight(name=name, shape=shape, initializer="zeros")
                      for name, shape in cell.weights(features, units).items()}
            self.built = True

        def call(self, inputs, states):
            states = list(states) if isinstance(states, (list, tuple)) else [states]
            return cell.step(ops, self.w, inputs, states)

    return HandWrittenCell(name=f"{cell.name}_cell", **kwargs)
