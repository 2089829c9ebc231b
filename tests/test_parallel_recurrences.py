"""Recurrences computed in parallel: keras-lmu's ``LMUFeedforward`` and mingru-keras's ``MinGRU``,
and the op handlers (``tf2onnx_rnn/handlers.py``) their graphs need.

Neither layer is a recurrent loop. ``LMUFeedforward`` convolves its input with the LMU's impulse
response through an FFT: RFFT, a complex product, IRFFT. ``MinGRU`` runs a parallel (Blelloch) scan
over time with Keras 3's ``associative_scan``, whose ``tf.cond`` branches receive their axis as a
tensor. Stock tf2onnx refuses both: it has no IRFFT, its RFFT takes only a spectrum every consumer
of which is ComplexAbs, its GatherV2 and ConcatV2 want a constant axis, and its StridedSlice wants
the input's rank for an ellipsis (the scan's If output has none).

1. Both layers against Keras (``model(x, training=False)``), random weights, batch 3 unlike the
   time lengths: LMUFeedforward at a dynamic time length (opset 15: the FFTs as matrix products)
   and at a fixed one (opset 17: ONNX DFT, the impulse response's spectrum a complex constant);
   MinGRU at an even and an odd time length (Keras's scan traces only at a fixed one).
2. RFFT, IRFFT, the complex product, Real and Imag against TensorFlow on random signals: lengths
   even and odd, cropped and padded, float32 and float64, at opsets 15, 17 and 20 (tf2onnx 1.17
   writes at most opset 18: opset 20 is reached by adding its IR version to tf2onnx's table).
3. GatherV2 and ConcatV2 at an axis known only at run time and StridedSlice with an ellipsis on a
   tensor of unknown rank, against TensorFlow, exactly (one model, inputs of two ranks).
4. What stays tf2onnx's (an RFFT read only by ComplexAbs; every node the cases above do not pick)
   and what is refused.

Tolerances: the layers' outputs (at most 3 in size) are within 1e-5 relative of Keras above an
absolute floor of 1e-6, 8 float32 ulps at 1: near an output's zero a relative bound means nothing,
and TensorFlow's own float32 FFTs and products round at about 1e-7 of the outputs' scale (measured
here: errors up to 7e-7, of which 1.2e-7 beyond the relative bound). The FFT handlers compute in
float64; against TensorFlow they are within 1e-6 (float32) and 1e-12 (float64) of each output's
largest magnitude (measured: 3.3e-7 and 1e-13, TensorFlow's own rounding).
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest

import helpers
import parity
import tf2onnx_rnn
from tf2onnx_rnn.handlers import ensure_registered

RTOL, ATOL = 1e-5, 1e-6  # the layers against Keras (see the module docstring)
FEATURES = 5
BATCH = 3


def assert_matches_keras(model, session, x):
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    want = np.asarray(model(x, training=False))
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"input {x.shape}")


def random_inputs(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


# -- 1. the layers against Keras ---------------------------------------------------------------

def lmu_model(time, hidden_cell, seed):
    keras_lmu = pytest.importorskip("keras_lmu")
    import keras

    x = keras.Input((time, FEATURES), name="x")
    with warnings.catch_warnings():  # at a dynamic time: "Approximating unknown impulse length"
        warnings.simplefilter("ignore", UserWarning)
        layer = keras_lmu.LMUFeedforward(memory_d=2, order=6, theta=4, hidden_cell=hidden_cell, use_bias=True,
                                         return_sequences=True, name="lmu")
        model = keras.Model(x, layer(x))
    parity.randomize_weights(model, seed)
    return model


@pytest.fixture(scope="module")
def lmu_dynamic():
    """Dynamic time, no hidden cell, the default opset (15): the FFTs become matrix products."""
    model = lmu_model(None, None, seed=11)
    return model, tf2onnx_rnn.convert_keras(model)


@pytest.fixture(scope="module")
def lmu_fixed():
    """Fixed time 10 and a SimpleRNN hidden cell, opset 17: ONNX DFT; the impulse response's
    spectrum is a complex constant in TensorFlow's graph."""
    import keras

    model = lmu_model(10, keras.layers.SimpleRNNCell(8), seed=12)
    return model, tf2onnx_rnn.convert_keras(model, opset=17)


