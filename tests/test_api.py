"""convert_keras without an input_signature, the report in the model, and loops left alone."""
from __future__ import annotations

import logging

import keras
import numpy as np
import onnx
import pytest

import helpers
import parity
import tf2onnx_rnn  # noqa: E402
from tf2onnx_rnn.rewriters import pipeline  # noqa: E402
from tf2onnx_rnn.rewriters.cells import gru as gru_matcher  # noqa: E402
from tf2onnx_rnn.rewriters.description import NoMatch  # noqa: E402
from tf2onnx_rnn.verify import verify_keras  # noqa: E402


def _randomize(model, seed=7):
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(w.dtype) for w in model.get_weights()])
    return model


def _sequential():
    model = keras.Sequential([keras.Input((None, 5)), keras.layers.GRU(6, return_sequences=True),
                              keras.layers.SimpleRNN(4)])
    return _randomize(model)


def _functional():
    tokens = keras.Input((None, 5), name="features")
    state = keras.Input((6,), name="state")
    sequence = keras.layers.LSTM(6, return_sequences=True, name="lstm_a")(tokens)
    last = keras.layers.GRU(6, name="gru_b")(sequence, initial_state=[state])
    return _randomize(keras.Model([tokens, state], keras.layers.Dense(2)(last)))


@pytest.mark.parametrize("build, expected", [(_sequential, ["GRU", "RNN"]), (_functional, ["LSTM", "GRU"])])
def test_convert_keras_without_signature(build, expected):
    """Sequential and functional models: every layer fused, no Loop/Scan, the Keras input names,
    batch left dynamic, and the model matches Keras."""
    model = build()
    model_proto = tf2onnx_rnn.convert_keras(model)
    ops = helpers.op_types(model_proto)
    assert sorted(op for op in ops if op in helpers.RECURRENT_OPS) == sorted(expected)
    assert "Loop" not in ops and "Scan" not in ops
    names = [i.name for i in model_proto.graph.input]
    assert names == [t.name for t in model.inputs]
    for value in model_proto.graph.input:  # batch and time stay dynamic
        dims = value.type.tensor_type.shape.dim
        assert not dims[0].HasField("dim_value")
    result = verify_keras(model, model_proto, tolerance=1e-5)
    assert result.passed, result.table()


def test_report_is_stored_logged_and_names_layers(caplog):
    model = _functional()
    with caplog.at_level(logging.INFO, logger="tf2onnx_rnn"):
        model_proto = tf2onnx_rnn.convert_keras(model, opset=17)
    report = tf2onnx_rnn.report_of(model_proto)
    assert [(o.layer, o.kind, o.became) for o in report.outcomes] == [("lstm_a", "LSTM", "LSTM"),
                                                                       ("gru_b", "GRU", "GRU")]
    assert any(p.key == tf2onnx_rnn.METADATA_KEY for p in model_proto.metadata_props)
    assert "lstm_a" in caplog.text and "gru_b" in caplog.text
    assert model_proto.opset_import[0].version == 17


def test_output_path_holds_the_returned_model_and_onnxruntime_loads_it(tmp_path):
    """The file written to ``output_path`` is the returned model; onnxruntime loads it (so it
    accepts its IR version); no temporary file is left beside it."""
    path = tmp_path / "model.onnx"
    model_proto = tf2onnx_rnn.convert_keras(_sequential(), output_path=str(path))
    assert onnx.load(str(path)) == model_proto
    helpers.ort_session(path)
    assert not [p for p in tmp_path.iterdir() if p.name != "model.onnx"], "temporary files left behind"


def _reject(view, skeleton):
    raise NoMatch("rejected on purpose by the test", skeleton.y_t)


def _explode(*args, **kwargs):
    raise RuntimeError("injected failure")


@pytest.mark.parametrize("target, attribute, replacement, reason", [
    (gru_matcher, "match", _reject, "rejected on purpose by the test"),
    (gru_matcher, "match", _explode, "internal error while matching: RuntimeError: injected failure"),
    (pipeline, "emit", _explode, "internal error while emitting: RuntimeError: injected failure"),
])
def test_rejected_layer_stays_an_exact_loop(monkeypatch, target, attribute, replacement, reason):
    model = _sequential()
    monkeypatch.setattr(target, attribute, replacement)
    model_proto = tf2onnx_rnn.convert_keras(model)
    ops = helpers.op_types(model_proto)
    report = tf2onnx_rnn.report_of(model_proto)
    by_kind = {o.kind: o for o in report.outcomes}
    if by_kind["GRU"].became == "GRU":  # Keras 2.15's GRU loop, which tf2onnx's own rewriter fuses once ours declines
        assert "tf2onnx's own" in by_kind["GRU"].activations and "GRU" in ops and attribute == "match"
    else:  # no native node: the loop is written as a Scan of its own step, exact, and the row keeps the reason
        assert by_kind["GRU"].became == "Scan"
        assert reason in by_kind["GRU"].reason
        assert "Scan" in ops and "Loop" not in ops and "GRU" not in ops
    if attribute == "match":
        assert by_kind["SimpleRNN"].became == "RNN" and "RNN" in ops
    result = verify_keras(model, model_proto, tolerance=1e-5)
    assert result.passed, result.table()


