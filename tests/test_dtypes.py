"""Element types: a recurrent layer becomes a native node only in a type onnxruntime runs.

onnxruntime's LSTM, GRU and RNN kernels run float32 and float16, not float64 (LSTM and GRU fail at
run time, RNN at session creation). A float64 layer therefore stays tf2onnx's exact Loop, with a
reason that names the type; a float16 layer becomes a native float16 node. Either way the model
loads and runs, against Keras.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import helpers
import parity
import tf2onnx_rnn

_CONVERTED: dict = {}


def converted(flavor: str, dtype: str):
    """LSTM -> GRU -> SimpleRNN, every layer and the input in ``dtype``; built and converted once."""
    key = (flavor, dtype)
    if key not in _CONVERTED:
        K = parity.keras_module(flavor)
        x = K.Input((None, 3), name="x", dtype=dtype)
        h = K.layers.LSTM(4, return_sequences=True, dtype=dtype, name="lstm")(x)
        h = K.layers.GRU(4, return_sequences=True, dtype=dtype, name="gru")(h)
        model = K.Model(x, K.layers.SimpleRNN(2, dtype=dtype, name="rnn")(h))
        parity.randomize_weights(model, 64 if dtype == "float64" else 16)
        _CONVERTED[key] = (model, tf2onnx_rnn.convert_keras(model))
    return _CONVERTED[key]


def _run(model, model_proto, dtype: str):
    x = np.random.default_rng(2).standard_normal((3, 7, 3)).astype(dtype)
    (got,) = helpers.ort_session(model_proto).run(None, {"x": x})
    return got, np.asarray(model(x, training=False))


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_float64_layers_stay_exact_loops_with_a_reason(flavor):
    model, model_proto = converted(flavor, "float64")
    report = tf2onnx_rnn.report_of(model_proto)
    assert len(report.outcomes) == 3 and not report.fused, report.table()
    for row in report.outcomes:
        # a Scan of the loop's own step where its types are known, else the exact Loop; the reason either way
        assert row.became in ("Scan", "Loop") and "does not run float64" in row.reason, report.table()
    assert not helpers.nodes_of_types(model_proto, helpers.RECURRENT_OPS)
    got, want = _run(model, model_proto, "float64")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_float16_layers_become_native_float16_nodes(flavor):
    model, model_proto = converted(flavor, "float16")
    report = tf2onnx_rnn.report_of(model_proto)
    assert [row.became for row in report.outcomes] == ["LSTM", "GRU", "RNN"], report.table()
    assert not helpers.nodes_of_types(model_proto, helpers.LOOP_OPS)
    got, want = _run(model, model_proto, "float16")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=1e-2)


_POLICIES: dict = {}


def converted_with_policy(flavor: str, policy: str):
    """The same stack built under a Keras mixed-precision policy (float32 variables, the policy's
    compute type); the global policy is restored at once."""
    key = (flavor, policy)
    if key not in _POLICIES:
        K = parity.keras_module(flavor)
        previous = K.mixed_precision.global_policy()
        K.mixed_precision.set_global_policy(policy)
        try:
            x = K.Input((None, 3), name="x")
            h = K.layers.LSTM(4, return_sequences=True, name="lstm")(x)
            h = K.layers.GRU(4, return_sequences=True, name="gru")(h)
            model = K.Model(x, K.layers.SimpleRNN(2, name="rnn")(h))
        finally:
            K.mixed_precision.set_global_policy(previous)
        parity.randomize_weights(model, 17)
        _POLICIES[key] = (model, tf2onnx_rnn.convert_keras(model))
    return _POLICIES[key]


# Keras 3 computes its bfloat16 policy so that the graph holds no bfloat16 loop; Keras 2 (TensorFlow
# 2.15) and tf_keras keep bfloat16 tensors that no onnxruntime kernel takes, or that the onnx package
# next to TensorFlow 2.15 cannot even hold
BFLOAT16_FUSED = [f for f in parity.FLAVORS if f == "keras3"]
BFLOAT16_REFUSED = [f for f in parity.FLAVORS if f != "keras3"]


@pytest.mark.parametrize("flavor, policy", [(f, "mixed_float16") for f in parity.FLAVORS] +
                         [(f, "mixed_bfloat16") for f in BFLOAT16_FUSED])
def test_mixed_precision_policies_become_native_nodes_that_run(flavor, policy):
    """Both policies fuse every layer, and the model runs: mixed_float16 in float16; bfloat16 reaches
    the ONNX model as float16 too (tf2onnx's mapping), within bfloat16's own error of Keras."""
    model, model_proto = converted_with_policy(flavor, policy)
    report = tf2onnx_rnn.report_of(model_proto)
    assert [row.became for row in report.outcomes] == ["LSTM", "GRU", "RNN"], report.table()
    assert not helpers.nodes_of_types(model_proto, helpers.LOOP_OPS)
    x = np.random.default_rng(2).standard_normal((3, 7, 3)).astype(np.float32)
    (got,) = helpers.ort_session(model_proto).run(None, {"x": x})
    want = np.asarray(model(x, training=False)).astype(np.float32)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=1e-2 if policy == "mixed_float16" else 2e-2)


@pytest.mark.parametrize("flavor", BFLOAT16_REFUSED)
def test_a_bfloat16_loop_onnxruntime_cannot_load_is_a_clear_error_not_a_file(flavor):
    """tf_keras's (and Keras 2's) mixed_bfloat16 keeps bfloat16 tensors in the loop, which no
    onnxruntime kernel takes (nor the native nodes): the conversion stops with one line naming
    bfloat16 instead of writing a model that cannot load (on the oldest stack tf2onnx itself cannot
    hold the type: the same one line, not its traceback)."""
    with pytest.raises(tf2onnx_rnn.ConversionError, match="bfloat16") as raised:
        converted_with_policy(flavor, "mixed_bfloat16")
    assert "\n" not in str(raised.value).strip(), str(raised.value)


# -- sequences of integers or bools --------------------------------------------------------------
# Keras 3 takes a sequence of integers (or bools) and casts each step to the layer's type inside the
# loop (or in each unrolled step); tf_keras and Keras 2 refuse one (their cell multiplies the step as is)
NON_FLOAT_FLAVORS = [f for f in parity.FLAVORS if f == "keras3"]
NON_FLOAT_TYPES = ("int32", "int64", "uint8", "bool")
FORMS = ("loop", "unrolled")
UNROLLED_TIME = 5  # unroll=True needs a known number of steps
_NON_FLOAT: dict = {}


def converted_non_float(flavor: str, dtype: str, form: str):
    """LSTM, GRU, SimpleRNN and a Bidirectional LSTM side by side on one ``dtype`` input, each
    returning its sequence; built and converted once."""
    key = (flavor, dtype, form)
    if key not in _NON_FLOAT:
        K = parity.keras_module(flavor)
        unroll = form == "unrolled"
        x = K.Input((UNROLLED_TIME if unroll else None, 3), name="x", dtype=dtype)
        outputs = [K.layers.LSTM(4, return_sequences=True, unroll=unroll, name="lstm")(x),
                   K.layers.GRU(3, return_sequences=True, unroll=unroll, name="gru")(x),
                   K.layers.SimpleRNN(2, return_sequences=True, unroll=unroll, name="simple_rnn")(x),
                   K.layers.Bidirectional(K.layers.LSTM(2, return_sequences=True, unroll=unroll),
                                          name="bidirectional")(x)]
        model = K.Model(x, outputs)
        parity.randomize_weights(model, 23)
        _NON_FLOAT[key] = (model, tf2onnx_rnn.convert_keras(model))
    return _NON_FLOAT[key]


def non_float_steps(dtype: str, batch: int, time: int) -> np.ndarray:
    """Small integers (non-negative for uint8), or random bools, as ``dtype``."""
    rng = np.random.default_rng(batch * 10 + time)
    low = 0 if dtype in ("uint8", "bool") else -3
    return rng.integers(low, 2 if dtype == "bool" else 4, (batch, time, 3)).astype(dtype)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", NON_FLOAT_TYPES)
@pytest.mark.parametrize("flavor", NON_FLOAT_FLAVORS)
def test_a_sequence_of_integers_or_bools_becomes_native_nodes_over_its_cast(flavor, dtype, form):
    """Each step cast to the layer's type is the step for the matchers: every layer becomes its native
    node (the Bidirectional one node), which takes the sequence cast once before it; the model still
    takes the integer (or bool) input, and gives Keras's outputs at batch 1 and 3."""
    model, model_proto = converted_non_float(flavor, dtype, form)
    report = tf2onnx_rnn.report_of(model_proto)
    assert sorted(row.became for row in report.outcomes) == ["GRU", "LSTM", "LSTM", "LSTM", "RNN"], report.table()
    assert not helpers.nodes_of_types(model_proto, helpers.LOOP_OPS), report.table()
    ops = helpers.op_counts(model_proto)
    assert (ops["LSTM"], ops["GRU"], ops["RNN"], ops["MatMul"]) == (2, 1, 1, 0), dict(ops)
    (graph_input,) = model_proto.graph.input
    assert graph_input.type.tensor_type.elem_type == helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    session = helpers.ort_session(model_proto)
    for batch, time in ((1, UNROLLED_TIME), (3, UNROLLED_TIME)) if form == "unrolled" else ((1, 6), (3, 7)):
        x = non_float_steps(dtype, batch, time)
        expected = parity.keras_outputs(model, [x])
        actual = parity.run_onnx(session, ["x"], [x])
        problems, _ = parity.output_problems(f"{dtype} batch {batch}", [o.name for o in model_proto.graph.output],
                                             expected, actual, 1e-5)
        assert not problems, "\n".join(problems) + "\n" + report.table()
