"""tf2onnx's command-line flags for SavedModel and Keras inputs, as tf2onnx users type them.

For each flag: what it does to the written ONNX model (input and output names, transposes,
opset imports, external data, input shapes), with onnxruntime compared against Keras
(``model(x, training=False)``), and the Python API's equivalent where there is one. Bad values
and flags that conflict exit 2 with one error line and write nothing. Conversions run
in-process through :func:`tf2onnx_rnn.convert.main` (as in test_cli.py); one case runs the
command in a child process, to see the warning a user sees.

The models are small: the suite runs on both supported stacks (``keras`` is Keras 3 on the
newest, Keras 2.15 on TensorFlow 2.15).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf

import cli_models  # noqa: E402  (tests/ is on sys.path, see conftest.py)
import helpers  # noqa: E402
from helpers import attribute, nodes_of_types, op_counts, ort_session  # noqa: E402
from tf2onnx_rnn import api, options, probes, sources  # noqa: E402
from tf2onnx_rnn import convert as cli  # noqa: E402
from tf2onnx_rnn import output as output_module  # noqa: E402
from tf2onnx_rnn.errors import ConversionError  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
KERAS2_H5 = os.path.join(DATA, "keras2_lstm_dense.h5")
ROWS, COLS, CHANNELS = 6, 5, 3  # the image model's NHWC input
SEQ_FEATURES = 16  # the sequence model's features
NCHW_TO_NHWC, NHWC_TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
KB = 1024
ATOL = 1e-4


# -- models ------------------------------------------------------------------------------------
@dataclass
class Built:
    path: str
    model: object = None  # what computes the reference outputs


def image_model():
    """NHWC image (rows x cols x channels) -> one step per row -> LSTM -> Dense -> rank-4 output
    (rows x 2 x 3): a rank-4 input and a rank-4 output for the NCHW flags."""
    inputs = keras.Input((ROWS, COLS, CHANNELS), name="image")
    hidden = keras.layers.Reshape((ROWS, COLS * CHANNELS))(inputs)
    hidden = keras.layers.LSTM(4, return_sequences=True, name="rows_lstm")(hidden)
    hidden = keras.layers.Dense(6, name="head")(hidden)
    outputs = keras.layers.Reshape((ROWS, 2, 3), name="grid")(hidden)
    model = keras.Model(inputs, outputs, name="image_model")
    cli_models.randomize(model, 21)
    return model


def sequence_model():
    """x (batch, time, 16) -> LSTM(64) -> Dense(8): weights of 2 to 64 KB, for --large_model."""
    inputs = keras.Input((None, SEQ_FEATURES), name="x")
    hidden = keras.layers.LSTM(64, name="seq_lstm")(inputs)
    outputs = keras.layers.Dense(8, name="seq_head")(hidden)
    model = keras.Model(inputs, outputs, name="sequence_model")
    cli_models.randomize(model, 22)
    return model


def resize_model():
    """Nearest-neighbour resizing (TensorFlow's half-pixel centers), then an LSTM over the rows."""
    inputs = keras.Input((4, 5, 2), name="image")
    hidden = keras.layers.Resizing(8, 10, interpolation="nearest", name="upscale")(inputs)
    hidden = keras.layers.Reshape((8, 20))(hidden)
    outputs = keras.layers.LSTM(3, name="resize_lstm")(hidden)
    model = keras.Model(inputs, outputs, name="resize_model")
    cli_models.randomize(model, 23)
    return model


class _Lgamma(tf.Module):
    """A signature with an op tf2onnx has no handler for (Lgamma)."""

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.math.lgamma(tf.abs(x) + 1.0) * 2.0}


class _TwoTraces(tf.Module):
    """A GRU behind a tf.function without an input signature, traced for two shapes: saved, it
    has two concrete functions and no signature. (The fixed shape is traced first: a trace for
    the dynamic one would serve it too.)"""

    SPECS = (tf.TensorSpec([2, 6, 3], tf.float32, name="x"), tf.TensorSpec([None, None, 3], tf.float32, name="x"))

    def __init__(self):
        super().__init__()
        self.gru = keras.layers.GRU(4, name="module_gru")
        self.gru.build((None, None, 3))
        rng = np.random.default_rng(24)
        self.gru.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in self.gru.get_weights()])

    @tf.function
    def __call__(self, x):
        return self.gru(x, training=False)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("flag_models")


@pytest.fixture(scope="module")
def image_file(models_dir):
    model = image_model()
    path = str(models_dir / "image.keras")
    model.save(path)
    return Built(path, model)


@pytest.fixture(scope="module")
def sequence_file(models_dir):
    model = sequence_model()
    path = str(models_dir / "sequence.keras")
    model.save(path)
    return Built(path, model)


@pytest.fixture(scope="module")
def sequence_saved_model(models_dir, sequence_file):
    path = str(models_dir / "sequence_saved_model")
    sequence_file.model.export(path)
    return Built(path, sequence_file.model)


@pytest.fixture(scope="module")
def resize_file(models_dir):
    model = resize_model()
    path = str(models_dir / "resize.keras")
    model.save(path)
    return Built(path, model)


@pytest.fixture(scope="module")
def lgamma_saved_model(models_dir):
    module = _Lgamma()
    path = str(models_dir / "lgamma_saved_model")
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__.get_concrete_function()})
    return Built(path, module)


