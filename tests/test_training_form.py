"""The training form (``target="training"``, CLI ``--target training``): converted models that
onnxruntime's training API can differentiate, with the same outputs as Keras.

Runs in the main environment (no training build needed; tests/training/ runs the training itself).
For the masked cases of test_parity_masking.py and its stacks, and unmasked layers in every
direction, in Keras 3 and tf_keras, every weight randomized:

- onnxruntime matches ``model(inputs, training=False)`` within 1e-5 (masked: on batches mixing full,
  post-padded, pre-padded, holed and empty rows);
- no Loop, Scan or RNN node; every native node runs forward, takes no ``sequence_lens`` and lists no
  activations unless its report row says it does not train (a masked LSTM whose final cell state is
  used keeps ``sequence_lens``; a SimpleRNN with a non-default activation stays an RNN);
- every node keeps its optional inputs up to its initial states (as ``""`` when absent);
- a SimpleRNN becomes a GRU whose gates are held by initializers of their own, listed in the model's
  metadata and never among :func:`tf2onnx_rnn.trainable_parameters`, which holds every recurrent
  weight and bias and the Dense layers'; a node whose Keras layer has one bias (LSTM, GRU with
  ``reset_after=False``, SimpleRNN) trains one, its recurrent bias held at zero.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import helpers
import parity
import test_parity_masking as masking
import tf2onnx_rnn
from test_parity_masking import MaskCase
from tf2onnx_rnn import report_of, trainable_parameters
from tf2onnx_rnn.training import HELD_KEY, held_parameters

_CONVERTED: dict = {}
UNTRAINABLE = "does not train in onnxruntime"


def converted(flavor: str, case, build):
    key = (flavor, case)
    if key not in _CONVERTED:
        entry = parity.Converted(flavor, case)
        try:
            entry.model = build(flavor, case)
            entry.proto = tf2onnx_rnn.convert_keras(entry.model, target="training")
        except Exception as error:  # noqa: BLE001 - reported by every test of the case
            entry.error = error
        _CONVERTED[key] = entry
    return _CONVERTED[key].get().proto


def form_problems(proto) -> list:
    """What in ``proto`` onnxruntime's training kernels would refuse, but for rows that say so."""
    problems = [f"{n.op_type} node {n.name} left" for n in helpers.nodes_of_types(proto, helpers.LOOP_OPS)]
    untrainable = {o.node for o in report_of(proto).outcomes if UNTRAINABLE in o.activations}
    for node in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS):
        slots = 7 if node.op_type == "LSTM" else 6
        if len(node.input) != slots:
            problems.append(f"{node.name}: {len(node.input)} inputs, not {slots} (padded up to its initial states)")
        if node.name in untrainable:
            continue
        if node.op_type == "RNN":
            problems.append(f"{node.name}: an RNN node (no gradient in onnxruntime)")
        if helpers.direction_of(node) != "forward":
            problems.append(f"{node.name}: runs {helpers.direction_of(node)}")
        if len(node.input) > 4 and node.input[4]:
            problems.append(f"{node.name}: takes sequence_lens")
        if helpers.attribute(node, "activations") is not None:
            problems.append(f"{node.name}: lists activations {helpers.attribute(node, 'activations')}")
    return problems


def parameter_problems(proto) -> list:
    """The held gates are initializers listed in the metadata and never trained; every recurrent
    node's weights and biases train (through the held gates' Concats)."""
    problems = []
    held, trainable = set(held_parameters(proto)), set(trainable_parameters(proto))
    initializers = {i.name for i in proto.graph.initializer}
    if held - initializers:
        problems.append(f"held gates {sorted(held - initializers)} are not initializers")
    if held & trainable:
        problems.append(f"held gates would train: {sorted(held & trainable)}")
    producers = {out: n for n in proto.graph.node for out in n.output}
    for node in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS):
        for name in node.input[1:4]:
            parts = producers[name].input if name in producers and producers[name].op_type == "Concat" else [name]
            if not [p for p in parts if p in trainable]:
                problems.append(f"{node.name}: nothing of {name} trains")
    # held: a held-gate GRU's weights and biases (4), and the recurrent bias of a node whose Keras layer
    # has one bias (LSTM, GRU with linear_before_reset=0), held at zero (1)
    gates = [n for n in helpers.nodes_of_types(proto, {"GRU"}) if n.input[1] in producers]
    one_bias = [n for n in helpers.nodes_of_types(proto, {"LSTM", "GRU"}) if n.input[1] not in producers
                and not helpers.attribute(n, "linear_before_reset") and n.name not in untrainable_nodes(proto)]
    if len(held) != 4 * len(gates) + len(one_bias):
        problems.append(f"{len(held)} held initializers for {len(gates)} held-gate GRUs and {len(one_bias)} "
                        "one-bias nodes")
    return problems


def untrainable_nodes(proto) -> set:
    return {o.node for o in report_of(proto).outcomes if UNTRAINABLE in o.activations}


def check_masked(flavor: str, case) -> None:
    proto = converted(flavor, case, masking.build)
    problems = form_problems(proto) + parameter_problems(proto)
    problems += masking.parity_problems(proto, _CONVERTED[(flavor, case)].model, case,
                                        masking.seed_of(flavor, case), masking.rounds())
    kinds = [case.kind] if isinstance(case, MaskCase) else []
    if "SimpleRNN" in kinds and not helpers.nodes_of_types(proto, {"GRU"}):
        problems.append("the SimpleRNN did not become a GRU")
    masking.fail_with(problems, proto, flavor, case)


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}")
                                          for f in parity.FLAVORS for c in masking.CASES])
