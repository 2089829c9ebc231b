"""Near-miss cells: custom recurrent cells that resemble LSTM, GRU or SimpleRNN but compute another
function must never become a native node that differs from Keras.

Each cell is written once, against the Keras module ``K`` (Keras 3 or tf_keras), as ``RNN(cell,
return_sequences=True)`` with random weights (biases included), as a while-loop and unrolled
(``unroll=True``: a chain of steps the unrolled reader reads with the same matchers). Converted with ``convert_keras``,
every cell must run in onnxruntime within 1e-5 of ``model(x, training=False)``; its report row is
either a native node (which then matched Keras, so it is the same function, for example
``0.5 * tanh`` as ONNX ``ScaledTanh``) or tf2onnx's exact ``Loop`` with a reason. Two cells are the
standard ones written by hand (a simple ``tanh`` cell and Keras's ``reset_after=True`` GRU): they
must be fused, so the test shows the matchers tell the two apart, not that they refuse custom cells.

Activations are identified by their values on probe points, so three cells differ from a standard
activation only far from zero (``clip(v, -20, 20)`` is the identity, ``min(relu(v), 30)`` is relu
and ``clip(0.02 v + 0.5, 0, 1)`` is affine on [-12, 12]): their inputs are scaled up so that the
difference shows in the outputs. A row that stays a Loop must carry the reason of the matcher of
the kind the cell resembles (the layer's name carries that kind's scope), never an internal error.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pytest

import helpers
import parity

FEATURES, UNITS = 5, 4
BATCH, TIME = 3, 6
TOLERANCE = 1e-5


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


def cell_layer(K, cell: Cell, units: int):
    """An instance of ``cell`` as a ``K.layers.Layer`` subclass (Keras 3 or tf_keras)."""
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

    return HandWrittenCell(name=f"{cell.name}_cell")


# -- conversions, shared by the tests of a cell and flavor ----------------------------------------

@dataclass
class Result:
    proto: object = None
    keras: np.ndarray = None
    onnx: np.ndarray = None
    outcomes: list = field(default_factory=list)
    error: Optional[BaseException] = None


_CACHE: dict = {}


FORMS = ("loop", "unrolled")  # RNN(cell) as a while-loop, and with unroll=True as a chain of steps


def result(flavor: str, cell: Cell, form: str = "loop") -> Result:
    key = (flavor, cell.name, form)
    if key not in _CACHE:
        entry = Result()
        try:
            _convert_and_run(flavor, cell, entry, form == "unrolled")
        except Exception as error:  # noqa: BLE001 - re-raised by every test of the case
            entry.error = error
        _CACHE[key] = entry
    entry = _CACHE[key]
    if entry.error is not None:
        raise AssertionError(f"{flavor} {cell.name}: {type(entry.error).__name__}: {entry.error}") from entry.error
    return entry


def _convert_and_run(flavor: str, cell: Cell, entry: Result, unrolled: bool) -> None:
    from tf2onnx_rnn import convert_keras, report_of

    K = parity.keras_module(flavor)
    x = K.Input((TIME if unrolled else None, FEATURES), name="x")
    y = K.layers.RNN(cell_layer(K, cell, UNITS), return_sequences=True, unroll=unrolled, name=cell.layer_name)(x)
    model = K.Model(x, y)
    seed = zlib.crc32(f"{flavor}/{cell.name}".encode())
    parity.randomize_weights(model, seed)
    inputs = np.random.default_rng(seed + 1).standard_normal((BATCH, TIME, FEATURES))
    inputs = (inputs * cell.input_scale).astype(np.float32)
    entry.keras = np.asarray(model(inputs, training=False))
    entry.proto = convert_keras(model)
    (entry.onnx,) = helpers.ort_session(entry.proto).run(None, {"x": inputs})
    entry.outcomes = list(report_of(entry.proto).outcomes)


# -- the tests -------------------------------------------------------------------------------------

CASES = [pytest.param(flavor, cell, form, id=f"{cell.name}-{form}-{flavor}")
         for cell in CELLS for form in FORMS for flavor in parity.FLAVORS]


def _row(flavor: str, cell: Cell, form: str = "loop"):
    outcomes = result(flavor, cell, form).outcomes
    assert len(outcomes) == 1, f"{flavor} {cell.name}: {len(outcomes)} report rows for one recurrent layer"
    return outcomes[0]


@pytest.mark.parametrize("flavor, cell, form", CASES)
def test_onnx_output_matches_keras(flavor, cell, form):
    """Whatever the cell became, onnxruntime gives Keras's output within 1e-5."""
    entry = result(flavor, cell, form)
    row = _row(flavor, cell, form)
    assert entry.onnx.shape == entry.keras.shape
    error = float(np.max(np.abs(entry.onnx.astype(np.float64) - entry.keras)))
    became = f"became {row.became}" + (f" ({row.activations})" if row.fused else f" ({row.reason})")
    assert error <= TOLERANCE, f"{flavor} {cell.what}: {became}, max abs error {error:.3g} from Keras"