@pytest.fixture(scope="module")
def functions_saved_model(models_dir):
    module = _TwoTraces()
    for spec in _TwoTraces.SPECS:
        module.__call__.get_concrete_function(spec)
    path = str(models_dir / "functions_saved_model")
    tf.saved_model.save(module, path)
    return Built(path, module)


# -- helpers -----------------------------------------------------------------------------------
def convert_ok(argv, capfd) -> str:
    """Run the command in-process; it must succeed. Returns stdout."""
    code = cli.main([str(arg) for arg in argv])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and not re.search(r"^error:", err, re.MULTILINE), err
    return out


assert_one_error_line = helpers.assert_one_error_line


def dims(value: onnx.ValueInfoProto) -> list:
    """A graph input's or output's shape: sizes, None for a dynamic dimension."""
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def keras_out(model, x) -> np.ndarray:
    return np.asarray(model(x, training=False))


def image_batch() -> np.ndarray:
    return np.random.default_rng(31).standard_normal((3, ROWS, COLS, CHANNELS)).astype(np.float32)


def sequences(batch=2, steps=7) -> np.ndarray:
    return np.random.default_rng(32).standard_normal((batch, steps, SEQ_FEATURES)).astype(np.float32)


def consumers(model_proto: onnx.ModelProto, name: str) -> list:
    return [node for node in model_proto.graph.node if name in node.input]


def producer(model_proto: onnx.ModelProto, name: str) -> onnx.NodeProto:
    (node,) = [node for node in model_proto.graph.node if name in node.output]
    return node


def perm(node: onnx.NodeProto) -> list:
    return list(attribute(node, "perm"))


def opsets(model_proto: onnx.ModelProto) -> dict:
    return {entry.domain: entry.version for entry in model_proto.opset_import}


# -- --inputs-as-nchw / --outputs-as-nchw --------------------------------------------------------
def assert_input_as_nchw(model_proto, name: str, keras_model) -> None:
    """The input is NCHW, a Transpose back to NHWC reads it, and the model matches Keras on the
    transposed batch."""
    (graph_input,) = model_proto.graph.input
    assert graph_input.name == name
    assert dims(graph_input) == [None, CHANNELS, ROWS, COLS]
    transposes = [node for node in consumers(model_proto, name) if node.op_type == "Transpose"]
    assert [perm(node) for node in transposes] == [NCHW_TO_NHWC]
    x = image_batch()
    (y,) = ort_session(model_proto).run(None, {name: x.transpose(NHWC_TO_NCHW)})
    np.testing.assert_allclose(y, keras_out(keras_model, x), rtol=0, atol=ATOL)


def test_inputs_as_nchw(image_file, tmp_path, capfd):
    output = tmp_path / "nchw_in.onnx"
    convert_ok(["--keras", image_file.path, "--output", output, "--inputs-as-nchw", "image"], capfd)
    model_proto = onnx.load(str(output))
    assert_input_as_nchw(model_proto, "image", image_file.model)
    assert dims(model_proto.graph.output[0]) == [None, ROWS, 2, 3]  # outputs untouched


def test_inputs_as_nchw_with_renamed_input_and_graph_name(image_file, tmp_path, capfd):
    """tf2onnx's underscore spelling, and the input named by its new name or its graph tensor name."""
    for index, name in enumerate(("pixels", "image:0")):
        output = tmp_path / f"nchw_renamed_{index}.onnx"
        convert_ok(["--keras", image_file.path, "--output", output, "--rename-inputs", "pixels",
                    "--inputs_as_nchw", name], capfd)
        assert_input_as_nchw(onnx.load(str(output)), "pixels", image_file.model)


def test_inputs_as_nchw_api(image_file):
    model_proto = api.convert_keras(image_file.model, inputs_as_nchw="image")
    assert_input_as_nchw(model_proto, "image", image_file.model)


def test_outputs_as_nchw(image_file, tmp_path, capfd):
    output = tmp_path / "nchw_out.onnx"
    convert_ok(["--keras", image_file.path, "--output", output, "--outputs-as-nchw", "grid"], capfd)
    model_proto = onnx.load(str(output))
    (graph_output,) = model_proto.graph.output
    assert graph_output.name == "grid"
    assert dims(graph_output) == [None, 3, ROWS, 2]
    assert dims(model_proto.graph.input[0]) == [None, ROWS, COLS, CHANNELS]  # inputs untouched
    last = producer(model_proto, "grid")
    assert last.op_type == "Transpose" and perm(last) == NHWC_TO_NCHW
    x = image_batch()
    (y,) = ort_session(str(output)).run(None, {"image": x})
    np.testing.assert_allclose(y, keras_out(image_file.model, x).transpose(NHWC_TO_NCHW), rtol=0, atol=ATOL)


def test_verification_and_the_shape_check_follow_the_nchw_transposes(image_file, tmp_path, capfd):
    """The source runs on NHWC inputs and its NHWC outputs are compared transposed, so a model converted
    with transposed inputs and outputs verifies, and the default shape check passes."""
    for given in ({"inputs_as_nchw": "image"}, {"outputs_as_nchw": "grid"},
                  {"inputs_as_nchw": "image", "outputs_as_nchw": "grid"}):
        model_proto = api.convert_keras(image_file.model, verify=True, tolerance=ATOL, **given)
        assert api.report_of(model_proto).checked.startswith("outputs verified against Keras"), given
        checked = api.report_of(api.convert_keras(image_file.model, **given)).checked
        assert checked.startswith("output shapes checked against Keras"), (given, checked)
    output = tmp_path / "nchw_verified.onnx"
    convert_ok(["--keras", image_file.path, "--output", output, "--outputs-as-nchw", "grid", "--inputs-as-nchw",
                "image", "--verify"], capfd)


