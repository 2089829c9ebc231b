"""TFLite files made from Keras models, converted with :func:`tf2onnx_rnn.convert_tflite`.

Each model is built in both Keras flavors with random weights and biases and exported with
``tf.lite.TFLiteConverter.from_keras_model``: Keras 3 layers become TFLite ``WHILE`` loops, a
tf_keras LSTM becomes the fused ``UNIDIRECTIONAL_SEQUENCE_LSTM`` op (a Bidirectional one two of
them), other tf_keras layers ``WHILE`` loops. Every model is exported with a fixed batch of 1 and
of 5 (the converter needs a fixed batch) and some with a dynamic time axis as well. Its conversion
has no Loop or Scan, every report row is fused, and onnxruntime's outputs equal the TFLite
interpreter's and Keras's ``model(x, training=False)`` (1e-5); masked models get batches mixing
full, post-padded, pre-padded, holed and empty rows.
"""
from __future__ import annotations

import functools
import os
import tempfile
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import onnx
import pytest

import helpers
import parity
from tf2onnx_rnn import ConversionError, convert_tflite, report_of

UNITS, FEATURES, TIME = 4, 3, 5
TOLERANCE = 1e-5
BATCHES = (1, 5)
_DIR = tempfile.mkdtemp(prefix="tflite_models_")


def interpreter(path: str):
    """The TFLite interpreter: LiteRT's where installed, else TensorFlow's."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Interpreter(model_path=path)


def run_tflite(path: str, x: np.ndarray) -> dict:
    """Output name -> value, the interpreter's states reset (each call starts from zeros)."""
    runner = interpreter(path)
    (detail,) = runner.get_input_details()
    if list(detail["shape"]) != list(x.shape):
        runner.resize_tensor_input(detail["index"], list(x.shape), strict=True)
    runner.allocate_tensors()
    runner.reset_all_variables()
    runner.set_tensor(detail["index"], x)
    runner.invoke()
    return {d["name"]: runner.get_tensor(d["index"]) for d in runner.get_output_details()}


# -- the models ---------------------------------------------------------------------------------
def _layers(K, name: str):
    """The layers of each model, applied to the input tensor."""
    L = K.layers
    return {
        "lstm": lambda x: L.LSTM(UNITS, return_sequences=True)(x),
        "gru": lambda x: L.GRU(UNITS, return_sequences=True)(x),
        "gru_reset_before": lambda x: L.GRU(UNITS, reset_after=False, return_sequences=True)(x),
        "simple_rnn": lambda x: L.SimpleRNN(UNITS, return_sequences=True)(x),
        "lstm_backwards": lambda x: L.LSTM(UNITS, go_backwards=True, return_sequences=True)(x),
        "lstm_last": lambda x: L.LSTM(UNITS)(x),
        "bidirectional_lstm": lambda x: L.Bidirectional(L.LSTM(UNITS, return_sequences=True))(x),
        "bidirectional_gru": lambda x: L.Bidirectional(L.GRU(UNITS, return_sequences=True))(x),
        "stack": lambda x: L.LSTM(UNITS)(L.LSTM(UNITS, return_sequences=True)(x)),
        "stack_lstm_gru": lambda x: L.GRU(UNITS)(L.LSTM(UNITS, return_sequences=True)(x)),
        "lstm_states": lambda x: list(L.LSTM(UNITS, return_sequences=True, return_state=True)(x)),
        "masked_lstm": lambda x: L.LSTM(UNITS, return_sequences=True)(L.Masking(0.0)(x)),
        "masked_gru": lambda x: L.GRU(UNITS)(L.Masking(0.0)(x)),
    }[name]


MODELS = ("lstm", "gru", "gru_reset_before", "simple_rnn", "lstm_backwards", "lstm_last", "bidirectional_lstm",
          "bidirectional_gru", "stack", "stack_lstm_gru", "lstm_states", "masked_lstm", "masked_gru")
# the TFLite converter gives a tf_keras LSTM's state variable to the GRU above it as its zero initial
# state, so the file differs from Keras (test_a_shared_state_variable_is_read_as_the_interpreter_does)
# (TensorFlow 2.15's own Keras 2 exports as tf_keras does)
KERAS2 = tuple(flavor for flavor in parity.FLAVORS if flavor != "keras3")
CASES = [(flavor, name) for flavor in parity.FLAVORS for name in MODELS
         if not (flavor in KERAS2 and name == "stack_lstm_gru")]
