"""The Scan pass's graph index and types, kept up to date by its own edits (``scan/live_graph.py``,
``scan/inferred_types.py``), are those it would read by rebuilding them: after every edit the pass makes,
the index a refresh gives is the index a rebuild gives (each tensor's producer, its readers in the graph's
order, the initializers), and between two refreshes it is the one of the first; each loop's types are
those of ``TypeTable(model, within=loop)``, inferred over the whole model as it stands.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers
import parity


def _index(scope) -> tuple:
    return ({name: id(node) for name, node in scope.producers.items()},
            {name: [id(node) for node in nodes] for name, nodes in scope.readers.items() if nodes},
            set(scope.initializers), scope.inputs, scope.graph_outputs)


def _rebuilt(graph: onnx.GraphProto) -> tuple:
    from tf2onnx_rnn.rewriters.written.scope import Scope

    return _index(Scope(graph))


def _graph() -> onnx.GraphProto:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Neg", ["a"], ["b"], name="b"),
             helper.make_node("Add", ["a", "b"], ["c"], name="c"), helper.make_node("Mul", ["c", "w"], ["y"], name="y")]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                             [helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])])


def test_each_edit_entered_gives_the_index_a_rebuild_gives():
    from tf2onnx_rnn.rewriters.written.scan.live_graph import LiveScope

    graph = _graph()
    scope = LiveScope(graph)
    assert _index(scope) == _rebuilt(graph) and scope.changes()[0]  # read whole
    b = scope.producer("b")
    held = scope.replace(b, [helper.make_node("Abs", ["a"], ["b0"], name="b0"),
                             helper.make_node("Neg", ["b0"], ["b"], name="b1")])
    assert [n.name for n in graph.node] == ["a", "b0", "b1", "c", "y"] and held[0] is graph.node[1]
    before = _index(scope)
    scope.add_initializers([helper.make_tensor("v", TensorProto.FLOAT, [2], [3.0, 4.0])])
    scope.append([helper.make_node("Sub", ["c", "v"], ["z"], name="z")])
    c = scope.producer("c")
    c.input[1] = "b0"  # c reads b0 in place of b: b1 is read by nothing
    scope.reread(c)
    assert _index(scope) == before  # not entered until the next refresh, as a rebuilt index would not be
    scope.refresh()
    assert _index(scope) == _rebuilt(graph)
    assert [n.name for n in scope.readers["b0"]] == ["b1", "c"]  # in the graph's order
    scope.remove([scope.producer("b")])
    scope.drop_initializers({"v"})
    scope.refresh()
    assert _index(scope) == _rebuilt(graph)
    assert [n.name for n in graph.node] == ["a", "b0", "c", "y", "z"] and "v" not in scope.initializers
    rebuilt, touched, unmade = scope.changes()
    assert not rebuilt and {n.name for n in touched} == {"b0", "c", "z"} and unmade == {"b", "v"}


def _stack(flavor: str, form: str):
    """Three layers written as Scans of their own steps: a Bidirectional among them (masked or not), or, to
    be streamed, each forward."""
    K = parity.keras_module(flavor)
    x = K.Input((None, 3), name="x")
    h = K.layers.Masking(0.0)(x) if form == "masked" else x
    h = K.layers.SimpleRNN(4, activation="gelu", return_sequences=True)(h)
    lstm = K.layers.LSTM(3, activation="selu", return_sequences=True)
    h = lstm(h) if form == "streamed" else K.layers.Bidirectional(lstm)(h)
    model = K.Model(x, K.layers.SimpleRNN(2, activation="gelu")(h))
    parity.randomize_weights(model, 3)
    return model


@pytest.mark.parametrize("form", ["plain", "masked", "streamed"])
def test_the_pass_reads_what_it_would_read_rebuilding_every_loop(monkeypatch, form):
    """Converting a stack of Scan-form layers: at each loop, the index and the types are those a rebuild of
    the index and an inference of the whole model give; the model is exact."""
    from tf2onnx_rnn import convert_keras
    from tf2onnx_rnn.rewriters.written.scan import inferred_types
    from tf2onnx_rnn.rewriters.written.scope import TypeTable

    table, seen = inferred_types.InferredTypes.table, []

    def checked(self, node):
        types = table(self, node)
        whole = TypeTable(self.model, within=node.name)
        assert _index(self.scope) == _rebuilt(self.model.graph)
        assert {name: (types.elem_type(name), types.shape(name)) for name in types.types} == \
            {name: (whole.elem_type(name), whole.shape(name)) for name in whole.types}
        seen.append(node.name)
        return types

    monkeypatch.setattr(inferred_types.InferredTypes, "table", checked)
    model = _stack(parity.FLAVORS[0], form)
    proto = convert_keras(model, opset=17, **({"streaming": True} if form == "streamed" else {}))
    loops = 3 if form == "streamed" else 4
    assert len(seen) == loops and helpers.op_counts(proto)["Scan"] == loops, helpers.op_counts(proto)
    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    x[1, 3:] = 0.0
    feeds = {"x": x}  # a streamed layer starts from zero states, as Keras's does
    initialized = {t.name for t in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name not in feeds and value.name not in initialized:
            feeds[value.name] = np.zeros([d.dim_value or len(x) for d in value.type.tensor_type.shape.dim], np.float32)
    np.testing.assert_allclose(helpers.ort_session(proto).run(None, feeds)[0], parity.keras_outputs(model, [x])[0],
                               atol=1e-5)