def test_outputs_as_nchw_api(image_file):
    model_proto = api.convert_keras(image_file.model, outputs_as_nchw=["grid"], rename_outputs=["cells"])
    (graph_output,) = model_proto.graph.output
    assert graph_output.name == "cells" and dims(graph_output) == [None, 3, ROWS, 2]
    x = image_batch()
    (y,) = ort_session(model_proto).run(None, {"image": x})
    np.testing.assert_allclose(y, keras_out(image_file.model, x).transpose(NHWC_TO_NCHW), rtol=0, atol=ATOL)


# -- --rename-inputs / --rename-outputs ----------------------------------------------------------
def test_rename_inputs_and_outputs(sequence_saved_model, tmp_path, capfd):
    output = tmp_path / "renamed.onnx"
    convert_ok(["--saved-model", sequence_saved_model.path, "--output", output, "--rename-inputs", "frames",
                "--rename-outputs", "scores"], capfd)
    model_proto = onnx.load(str(output))
    assert [i.name for i in model_proto.graph.input] == ["frames"]
    assert [o.name for o in model_proto.graph.output] == ["scores"]
    x = sequences()
    (y,) = ort_session(str(output)).run(["scores"], {"frames": x})
    np.testing.assert_allclose(y, keras_out(sequence_saved_model.model, x), rtol=0, atol=ATOL)


def test_rename_api(sequence_file):
    model_proto = api.convert_keras(sequence_file.model, rename_inputs="frames", rename_outputs=("scores",))
    assert [i.name for i in model_proto.graph.input] == ["frames"]
    assert [o.name for o in model_proto.graph.output] == ["scores"]
    x = sequences()
    (y,) = ort_session(model_proto).run(["scores"], {"frames": x})
    np.testing.assert_allclose(y, keras_out(sequence_file.model, x), rtol=0, atol=ATOL)


def test_rename_with_the_wrong_count_api(sequence_file):
    with pytest.raises(ConversionError, match=r"^rename_outputs gives 2 name\(s\), the model has 1 outputs"):
        api.convert_keras(sequence_file.model, rename_outputs=["a", "b"])