@pytest.mark.parametrize("flavor, cell, form", CASES)
def test_report_row_is_a_native_node_or_a_loop_with_a_reason(flavor, cell, form):
    """A fused row names a native node of the model and leaves no Loop (nor, unrolled, a step of
    the cell: no MatMul); a row that stayed a Loop (or unrolled ops) says why, and the Loop (or
    the steps' ops) is in the model."""
    entry = result(flavor, cell, form)
    row = _row(flavor, cell, form)
    ops = helpers.op_counts(entry.proto)
    if row.fused:
        assert row.became in helpers.RECURRENT_OPS, f"{cell.name}: became {row.became!r}"
        nodes = [n for n in helpers.all_nodes(entry.proto) if n.name == row.node]
        assert nodes and nodes[0].op_type == row.became, f"{cell.name}: the row names no {row.became} node"
        assert not any(ops[op] for op in helpers.LOOP_OPS), f"{cell.name}: fused, yet the model has a Loop"
        assert form == "loop" or (not ops["MatMul"] and row.unrolled == TIME), f"{cell.name}: {dict(ops)}"
    elif form == "unrolled":
        assert row.became == "unrolled ops", f"{cell.name}: became {row.became!r}"
        assert row.reason.strip() and not row.reason.startswith("internal error"), f"{flavor} {cell.name}: {row.reason}"
        assert ops["MatMul"] and not any(ops[op] for op in helpers.RECURRENT_OPS), f"{cell.name}: {dict(ops)}"
    else:
        assert row.became == "Loop", f"{cell.name}: became {row.became!r}"
        assert row.reason.strip(), f"{flavor} {cell.name}: stayed a Loop without a reason"
        # the matcher of the kind it resembles declined with a reason of its own, not a fault
        assert row.reason.startswith(f"not a {cell.family} cell: "), f"{flavor} {cell.name}: {row.reason}"
        assert ops["Loop"] == 1, f"{cell.name}: stayed a Loop, yet the model has {ops['Loop']} Loops"
        assert not any(ops[op] for op in helpers.RECURRENT_OPS), f"{cell.name}: a Loop row beside a native node"


@pytest.mark.parametrize("flavor, cell, form", [pytest.param(flavor, cell, form, id=f"{cell.name}-{form}-{flavor}")
                                                for cell in STANDARD for form in FORMS for flavor in parity.FLAVORS])
def test_hand_written_standard_cell_is_fused(flavor, cell, form):
    """The standard formulas written by hand become their native node, so the declines above are
    the matchers telling near-misses apart, not refusing custom cells."""
    entry = result(flavor, cell, form)
    row = _row(flavor, cell, form)
    assert row.became == cell.standard, f"{flavor} {cell.name}: became {row.became} ({row.reason})"
    assert helpers.op_counts(entry.proto)[cell.standard] == 1
    if cell.standard == "GRU":
        (node,) = helpers.nodes_of_types(entry.proto, {"GRU"})
        assert helpers.attribute(node, "linear_before_reset") == 1