def test_model_without_inputs_is_a_clear_error():
    model = keras.Sequential([keras.layers.LSTM(3)])
    with pytest.raises(tf2onnx_rnn.ConversionError, match="no defined inputs"):
        tf2onnx_rnn.convert_keras(model)


def test_bad_opset_is_a_clear_error():
    with pytest.raises(tf2onnx_rnn.ConversionError, match="opset 9 is not supported"):
        tf2onnx_rnn.convert_keras(_sequential(), opset=9)


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
@pytest.mark.parametrize("form", ["first", "bidirectional", "in-time-distributed", "batch"])
def test_an_unbuilt_sequential_whose_first_layer_declares_its_input_converts(flavor, form):
    """A Sequential never called, whose first layer declares ``input_shape`` (Keras 3 warns and keeps
    it; ``batch_input_shape`` in Keras 2), even inside a wrapper: built from that shape, its recurrent
    layers fused, exact. (Keras 3 keeps no shape a layer inside a Bidirectional declares: there the
    wrapper declares it.)"""
    import importlib

    K = importlib.import_module(flavor)
    keras3 = flavor == "keras" and parity.KERAS3
    if form == "batch" and keras3:
        pytest.skip("Keras 3 layers take no batch_input_shape")
    declared = {"batch_input_shape": (None, None, 5)} if form == "batch" else {"input_shape": (None, 5)}
    if form == "in-time-distributed":
        layers = [K.layers.TimeDistributed(K.layers.Dense(6, input_shape=(5,))), K.layers.GRU(4)]
    elif form == "bidirectional" and keras3:
        layers = [K.layers.Bidirectional(K.layers.LSTM(3), **declared), K.layers.Dense(2)]
    elif form == "bidirectional":
        layers = [K.layers.Bidirectional(K.layers.LSTM(3, **declared)), K.layers.Dense(2)]
    else:
        layers = [K.layers.LSTM(3, return_sequences=True, **declared), K.layers.SimpleRNN(2)]
    model = K.Sequential(layers)
    model_proto = tf2onnx_rnn.convert_keras(model)
    _randomize(model)
    model_proto = tf2onnx_rnn.convert_keras(model)
    rows = tf2onnx_rnn.report_of(model_proto).outcomes
    assert rows and all(row.fused for row in rows), tf2onnx_rnn.report_of(model_proto).table()
    result = verify_keras(model, model_proto, tolerance=1e-5)
    assert result.passed, result.table()


_LOAD_BESIDE_TF_KERAS = """
import sys
import numpy as np
import tf_keras  # imported first, as a notebook that uses both would have it
import keras
import onnxruntime as ort
from tf2onnx_rnn.api import run
from tf2onnx_rnn.sources.keras_file import KerasFile

x = keras.Input((None, 3), name="x")
model = keras.Model(x, keras.layers.SimpleRNN(4, go_backwards=True)(keras.layers.Masking(0.0)(x)))
path = sys.argv[1]
model.save(path)
proto = run(KerasFile(path)).model_proto
batch = np.random.default_rng(3).standard_normal((2, 5, 3)).astype(np.float32)
batch[1, 3:] = 0.0
got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": batch})[0]
print("max error", float(np.abs(got - model(batch, training=False).numpy()).max()))
"""


def test_a_keras_file_loads_with_tf_keras_imported_beside_keras(tmp_path):
    """A ``.keras`` file saved by ``keras`` converts exactly in a process that imported tf_keras too.
    (On TensorFlow 2.15 Keras 2's own loader never returns there; the file is read with tf_keras.)
    Run in a fresh process, under a time limit, so that a hang fails instead of stalling the suite."""
    pytest.importorskip("tf_keras")
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _LOAD_BESIDE_TF_KERAS, str(tmp_path / "model.keras")],
                            capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    error = float(result.stdout.split("max error")[-1])
    assert error < parity.TOLERANCE, result.stdout
