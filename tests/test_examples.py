"""The bundled example SavedModel: it converts fully, and its script still regenerates it."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import helpers
import tf2onnx_rnn  # noqa: E402
from tf2onnx_rnn.verify import verify_saved_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "lstm_gru_savedmodel")
SCRIPT = os.path.join(ROOT, "examples", "make_example_model.py")


def _serve(path):
    return tf.saved_model.load(path).signatures["serve"]


def test_script_regenerates_an_equivalent_model(tmp_path):
    output = tmp_path / "regenerated"
    subprocess.run([sys.executable, SCRIPT, str(output)], check=True, capture_output=True)
    bundled, fresh = _serve(EXAMPLE), _serve(str(output))
    assert bundled.structured_input_signature == fresh.structured_input_signature
    x = tf.constant(np.random.default_rng(3).standard_normal((4, 13, 8)).astype(np.float32))
    (key,) = bundled(x).keys()
    np.testing.assert_allclose(bundled(x)[key].numpy(), fresh(x)[key].numpy(), rtol=0, atol=1e-6)


def test_bundled_example_converts_to_native_nodes():
    model_proto = tf2onnx_rnn.convert_saved_model(EXAMPLE)
    report = tf2onnx_rnn.report_of(model_proto)
    assert [(o.kind, o.became) for o in report.outcomes] == [("LSTM", "LSTM"), ("GRU", "GRU")]
    counts = helpers.op_counts(model_proto)
    assert counts["LSTM"] == 1 and counts["GRU"] == 1 and not counts["Loop"]
    result = verify_saved_model(EXAMPLE, model_proto, tolerance=1e-5)
    assert result.passed, result.table()
