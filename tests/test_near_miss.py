"""Near-miss cells: custom recurrent cells that resemble LSTM, GRU or SimpleRNN but compute another
function must never become a native node that differs from Keras.

Each cell is written once, against the Keras module ``K`` (Keras 3 or tf_keras), as ``RNN(cell,
return_sequences=True)`` with random weights (biases included), as a while-loop and unrolled
(``unroll=True``: a chain of steps the unrolled reader reads with the same matchers). Converted with ``convert_keras``,
every cell must run in onnxruntime within 1e-5 of ``model(x, training=False)``; its report row is
either a native node (which then matched Keras, so it is the same function, for example
``0.5 * tanh`` as ONNX ``ScaledTanh``) or tf2onnx's exact ``Loop`` with a reason. Three cells are
standard ones written by hand (a simple ``tanh`` cell, Keras's ``reset_after=True`` GRU, and
``x W + h U`` with no bias and no activation, which is ``SimpleRNN(activation="linear",
use_bias=False)``, ONNX's RNN with the identity ``Affine(alpha=1, beta=0)``): they must be fused, so
the test shows the matchers tell the two apart, not that they refuse custom cells.

Activations are identified by their values on probe points, so three cells differ from a standard
activation only far from zero (``clip(v, -20, 20)`` is the identity, ``min(relu(v), 30)`` is relu
and ``clip(0.02 v + 0.5, 0, 1)`` is affine on [-12, 12]): their inputs are scaled up so that the
difference shows in the outputs. A row that stays a Loop must carry the reason of the matcher of
the kind the cell resembles (the layer's name carries that kind's scope), never an internal error.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

import helpers
import parity
from cells import CELLS, STANDARD, UNITS, Cell, cell_layer

FEATURES = 5
BATCH, TIME = 3, 6
TOLERANCE = 1e-5


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
        assert row.became == ("Scan" if form == "loop" else "Loop"), f"{cell.name}: became {row.became!r}"
        assert row.reason.strip(), f"{flavor} {cell.name}: stayed a Loop without a reason"
        # the matcher of the kind it resembles declined with a reason of its own, not a fault
        assert row.reason.startswith(f"not a {cell.family} cell: "), f"{flavor} {cell.name}: {row.reason}"
        assert ops["Scan"] == 1 and not ops["Loop"], f"{cell.name}: a Scan row, yet the model has {dict(ops)}"
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


@pytest.mark.parametrize("flavor, form", [pytest.param(flavor, form, id=f"{form}-{flavor}")
                                          for form in FORMS for flavor in parity.FLAVORS])
def test_hand_written_linear_cell_is_an_rnn_with_the_identity_written_out(flavor, form):
    """``x W + h U`` (no bias, no activation) is the function of ONNX's RNN with ``Affine(alpha=1,
    beta=0)`` and zero biases, so it is fused. The node writes alpha and beta out: onnxruntime does not
    take the spec's defaults for them (an ``Affine`` without them outputs zeros there)."""
    cell = next(c for c in STANDARD if c.name == "standard_linear")
    entry = result(flavor, cell, form)
    assert _row(flavor, cell, form).became == "RNN"
    (node,) = helpers.nodes_of_types(entry.proto, {"RNN"})
    written = [helpers.attribute(node, name) for name in ("activations", "activation_alpha", "activation_beta")]
    assert written == [[b"Affine"], [1.0], [0.0]], written
    if len(node.input) > 3 and node.input[3]:  # B, where the node has one: zeros
        initializers = {i.name: onnx.numpy_helper.to_array(i) for i in entry.proto.graph.initializer}
        assert node.input[3] in initializers and not np.any(initializers[node.input[3]]), "a bias appeared"