def test_lmu_feedforward_at_a_dynamic_time_length_matches_keras(lmu_dynamic):
    """One model at time lengths 7, 9 and 12 and past the impulse response's 5 * theta = 20 steps
    (Keras convolves with the truncated response there too)."""
    model, proto = lmu_dynamic
    ops = helpers.op_counts(proto)
    assert ops["MatMul"] >= 2 and not ops["DFT"], ops
    session = helpers.ort_session(proto)
    for seed, time in enumerate((7, 9, 12, 23)):
        (x,) = random_inputs(seed, (BATCH, time, FEATURES))
        assert_matches_keras(model, session, x)


def test_lmu_feedforward_at_a_fixed_time_length_with_a_hidden_cell_matches_keras(lmu_fixed):
    """Batch 3 and 1 on one model: the convolution through DFT, the hidden SimpleRNN a native node."""
    model, proto = lmu_fixed
    ops = helpers.op_counts(proto)
    assert ops["DFT"] == 2 and not ops["Loop"], ops  # RFFT and IRFFT; the hidden SimpleRNN a native RNN
    session = helpers.ort_session(proto)
    for seed, batch in enumerate((BATCH, 1)):
        (x,) = random_inputs(seed, (batch, 10, FEATURES))
        assert_matches_keras(model, session, x)


MINGRU_UNITS = 12


def mingru_model(time):
    mingru_keras = pytest.importorskip("mingru_keras")
    import keras

    x = keras.Input((time, FEATURES), name="x")
    model = keras.Model(x, mingru_keras.MinGRU(MINGRU_UNITS, name="mingru")(x))
    parity.randomize_weights(model, 20 + time)
    return model


@pytest.fixture(scope="module", params=[12, 9], ids=["time12", "time9"])
def mingru(request):
    """MinGRU over a fixed time length: 12 is even (the scan's last level slices the If's output
    with an ellipsis), 9 odd."""
    model = mingru_model(request.param)
    return model, tf2onnx_rnn.convert_keras(model)


def test_mingru_matches_keras(mingru):
    model, proto = mingru
    assert helpers.op_counts(proto)["If"], "the scan's tf.cond branches were expected as If nodes"
    session = helpers.ort_session(proto)
    time = model.inputs[0].shape[1]
    for seed, batch in enumerate((BATCH, 1)):
        (x,) = random_inputs(seed, (batch, time, FEATURES))
        assert_matches_keras(model, session, x)


def test_an_output_traced_without_a_rank_takes_the_keras_models_shape(mingru):
    """TensorFlow's trace gives MinGRU's output no rank (Keras reshapes it to a shape computed from a
    tensor axis); the ONNX graph output takes the Keras model's declared shape, so the full checker passes."""
    model, proto = mingru
    import onnx

    onnx.checker.check_model(proto, full_check=True)
    (output,) = proto.graph.output
    dims = [d.dim_value or None for d in output.type.tensor_type.shape.dim]
    assert dims == [None] + [int(d) for d in model.outputs[0].shape[1:]], dims