# -- --extra_opset -------------------------------------------------------------------------------
def test_extra_opset(sequence_file, tmp_path, capfd):
    output = tmp_path / "extra_opset.onnx"
    convert_ok(["--keras", sequence_file.path, "--output", output, "--opset", "15",
                "--extra_opset", "com.microsoft:1"], capfd)
    model_proto = onnx.load(str(output))
    imported = opsets(model_proto)
    assert imported["com.microsoft"] == 1
    assert imported[""] == 15  # the default domain stays at --opset
    assert len(model_proto.opset_import) == len(imported)  # each domain imported once
    x = sequences()
    (y,) = ort_session(str(output)).run(None, {"x": x})
    np.testing.assert_allclose(y, keras_out(sequence_file.model, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize("extra", [["com.microsoft:1", "ai.onnx.contrib:1"],
                                   [onnx.helper.make_opsetid("com.microsoft", 1),
                                    onnx.helper.make_opsetid("ai.onnx.contrib", 1)]], ids=["strings", "protos"])
def test_extra_opset_api(sequence_file, extra):
    model_proto = api.convert_keras(sequence_file.model, extra_opset=extra)
    imported = opsets(model_proto)
    assert imported["com.microsoft"] == 1 and imported["ai.onnx.contrib"] == 1
    assert imported[""] == probes.default_opset(None)


# -- --target ------------------------------------------------------------------------------------
def resize_mode(model_proto) -> str:
    (node,) = nodes_of_types(model_proto, {"Resize"})
    return attribute(node, "coordinate_transformation_mode").decode()


def test_target_tensorrt_changes_the_resize(resize_file, tmp_path, capfd):
    """tf2onnx's TensorRT workaround: nearest resizing with half-pixel centers becomes ONNX's
    ``half_pixel`` (which TensorRT runs) instead of ``tf_half_pixel_for_nn`` (TensorFlow's, exact)."""
    default, tensorrt = tmp_path / "default.onnx", tmp_path / "tensorrt.onnx"
    convert_ok(["--keras", resize_file.path, "--output", default], capfd)
    convert_ok(["--keras", resize_file.path, "--output", tensorrt, "--target", "tensorrt"], capfd)
    assert resize_mode(onnx.load(str(default))) == "tf_half_pixel_for_nn"
    assert resize_mode(onnx.load(str(tensorrt))) == "half_pixel"
    x = np.random.default_rng(33).standard_normal((2, 4, 5, 2)).astype(np.float32)
    (y,) = ort_session(str(default)).run(None, {"image": x})
    np.testing.assert_allclose(y, keras_out(resize_file.model, x), rtol=0, atol=ATOL)
    ort_session(str(tensorrt)).run(None, {"image": x})  # loads and runs (not exact: that is the workaround)


def test_target_api(resize_file):
    assert resize_mode(api.convert_keras(resize_file.model, target="tensorrt")) == "half_pixel"
    assert resize_mode(api.convert_keras(resize_file.model, target=["rs4", "tensorrt"])) == "half_pixel"


def test_target_values_are_tf2onnx_targets():
    from tf2onnx import constants

    assert set(constants.POSSIBLE_TARGETS) <= set(options.known_targets())
    chosen = options.Options.of(target=list(constants.POSSIBLE_TARGETS))
    assert chosen.target == tuple(constants.POSSIBLE_TARGETS) and not chosen.portable
    with pytest.raises(ConversionError, match="unknown target 'rs4,rs5'"):
        options.Options.of(target="rs4,rs5")  # one string is one target


# -- --large_model -------------------------------------------------------------------------------
def tensor_bytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def assert_external_data(path: str) -> None:
    """Every initializer of 1 KB or more is in ``<path>.data`` (named relatively, its bytes within the
    file), every smaller one in the model; the .onnx file holds no weights."""
    data_path = path + ".data"
    data_size = os.path.getsize(data_path)
    model_proto = onnx.load(path, load_external_data=False)
    external = 0
    for tensor in model_proto.graph.initializer:
        size = tensor_bytes(tensor)
        if size >= KB:
            assert tensor.data_location == onnx.TensorProto.EXTERNAL, (tensor.name, size)
            info = {entry.key: entry.value for entry in tensor.external_data}
            assert info["location"] == os.path.basename(data_path)
            assert int(info["length"]) == size
            assert int(info.get("offset", 0)) + size <= data_size
            assert not tensor.raw_data
            external += size
        else:
            assert tensor.data_location != onnx.TensorProto.EXTERNAL, (tensor.name, size)
    assert external >= 80 * KB  # the LSTM's and the Dense layer's weights
    assert data_size >= external
    assert os.path.getsize(path) < 16 * KB


def assert_runs_like_keras(path: str, model) -> None:
    x = sequences()
    session = ort_session(path)
    (y,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(y, keras_out(model, x), rtol=0, atol=ATOL)


def test_large_model_writes_external_data(sequence_file, tmp_path, capfd):
    output = tmp_path / "model.onnx"
    output.write_bytes(b"previous model")
    (tmp_path / "model.onnx.data").write_bytes(b"previous data")
    out = convert_ok(["--keras", sequence_file.path, "--output", output, "--large_model", "--verify"], capfd)
    assert f"wrote {output} and {output}.data" in out
    assert "verification" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]  # nothing else left
    assert_external_data(str(output))
    assert_runs_like_keras(str(output), sequence_file.model)


def test_large_model_from_a_saved_model(sequence_saved_model, tmp_path, capfd):
    output = tmp_path / "saved.onnx"
    convert_ok(["--saved-model", sequence_saved_model.path, "--output", output, "--large-model"], capfd)
    assert_external_data(str(output))
    assert_runs_like_keras(str(output), sequence_saved_model.model)


def test_large_model_api_returns_the_whole_model(sequence_file, tmp_path):
    """The files hold external data; the returned model still holds every tensor itself."""
    output = tmp_path / "api.onnx"
    model_proto = api.convert_keras(sequence_file.model, large_model=True, output_path=str(output))
    assert_external_data(str(output))
    assert_runs_like_keras(str(output), sequence_file.model)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL and t.raw_data for t in model_proto.graph.initializer
               if tensor_bytes(t) >= KB)
    x = sequences()
    (y,) = ort_session(model_proto).run(None, {"x": x})
    np.testing.assert_allclose(y, keras_out(sequence_file.model, x), rtol=0, atol=ATOL)
    # saved again with save_model: the same files
    again = tmp_path / "again.onnx"
    assert output_module.save_model(model_proto, str(again)) == [str(again), str(again) + ".data"]
    assert (tmp_path / "again.onnx.data").read_bytes() == (tmp_path / "api.onnx.data").read_bytes()


@pytest.fixture
def over_2gb(monkeypatch):
    """The converted model counts as over protobuf's 2 GB (a real one takes minutes and many GB);
    records the files onnxruntime is asked to load from disk."""
    loaded = []
    check = output_module._check_file_loads

    def recording(path):
        loaded.append(path)
        check(path)

    for module in (api, probes, output_module):
        monkeypatch.setattr(module, "fits_in_protobuf", lambda model_proto: False)
    monkeypatch.setattr(output_module, "_check_file_loads", recording)
    return loaded


def test_over_2gb_large_model_is_loaded_from_its_files(sequence_file, tmp_path, capfd, over_2gb):
    """A model too big to load from memory is loaded from the written files, before they replace
    the output."""
    output = tmp_path / "model.onnx"
    out = convert_ok(["--keras", sequence_file.path, "--output", output, "--large_model"], capfd)
    assert f"wrote {output} and {output}.data" in out
    (staged,) = over_2gb
    assert os.path.basename(staged) == "model.onnx" and os.path.dirname(staged) != str(tmp_path)
    assert not os.path.exists(staged)  # the staging directory is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert_external_data(str(output))
    assert_runs_like_keras(str(output), sequence_file.model)


@pytest.mark.parametrize("flags, message", [
    (("--large_model", "--verify"), "--verify cannot run a model over 2 GB"),
    ((), "the model is over 2 GB, protobuf's limit for one file: convert it with --large_model"),
], ids=["verify", "without-large-model"])
def test_over_2gb_refused(sequence_file, tmp_path, capfd, over_2gb, flags, message):
    output = tmp_path / "model.onnx"
    code = cli.main(["--keras", sequence_file.path, "--output", str(output), *flags])
    assert code == 2
    assert message in assert_one_error_line(capfd.readouterr().err)
    assert list(tmp_path.iterdir()) == [] and over_2gb == []


def test_save_model_checks_the_files_load_before_replacing(tmp_path):
    """``check_loads``: files onnxruntime refuses replace nothing."""
    weights = onnx.numpy_helper.from_array(np.ones((32, 32), np.float32), "w")  # 4 KB: external
    graph = onnx.helper.make_graph([onnx.helper.make_node("NoSuchOp", ["x", "w"], ["y"])], "broken",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [32, 32])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [32, 32])],
                                   [weights])
    model_proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model_proto.metadata_props.add(key=output_module.LARGE_MODEL_KEY, value="1")
    output = tmp_path / "broken.onnx"
    output.write_bytes(b"previous model")
    with pytest.raises(ConversionError, match="onnxruntime cannot load the converted model"):
        output_module.save_model(model_proto, str(output), check_loads=True)
    assert [p.name for p in tmp_path.iterdir()] == ["broken.onnx"]
    assert output.read_bytes() == b"previous model"
    written = output_module.save_model(model_proto, str(output))  # unchecked: written
    assert written == [str(output), str(output) + ".data"]
    assert onnx.load(str(output)).graph.initializer[0].raw_data == weights.raw_data


