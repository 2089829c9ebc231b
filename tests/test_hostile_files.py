"""Other people's files: loading and verifying never run what a file carries without the opt-in.

Every model here would leave a canary file if what it carries ran: a ``Lambda`` layer whose Python
function writes it (in ``.keras`` and ``.h5`` files of both Keras flavors), a SavedModel whose
signature writes it or prints into it, one whose resource initializer (run when TensorFlow loads
it) writes it, a Keras model whose call writes it. For each, through the API and the command line:

- without the opt-in the canary never appears, the API raises one ``ConversionError`` and the
  command exits 2 with one error line naming what would run and how to opt in, writing nothing;
- converting without verification runs nothing: a SavedModel whose signature writes converts;
- with the opt-in (``safe_mode=False``, ``--no-safe-mode``) today's behaviour comes back: it loads,
  the canary appears, the model converts to native nodes.

A custom layer the process does not define is refused in one line naming it, and converts once
the Python file defining it is given (``--custom-objects``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

import helpers
import parity
from tf2onnx_rnn import ConversionError, api, sources
from tf2onnx_rnn import convert as cli

FEATURES, UNITS = 3, 4
CANARY = "TF2ONNX_RNN_TEST_CANARY"  # the environment variable naming the canary file a Lambda writes


def _lambda_model(flavor: str):
    """An LSTM and a Lambda whose function writes the file the environment names (written without
    globals, as marshalled bytecode must be)."""
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    y = K.layers.LSTM(UNITS, name="lstm")(x)
    y = K.layers.Lambda(lambda t: (open(__import__("os").environ["TF2ONNX_RNN_TEST_CANARY"], "w").write("ran"),
                                   t)[1] * 2.0, name="leave")(y)
    model = K.Model(x, y, name="hostile")
    parity.randomize_weights(model, 11)
    return model


LAMBDA_FILES = [(flavor, ext) for flavor in parity.FLAVORS for ext in (".keras", ".h5")
                if not (flavor == "tf_keras" and ext == ".keras")]


@pytest.fixture(scope="module")
def lambda_files(tmp_path_factory):
    """Per (flavor, extension): a Keras file with the canary-writing Lambda (building the model ran it
    once: that canary is removed)."""
    folder = tmp_path_factory.mktemp("hostile")
    canary = folder / "built.canary"
    os.environ[CANARY] = str(canary)
    files = {}
    try:
        for flavor, ext in LAMBDA_FILES:
            path = folder / f"{flavor}_lambda{ext}"
            _lambda_model(flavor).save(str(path))
            files[(flavor, ext)] = str(path)
    finally:
        os.environ.pop(CANARY, None)
    canary.unlink(missing_ok=True)
    return files


@pytest.fixture
def canary(tmp_path, monkeypatch):
    path = tmp_path / "canary"
    monkeypatch.setenv(CANARY, str(path))
    return path


def run_cli(argv, capfd) -> tuple:
    code = cli.main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return code, out, helpers.without_tf_log(err)


@pytest.mark.parametrize("flavor, ext", LAMBDA_FILES)
def test_a_keras_file_with_code_is_refused_before_loading(flavor, ext, lambda_files, canary, tmp_path, capfd):
    path = lambda_files[(flavor, ext)]
    with pytest.raises(ConversionError) as refused:
        api.run(sources.choose(keras_file=path))
    assert "layer 'leave' (Lambda" in str(refused.value) and "safe_mode=False" in str(refused.value)
    output = tmp_path / "model.onnx"
    code, out, err = run_cli(["--keras", path, "--output", output], capfd)
    line = helpers.assert_one_error_line(err)
    assert code == 2 and "layer 'leave' (Lambda: marshalled Python bytecode)" in line and "--no-safe-mode" in line
    assert not canary.exists() and not output.exists()


@pytest.mark.parametrize("flavor, ext", LAMBDA_FILES)
def test_the_opt_in_loads_a_keras_file_with_code(flavor, ext, lambda_files, canary, tmp_path):
    """In a process of its own, as a user runs it (Keras 2.15 hangs loading a Lambda in a process
    that also built a tf_keras model, as the test process has)."""
    output = tmp_path / "model.onnx"
    done = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--keras", lambda_files[(flavor, ext)],
                           "--output", str(output), "--no-safe-mode", "--verify"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert canary.exists(), "the opt-in did not load the Lambda"
    assert helpers.op_counts(onnx.load(str(output)))["LSTM"] == 1 and "verification" in done.stdout


# -- SavedModels ----------------------------------------------------------------------------------
def _saved_models(folder, canary: str) -> dict:
    """SavedModels, each with an LSTM, that touch ``canary`` in one way."""
    import keras
    import tensorflow as tf

    def module(serve_extra=None, resource=None):
        m = tf.Module()
        m.lstm = keras.layers.LSTM(UNITS)
        m.lstm.build((None, None, FEATURES))
        m.resource = resource

        @tf.function(input_signature=[tf.TensorSpec([None, None, FEATURES], tf.float32)])
        def serve(x):
            y = m.lstm(x)
            if serve_extra is not None:
                serve_extra(y)
            return {"y": y}

        m.serve = serve
        return m

    class WritesAtLoad(tf.saved_model.experimental.TrackableResource):
        def _create_resource(self):
            return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="hostile_canary")

        def _initialize(self):
            tf.io.write_file(canary, "ran at load")

    modules = {"signature-writes": module(lambda y: tf.io.write_file(canary, "ran")),
               "signature-prints": module(lambda y: tf.print(y, output_stream="file://" + canary)),
               "loading-writes": module(resource=WritesAtLoad())}
    paths = {}
    for name, m in modules.items():
        paths[name] = str(folder / name)
        tf.saved_model.save(m, paths[name], signatures={"serving_default": m.serve})
    return paths


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile_saved_models")
    canary = folder / "canary"
    return _saved_models(folder, str(canary)), canary


@pytest.mark.parametrize("name, op", [("signature-writes", "WriteFile"), ("signature-prints", "PrintV2")])
def test_verifying_a_saved_model_that_reaches_outside_is_refused(name, op, saved_models, tmp_path, capfd):
    paths, canary = saved_models
    canary.unlink(missing_ok=True)
    output = tmp_path / "model.onnx"
    code, out, err = run_cli(["--saved-model", paths[name], "--output", output], capfd)
    assert code == 0 and output.exists() and not canary.exists(), err  # converting runs nothing
    output.unlink()
    with pytest.raises(ConversionError, match=f"verification runs the signature 'serving_default'.*{op}"):
        api.convert_saved_model(paths[name], verify=True)
    code, out, err = run_cli(["--saved-model", paths[name], "--output", output, "--verify"], capfd)
    line = helpers.assert_one_error_line(err)
    assert code == 2 and op in line and "--no-safe-mode" in line, err
    assert not canary.exists() and not output.exists()
    code, out, err = run_cli(["--saved-model", paths[name], "--output", output, "--verify", "--no-safe-mode"], capfd)
    assert code == 0 and canary.exists() and output.exists(), err


def test_loading_a_saved_model_that_reaches_outside_is_refused(saved_models, tmp_path, capfd):
    paths, canary = saved_models
    canary.unlink(missing_ok=True)
    output = tmp_path / "model.onnx"
    with pytest.raises(ConversionError, match="loading the SavedModel runs ops that reach outside.*WriteFile"):
        api.convert_saved_model(paths["loading-writes"])
    code, out, err = run_cli(["--saved-model", paths["loading-writes"], "--output", output], capfd)
    line = helpers.assert_one_error_line(err)
    assert code == 2 and "WriteFile" in line and "--no-safe-mode" in line
    assert not canary.exists() and not output.exists()
    model_proto = api.convert_saved_model(paths["loading-writes"], safe_mode=False)
    assert canary.exists() and helpers.op_counts(model_proto)["LSTM"] == 1


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_verifying_a_keras_model_whose_call_writes_is_refused(flavor, tmp_path):
    import tensorflow as tf

    K = parity.keras_module(flavor)
    canary = tmp_path / "canary"
    x = K.Input((None, FEATURES), name="x")
    y = K.layers.LSTM(UNITS, name="lstm")(x)
    y = K.layers.Lambda(lambda t: (tf.io.write_file(str(canary), "ran"), t)[1], name="writes")(y)
    model = K.Model(x, y)
    parity.randomize_weights(model, 3)
    with pytest.raises(ConversionError, match="verification calls the Keras model.*WriteFile"):
        api.convert_keras(model, verify=True)
    assert not canary.exists()
    model_proto = api.convert_keras(model, verify=True, safe_mode=False)
    assert canary.exists() and helpers.op_counts(model_proto)["LSTM"] == 1


# -- custom objects --------------------------------------------------------------------------------
CUSTOM_LAYER = textwrap.dedent("""
    import keras


    @keras.saving.register_keras_serializable(package="hostile_test")
    class Scale(keras.layers.Layer):
        def call(self, x):
            return x * 3.0
