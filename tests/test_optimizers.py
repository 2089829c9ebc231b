"""tf2onnx's optimizers, run once on the graph: the same model tf2onnx's own loop makes, a failing
optimizer skipped as tf2onnx skips it, and raised when ``TF2ONNX_CATCH_ERRORS`` says so."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import helpers
import parity
from tf2onnx_rnn import ConversionError, convert_keras, tf2onnx_call


def _model():
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 5), name="x")
    y = K.layers.Bidirectional(K.layers.LSTM(4, return_sequences=True))(K.layers.Masking(0.0)(x))
    model = K.Model(x, K.layers.Dense(3)(K.layers.GRU(3)(y)))
    parity.randomize_weights(model, 5)
    return model


def _stock_optimized(graph, optimizers, caught, made_again):
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
    monkeypatch.setattr(tf2onnx_call, "_optimized", _stock_optimized)
    stock = convert_keras(model)
    assert helpers.structure(ours) == helpers.structure(stock)


def _looped_model():
    """Layers tf2onnx converts as loops (no native node computes them: Scans of their own steps) beside a
    fused one, masked: the inlined loop conditions and the optimizers' passes over loop bodies."""
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 5), name="x")
    h = K.layers.SimpleRNN(4, activation="gelu", return_sequences=True)(K.layers.Masking(0.0)(x))
    h = K.layers.LSTM(3, activation="selu", return_sequences=True)(h)
    model = K.Model(x, K.layers.Dense(2)(K.layers.GRU(3)(h)))
    parity.randomize_weights(model, 6)
    return model


def test_the_lean_steps_make_the_model_tf2onnx_makes(monkeypatch):
    """tf2onnx's steps this package makes linear in the loops (the condition inlined without copying the
    model, the passes without rebuilding protobufs, Identities renamed in their readers only) write the
    model tf2onnx's own steps write."""
    import contextlib

    model = _looped_model()
    ours = convert_keras(model)
    assert helpers.op_counts(ours)["Scan"] == 2, helpers.op_counts(ours)
    monkeypatch.setattr(tf2onnx_call, "_optimized", _stock_optimized)
    monkeypatch.setattr(tf2onnx_call, "shared_parents", contextlib.nullcontext)
    stock = convert_keras(model)
    assert helpers.structure(ours) == helpers.structure(stock)
    x = _x()
    np.testing.assert_allclose(parity.run_onnx(helpers.ort_session(ours), ["x"], [x])[0],
                               parity.keras_outputs(model, [x])[0], atol=1e-5)


def test_a_failing_optimizer_is_skipped_and_its_half_done_work_undone(caplog):
    from tf2onnx import optimizer

    model = _model()
    optimizers = dict(optimizer._get_optimizers())
    unbroken = convert_keras(model, optimizers=optimizers)
    with caplog.at_level(logging.WARNING, logger="tf2onnx"):
        proto = convert_keras(model, optimizers={"breaking": _breaking_optimizer(), **optimizers})
    assert any("Failed to apply breaking" in r.getMessage() for r in caplog.records), caplog.text
    assert helpers.structure(proto) == helpers.structure(unbroken)
    x = _x()
    expected = parity.keras_outputs(model, [x])
    actual = parity.run_onnx(helpers.ort_session(proto), ["x"], [x])
    np.testing.assert_allclose(actual[0], expected[0], atol=1e-5)


@pytest.mark.parametrize("value", ["FALSE", "false"])
def test_catch_errors_false_raises_the_optimizers_failure(monkeypatch, value):
    monkeypatch.setenv(tf2onnx_call.CATCH_ERRORS, value)
    with pytest.raises(ConversionError, match="this optimizer breaks"):
        convert_keras(_model(), optimizers={"breaking": _breaking_optimizer()})


def _skip_concatenated_stack(K):
    """Two stacked LSTMs whose sequences are concatenated with the model's input (a text model's skip
    connections): the transposes around the fused nodes meet an input that has none at the Concat."""
    x = K.Input((None, 16), name="x")
    r1 = K.layers.LSTM(8, return_sequences=True)(x)
    r2 = K.layers.LSTM(8, return_sequences=True)(r1)
    model = K.Model(x, K.layers.GlobalAveragePooling1D()(K.layers.concatenate([x, r1, r2])))
    parity.randomize_weights(model, 8)
    return model


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_skip_concatenated_stack_converts_at_batch_1_as_at_batch_3(flavor):
    """At a fixed batch of 1, tf2onnx's transpose optimizer left a pair of transposes at the Concat each
    round, one of them a Reshape no round cancels: its rounds never ended. Both batches now convert to
    as many nodes, two native LSTMs, exact (at batch 1 tf2onnx writes a transpose that moves only the axis
    of size 1 as a Reshape)."""
    import tensorflow as tf

    model = _skip_concatenated_stack(parity.keras_module(flavor))
    counts = {}
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 11, 16)).astype(np.float32)
        proto = convert_keras(model, input_signature=[tf.TensorSpec(x.shape, tf.float32, name="x")])
        counts[batch] = helpers.op_counts(proto)
        counts[batch]["Transpose"] += counts[batch].pop("Reshape", 0)
        assert counts[batch]["LSTM"] == 2 and not helpers.nodes_of_types(proto, ["Loop", "Scan"]), counts[batch]
        np.testing.assert_allclose(parity.run_onnx(helpers.ort_session(proto), ["x"], [x])[0],
                                   parity.keras_outputs(model, [x])[0], rtol=1e-5, atol=1e-5)
    assert counts[1] == counts[3], counts


def _restless_optimizer():
    """An optimizer that says it changed the graph every time it runs, as one that undoes another's work does."""
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    class Restless(GraphOptimizerBase):
        def _optimize(self, graph):
            self.graph_been_opt = True
            return graph

    return Restless


@pytest.mark.parametrize("value", ["TRUE", "FALSE"])
def test_optimizers_that_never_settle_stop_the_conversion_in_one_line(monkeypatch, value):
    """Caught or not (tf2onnx's switch), rounds of optimizers that never end stop the conversion with an
    error naming the stage and the optimizer still at work, after a bounded number of rounds."""
    from tf2onnx import optimizer

    from tf2onnx_rnn import lean_tf2onnx

    monkeypatch.setenv(tf2onnx_call.CATCH_ERRORS, value)
    rounds = []
    restless = _restless_optimizer()

    def counted():
        rounds.append(1)
        return restless()

    with pytest.raises(ConversionError) as raised:
        convert_keras(_model(), optimizers={**optimizer._get_optimizers(), "restless": counted})
    message = str(raised.value)
    assert "\n" not in message and "tf2onnx's optimizers did not settle" in message and "Restless" in message, message
    assert len(rounds) == lean_tf2onnx.ROUNDS, len(rounds)