def test_large_model_without_big_tensors_writes_one_file(image_file, tmp_path, capfd):
    output = tmp_path / "small.onnx"
    out = convert_ok(["--keras", image_file.path, "--output", output, "--large_model"], capfd)
    assert out.rstrip().endswith(f"wrote {output}")
    assert [p.name for p in tmp_path.iterdir()] == ["small.onnx"]
    assert all(tensor_bytes(t) < KB for t in onnx.load(str(output)).graph.initializer)


# -- --continue_on_error -------------------------------------------------------------------------
def test_unconverted_op_without_continue_on_error_exits_2_and_writes_nothing(lgamma_saved_model, tmp_path, capfd):
    output = tmp_path / "lgamma.onnx"
    code = cli.main(["--saved-model", lgamma_saved_model.path, "--output", str(output)])
    out, err = capfd.readouterr()
    assert code == 2
    line = assert_one_error_line(err)
    assert "tf2onnx could not convert these TensorFlow ops: Lgamma" in line
    assert "continue_on_error" in line
    assert out == ""
    assert list(tmp_path.iterdir()) == []


def test_continue_on_error_writes_the_model_with_a_warning(lgamma_saved_model, tmp_path):
    """In a child process: the one warning line is what the user sees on stderr."""
    output = tmp_path / "lgamma.onnx"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")}
    result = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--saved-model", lgamma_saved_model.path,
                             "--output", str(output), "--continue_on_error"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warning: tf2onnx could not convert these TensorFlow ops: Lgamma"), result.stderr
    assert f"wrote {output}" in result.stdout
    model_proto = onnx.load(str(output))
    assert op_counts(model_proto)["Lgamma"] == 1  # left in the graph for a runtime that has it
    assert [i.name for i in model_proto.graph.input] == ["x"] and [o.name for o in model_proto.graph.output] == ["y"]


def test_continue_on_error_api(lgamma_saved_model):
    with pytest.raises(ConversionError, match="could not convert these TensorFlow ops: Lgamma"):
        api.convert_saved_model(lgamma_saved_model.path)
    model_proto = api.convert_saved_model(lgamma_saved_model.path, continue_on_error=True)
    assert op_counts(model_proto)["Lgamma"] == 1
    assert probes.unconverted_ops(model_proto) == ["Lgamma"]


# -- --concrete_function -------------------------------------------------------------------------
@pytest.mark.parametrize("index", [0, 1])
def test_concrete_function(functions_saved_model, tmp_path, capfd, index):
    """The index picks the saved tf.function trace: the ONNX input has that trace's shape."""
    (spec,), _ = tf.saved_model.load(functions_saved_model.path).__call__.concrete_functions[index] \
        .structured_input_signature
    output = tmp_path / f"function_{index}.onnx"
    convert_ok(["--saved-model", functions_saved_model.path, "--output", output, "--concrete_function", index],
               capfd)
    model_proto = onnx.load(str(output))
    (graph_input,) = model_proto.graph.input
    assert dims(graph_input) == spec.shape.as_list()
    counts = op_counts(model_proto)
    assert counts["GRU"] == 1 and not counts["Loop"] and not counts["Scan"]
    x = np.random.default_rng(34).standard_normal((2, 6, 3)).astype(np.float32)  # fits both traces
    (y,) = ort_session(str(output)).run(None, {graph_input.name: x})
    np.testing.assert_allclose(y, np.asarray(functions_saved_model.model.gru(x, training=False)), rtol=0, atol=ATOL)