DYNAMIC_TIME = ("lstm", "gru", "bidirectional_lstm", "masked_lstm")


@dataclass(frozen=True)
class Exported:
    model: object
    path: str


@functools.lru_cache(maxsize=None)
def exported(flavor: str, name: str, batch: int, time) -> Exported:
    """The Keras model and its TFLite file (``time`` None: a dynamic time axis), made once per process."""

    K = parity.keras_module(flavor)
    x = K.Input((time, FEATURES), batch_size=batch, name="x")
    model = K.Model(x, _layers(K, name)(x))
    parity.randomize_weights(model, zlib.crc32(f"{flavor}/{name}".encode()))
    content = helpers.keras_tflite(model)
    path = os.path.join(_DIR, f"{flavor}_{name}_b{batch}_t{time}.tflite")
    with open(path, "wb") as stream:
        stream.write(content)
    return Exported(model, path)


def inputs_for(name: str, batch: int, time: int, seed: int) -> np.ndarray:
    """Random inputs; for a masked model, rows that are full, post-padded, pre-padded, holed and empty
    (with a batch of one, a holed row)."""
    x = np.random.default_rng(seed).standard_normal((batch, time, FEATURES)).astype(np.float32)
    if name.startswith("masked"):
        patterns = [slice(0, 0), slice(time - 2, time), slice(0, 2), slice(time // 2, time // 2 + 1),
                    slice(0, time)] if batch > 1 else [slice(1, 2)]
        for row in range(batch):
            x[row, patterns[row % len(patterns)]] = 0.0
    return x


def keras_outputs(model, x: np.ndarray) -> list:
    return parity.keras_outputs(model, [x])


SHARED_NOTE = "reads the state this layer leaves"


def check_converted(flavor: str, name: str, batch: int, time, **options):
    """Convert, check no loop is left, and compare with the interpreter and Keras (from which the
    file differs where its converter shared a state variable, which the report says); the report."""
    built = exported(flavor, name, batch, time)
    proto = convert_tflite(built.path, **options)
    assert not helpers.nodes_of_types(proto, helpers.LOOP_OPS), helpers.op_counts(proto)
    report = report_of(proto)
    assert report.outcomes and all(o.fused for o in report.outcomes), report.table()
    like_keras = not any(SHARED_NOTE in o.activations for o in report.outcomes)
    session = helpers.ort_session(proto)
    (onnx_input,) = session.get_inputs()
    for round_, steps in enumerate((TIME,) if time else (TIME, 2, 9)):
        x = inputs_for(name, batch, steps, seed=round_)
        onnx_outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {onnx_input.name: x})))
        tflite_outputs = run_tflite(built.path, x)
        expected = keras_outputs(built.model, x)
        assert set(onnx_outputs) == set(tflite_outputs)
        for output, value in onnx_outputs.items():
            np.testing.assert_allclose(value, tflite_outputs[output], atol=TOLERANCE, rtol=0,
                                       err_msg=f"{output} vs the TFLite interpreter, {steps} steps")
            keras_index = int(output.rsplit(":", 1)[1])  # the file's outputs are named after Keras's order
            if like_keras:
                np.testing.assert_allclose(value, expected[keras_index], atol=TOLERANCE, rtol=0,
                                           err_msg=f"{output} vs Keras, {steps} steps")
            else:
                assert np.max(np.abs(value - expected[keras_index])) > 1e-3
    return report


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("flavor, name", CASES)
def test_fixed_shapes_fuse_exactly(flavor, name, batch):
    check_converted(flavor, name, batch, TIME)


@pytest.mark.parametrize("name", DYNAMIC_TIME)
@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_dynamic_time_fuses_exactly(flavor, name):
    # a tf_keras LSTM's fused op clips its cell state at 10, which can act over a dynamic number of
    # steps: dropped here, exact since |c| grows by at most one a step (9 steps at most)
    check_converted(flavor, name, 2, None, drop_cell_clip=True)