@pytest.mark.parametrize("layer, target", [("mingru", "iree"), ("mingru", "tvm"), ("lmu", "iree"), ("lmu", "tvm")])
def test_a_targets_form_holds_neither_if_nor_dft_and_equals_keras_in_its_runtime(layer, target, tmp_path):
    """IREE 3.13 and TVM 0.27 fail on MinGRU's If nodes (their outputs' rank unknown, shapes computed in
    them) and compile no DFT: at fixed shapes the Ifs the shapes decide become the branches they take, and
    the FFTs of an LMUFeedforward at opset 17 are matrix products. Exact in onnxruntime, and in the runtime
    where ``TF2ONNX_RNN_<RUNTIME>_PYTHON`` names one that has it."""
    import tensorflow as tf

    from tf2onnx_rnn.rewriters.obstacles import obstacles
    from tf2onnx_rnn.rewriters.runtimes import BY_KEY
    from tf2onnx_rnn.runtime_check import RuntimeSession, python_for

    model = mingru_model(12) if layer == "mingru" else lmu_model(10, None, seed=13)
    (x,) = random_inputs(5, (1 if target == "ncnn" else BATCH, 12 if layer == "mingru" else 10, FEATURES))
    proto = tf2onnx_rnn.convert_keras(model, input_signature=[tf.TensorSpec(x.shape, tf.float32, name="x")],
                                      opset=17, target=target)
    ops = helpers.op_counts(proto)
    assert not ops["If"] and not ops["DFT"] and not obstacles(proto, BY_KEY[target]), ops
    assert_matches_keras(model, helpers.ort_session(proto), x)
    python = python_for(BY_KEY[target])
    if python is None:
        pytest.skip(f"{BY_KEY[target].name} is not installed (TF2ONNX_RNN_{target.upper()}_PYTHON)")
    (got,) = RuntimeSession(proto, BY_KEY[target], python, str(tmp_path)).run(None, {"x": x})
    np.testing.assert_allclose(got, np.asarray(model(x, training=False)), rtol=1e-4, atol=1e-5)


# -- 2. the FFT handlers against TensorFlow -------------------------------------------------------

SIGNAL = 20  # the signal's length; fft lengths below it crop it, above it pad it
LENGTHS = ((1, 1), (2, 3), (5, 4), (7, 7), (8, 8), (12, 9), (13, 14), (20, 20), (31, 17), (64, 33), (40, 80))
FFT_LIMITS = {"float32": 1e-6, "float64": 1e-12}  # x the output's largest magnitude


