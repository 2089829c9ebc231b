"""float64 Softsign, Softplus, Elu, Selu and LeakyRelu convert to float64 ops onnxruntime runs, exact.

tf2onnx writes each as the ONNX op of its name, which onnxruntime implements for float32 only below
opset 18; from 18 it expands the op's ONNX function, whose Softplus overflows past 709 and is 0 below
-37, and whose Selu and LeakyRelu take their constants as float32 attributes (Selu 3e-8 off at every
positive value). A float64 model using one did not load
(``tf2onnx_rnn.handlers.double_activations`` computes each as TensorFlow's kernel does). Checked within
4 ulps of Keras on values where other forms go wrong: Softplus beyond both of TensorFlow's thresholds,
past exp's overflow and near 0; Elu and Selu at 1e-12 (where TensorFlow's ``exp(x) - 1`` is what Keras
gives) and at the float64 limits; in an activation layer, a Dense and a recurrent cell (a Scan of its
step in float64), for both Keras flavors and at opsets 15 and 18. float32 keeps the ONNX op.
"""
from __future__ import annotations

import numpy as np
import pytest

import helpers
import parity

# (Keras activation, the TF op it runs)
ACTIVATIONS = [("softsign", "Softsign"), ("softplus", "Softplus"), ("elu", "Elu"), ("selu", "Selu"),
               ("leaky_relu", "LeakyRelu")]
EDGES = np.array([0.0, -0.0, 1e-300, -1e-300, 1e-12, -1e-12, 1e-6, -1e-6, 0.3, -0.3, 1.0, -1.0, 20.0, -20.0,
                  34.0, -34.0, 34.1, -34.1, 36.0, -36.0, 40.0, -40.0, 700.0, -700.0, 710.0, -710.0, 1e300, -1e300])


def _layer(K, activation: str, dtype: str = "float64"):
    if activation != "leaky_relu":
        return K.layers.Activation(activation, dtype=dtype)
    if hasattr(K.layers.LeakyReLU(), "negative_slope"):  # Keras 3
        return K.layers.LeakyReLU(negative_slope=0.3, dtype=dtype)
    return K.layers.LeakyReLU(alpha=0.3, dtype=dtype)


def _activation_model(flavor: str, activation: str):
    K = parity.keras_module(flavor)
    x = K.Input((EDGES.size,), dtype="float64", name="x")
    return K.Model(x, _layer(K, activation)(x))


def _convert(model, opset: int):
    from tf2onnx_rnn import convert_keras

    return convert_keras(model, opset=opset)


def _assert_ulps(got: np.ndarray, want: np.ndarray, ulps: float = 4.0) -> None:
    assert got.dtype == np.float64
    assert np.array_equal(np.isfinite(got), np.isfinite(want)), (got, want)
    finite = np.isfinite(want)
    spacing = np.spacing(np.maximum(np.abs(want[finite]), np.finfo(np.float64).tiny))
    difference = np.abs(got[finite] - want[finite])
    # below float64's smallest normal number TensorFlow's CPU kernels flush to zero; onnxruntime does not
    error = np.where(difference < np.finfo(np.float64).tiny, 0.0, difference / spacing)
    assert error.max() <= ulps, f"{error.max():.1f} ulps at {want[finite][np.argmax(error)]!r}"


@pytest.mark.parametrize("opset", [15, 18])
@pytest.mark.parametrize("activation, op", ACTIVATIONS)
@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_float64_activation_is_exact_at_its_edges(flavor, activation, op, opset):
    model = _activation_model(flavor, activation)
    proto = _convert(model, opset)
    assert op not in helpers.op_types(proto)
    x = np.stack([EDGES, EDGES * 0.5])
    (got,) = helpers.ort_session(proto).run(None, {"x": x})
    _assert_ulps(got, np.asarray(model(x, training=False)))


@pytest.mark.parametrize("activation, op", ACTIVATIONS)
def test_float32_keeps_the_onnx_op(activation, op):
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((4,), name="x")
    model = K.Model(x, _layer(K, activation, "float32")(x))
    proto = _convert(model, 15)
    assert op in helpers.op_types(proto)
    values = np.array([[-2.0, -1e-3, 0.5, 3.0]], np.float32)
    (got,) = helpers.ort_session(proto).run(None, {"x": values})
    np.testing.assert_allclose(got, np.asarray(model(values, training=False)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("activation, _", ACTIVATIONS)
@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_float64_recurrent_and_dense_layers_load_and_match_keras(flavor, activation, _):
    """A float64 SimpleRNN with the activation (a Scan of its step: onnxruntime has no float64 RNN
    node), then a Dense with it: the model loads in onnxruntime and equals Keras in float64."""
    K = parity.keras_module(flavor)
    x = K.Input((None, 3), dtype="float64", name="x")
    if activation == "leaky_relu":  # no activation of that name in tf_keras's layers
        h = _layer(K, activation)(K.layers.SimpleRNN(4, return_sequences=True, dtype="float64")(x))
        y = _layer(K, activation)(K.layers.Dense(2, dtype="float64")(h))
    else:
        h = K.layers.SimpleRNN(4, activation=activation, return_sequences=True, dtype="float64")(x)
        y = K.layers.Dense(2, activation=activation, dtype="float64")(h)
    model = K.Model(x, y)
    rng = np.random.default_rng(7)
    model.set_weights([rng.standard_normal(w.shape) * 2.0 for w in model.get_weights()])
    proto = _convert(model, 15)
    session = helpers.ort_session(proto)
    for batch, time in ((1, 6), (5, 3), (3, 9)):
        values = rng.standard_normal((batch, time, 3)) * 3.0
        (got,) = session.run(None, {"x": values})
        np.testing.assert_allclose(got, np.asarray(model(values, training=False)), rtol=1e-12, atol=1e-14)
