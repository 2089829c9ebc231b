"""Both ends of the supported opset range convert, pass the checker and match Keras, in the default
form and the onnxruntime target's; the default opset is one every consumer reads."""
from __future__ import annotations

import keras
import numpy as np
import onnx
import pytest

import helpers
import tf2onnx_rnn  # noqa: E402
from tf2onnx_rnn.probes import default_opset, supported_opsets  # noqa: E402
from tf2onnx_rnn.verify import verify_keras  # noqa: E402


def _model():
    x = keras.Input((None, 4), name="x")
    h = keras.layers.Masking()(x)
    h = keras.layers.Bidirectional(keras.layers.GRU(5, return_sequences=True))(h)
    h = keras.layers.LSTM(3, return_sequences=True, go_backwards=True)(h)
    y = keras.layers.SimpleRNN(2)(h)
    model = keras.Model(x, y)
    rng = np.random.default_rng(4)
    model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(w.dtype) for w in model.get_weights()])
    return model


def test_supported_range_starts_at_14_and_reaches_at_least_17():
    opsets = supported_opsets()
    assert opsets.start == 14 and opsets.stop - 1 >= 17


def test_the_default_opset_is_one_every_consumer_reads():
    """The default's recurrent ops are those of opset 14 (LSTM-14, GRU-14, RNN-14), which onnx2torch (with
    converters registered per since_version), tract and OpenVINO read (docs/downstream.md), and its other ops
    predate opset 19, from which on onnx2torch 1.5.15 lacks converters (Identity-19, Reshape-21, ...)."""
    opset = default_opset(None)
    assert opset < 19
    for op in helpers.RECURRENT_OPS:
        assert onnx.defs.get_schema(op, max_inclusive_version=opset).since_version == 14, op


@pytest.mark.parametrize("target", ["default", "onnxruntime"])
@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_oldest_and_newest_opsets_convert_to_native_nodes_and_match_keras(end, target):
    opsets = supported_opsets()
    opset = opsets.start if end == "oldest" else opsets.stop - 1
    model = _model()
    # the conftest runs the full checker
    model_proto = tf2onnx_rnn.convert_keras(model, opset=opset, target=None if target == "default" else target)
    assert [o.version for o in model_proto.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    ops = helpers.op_types(model_proto)
    native = ["GRU", "LSTM", "RNN"] if target == "default" else ["GRU", "LSTM"]
    assert sorted(op for op in ops if op in helpers.RECURRENT_OPS) == native
    assert "Loop" not in ops and ops.count("Scan") == (target == "onnxruntime")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 6, 4)).astype(np.float32)
    x[1, 3:] = 0.0  # post-padded
    x[2, :2] = 0.0  # pre-padded
    x[3] = 0.0  # empty
    result = verify_keras(model, model_proto, tolerance=1e-5, inputs=[x])
    assert result.passed, result.table()