""")


@parity.only_keras3
def test_a_custom_layer_is_named_and_converts_from_its_file(tmp_path):
    """In a fresh process that does not define it, the custom layer is refused by name; given the
    file that defines it, the model converts."""
    layers_file = tmp_path / "my_layers.py"
    layers_file.write_text(CUSTOM_LAYER)
    script = textwrap.dedent(f"""
        import importlib.util, sys, keras
        spec = importlib.util.spec_from_file_location("my_layers", {str(layers_file)!r})
        module = importlib.util.module_from_spec(spec); sys.modules["my_layers"] = module
        spec.loader.exec_module(module)
        x = keras.Input((None, {FEATURES}), name="x")
        keras.Model(x, module.Scale()(keras.layers.GRU({UNITS})(x))).save({str(tmp_path / "custom.keras")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    command = [sys.executable, "-m", "tf2onnx_rnn.convert", "--keras", str(tmp_path / "custom.keras"),
               "--output", str(tmp_path / "m.onnx")]
    refused = subprocess.run(command, capture_output=True, text=True, cwd=str(tmp_path))
    line = helpers.assert_one_error_line(helpers.without_tf_log(refused.stderr))
    assert refused.returncode == 2 and "'Scale'" in line and "'my_layers'" in line and "--custom-objects" in line
    done = subprocess.run(command + ["--custom-objects", str(layers_file)], capture_output=True, text=True,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert helpers.op_counts(onnx.load(str(tmp_path / "m.onnx")))["GRU"] == 1


def test_an_unregistered_tf_keras_layer_is_named(tmp_path, capfd):
    import tf_keras

    class Scale(tf_keras.layers.Layer):
        def call(self, x):
            return x * 3.0

    x = tf_keras.Input((None, FEATURES), name="x")
    path = tmp_path / "custom.h5"
    tf_keras.Model(x, Scale(name="scale")(tf_keras.layers.GRU(UNITS)(x))).save(str(path))
    code, out, err = run_cli(["--keras", path, "--output", tmp_path / "m.onnx"], capfd)
    line = helpers.assert_one_error_line(err)
    assert code == 2 and "'Scale'" in line and "--custom-objects" in line, err
    layers_file = tmp_path / "scale_layer.py"
    layers_file.write_text(textwrap.dedent("""
        import tf_keras


        class Scale(tf_keras.layers.Layer):
            def call(self, x):
                return x * 3.0
    """))
    code, out, err = run_cli(["--keras", path, "--output", tmp_path / "m.onnx", "--custom-objects", layers_file],
                             capfd)
    assert code == 0, err
    x = np.random.default_rng(1).standard_normal((2, 5, FEATURES)).astype(np.float32)
    (y,) = helpers.ort_session(str(tmp_path / "m.onnx")).run(None, {"x": x})
    assert np.all(np.isfinite(y)) and y.shape == (2, UNITS)