@pytest.fixture(scope="module")
def fft_function():
    """Per type: ``rfft(x, n) * c`` (c complex: it makes the 0th and middle entries complex, whose
    imaginary parts IRFFT ignores) as its real and imaginary parts and its shape, ``irfft`` of that
    at length m, and the same at constant lengths 12 and 11."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None, SIGNAL], tf.float32, name="x32"),
                                  tf.TensorSpec([None, None, SIGNAL], tf.float64, name="x64"),
                                  tf.TensorSpec([1], tf.int32, name="n"), tf.TensorSpec([1], tf.int32, name="m")])
    def ffts(x32, x64, n, m):
        outputs = {}
        for dtype, x, complex_type in (("float32", x32, tf.complex64), ("float64", x64, tf.complex128)):
            c = tf.constant(0.75 - 1.25j, complex_type)
            spectrum = tf.signal.rfft(x, fft_length=n) * c
            fixed = tf.signal.rfft(x, fft_length=[12]) * c
            outputs.update({f"real_{dtype}": tf.math.real(spectrum), f"imag_{dtype}": tf.math.imag(spectrum),
                            f"shape_{dtype}": tf.shape(spectrum),
                            f"signal_{dtype}": tf.signal.irfft(spectrum, fft_length=m),
                            f"fixed_{dtype}": tf.signal.irfft(fixed, fft_length=[11])})
        return outputs

    return ffts


def convert_function(function, opset, monkeypatch=None):
    import tf2onnx

    ensure_registered()
    if opset > 18:  # tf2onnx 1.17 knows IR versions up to opset 18; 20's is 9
        from tf2onnx import constants

        monkeypatch.setitem(constants.OPSET_TO_IR_VERSION, 19, 9)
        monkeypatch.setitem(constants.OPSET_TO_IR_VERSION, opset, 9)
    proto, _ = tf2onnx.convert.from_function(function, input_signature=function.input_signature, opset=opset)
    left = sorted({op for op in helpers.op_types(proto)} & {"RFFT", "IRFFT", "Real", "Imag", "Complex"})
    assert not left, f"TF ops left: {left}"
    return proto


@pytest.mark.parametrize("opset", [15, 17, 20])
def test_fft_handlers_match_tensorflow(fft_function, opset, monkeypatch):
    """Lengths 1 to 80, even and odd, the signal cropped (n < 20) and padded (n > 20), the
    spectrum cropped (m < 2n) and padded (m > 2n), one converted model; the form is the opset's
    (15: MatMul, 17 and 20: DFT)."""
    proto = convert_function(fft_function, opset, monkeypatch)
    assert bool(helpers.op_counts(proto)["DFT"]) == (opset >= 17), helpers.op_counts(proto)
    session = helpers.ort_session(proto)
    names = [o.name for o in session.get_outputs()]
    x = np.random.default_rng(opset).standard_normal((BATCH, 2, SIGNAL))
    for n, m in LENGTHS:
        feeds = {"x32": x.astype(np.float32), "x64": x, "n": np.array([n], np.int32), "m": np.array([m], np.int32)}
        expected = {key: value.numpy() for key, value in fft_function(**feeds).items()}
        actual = dict(zip(names, session.run(None, feeds)))
        assert sorted(actual) == sorted(expected)
        for key, want in expected.items():
            got = actual[key]
            assert got.dtype == want.dtype and got.shape == want.shape, (key, n, m, got.shape, want.shape)
            if key.startswith("shape"):
                np.testing.assert_array_equal(got, want, err_msg=f"{key} at n={n}")
                continue
            error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
            assert error <= FFT_LIMITS[key.split("_")[1]], f"{key} at n={n}, m={m}: {error:.3g} of the largest"


def test_fft_handlers_for_a_runtime_without_float64_compute_in_float32(fft_function):
    """Where the target's runtime has no float64 (ncnn: pnnx leaves a Cast to it as an op ncnn does not load)
    nor DFT, the transforms are float32 matrix products (a float64 signal's too: cast back to float64 at the
    end), and the float32 outputs within 2e-6 of the largest magnitude of TensorFlow's."""
    from tf2onnx_rnn import handlers

    with handlers.lacking({"float64", "DFT"}):
        proto = convert_function(fft_function, 17)
    doubles = {"x64"} | {n.output[0] for n in helpers.nodes_of_types(proto, ["Cast"])
                         if helpers.attribute(n, "to") == onnx.TensorProto.DOUBLE}
    products = helpers.nodes_of_types(proto, ["MatMul"])
    assert products and not [n.name for n in products if set(n.input) & doubles], doubles
    assert not helpers.op_counts(proto)["DFT"]
    session = helpers.ort_session(proto)
    names = [o.name for o in session.get_outputs()]
    x = np.random.default_rng(3).standard_normal((BATCH, 2, SIGNAL))
    for n, m in LENGTHS:
        feeds = {"x32": x.astype(np.float32), "x64": x, "n": np.array([n], np.int32), "m": np.array([m], np.int32)}
        expected = {key: value.numpy() for key, value in fft_function(**feeds).items()}
        actual = dict(zip(names, session.run(None, feeds)))
        for key in [k for k in expected if k.endswith("float32") and not k.startswith("shape")]:
            error = np.abs(actual[key].astype(np.float64) - expected[key]).max() / np.abs(expected[key]).max()
            assert error <= 2e-6, f"{key} at n={n}, m={m}: {error:.3g} of the largest"


# -- 3. axes known at run time, tensors of unknown rank ------------------------------------------

@pytest.fixture(scope="module")
def axis_function():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="flat"),
                                  tf.TensorSpec([None], tf.int32, name="dims"),
                                  tf.TensorSpec([], tf.int32, name="axis"),
                                  tf.TensorSpec([None], tf.int32, name="indices")])
    def by_axis(flat, dims, axis, indices):
        x = tf.reshape(flat, dims)  # of a rank neither TensorFlow nor tf2onnx knows
        assert x.shape.rank is None
        picked = tf.gather(x, indices, axis=axis)
        return {"gather": picked, "concat": tf.concat([x, picked, x], axis=axis),
                "every_other": x[..., 1::2, :], "reversed_last": x[1:, ..., ::-1], "last": x[..., -1],
                "first_of_first": x[0, ..., 3:0:-2, 1], "mixed": x[..., 2:, -2]}

    return by_axis


