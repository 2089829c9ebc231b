"""Keras 3 models from every backend: ``.keras`` files saved under JAX, PyTorch and NumPy convert on
TensorFlow, exactly, whatever backend the user's environment names.

``tests/data/backends/`` holds small models (LSTM, GRU, SimpleRNN, Bidirectional GRU, a masked LSTM,
Embedding(mask_zero) + Bidirectional LSTM) saved under each backend with the outputs that backend
gave on fixed inputs (``tests/data/make_backend_models.py`` makes them). Each converts to native
nodes and onnxruntime gives the stored outputs within 1e-5, through the API and through the command
line run with ``KERAS_BACKEND`` (or ``keras.json``) naming the file's backend, which need not even
be installed: the command line loads every Keras file on TensorFlow and says so in one line. A live
model object built on another backend is refused by the API in one line saying how to convert it.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

import helpers
import parity

pytestmark = parity.only_keras3

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "backends")
FILES = sorted(glob.glob(os.path.join(DATA, "*.keras")))
TOLERANCE = 1e-5
NATIVE = {"lstm": ["LSTM"], "gru": ["GRU"], "simple_rnn": ["RNN"], "bigru": ["GRU"], "masked_lstm": ["LSTM"],
          "embedding_bilstm": ["LSTM"]}


def stored(path: str) -> tuple:
    """(backend, model name, input, output) of a data file."""
    backend, name = os.path.basename(path)[:-len(".keras")].split("_", 1)
    with np.load(path[:-len(".keras")] + ".npz") as arrays:
        return backend, name, arrays["input"], arrays["output"]


def check(model_proto: onnx.ModelProto, path: str) -> None:
    _, name, x, expected = stored(path)
    ops = helpers.op_counts(model_proto)
    assert sorted(op for op in ops.elements() if op in helpers.RECURRENT_OPS) == NATIVE[name], dict(ops)
    assert not any(ops[op] for op in helpers.LOOP_OPS), dict(ops)
    session = helpers.ort_session(model_proto)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE)


def test_every_backend_has_its_files():
    assert {stored(path)[0] for path in FILES} == {"jax", "torch", "numpy"}
    assert len(FILES) == 18


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p) for p in FILES])
def test_a_file_from_another_backend_converts_exactly(path):
    from tf2onnx_rnn import api, sources

    check(api.run(sources.choose(keras_file=path)).model_proto, path)


def _cli(path: str, output: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--keras", path, "--output", output],
                          capture_output=True, text=True, env={**os.environ, **env})


@pytest.mark.parametrize("backend", ["jax", "torch", "numpy"])
def test_the_cli_loads_on_tensorflow_whatever_the_environment_names(backend, tmp_path):
    path = os.path.join(DATA, f"{backend}_masked_lstm.keras")
    output = str(tmp_path / "model.onnx")
    done = _cli(path, output, {"KERAS_BACKEND": backend})
    assert done.returncode == 0, done.stderr
    notes = [line for line in helpers.without_tf_log(done.stderr).splitlines() if line.strip()]
    assert notes == [f"note: loading on Keras's tensorflow backend (this environment names {backend})"], done.stderr
    check(onnx.load(output), path)


def test_the_cli_overrides_a_backend_keras_json_names(tmp_path):
    home = tmp_path / "keras_home"
    home.mkdir()
    (home / "keras.json").write_text(json.dumps({"backend": "jax", "floatx": "float32"}))
    path = os.path.join(DATA, "jax_bigru.keras")
    env = {"KERAS_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--keras", path, "--output",
                           str(tmp_path / "m.onnx")], capture_output=True, text=True,
                          env={k: v for k, v in {**os.environ, **env}.items() if k != "KERAS_BACKEND"})
    assert done.returncode == 0, done.stderr
    assert "this environment names jax" in done.stderr
    check(onnx.load(str(tmp_path / "m.onnx")), path)


def test_a_live_model_on_another_backend_is_refused_in_one_line():
    pytest.importorskip("jax")  # a second backend (the test extra installs it)
    script = textwrap.dedent("""
        import keras
        from tf2onnx_rnn import ConversionError, convert_keras
        x = keras.Input((None, 3))
        model = keras.Model(x, keras.layers.LSTM(4)(x))
        try:
            convert_keras(model)
        except ConversionError as error:
            print("refused:", error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": "jax"})
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("refused:")]
    assert "jax backend" in line and "model.save" in line and "--keras" not in line, line