def test_concrete_function_api(functions_saved_model):
    shapes = {tuple(dims(api.convert_saved_model(functions_saved_model.path, concrete_function=i).graph.input[0]))
              for i in (0, 1)}
    assert shapes == {tuple(spec.shape.as_list()) for spec in _TwoTraces.SPECS}


# -- --inputs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["keras", "saved-model"])
def test_inputs_fixes_the_shape(source, sequence_file, sequence_saved_model, tmp_path, capfd):
    built = sequence_file if source == "keras" else sequence_saved_model
    output = tmp_path / "fixed.onnx"
    convert_ok([f"--{source}", built.path, "--output", output, "--inputs", f"x[1,50,{SEQ_FEATURES}]"], capfd)
    model_proto = onnx.load(str(output))
    (graph_input,) = model_proto.graph.input
    assert dims(graph_input) == [1, 50, SEQ_FEATURES]
    assert op_counts(model_proto)["LSTM"] == 1
    x = sequences(batch=1, steps=50)
    (y,) = ort_session(str(output)).run(None, {graph_input.name: x})
    np.testing.assert_allclose(y, keras_out(built.model, x), rtol=0, atol=ATOL)


@pytest.mark.parametrize("source", ["keras", "saved-model"])
def test_inputs_with_dynamic_dimensions_and_graph_names(source, sequence_file, sequence_saved_model, tmp_path,
                                                        capfd):
    """-1 and ? keep a dimension dynamic; ``x:0`` is ``x``; a name alone keeps the model's shape."""
    built = sequence_file if source == "keras" else sequence_saved_model
    for spelling, expected in ((f"x:0[-1,12,{SEQ_FEATURES}]", [None, 12, SEQ_FEATURES]),
                               (f"x[3,?,{SEQ_FEATURES}]", [3, None, SEQ_FEATURES]),
                               ("x", [None, None, SEQ_FEATURES])):
        output = tmp_path / "dynamic.onnx"
        convert_ok([f"--{source}", built.path, "--output", output, "--inputs", spelling], capfd)
        assert dims(onnx.load(str(output)).graph.input[0]) == expected, spelling


def test_inputs_api(sequence_file, sequence_saved_model):
    for model_proto in (api.convert_keras(sequence_file.model, inputs={"x": [1, 50, SEQ_FEATURES]}),
                        api.convert_saved_model(sequence_saved_model.path, inputs={"x": [1, 50, SEQ_FEATURES]})):
        assert dims(model_proto.graph.input[0]) == [1, 50, SEQ_FEATURES]
    with pytest.raises(ConversionError, match="input_signature and inputs exclude each other"):
        api.convert_keras(sequence_file.model, inputs={"x": [1, 50, SEQ_FEATURES]},
                          input_signature=[tf.TensorSpec([1, 50, SEQ_FEATURES], tf.float32)])


# -- a Keras 2 .h5 file (TensorFlow 2.15) ----------------------------------------------------------
def load_keras2_h5():
    """The reference: the same file loaded by ``keras`` or, where that refuses it, tf_keras."""
    try:
        return keras.models.load_model(KERAS2_H5, compile=False)
    except Exception:  # noqa: BLE001 - Keras 3 refuses some Keras 2 layer configurations
        import tf_keras

        return tf_keras.models.load_model(KERAS2_H5, compile=False)


def test_keras2_h5_converts(tmp_path, capfd):
    output = tmp_path / "keras2.onnx"
    out = convert_ok(["--keras", KERAS2_H5, "--output", output, "--verify"], capfd)
    assert "verification" in out and "FAILED" not in out
    model_proto = onnx.load(str(output))
    counts = op_counts(model_proto)
    assert counts["LSTM"] == 1 and not counts["Loop"]
    reference = load_keras2_h5()
    x = np.random.default_rng(35).standard_normal((3, 9, 4)).astype(np.float32)
    (y,) = ort_session(str(output)).run(None, {model_proto.graph.input[0].name: x})
    np.testing.assert_allclose(y, keras_out(reference, x), rtol=0, atol=ATOL)


# -- bad values and conflicting flags ---------------------------------------------------------------
@dataclass(frozen=True)
class Bad:
    id: str
    argv: tuple  # {placeholders} are fixtures' paths
    message: str  # a regular expression the error line must match


