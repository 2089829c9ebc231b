"""float16 conversion of converted models: onnxconverter-common's
``convert_float_to_float16(model, keep_io_types=True)``, the usual way to halve a model, must give a
model onnxruntime runs, within 1e-2 of Keras, for every kind, one direction and Bidirectional,
masked (a ``Masking`` layer; rows pre-padded, post-padded, holed and empty) and not, in both Keras
flavors. The mask arithmetic has no float Cast for it to mistype (Keras's own Masking included).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import helpers
import parity
import tf2onnx_rnn
from helpers import KINDS

float16 = pytest.importorskip("onnxconverter_common.float16")

FEATURES, UNITS, TIME = 3, 4, 7


def build(flavor: str, kind: str, bidirectional: bool, masked: bool):
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    h = K.layers.Masking(0.0, name="masking")(x) if masked else x
    layer = getattr(K.layers, kind)(UNITS, return_sequences=True, name="rnn")
    y = (K.layers.Bidirectional(layer, name="bi") if bidirectional else layer)(h)
    model = K.Model(x, y)
    parity.randomize_weights(model, zlib.crc32(f"fp16/{flavor}/{kind}/{bidirectional}/{masked}".encode()))
    return model


def batch(masked: bool) -> np.ndarray:
    x = np.random.default_rng(3).standard_normal((4, TIME, FEATURES)).astype(np.float32)
    if masked:
        x[0, :2] = 0.0  # pre-padded
        x[1, 4:] = 0.0  # post-padded
        x[2, 2:4] = 0.0  # holed
        x[3] = 0.0  # empty
    return x


@pytest.mark.parametrize("flavor, kind, bidirectional, masked", [
    pytest.param(f, k, b, m, id=f"{f}-{k}-{'bi' if b else 'uni'}-{'masked' if m else 'plain'}")
    for f in parity.FLAVORS for k in KINDS for b in (False, True) for m in (False, True)])
def test_float16_conversion_runs_and_matches(flavor, kind, bidirectional, masked):
    model = build(flavor, kind, bidirectional, masked)
    model_proto = tf2onnx_rnn.convert_keras(model)
    assert not helpers.nodes_of_types(model_proto, helpers.LOOP_OPS)
    halved = float16.convert_float_to_float16(model_proto, keep_io_types=True)
    x = batch(masked)
    (got,) = helpers.ort_session(halved).run(None, {"x": x})
    np.testing.assert_allclose(got, np.asarray(model(x, training=False)), rtol=0, atol=1e-2)
