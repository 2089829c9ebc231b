"""A new cell kind is one module: a fourth family, written here, is found and fused by every reader.

The minimal gated unit (MGU) has one gate ``f`` that both forgets and resets:
``f = sigmoid(x Wf + h Uf + bf)``, ``hh = tanh(x Wh + (f * h) Uh + bh)``, ``h' = (1 - f) h + f hh``.
It is exactly ONNX's GRU with ``linear_before_reset=0``: update gate ``z = 1 - f = sigmoid(-(x Wf + h Uf
+ bf))`` and reset gate ``r = f``. The module below (its ``KIND`` and ``match``, nothing else) is written
into a folder that joins the rewriter package's path for these tests only: no other module of the
package changes. Without it the MGU layers stay tf2onnx's exact Loop; with it every form (sequences,
go_backwards, Bidirectional, a Masking layer over rows full, post-padded, pre-padded, holed and
empty, unrolled, a StackedRNNCells layer mixing it with an LSTM cell) becomes native GRU nodes
reported as MGU, no Loop is left, and onnxruntime matches Keras in Keras 3 and tf_keras.
"""
from __future__ import annotations

import sys
import textwrap
import zlib

import numpy as np
import pytest

import cells
import helpers
import parity

FEATURES, UNITS, TIME = 3, 4, 6
TOLERANCE = 1e-5

MGU_MODULE = textwrap.dedent('''
    """Minimal gated unit cells (written by the test): one gate f both forgets and resets."""
    from .body import BodyView
    from .description import BodyMatch, CellKind, GateForm, StateRole, require
    from .gru import step as gru_step
    from .skeleton import Skeleton

    KIND = CellKind(keras_name="MGU", onnx_op="GRU", scope_hint="mgu", state_roles=(StateRole.HIDDEN,),
                    step=gru_step)


    def _negated(source):
        return None if source is None else (lambda values: -source(values))


    def match(view: BodyView, skeleton: Skeleton) -> BodyMatch:
        h_slot, h_prev = skeleton.single_state("MGU")
        x_t, constants = skeleton.x_t, skeleton.constant_slots
        products = [view.producer(t) for t in view.sum_terms(skeleton.y_t)]
        require(len(products) == 2 and all(p is not None and p.type == "Mul" for p in products),
                "h_t is not (1 - f) * h + f * hh", skeleton.y_t)
        carried = [p for p in products if h_prev in view.operands(p)]
        require(len(carried) == 1, "h_t does not scale the previous state once", skeleton.y_t)
        (one_minus_f,) = [t for t in view.operands(carried[0]) if t != h_prev]
        sub = view.producer(one_minus_f)
        require(sub is not None and sub.type == "Sub" and view.scalar(sub.input[0]) == 1.0,
                "the previous state is not scaled by 1 - f", one_minus_f)
        f = view.resolve(sub.input[1])
        (update,) = [p for p in products if p is not carried[0]]
        require(f in view.operands(update), "the new-state term is not f * hh", update.name)
        (candidate,) = [t for t in view.operands(update) if t != f] or [f]
        f_pre, gate_activation = view.gate(f)
        require(gate_activation.name == "Sigmoid", "the gate is not a sigmoid (1 - f is then no gate)", f)
        hh_pre, candidate_activation = view.gate(candidate)
        gate = view.affine(f_pre, x_t, h_prev, constants)
        require(gate.input_weight is not None, "the gate has no x_t @ W term", f_pre)
        terms = view.terms(hh_pre, constants)
        gated_h = {view.unbroadcast(f), view.unbroadcast(h_prev)}

        def resets(term) -> bool:
            inner = view.producer(term.operand) if term.operand is not None else None
            return inner is not None and inner.type == "Mul" and {view.unbroadcast(t) for t in inner.input} == gated_h

        reset = [t for t in terms if t.weight is not None and resets(t)]
        require(len(reset) == 1, "the candidate does not read (f * h) @ U once", hh_pre)
        inputs = view.affine_of([t for t in terms if t is not reset[0]], x_t, h_prev, hh_pre)
        require(inputs.input_weight is not None and inputs.recurrent_weight is None,
                "the candidate's input part is not x @ W + b", hh_pre)
        update_gate = GateForm(_negated(gate.input_weight), _negated(gate.recurrent_weight), _negated(gate.bias()))
        reset_gate = GateForm(gate.input_weight, gate.recurrent_weight, gate.bias())
        return BodyMatch(kind=KIND, gates=(update_gate, reset_gate, GateForm(inputs.input_weight, reset[0].weight,
                                                                            inputs.bias())),
                         activations=(gate_activation, candidate_activation), states=((StateRole.HIDDEN, h_slot),),
                         input_slot=skeleton.input_slot, output_slot=skeleton.output_slot,
                         output_every_step=skeleton.output_every_step, attributes=(("linear_before_reset", 0),))
''')