def test_runtime_axes_and_unknown_rank_slices_match_tensorflow(axis_function):
    """One converted model: GatherV2 and ConcatV2 at axes 0, 1, -1, -2 of a rank-3 and a rank-4
    input, and StridedSlice with an ellipsis (before, between and after the other specs; strides
    2 and -1 and -2; shrinking at either end), all exactly as TensorFlow."""
    proto = convert_function(axis_function, 15)
    session = helpers.ort_session(proto)
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(5)
    for shape in ((4, 5, 6), (3, 4, 5, 6)):
        x = rng.standard_normal(shape).astype(np.float32)
        for axis in (0, 1, -1, -2):
            indices = np.array([2, 0, 2, 1], np.int32)
            feeds = {"flat": x.ravel(), "dims": np.array(shape, np.int32), "axis": np.array(axis, np.int32),
                     "indices": indices}
            expected = {key: value.numpy() for key, value in axis_function(**feeds).items()}
            actual = dict(zip(names, session.run(None, feeds)))
            for key, want in expected.items():
                np.testing.assert_array_equal(actual[key], want, err_msg=f"{key}, shape {shape}, axis {axis}")


# -- 4. what stays tf2onnx's, what is refused --------------------------------------------------

def test_an_rfft_read_only_by_complex_abs_stays_tf2onnx_conversion():
    """A magnitude spectrum (every consumer ComplexAbs, a constant length) is tf2onnx's own form."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([3, 16], tf.float32, name="x")])
    def magnitude(x):
        return {"magnitude": tf.abs(tf.signal.rfft(x, fft_length=[16]))}

    proto = convert_function(magnitude, 15)
    assert not helpers.op_counts(proto)["Range"], "this package's matrix form was used, not tf2onnx's"
    (x,) = random_inputs(3, (3, 16))
    (got,) = helpers.ort_session(proto).run(None, {"x": x})
    np.testing.assert_allclose(got, magnitude(x)["magnitude"].numpy(), rtol=1e-5, atol=1e-5)


def test_a_spectrum_reaching_an_op_without_a_complex_form_is_refused(caplog):
    """``conj`` has no complex form here: the RFFT is refused in one line naming the op (handing
    the spectrum's pair layout on as if it were complex would be silently wrong), and so is the
    IRFFT of the unconverted result; tf2onnx leaves both in the graph and logs why."""
    import tensorflow as tf
    import tf2onnx

    @tf.function(input_signature=[tf.TensorSpec([3, 16], tf.float32, name="x")])
    def conjugated(x):
        return {"y": tf.signal.irfft(tf.math.conj(tf.signal.rfft(x, fft_length=[16])), fft_length=[16])}

    ensure_registered()
    with caplog.at_level(logging.ERROR, logger="tf2onnx"):
        proto, _ = tf2onnx.convert.from_function(conjugated, input_signature=conjugated.input_signature, opset=17)
    assert {"RFFT", "IRFFT"} <= set(helpers.op_types(proto))
    assert "RFFT rfft: its complex result reaches Conj Conj, which has no complex form here" in caplog.text
    assert "IRFFT irfft: complex input Conj:0 comes from Conj" in caplog.text


def test_the_handlers_are_registered_in_front_of_tf2onnx():
    """IRFFT, Real and Imag are new; RFFT, Mul, ExpandDims, Pad, Shape, GatherV2, ConcatV2,
    StridedSlice and the float64 activations keep tf2onnx's handler for every node their own case does
    not take."""
    from tf2onnx import handler

    registered = ensure_registered()
    activations = ("Softsign", "Softplus", "Elu", "Selu", "LeakyRelu")
    assert all(registered[op] for op in ("IRFFT", "Real", "Imag", "RFFT", "Mul", "ExpandDims", "Pad", "Shape",
                                         "GatherV2", "ConcatV2", "StridedSlice") + activations), registered
    mapping = handler.tf_op.create_mapping(17, [])
    for op in ("RFFT", "Mul", "GatherV2", "ConcatV2", "StridedSlice") + activations:
        ours = mapping[op][0]
        assert ours.__module__ == "tf2onnx_rnn.handlers", op
        assert ours.theirs.__module__.startswith("tf2onnx.onnx_opset"), (op, ours.theirs)
    assert mapping["AddV2"][0].__module__.startswith("tf2onnx.onnx_opset"), "an op shared with Mul was wrapped"