@pytest.mark.parametrize("flavor", KERAS2)
@pytest.mark.parametrize("batch", BATCHES)
def test_a_shared_state_variable_is_read_as_the_interpreter_does(flavor, batch):
    """tf_keras LSTM -> GRU: the TFLite converter merges the GRU's zero initial state with the LSTM's
    state variable, which the LSTM op leaves holding its final state. The conversion computes what
    the interpreter does (not what Keras does) and its report says so. (TensorFlow 2.15's converter
    shares it in some exports only: where it does not, the file and the conversion equal Keras.)"""
    report = check_converted(flavor, "stack_lstm_gru", batch, TIME)
    if parity.KERAS3:  # the newest stack: always shared
        assert any(SHARED_NOTE in o.activations for o in report.outcomes), report.table()


def test_the_export_paths_differ_by_flavor():
    """What the tests above cover: Keras 3 layers as WHILE loops, a tf_keras LSTM as the fused op."""
    from tf2onnx_rnn.sources.tflite import read_layout

    keras3 = read_layout(exported(parity.FLAVORS[0], "bidirectional_lstm", 1, TIME).path)
    tf_keras = read_layout(exported("tf_keras", "bidirectional_lstm", 1, TIME).path)
    if parity.KERAS3:
        assert len(keras3.loops) == 2 and not keras3.fused_ops
    assert len(tf_keras.fused_ops) == 2 and not tf_keras.loops


# -- the fused LSTM's cell clip ---------------------------------------------------------------
def test_cell_clip_is_refused_where_it_can_act_and_dropped_on_request():
    dynamic = exported("tf_keras", "lstm", 2, None)
    with pytest.raises(ConversionError, match=r"cell_clip.*drop_cell_clip=True \(--drop-cell-clip\)"):
        convert_tflite(dynamic.path)
    fixed = exported("tf_keras", "lstm", 1, TIME)  # 5 steps: |c| <= 5 < 10, the clip never acts
    assert helpers.nodes_of_types(convert_tflite(fixed.path), ["LSTM"])


def test_a_clip_that_acts_makes_the_file_differ_from_keras_and_the_conversion_follows_keras():
    """A cell state driven past 10: the TFLite file clips it, Keras does not; converted with the clip
    dropped, the model equals Keras (the report says the clip was dropped)."""
    import tf_keras as K

    steps = 36
    x_in = K.Input((steps, 1), batch_size=1)
    layer = K.layers.LSTM(1, return_sequences=True)
    model = K.Model(x_in, layer(x_in))
    # i, f, o saturated open; the candidate follows the input's sign: c climbs 20 steps, falls 16
    kernel = np.array([[1e-3, 1e-3, 50.0, 1e-3]], np.float32)  # no zero weight: the converter shares zeros
    bias = np.array([50.0, 50.0, 0.0, 50.0], np.float32)
    layer.set_weights([kernel, np.full((1, 4), 1e-3, np.float32), bias])
    path = os.path.join(_DIR, "clip_acts.tflite")
    with open(path, "wb") as stream:
        stream.write(helpers.keras_tflite(model))
    x = np.concatenate([np.ones(20), -np.ones(16)]).astype(np.float32).reshape(1, steps, 1)
    with pytest.raises(ConversionError, match="over 36 steps the clip can act"):
        convert_tflite(path)
    proto = convert_tflite(path, drop_cell_clip=True)
    (onnx_out,) = helpers.ort_session(proto).run(None, {proto.graph.input[0].name: x})
    (tflite_out,) = run_tflite(path, x).values()
    keras_out = np.asarray(model(x, training=False))
    assert np.max(np.abs(tflite_out - keras_out)) > 0.5  # the file clips
    np.testing.assert_allclose(onnx_out, keras_out, atol=TOLERANCE, rtol=0)


# -- quantized files ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def quantized(flavor: str, kind: str, how: str) -> Exported:
    """A 16-unit layer over 64 features (big enough for the converter to quantize its weights),
    quantized ``how``: float16 weights, dynamic range (int8 weights, inputs quantized at run time),
    or full integer."""
    import tensorflow as tf

    K = parity.keras_module(flavor)
    x = K.Input((TIME, 64), batch_size=2, name="x")
    model = K.Model(x, getattr(K.layers, kind)(16, return_sequences=True)(x))
    parity.randomize_weights(model, zlib.crc32(f"{flavor}/{kind}/{how}".encode()))

    def configure(converter) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if how == "float16":
            converter.target_spec.supported_types = [tf.float16]
        elif how == "integer":
            rng = np.random.default_rng(0)
            converter.representative_dataset = lambda: ([rng.standard_normal((2, TIME, 64)).astype(np.float32)]
                                                        for _ in range(20))

    path = os.path.join(_DIR, f"{flavor}_{kind}_{how}.tflite")
    with open(path, "wb") as stream:
        stream.write(helpers.keras_tflite(model, configure))
    return Exported(model, path)


