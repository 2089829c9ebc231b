"""Dynamic dimensions named for what they are (``tf2onnx_rnn.dim_names``).

The property: no input or output of a converted Keras model (``convert_keras``, a ``.keras`` file, a
SavedModel, a TFLite file) has a dimension named ``unk__``. A Keras input's axis 0 is ``batch``;
an axis the graph carries to a recurrent node's sequence axis is ``time`` (``<input>_time`` where
two inputs have lengths of their own, so names differ where dimensions do); an output axis carries
an input axis's name only where the output shape check measured it equal to it, otherwise
``<output>_dim<k>``. The named model passes the full checker and strict shape inference, loads in
onnxruntime (which shows the names), OpenVINO and tract, and the report lists the names.
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers
import parity
import tf2onnx_rnn
from tf2onnx_rnn.dim_names import name_dimensions

FEATURES = 3


def shapes(model_proto) -> dict:
    """Input and output name -> its dims (sizes and names)."""
    return {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in list(model_proto.graph.input) + list(model_proto.graph.output)}


def check_named(model_proto) -> dict:
    """The model's shapes, after checking that no dim is unnamed or ``unk__``, that the checker and strict
    shape inference are clean and that onnxruntime shows the names."""
    named = shapes(model_proto)
    for name, dims in named.items():
        assert all(isinstance(d, int) and d > 0 or (isinstance(d, str) and d and not d.startswith("unk__"))
                   for d in dims), (name, dims)
    for value in model_proto.graph.value_info:
        assert not any(d.dim_param.startswith("unk__") for d in value.type.tensor_type.shape.dim), value.name
    onnx.checker.check_model(model_proto, full_check=True)
    onnx.shape_inference.infer_shapes(model_proto, check_type=True, strict_mode=True)
    session = helpers.ort_session(model_proto)
    shown = {i.name: i.shape for i in session.get_inputs()}
    assert all(shown[name] == named[name] for name in shown), (shown, named)
    report = tf2onnx_rnn.report_of(model_proto)
    assert report.dimensions and f"dimensions: {report.dimensions}" in report.table()
    return named


def _model(flavor: str, name: str):
    K = parity.keras_module(flavor)
    if name == "encoder-decoder":  # two inputs, two lengths; each output follows one of them
        enc, dec = K.Input((None, FEATURES), name="enc"), K.Input((None, FEATURES + 1), name="dec")
        _, h, c = K.layers.LSTM(4, return_state=True, name="encoder")(enc)
        y = K.layers.LSTM(4, return_sequences=True, name="decoder")(dec, initial_state=[h, c])
        model = K.Model([enc, dec], [y, K.layers.GRU(2, return_sequences=True, name="side")(enc)])
    else:
        x = K.Input((None, FEATURES), name="x")
        layer = (K.layers.LSTM(4, name="lstm") if name == "lstm"
                 else K.layers.Bidirectional(K.layers.GRU(4, return_sequences=True), name="bidi"))
        model = K.Model(x, layer(x))
    parity.randomize_weights(model, zlib.crc32(f"dims/{flavor}/{name}".encode()))
    return model


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_plain_lstm(flavor):
    named = check_named(tf2onnx_rnn.convert_keras(_model(flavor, "lstm")))
    assert named == {"x": ["batch", "time", FEATURES], "lstm": ["batch", 4]}


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_bidirectional_sequences_follow_the_input(flavor):
    named = check_named(tf2onnx_rnn.convert_keras(_model(flavor, "bidi")))
    assert named == {"x": ["batch", "time", FEATURES], "bidi": ["batch", "time", 8]}


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_two_inputs_of_their_own_lengths_keep_distinct_names(flavor):
    """The shape check feeds both inputs the same length, so the measurement alone cannot tell which an
    output follows; the symbol shape inference carries to it picks among those it measured equal."""
    model = _model(flavor, "encoder-decoder")
    named = check_named(tf2onnx_rnn.convert_keras(model))
    assert named == {"enc": ["batch", "enc_time", FEATURES], "dec": ["batch", "dec_time", FEATURES + 1],
                     "decoder": ["batch", "dec_time", 4], "side": ["batch", "enc_time", 2]}
    unmeasured = check_named(tf2onnx_rnn.convert_keras(model, check_shapes=False))
    assert unmeasured["decoder"] == ["decoder_dim0", "decoder_dim1", 4]  # nothing measured: nothing shared
    assert unmeasured["side"] == ["side_dim0", "side_dim1", 2]


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_stateful_model_has_a_fixed_batch_and_named_states(flavor):
    K = parity.keras_module(flavor)
    x = K.Input(batch_shape=(2, None, FEATURES), name="x")
    model = K.Model(x, K.layers.GRU(4, stateful=True, return_sequences=True, name="gru")(x))
    parity.randomize_weights(model, 5)
    named = check_named(tf2onnx_rnn.convert_keras(model))
    assert named == {"x": [2, "time", FEATURES], "gru/h_in": [2, 4], "gru": [2, "time", 4], "gru/h_out": [2, 4]}
    streamed = check_named(tf2onnx_rnn.convert_keras(_model(flavor, "lstm"), streaming=True))
    assert streamed["lstm/h_in"] == streamed["lstm/c_out"] == ["batch", 4]


def test_a_keras_file_and_a_saved_model(tmp_path, capfd):
    """The command line's doors: the report printed lists the names; a SavedModel's batch is named from
    the recurrent node it reaches (the signature does not say which axis is the batch)."""

    from tf2onnx_rnn import convert

    model = _model(parity.FLAVORS[0], "bidi")
    path = tmp_path / ("model.keras" if parity.KERAS3 else "model.h5")
    model.save(str(path))
    code = convert.main(["--keras", str(path), "--output", str(tmp_path / "file.onnx")])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "dimensions: x[batch, time, 3]; bidi[batch, time, 8]" in out
    check_named(onnx.load(str(tmp_path / "file.onnx")))
    helpers.save_serving(model, tmp_path / "saved", FEATURES)
    code = convert.main(["--saved-model", str(tmp_path / "saved"), "--output", str(tmp_path / "saved.onnx")])
    assert code == 0, capfd.readouterr().out
    assert check_named(onnx.load(str(tmp_path / "saved.onnx"))) == {"x": ["batch", "time", FEATURES],
                                                                    "y": ["batch", "time", 8]}


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_tflite_file(flavor, tmp_path):

    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), batch_size=2, name="x")
    model = K.Model(x, K.layers.GRU(4, return_sequences=True, name="gru")(x))  # tf_keras's LSTM: a clipping fused op
    parity.randomize_weights(model, 6)
    path = tmp_path / "model.tflite"
    path.write_bytes(helpers.keras_tflite(model))
    named = check_named(tf2onnx_rnn.convert_tflite(str(path)))
    (data,) = [name for name in named if len(named[name]) == 3 and named[name][2] == FEATURES]
    (output,) = [name for name in named if name != data]
    assert named[data][:2] == [2, "time"] and named[output] == [2, "time", 4], named


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_named_models_load_downstream(flavor, tmp_path):
    """OpenVINO and tract load and run the named model (tract makes each name a symbol)."""
    openvino = pytest.importorskip("openvino")
    tract = pytest.importorskip("tract")
    model = _model(flavor, "bidi")
    path = str(tmp_path / "named.onnx")
    onnx.save(tf2onnx_rnn.convert_keras(model), path)
    x = np.random.default_rng(1).standard_normal((2, 7, FEATURES)).astype(np.float32)
    want = np.asarray(model(x, training=False))
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(np.asarray(compiled([x])[compiled.outputs[0]]), want, rtol=0, atol=1e-4)
    loaded = tract.onnx().load(path)
    loaded.set_input_fact(0, "2,7,3,f32")
    got = loaded.into_model().into_runnable().run([x])[0].to_numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


# -- the naming on its own: what is measured decides ------------------------------------------------

def _identity_model() -> onnx.ModelProto:
    """y = Identity(x), x [unk__1, unk__2], y [unk__3, unk__4], and an intermediate shape of tf2onnx's."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"]), helper.make_node("Identity", ["t"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__1", "unk__2"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__3", "unk__4"])],
        value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, ["unk__1", "unk__9"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_output_axis_takes_an_input_axis_name_only_where_measured_equal():
    model_proto = _identity_model()
    rounds = [({"x": (2, 5)}, {"y": (2, 5)}), ({"x": (3, 9)}, {"y": (3, 9)})]
    line = name_dimensions(model_proto, rounds, keras=True)
    assert shapes(model_proto) == {"x": ["batch", "x_dim1"], "y": ["batch", "x_dim1"]}
    assert line == "x[batch, x_dim1]; y[batch, x_dim1]"
    assert [d.dim_param for d in model_proto.graph.value_info[0].type.tensor_type.shape.dim] == ["batch", ""]
    model_proto = _identity_model()  # measured otherwise than shape inference would say: the measure wins
    rounds = [({"x": (2, 5)}, {"y": (2, 4)}), ({"x": (3, 9)}, {"y": (3, 9)})]
    name_dimensions(model_proto, rounds, keras=True)
    assert shapes(model_proto)["y"] == ["batch", "y_dim1"]
    model_proto = _identity_model()  # nothing measured: no output axis follows an input's
    name_dimensions(model_proto, [], keras=False)
    assert shapes(model_proto) == {"x": ["x_dim0", "x_dim1"], "y": ["y_dim0", "y_dim1"]}
    onnx.checker.check_model(model_proto, full_check=True)