def test_masked_layer_in_training_form(flavor: str, case: MaskCase):
    check_masked(flavor, case)


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}")
                                          for f in parity.FLAVORS for c in masking.STACKS])
def test_masked_stack_in_training_form(flavor: str, case):
    check_masked(flavor, case)


# -- unmasked layers ---------------------------------------------------------------------------
UNMASKED = {
    # name: (layer kind, wrapper, keyword arguments)
    "lstm_seq": ("LSTM", None, dict(return_sequences=True)),
    "gru_backwards": ("GRU", None, dict(go_backwards=True, return_sequences=True, reset_after=False)),
    "bidirectional_lstm_state": ("LSTM", "bidirectional", dict(return_sequences=True, return_state=True)),
    "bidirectional_gru": ("GRU", "bidirectional", dict()),
    "simple_rnn": ("SimpleRNN", None, dict(return_sequences=True)),
    "simple_rnn_nobias_backwards": ("SimpleRNN", None, dict(use_bias=False, go_backwards=True)),
    "bidirectional_simple_rnn": ("SimpleRNN", "bidirectional", dict(return_sequences=True)),
    "simple_rnn_relu": ("SimpleRNN", None, dict(activation="relu")),
}


@dataclass(frozen=True)
class Unmasked:
    """An unmasked case, named."""

    id: str

    @property
    def kind(self) -> str:
        return UNMASKED[self.id][0]


def build_unmasked(flavor: str, case: Unmasked):
    K = parity.keras_module(flavor)
    kind, wrapper, kwargs = UNMASKED[case.id]
    x = K.Input((None, parity.FEATURES), name="x")
    layer = getattr(K.layers, kind)(parity.UNITS, **kwargs)
    out = (K.layers.Bidirectional(layer) if wrapper else layer)(x)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    outs[0] = K.layers.Dense(2)(outs[0])
    model = K.Model(x, outs)
    parity.randomize_weights(model, parity.case_seed(flavor, case))
    return model


@pytest.mark.parametrize("flavor, name", [pytest.param(f, n, id=f"{f}-{n}") for f in parity.FLAVORS
                                          for n in UNMASKED])
def test_unmasked_layer_in_training_form(flavor: str, name: str):
    case = Unmasked(name)
    proto = converted(flavor, case, build_unmasked)
    model = _CONVERTED[(flavor, case)].model
    problems = form_problems(proto) + parameter_problems(proto)
    session = helpers.ort_session(proto)
    for batch, time in ((3, 6), (1, 4)):
        x = np.random.default_rng(batch * time).standard_normal((batch, time, parity.FEATURES)).astype(np.float32)
        expected = parity.keras_outputs(model, [x])
        actual = parity.run_onnx(session, ["x"], [x])
        problems += parity.output_problems(f"b{batch} T{time}", [o.name for o in proto.graph.output], expected,
                                           actual, parity.TOLERANCE)[0]
    rows = report_of(proto).outcomes
    if name == "simple_rnn_relu":  # ONNX's GRU trains only with its default activations
        if not (helpers.nodes_of_types(proto, {"RNN"}) and all(UNTRAINABLE in o.activations for o in rows)):
            problems.append("a relu SimpleRNN should stay an RNN whose row says it does not train")
    elif UNMASKED[name][0] == "SimpleRNN":
        if helpers.nodes_of_types(proto, {"RNN"}) or not all("update gate held at 0" in o.activations for o in rows):
            problems.append("a SimpleRNN should become a held-gate GRU and its row say so")
    if any(UNTRAINABLE in o.activations for o in rows) != (name == "simple_rnn_relu"):
        problems.append("rows saying they do not train: " + str([o.activations for o in rows]))
    masking.fail_with(problems, proto, flavor, case)


def test_training_form_keeps_the_default_form_apart():
    """Without the target, a SimpleRNN stays an RNN and nothing is held; with it, the metadata lists
    the held gates and the report says how the layer trains."""
    trained = converted(parity.FLAVORS[0], Unmasked("simple_rnn"), build_unmasked)
    default = tf2onnx_rnn.convert_keras(_CONVERTED[(parity.FLAVORS[0], Unmasked("simple_rnn"))].model)
    assert helpers.nodes_of_types(default, {"RNN"}) and not held_parameters(default)
    assert HELD_KEY not in {p.key for p in default.metadata_props}
    assert len(held_parameters(trained)) == 4
    dense = [n for n in trained.graph.node if n.op_type == "MatMul"]
    assert dense and dense[0].input[1] in trainable_parameters(trained)


@pytest.mark.parametrize("what, build, message", [
    ("a layer left a Loop", lambda K: K.layers.LSTM(parity.UNITS, activation="selu"), "is a Loop or Scan"),
    ("an RNN node", lambda K: K.layers.SimpleRNN(parity.UNITS), "an RNN node, which has no gradient"),
    ("a masked layer's sequence_lens", "masked", "takes sequence_lens"),
])
def test_what_cannot_train_is_refused_before_anything_runs(what, build, message, tmp_path):
    """The default form's models that onnxruntime's training build cannot take are refused in one
    line naming the node (its artifact generation would abort the process on a Loop)."""
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, parity.FEATURES), name="x")
    if build == "masked":
        out = K.layers.GRU(parity.UNITS)(K.layers.Masking()(x))
    else:
        out = build(K)(x)
    proto = tf2onnx_rnn.convert_keras(K.Model(x, out))
    with pytest.raises(tf2onnx_rnn.ConversionError, match=message) as refused:
        tf2onnx_rnn.write_training_artifacts(proto, str(tmp_path / "artifacts"))
    assert "\n" not in str(refused.value) and "cannot train in onnxruntime" in str(refused.value)
    assert not (tmp_path / "artifacts").exists()