def tf_version() -> tuple:
    import tensorflow as tf

    return tuple(int(part) for part in tf.__version__.split(".")[:2])


def _max_error(path: str, proto) -> float:
    x = np.random.default_rng(3).standard_normal((2, TIME, 64)).astype(np.float32)
    session = helpers.ort_session(proto)
    onnx_outputs = session.run(None, {session.get_inputs()[0].name: x})
    return max(float(np.max(np.abs(a - b))) for a, b in zip(onnx_outputs, run_tflite(path, x).values()))


@pytest.mark.parametrize("flavor, kind", [(parity.FLAVORS[0], "GRU"), ("tf_keras", "LSTM")])
def test_float16_weights_fuse_exactly(flavor, kind):
    if kind == "LSTM" and tf_version() < (2, 16):
        pytest.skip("TensorFlow 2.15's TFLite converter exhausts memory exporting a float16 tf_keras LSTM")
    built = quantized(flavor, kind, "float16")
    proto = convert_tflite(built.path)
    assert not helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    assert _max_error(built.path, proto) <= TOLERANCE


@parity.only_keras3
def test_dynamic_range_layers_are_refused_unless_computed_in_float_on_request():
    built = quantized("keras3", "GRU", "dynamic")
    # tf2onnx's own Loop for it computes in float too (about 0.04 off the interpreter): refused in one line
    with pytest.raises(ConversionError, match=r"quantizes its inputs at run time.*dequantize=True \(--dequantize\)"):
        convert_tflite(built.path)
    fused = convert_tflite(built.path, dequantize=True)
    (row,) = report_of(fused).outcomes
    assert row.fused and "without the TFLite kernel's run-time quantization" in row.activations
    assert not helpers.nodes_of_types(fused, helpers.LOOP_OPS)
    assert _max_error(built.path, fused) < 0.1  # the inputs' quantization error, said in the report


def test_integer_fused_lstm_is_refused_unless_computed_in_float_on_request():
    built = quantized("tf_keras", "LSTM", "integer")
    with pytest.raises(ConversionError, match=r"quantized to integers.*dequantize=True \(--dequantize\)"):
        convert_tflite(built.path)
    proto = convert_tflite(built.path, dequantize=True)
    (row,) = report_of(proto).outcomes
    assert row.fused and "dequantized as stored" in row.activations
    assert _max_error(built.path, proto) < 0.1  # the integer kernel's error, said in the report


@pytest.mark.parametrize("flavor, kind, how", [(parity.FLAVORS[0], "GRU", "dynamic"), ("tf_keras", "LSTM", "integer"),
                                               (parity.FLAVORS[0], "LSTM", "dynamic")])
def test_a_quantized_file_keeps_its_int8_weights_with_quantize(flavor, kind, how):
    """``quantize="weights"`` reads a quantized file's int8 weights as stored and keeps them in int8, on the file's
    own scales (one per row, or one per gate's tensor): the weights the model computes are the float reading's,
    exactly; weights the file kept float (a small recurrent kernel) are quantized within the budget; the model is
    within the interpreter's own quantization of it, and every layer it calls int8 is."""
    from test_quantization import check_claims, int8_fed

    built = quantized(flavor, kind, how)
    try:  # a quantized file is refused without dequantize (test_..._refused_unless_computed_in_float_on_request)
        convert_tflite(built.path)
        pytest.skip("this TensorFlow's converter leaves the layer's weights float (TensorFlow 2.15's, a Keras 2 LSTM)")
    except ConversionError:
        pass
    from tf2onnx_rnn.rewriters.written.quantize.rounding import LIMIT, on_grid

    proto = convert_tflite(built.path, quantize="weights", max_error=0.1)
    floated = convert_tflite(built.path, dequantize=True)
    quantization = report_of(proto).quantization
    assert any(row.int8 and row.op in ("LSTM", "GRU") for row in quantization.layers), quantization.lines()
    assert not check_claims(proto) and "int8 weights" in int8_fed(proto).values()
    (node,) = helpers.nodes_of_types(proto, {kind})
    (stored,) = helpers.nodes_of_types(floated, {kind})
    values = {t.name: onnx.numpy_helper.to_array(t) for t in floated.graph.initializer}
    on_file_grid = [k for k in (1, 2) if on_grid(values[stored.input[k]], np.max(
        np.abs(values[stored.input[k]]), axis=2, keepdims=True) / LIMIT) is not None]
    if not on_file_grid:
        pytest.skip("this TensorFlow's converter left the layer's recurrent weights float")
    tapped = onnx.ModelProto()
    tapped.CopyFrom(proto)
    tapped.graph.output.extend([onnx.helper.make_tensor_value_info(node.input[k], onnx.TensorProto.FLOAT, None)
                                for k in on_file_grid])
    x = np.random.default_rng(5).standard_normal((2, TIME, 64)).astype(np.float32)
    session = helpers.ort_session(tapped)
    kept = session.run(None, {session.get_inputs()[0].name: x})[-len(on_file_grid):]
    for k, weights in zip(on_file_grid, kept):  # the file's int8 values on its scales
        np.testing.assert_allclose(weights, values[stored.input[k]], rtol=1e-6, atol=0)
    assert _max_error(built.path, proto) < 0.1
    assert quantization.bytes < 0.6 * quantization.float_bytes, quantization.lines()