BAD = [
    Bad("concrete-function-with-keras", ("--keras", "{sequence_file}", "--concrete_function", "0"),
        "--concrete_function applies to --saved-model only"),
    Bad("signature-def-with-keras", ("--keras", "{sequence_file}", "--signature_def", "serve"),
        "--signature_def applies to --saved-model only"),
    Bad("signature-def-and-concrete-function", ("--saved-model", "{sequence_saved_model}", "--signature_def",
                                                "serve", "--concrete-function", "0"), "exclude each other"),
    Bad("concrete-function-negative", ("--saved-model", "{functions_saved_model}", "--concrete_function", "-1"),
        "--concrete_function is an index from 0"),
    Bad("concrete-function-out-of-range", ("--saved-model", "{functions_saved_model}", "--concrete_function", "2"),
        r"cannot load SavedModel .*concrete_function.*\b2\b"),
    Bad("no-signature-without-concrete-function", ("--saved-model", "{functions_saved_model}"),
        "cannot load SavedModel .*--concrete_function"),
    Bad("rename-inputs-wrong-count", ("--keras", "{sequence_file}", "--rename-inputs", "a,b"),
        r"--rename-inputs gives 2 name\(s\), the model has 1 inputs: x"),
    Bad("rename-outputs-twice-the-same", ("--keras", "{image_file}", "--rename-outputs", "a,a"),
        "--rename-outputs gives the name 'a' more than once"),
    Bad("rename-inputs-empty-name", ("--saved-model", "{sequence_saved_model}", "--rename-inputs", "a,"),
        "argument --rename-inputs/--rename_inputs: empty name"),
    Bad("inputs-as-nchw-unknown", ("--keras", "{image_file}", "--inputs-as-nchw", "picture"),
        "unknown name 'picture' in --inputs-as-nchw; the model's inputs are: image"),
    Bad("inputs-as-nchw-old-name-after-rename", ("--keras", "{image_file}", "--rename-inputs", "pixels",
                                                 "--inputs-as-nchw", "pixel"),
        "unknown name 'pixel' in --inputs-as-nchw; the model's inputs are: pixels"),
    Bad("outputs-as-nchw-unknown", ("--keras", "{image_file}", "--outputs-as-nchw", "image"),
        "unknown name 'image' in --outputs-as-nchw; the model's outputs are: grid"),
    Bad("inputs-as-nchw-rank-3", ("--saved-model", "{sequence_saved_model}", "--inputs-as-nchw", "x"),
        "--inputs-as-nchw: x has rank 3; NHWC <-> NCHW takes rank 4"),
    Bad("outputs-as-nchw-rank-2", ("--keras", "{sequence_file}", "--outputs-as-nchw", "seq_head"),
        "--outputs-as-nchw: seq_head has rank 2; NHWC <-> NCHW takes rank 4"),
    Bad("extra-opset-no-version", ("--keras", "{sequence_file}", "--extra_opset", "com.microsoft"),
        "--extra_opset 'com.microsoft' is not domain:version"),
    Bad("extra-opset-bad-version", ("--keras", "{sequence_file}", "--extra-opset", "com.microsoft:one"),
        "--extra_opset 'com.microsoft:one' is not domain:version"),
    Bad("extra-opset-default-domain", ("--keras", "{sequence_file}", "--extra_opset", "ai.onnx:17"),
        "--extra_opset cannot import 'ai.onnx'.*--opset"),
    Bad("extra-opset-version-0", ("--keras", "{sequence_file}", "--extra_opset", "com.microsoft:0"),
        "the version must be 1 or more"),
    Bad("extra-opset-domain-twice", ("--keras", "{sequence_file}", "--extra_opset", "com.microsoft:1,com.microsoft:2"),
        "gives the domain 'com.microsoft' more than once"),
    Bad("target-unknown", ("--keras", "{sequence_file}", "--target", "rs7"),
        "unknown --target 'rs7'; known: rs4, .*tensorrt"),
    Bad("target-one-unknown-of-two", ("--saved-model", "{sequence_saved_model}", "--target", "rs4,winml"),
        "unknown --target 'winml'"),
    Bad("inputs-unknown-name-keras", ("--keras", "{sequence_file}", "--inputs", "y[1,50,16]"),
        "unknown name 'y' in --inputs; the model's inputs are: x"),
    Bad("inputs-unknown-name-saved-model", ("--saved-model", "{sequence_saved_model}", "--inputs", "y[1,50,16]"),
        "unknown name 'y' in --inputs; the model's inputs are: x"),
    Bad("inputs-wrong-rank-keras", ("--keras", "{sequence_file}", "--inputs", "x[1,50]"),
        r"input x: --inputs has rank 2 \[1, 50\], the model takes rank 3"),
    Bad("inputs-wrong-rank-saved-model", ("--saved-model", "{sequence_saved_model}", "--inputs", "x[1,50]"),
        r"input x: --inputs has rank 2 \[1, 50\], the model takes rank 3"),
    Bad("inputs-wrong-features-keras", ("--keras", "{sequence_file}", "--inputs", "x[1,50,15]"),
        "input x: dimension 2 is 15 in --inputs, the model's is 16"),
    Bad("inputs-wrong-features-saved-model", ("--saved-model", "{sequence_saved_model}", "--inputs", "x[1,50,15]"),
        "input x: dimension 2 is 15 in --inputs, the model's is 16"),
    Bad("inputs-zero-dimension", ("--keras", "{sequence_file}", "--inputs", "x[0,50,16]"),
        "a dimension must be a positive size or -1"),
    Bad("inputs-not-a-number", ("--keras", "{sequence_file}", "--inputs", "x[1,a,16]"),
        "argument --inputs: a dimension of x is not a whole number"),
    Bad("large-model-failing-writes-no-data", ("--keras", "{sequence_file}", "--large_model", "--rename-inputs",
                                               "a,b"), r"--rename-inputs gives 2 name\(s\)"),
    Bad("unconverted-op", ("--saved-model", "{lgamma_saved_model}", "--large_model"),
        "tf2onnx could not convert these TensorFlow ops: Lgamma"),
]
FIXTURES = ("image_file", "sequence_file", "sequence_saved_model", "functions_saved_model", "lgamma_saved_model")