@pytest.fixture
def mgu_family(tmp_path_factory):
    """The MGU module in the rewriter package's path (and found), for one test."""
    import tf2onnx_rnn.rewriters as package

    folder = tmp_path_factory.mktemp("cell_families")
    (folder / "mgu.py").write_text(MGU_MODULE)
    package.__path__.append(str(folder))
    package.cell_matchers.cache_clear()
    try:
        yield
    finally:
        package.__path__.remove(str(folder))
        sys.modules.pop(f"{package.__name__}.mgu", None)
        package.cell_matchers.cache_clear()


def _mgu_step(o, w, x, states):
    h = states[0]
    f = o.sigmoid(o.matmul(x, w["kernel_f"]) + o.matmul(h, w["recurrent_f"]) + w["bias_f"])
    candidate = o.tanh(o.matmul(x, w["kernel_h"]) + o.matmul(f * h, w["recurrent_h"]) + w["bias_h"])
    h_new = (1.0 - f) * h + f * candidate
    return h_new, [h_new]


def _mgu_weights(features, units):
    return {"kernel_f": (features, units), "recurrent_f": (units, units), "bias_f": (units,),
            "kernel_h": (features, units), "recurrent_h": (units, units), "bias_h": (units,)}


MGU = cells.Cell("mgu", "GRU", _mgu_weights, _mgu_step, what="minimal gated unit")


def build(flavor: str):
    """Every form of an MGU layer side by side on one input, and a masked twin of each."""
    K = parity.keras_module(flavor)
    x = K.Input((TIME, FEATURES), name="x")
    masked = K.layers.Masking(0.0, name="masking")(x)

    def layer(name, **kwargs):
        return K.layers.RNN(cells.cell_layer(K, MGU, UNITS), name=f"mgu_{name}", **kwargs)

    outputs = []
    for source, prefix in ((x, ""), (masked, "masked_")):
        outputs.append(layer(prefix + "seq", return_sequences=True)(source))
        outputs.append(layer(prefix + "backward", go_backwards=True)(source))
        forward = layer(prefix + "bidi", return_sequences=True)
        with K.utils.custom_object_scope({type(forward.cell).__name__: type(forward.cell)}):  # Keras copies it
            outputs.append(K.layers.Bidirectional(forward, name=f"mgu_{prefix}bi")(source))
        outputs.append(layer(prefix + "unrolled", return_sequences=True, unroll=True)(source))
    stack = K.layers.StackedRNNCells([cells.cell_layer(K, MGU, UNITS), K.layers.LSTMCell(3)])
    outputs.append(K.layers.RNN(stack, return_sequences=True, name="mgu_stack")(masked))
    model = K.Model(x, outputs, name="mgu_model")
    parity.randomize_weights(model, zlib.crc32(f"mgu/{flavor}".encode()))
    return model


def batch() -> np.ndarray:
    """Rows: full, post-padded, pre-padded, holed, empty (the Masking layer masks zero steps)."""
    t = np.arange(TIME)
    mask = np.stack([t >= 0, t < 4, t >= 2, (t != 2) & (t != 3), t < 0])
    x = np.random.default_rng(3).standard_normal((len(mask), TIME, FEATURES)).astype(np.float32)
    return x * mask[:, :, None]


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_without_the_module_the_new_cell_stays_a_loop(flavor):
    from tf2onnx_rnn import convert_keras, report_of

    model = build(flavor)
    proto = convert_keras(model)
    rows = [row for row in report_of(proto).outcomes if row.kind != "StackedRNNCells"]
    assert rows and not any(row.fused for row in rows), parity.report_table(proto)
    assert helpers.op_counts(proto)["Scan"] and not helpers.op_counts(proto)["Loop"], parity.report_table(proto)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_fourth_cell_family_is_one_module(flavor, mgu_family):
    from tf2onnx_rnn import convert_keras, report_of

    model = build(flavor)
    proto = convert_keras(model)
    table = parity.report_table(proto)
    rows = report_of(proto).outcomes
    assert rows and all(row.fused for row in rows), table
    assert {row.kind for row in rows} == {"MGU", "StackedRNNCells"}, table
    assert all(row.became == "GRU" for row in rows if row.kind == "MGU"), table
    assert sum(1 for row in rows if row.unrolled == TIME) == 2, table
    for layer in ("mgu_bi", "mgu_masked_bi"):  # each Bidirectional layer is one bidirectional node
        pair = [row for row in rows if row.layer == layer]
        assert len(pair) == 2 and pair[0].node == pair[1].node, table
        assert {row.node_direction for row in pair} == {"bidirectional"}, table
    ops = helpers.op_counts(proto)
    assert not any(ops[op] for op in helpers.LOOP_OPS) and not ops["MatMul"], dict(ops)
    arrays = [batch()]
    expected = parity.keras_outputs(model, arrays)
    actual = parity.run_onnx(helpers.ort_session(proto), ["x"], arrays)
    problems, _ = parity.output_problems(flavor, [o.name for o in proto.graph.output], expected, actual, TOLERANCE)
    assert not problems, "\n".join(problems) + "\n" + table