def test_the_command_line_converts_and_verifies_a_tflite_file(tmp_path):
    """What a user sees: the report named from the file's tensors, verification against the interpreter."""
    import subprocess
    import sys

    built = exported("tf_keras", "bidirectional_lstm", 5, TIME)
    output = tmp_path / "model.onnx"
    result = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--tflite", built.path, "--output",
                             str(output), "--verify"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "ONNX vs TFLite" in result.stdout and "2 fused into native nodes" in result.stdout, result.stdout
    assert "tfl.unidirectional_sequence_lstm" in result.stdout  # the file's names for the layers
    assert "Traceback" not in result.stderr and "deprecated" not in result.stderr, result.stderr
    assert helpers.nodes_of_types(onnx.load(str(output)), ["LSTM"])


@pytest.mark.parametrize("lengths", [False, True], ids=["no-lengths", "sequence_length"])
def test_a_tf1_dynamic_rnn_over_a_custom_cell_becomes_a_scan(lengths):
    """TF 1.x ``dynamic_rnn`` over ``LSTMCell(num_proj)`` (no ONNX node computes it), converted to TFLite
    from a session at a fixed signature: its WHILE loop becomes a Scan of its own step, no Loop, the
    input's share of ``[x, h] @ W`` run once over the sequence. With ``sequence_length`` the loop ends at
    the longest row, and tf2onnx's Loop returned that many rows where the interpreter returns the
    input's length (the conversion was refused); the Scan runs every step: equal to the interpreter on
    rows of mixed lengths, an empty one among them, and on rows all shorter than the input."""
    import tf1_graphs
    from tf2onnx_rnn import convert_tflite, report_of

    case = tf1_graphs.Case("dynamic", "lstm_projection", lengths, "v2")
    batch, time = 3, 6
    path = tf1_graphs.tflite_file(case, batch, time)
    proto = convert_tflite(path, verify=True)
    ops = helpers.op_counts(proto)
    assert ops["Scan"] == 1 and not ops["Loop"], report_of(proto).table()
    (scan,) = helpers.nodes_of_types(proto, ["Scan"])
    step = [n.op_type for n in helpers.attribute(scan, "body").node]
    assert "Concat" not in step and "Gemm" not in step and step.count("MatMul") == 2, step
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    for rows in ([time, 0, 2], [2, 3, 1]) if lengths else ([time] * batch,):
        x = np.random.default_rng(sum(rows)).standard_normal((batch, time, tf1_graphs.FEATURES)).astype(np.float32)
        feeds = {name: (x if name.startswith("x") else np.asarray(rows, np.int32)) for name in names}
        runner = interpreter(path)
        runner.allocate_tensors()
        for detail in runner.get_input_details():
            runner.set_tensor(detail["index"], feeds[detail["name"]])
        runner.invoke()
        want = {d["name"]: runner.get_tensor(d["index"]) for d in runner.get_output_details()}
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        assert set(got) == set(want)
        for name, value in want.items():
            assert got[name].shape == value.shape, name
            assert float(np.max(np.abs(got[name] - value))) <= TOLERANCE, name