@pytest.mark.parametrize("case", BAD, ids=[case.id for case in BAD])
def test_bad_flag_exits_2_with_one_error_line(case, request, tmp_path, capfd):
    paths = {name: request.getfixturevalue(name).path for name in FIXTURES if "{" + name + "}" in " ".join(case.argv)}
    output = tmp_path / "model.onnx"
    output.write_bytes(b"previous model")
    code = cli.main([arg.format(**paths) for arg in case.argv] + ["--output", str(output)])
    out, err = capfd.readouterr()
    # TensorFlow's runtime, already loaded in this test process, may log a C++ line (cuInit) at any time
    err = helpers.without_tf_log(err)
    assert code == cli.EXIT_BAD_INPUT == 2, err
    line = assert_one_error_line(err)
    assert re.search(case.message, line), line
    assert "recurrent loop" not in out and "wrote" not in out
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]  # no .data, no temporary files
    assert output.read_bytes() == b"previous model"


def test_source_options_are_checked_by_the_api(sequence_file, sequence_saved_model):
    """The checks the command runs before loading anything are the API's, for Python callers too."""
    with pytest.raises(ConversionError, match="^concrete_function applies to saved_model only$"):
        sources.choose(keras_model=sequence_file.model, concrete_function=0)
    with pytest.raises(ConversionError, match="^input_signature applies to keras_model only$"):
        sources.choose(saved_model=sequence_saved_model.path, input_signature=[tf.TensorSpec([None, None, 16])])
    with pytest.raises(ConversionError, match="give one source"):
        sources.choose(keras_model=sequence_file.model, saved_model=sequence_saved_model.path)
    with pytest.raises(ConversionError, match="^concrete_function is an index from 0, got -1$"):
        api.run(sources.choose(saved_model=sequence_saved_model.path, concrete_function=-1))


@pytest.mark.parametrize("kwargs, message", [
    ({"rename_inputs": ["a", ""]}, "^rename_inputs: every name must be a non-empty string"),
    ({"inputs_as_nchw": [3]}, "^inputs_as_nchw: every name must be a non-empty string"),
    ({"extra_opset": [("com.microsoft", 1)]}, "^extra_opset takes domain:version strings"),
    ({"extra_opset": "ai.onnx.ml:3"}, "^extra_opset cannot import 'ai.onnx.ml'"),
    ({"inputs": {"x": [1, True, 16]}}, "a dimension must be a positive size"),
    ({"inputs": [1, 50, 16]}, "^inputs takes a dict"),
    ({"tagret": ["rs4"]}, "unknown option 'tagret'"),
], ids=["empty-rename", "nchw-not-a-name", "opset-tuple", "ml-domain", "bool-dimension", "inputs-list",
        "misspelled-option"])
def test_options_refused_before_converting(kwargs, message):
    with pytest.raises(ConversionError, match=message):
        options.Options.of(**kwargs)


# -- the parser ----------------------------------------------------------------------------------
@pytest.mark.parametrize("hyphen, underscore", [
    ("--inputs-as-nchw", "--inputs_as_nchw"), ("--outputs-as-nchw", "--outputs_as_nchw"),
    ("--rename-inputs", "--rename_inputs"), ("--rename-outputs", "--rename_outputs"),
    ("--extra-opset", "--extra_opset"), ("--concrete-function", "--concrete_function"),
])
def test_both_spellings_of_valued_flags(hyphen, underscore):
    parser = cli.build_parser()
    value = "1" if "concrete" in hyphen else "a,b"
    assert vars(parser.parse_args(["--keras", "m.keras", "--output", "o", hyphen, value])) == \
        vars(parser.parse_args(["--keras", "m.keras", "--output", "o", underscore, value]))


def test_parsed_flag_values():
    args = cli.build_parser().parse_args([
        "--saved-model", "d", "--output", "o", "--large-model", "--continue-on-error", "--target", "rs4,tensorrt",
        "--extra_opset", "com.microsoft:1,ai.onnx.contrib:1", "--inputs", "x:0[1,-1,16],mask[1,?]",
        "--rename-inputs", "a,b", "--outputs_as_nchw", "y"])
    assert args.large_model and args.continue_on_error
    assert args.target == ["rs4", "tensorrt"]
    assert args.extra_opset == ["com.microsoft:1", "ai.onnx.contrib:1"]
    assert args.inputs == {"x": [1, None, 16], "mask": [1, None]}
    assert args.rename_inputs == ["a", "b"] and args.outputs_as_nchw == ["y"]
    options = cli._options(args)
    assert [(o.domain, o.version) for o in options.extra_opset] == [("com.microsoft", 1),
                                                                                ("ai.onnx.contrib", 1)]
    assert options.large_model and options.continue_on_error and options.rename_inputs == ("a", "b")


def test_runtime_notes_end_the_report_with_each_runtimes_reason(sequence_file, tmp_path, capfd):
    """The report says where the model runs in a few lines; each other runtime's reason only when asked."""
    plain = convert_ok(["--keras", sequence_file.path, "--output", tmp_path / "a.onnx"], capfd)
    asked = convert_ok(["--keras", sequence_file.path, "--output", tmp_path / "b.onnx", "--runtime-notes"], capfd)
    assert "runs in, as ONNX defines it: onnxruntime" in plain and "for the others, --target iree" in plain, plain
    notes = [line for line in asked.splitlines() if line.startswith("note: Apache TVM")]
    assert notes and "fixed shapes" in notes[0] and "--target tvm" in notes[0], asked
    assert "note: Apache TVM" not in plain, plain
