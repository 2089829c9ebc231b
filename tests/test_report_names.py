"""The report names the model's own Keras layers, exactly, in both Keras flavors.

One model holds layers named ``lstm``, ``gru``, ``lstm_1``, ``lstm_2`` and a ``Bidirectional``
named ``bidi`` (its inner layer keeps the name Keras gives it): names that tracing's own scope
suffixes (``lstm_1`` for a second ``lstm`` scope) could confuse. Every layer has its own number
of units, so the ONNX node a row names tells which layer the row is about, and that layer's name
must be the row's ``layer``. The same layers run directly in the model and inside a nested model.
"""
from __future__ import annotations

import pytest

import helpers
import parity
import tf2onnx_rnn

FEATURES = 3
# layer name -> (kind, units); the units tell the layers' nodes apart
LAYERS = {"lstm": ("LSTM", 2), "gru": ("GRU", 3), "lstm_1": ("LSTM", 4), "bidi": ("Bidirectional", 5),
          "lstm_2": ("LSTM", 6)}
BY_UNITS = {units: name for name, (_, units) in LAYERS.items()}
ROWS = {"lstm": 1, "gru": 1, "lstm_1": 1, "bidi": 2, "lstm_2": 1}  # report rows per layer (one per loop)


def stack(K, x):
    """The layers of LAYERS, in order, on ``x``."""
    for name, (kind, units) in LAYERS.items():
        last = name == "lstm_2"
        if kind == "Bidirectional":
            x = K.layers.Bidirectional(K.layers.LSTM(units, return_sequences=True), name=name)(x)
        else:
            x = getattr(K.layers, kind)(units, return_sequences=not last, name=name)(x)
    return x


def build(flavor: str, nested: bool):
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    if nested:
        inner_x = K.Input((None, FEATURES), name="inner_x")
        inner = K.Model(inner_x, stack(K, inner_x), name="encoder")
        model = K.Model(x, K.layers.Dense(2, name="head")(inner(x)), name="outer")
    else:
        model = K.Model(x, stack(K, x), name="names")
    parity.randomize_weights(model, seed=11)
    return model


@pytest.mark.parametrize("nested", [False, True], ids=["direct", "nested"])
@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_rows_name_the_keras_layers(flavor, nested):
    model = build(flavor, nested)
    model_proto = tf2onnx_rnn.convert_keras(model)
    report = tf2onnx_rnn.report_of(model_proto)
    table = report.table()
    nodes = {n.name: n for n in helpers.all_nodes(model_proto.graph)}
    problems = []
    for row in report.outcomes:
        node = nodes.get(row.node)
        if not row.fused or node is None:
            problems.append(f"loop {row.loop}: not fused into a node of the graph ({row.became}, {row.node!r})")
            continue
        layer = BY_UNITS.get(helpers.attribute(node, "hidden_size"))
        if row.layer != layer:
            problems.append(f"loop {row.loop} became node {row.node} of layer {layer!r}; the row names {row.layer!r}")
    counts = {name: sum(row.layer == name for row in report.outcomes) for name in ROWS}
    if counts != ROWS:
        problems.append(f"rows per layer {counts}, expected {ROWS}")
    assert not problems, "\n".join(problems) + "\n" + table
