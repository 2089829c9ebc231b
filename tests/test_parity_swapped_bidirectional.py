"""tf_keras's Bidirectional around a go_backwards=True layer swaps the two directions: the
"forward" half steps backward and its sequence is used in step order, while the "backward" half
steps forward and tf_keras reverses its output. It still becomes one bidirectional node.
(Keras 3 refuses go_backwards=True inside Bidirectional.)"""
from __future__ import annotations

import numpy as np
import pytest
import tf_keras

import helpers
import parity
import tf2onnx_rnn


def _rows(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[1, 4:] = 0.0  # post-padded
    x[2, :2] = 0.0  # pre-padded
    x[3, [1, 3]] = 0.0  # holed
    x[4] = 0.0  # empty
    return x


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("kind, merge_mode", [("LSTM", "concat"), ("GRU", "sum"), ("SimpleRNN", "mul")])
def test_swapped_directions_become_one_bidirectional_node(kind, merge_mode, masked):
    inputs = tf_keras.Input((None, 3), name="x")
    hidden = tf_keras.layers.Masking()(inputs) if masked else inputs
    layer = getattr(tf_keras.layers, kind)(4, go_backwards=True, return_sequences=True)
    model = tf_keras.Model(inputs, tf_keras.layers.Bidirectional(layer, merge_mode=merge_mode)(hidden))
    parity.randomize_weights(model, seed=3)
    model_proto = tf2onnx_rnn.convert_keras(model)

    native = helpers.nodes_of_types(model_proto, helpers.RECURRENT_OPS)
    assert len(native) == 1 and native[0].op_type == helpers.ONNX_OP[kind]
    assert helpers.direction_of(native[0]) == "bidirectional"
    assert not helpers.nodes_of_types(model_proto, helpers.LOOP_OPS)
    session = helpers.ort_session(model_proto)
    for steps in (6, 9):
        x = np.random.default_rng(steps).standard_normal((5, steps, 3)).astype(np.float32)
        x = _rows(x) if masked else x
        (actual,) = session.run(None, {"x": x})
        expected = np.asarray(model(x, training=False))
        assert float(np.max(np.abs(actual - expected))) <= 1e-5
