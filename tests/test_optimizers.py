"""tf2onnx's optimizers, run once on the graph: the same model tf2onnx's own loop makes, a failing
optimizer skipped as tf2onnx skips it, and raised when ``TF2ONNX_CATCH_ERRORS`` says so."""
from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import helpers
import parity
from tf2onnx_rnn import ConversionError, convert_keras, translate


def _model():
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 5), name="x")
    y = K.layers.Bidirectional(K.layers.LSTM(4, return_sequences=True))(K.layers.Masking(0.0)(x))
    model = K.Model(x, K.layers.Dense(3)(K.layers.GRU(3)(y)))
    parity.randomize_weights(model, 5)
    return model


def _structure(model_proto: onnx.ModelProto) -> list:
    """The graph as lines, tensors named by where they first appear and constants by their values:
    two conversions of one model compare equal whatever names tf2onnx's counters gave them."""
    names: dict = {}

    def name(tensor: str) -> str:
        return names.setdefault(tensor, f"t{len(names)}") if tensor else ""

    lines: list = []

    def walk(graph, indent=""):
        for tensor in graph.initializer:
            value = numpy_helper.to_array(tensor).tobytes().hex()
            names[tensor.name] = f"{tensor.data_type}{list(tensor.dims)}:{value}"
        lines.extend(f"{indent}input {name(i.name)}" for i in graph.input)
        for node in graph.node:
            attributes = []
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g, indent + "  ")
                    attributes.append(f"{attribute.name}=<graph>")
                elif attribute.type == onnx.AttributeProto.TENSOR:
                    attributes.append(f"{attribute.name}={numpy_helper.to_array(attribute.t).tobytes().hex()}")
                else:
                    attributes.append(f"{attribute.name}={onnx.helper.get_attribute_value(attribute)}")
            lines.append(f"{indent}{node.op_type} {[name(i) for i in node.input]} -> "
                         f"{[name(o) for o in node.output]} {attributes}")
        lines.extend(f"{indent}output {name(o.name)}" for o in graph.output)

    walk(model_proto.graph)
    return lines


def _stock_optimized(graph, optimizers, caught):
    from tf2onnx import optimizer

    return optimizer.optimize_graph(graph, catch_errors=caught, optimizers=optimizers)


def _breaking_optimizer():
    """An optimizer that removes a node and then fails, as a buggy one would: half done."""
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    class Breaking(GraphOptimizerBase):
        def _optimize(self, graph):
            graph.remove_node(graph.get_nodes()[-1].name)
            raise RuntimeError("this optimizer breaks")

    return Breaking


def _x():
    x = np.random.default_rng(3).standard_normal((2, 6, 5)).astype(np.float32)
    x[1, 4:] = 0
    return x


def test_the_optimized_model_is_the_one_tf2onnx_makes(monkeypatch):
    model = _model()
    ours = convert_keras(model)
    monkeypatch.setattr(translate, "_optimized", _stock_optimized)
    stock = convert_keras(model)
    assert _structure(ours) == _structure(stock)


def test_a_failing_optimizer_is_skipped_and_its_half_done_work_undone(caplog):
    from tf2onnx import optimizer

    model = _model()
    optimizers = dict(optimizer._get_optimizers())
    unbroken = convert_keras(model, optimizers=optimizers)
    with caplog.at_level(logging.WARNING, logger="tf2onnx"):
        proto = convert_keras(model, optimizers={"breaking": _breaking_optimizer(), **optimizers})
    assert any("Failed to apply breaking" in r.getMessage() for r in caplog.records), caplog.text
    assert _structure(proto) == _structure(unbroken)
    x = _x()
    expected = parity.keras_outputs(model, [x])
    actual = parity.run_onnx(helpers.ort_session(proto), ["x"], [x])
    np.testing.assert_allclose(actual[0], expected[0], atol=1e-5)


@pytest.mark.parametrize("value", ["FALSE", "false"])
def test_catch_errors_false_raises_the_optimizers_failure(monkeypatch, value):
    monkeypatch.setenv(translate.CATCH_ERRORS, value)
    with pytest.raises(ConversionError, match="this optimizer breaks"):
        convert_keras(_model(), optimizers={"breaking": _breaking_optimizer()})
