"""Frozen graphs: :func:`tf2onnx_rnn.convert_graph_def` (``--graphdef``) and
:func:`tf2onnx_rnn.convert_checkpoint` (``--checkpoint``).

A Keras model frozen with ``convert_variables_to_constants_v2(..., lower_control_flow=False)`` keeps
its layers' while-loops functional: it converts fused and exact, as its SavedModel does, in both
Keras flavors. Frozen with the default lowering, its loops are TF1 control flow over TensorLists:
they fuse too, and one that cannot (tf2onnx has no other ONNX form of it) is refused in one line.
TF 1.x graphs (``dynamic_rnn`` and its kin) are tests/test_tf1_graphs.py's. Verifying runs the graph,
so a graph holding ops that reach outside TensorFlow is verified only with ``safe_mode=False``;
converting never runs it.
"""
from __future__ import annotations

import functools
import os
import tempfile
import zlib

import numpy as np
import onnx
import pytest

import helpers
import parity
from tf2onnx_rnn import ConversionError, convert_checkpoint, convert_graph_def, report_of

UNITS, FEATURES = 4, 3
_DIR = tempfile.mkdtemp(prefix="frozen_graphs_")


@functools.lru_cache(maxsize=None)
def frozen_keras(flavor: str, lowered: bool = False) -> tuple:
    """(the Keras model: LSTM -> Bidirectional GRU, the .pb path, input tensors, output tensors)."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    hidden = K.layers.LSTM(UNITS, return_sequences=True)(x)
    model = K.Model(x, K.layers.Bidirectional(K.layers.GRU(UNITS))(hidden))
    parity.randomize_weights(model, zlib.crc32(f"frozen/{flavor}".encode()))
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, None, FEATURES], tf.float32, name="x"))
    frozen = convert_variables_to_constants_v2(function, lower_control_flow=lowered)
    path = os.path.join(_DIR, f"{flavor}{'_lowered' if lowered else ''}.pb")
    with open(path, "wb") as stream:
        stream.write(frozen.graph.as_graph_def().SerializeToString())
    return model, path, [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]


@pytest.mark.parametrize("lowered", (False, True), ids=("functional", "lowered"))
@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_frozen_keras_model_fuses_exactly(flavor, lowered):
    """Frozen with its loops kept functional, or the way most guides show (``lower_control_flow=True``,
    the default: the layers' loops become TF1 control flow over TensorLists, read as they are), the
    layers fuse alike."""
    model, path, inputs, outputs = frozen_keras(flavor, lowered=lowered)
    proto = convert_graph_def(path, inputs=inputs, outputs=outputs)
    assert not helpers.nodes_of_types(proto, helpers.LOOP_OPS), helpers.op_counts(proto)
    assert sorted(o.became for o in report_of(proto).outcomes) == ["GRU", "GRU", "LSTM"]
    session = helpers.ort_session(proto)
    for batch, steps in ((3, 6), (1, 2)):
        x = np.random.default_rng(batch).standard_normal((batch, steps, FEATURES)).astype(np.float32)
        (actual,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_allclose(actual, np.asarray(model(x, training=False)), atol=1e-5, rtol=0)


def test_inputs_take_shapes_and_names_without_their_index():
    model, path, inputs, outputs = frozen_keras(parity.FLAVORS[0])
    proto = convert_graph_def(path, inputs={inputs[0].split(":")[0]: [2, 7, FEATURES]},
                              outputs=[o.split(":")[0] for o in outputs])
    dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 7, FEATURES]


def test_a_lowered_loop_that_stays_a_loop_is_refused_with_the_way_out(tmp_path):
    """A lowered loop has no ONNX form but a fused node (tf2onnx's Loop of it carries TensorLists
    onnxruntime cannot load): one that cannot be fused (selu) is refused naming it, with how to freeze."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, FEATURES), name="x")
    model = K.Model(x, K.layers.SimpleRNN(UNITS, activation="selu", name="selu_rnn")(x))
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, None, FEATURES], tf.float32, name="x"))
    frozen = convert_variables_to_constants_v2(function)
    path = str(tmp_path / "lowered_selu.pb")
    with open(path, "wb") as stream:
        stream.write(frozen.graph.as_graph_def().SerializeToString())
    with pytest.raises(ConversionError, match=r"selu_rnn.*lower_control_flow=False"):
        convert_graph_def(path, inputs=[t.name for t in frozen.inputs], outputs=[t.name for t in frozen.outputs])


@pytest.mark.parametrize("given, message", [
    (dict(inputs=["nope:0"]), "unknown tensor 'nope:0' in inputs"),
    (dict(outputs=["nope"]), "unknown tensor 'nope' in outputs"),
    (dict(outputs=[]), "needs outputs"),
    (dict(inputs=None), "needs inputs"),
])
def test_bad_tensor_names_are_refused(given, message):
    _, path, inputs, outputs = frozen_keras(parity.FLAVORS[0])
    arguments = {**dict(inputs=inputs, outputs=outputs), **given}
    with pytest.raises(ConversionError, match=message):
        convert_graph_def(path, **arguments)


def _writing_graph(canary: str) -> tuple:
    """A graph whose output waits on writing a file: (path, inputs, outputs)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        with tf.control_dependencies([tf.io.write_file(canary, "written")]):
            tf.identity(x * 2.0, name="y")
    path = os.path.join(_DIR, "writes.pb")
    with open(path, "wb") as stream:
        stream.write(graph.as_graph_def().SerializeToString())
    return path, ["x:0"], ["y:0"]


def test_verifying_a_graph_that_writes_a_file_needs_the_opt_in(tmp_path):
    canary = str(tmp_path / "canary.txt")
    path, inputs, outputs = _writing_graph(canary)
    convert_graph_def(path, inputs=inputs, outputs=outputs)  # converting runs nothing
    assert not os.path.exists(canary)
    with pytest.raises(ConversionError, match=r"WriteFile .*safe_mode=False"):
        convert_graph_def(path, inputs=inputs, outputs=outputs, verify=True)
    assert not os.path.exists(canary)
    convert_graph_def(path, inputs=inputs, outputs=outputs, verify=True, safe_mode=False)
    assert os.path.exists(canary)


def test_a_checkpoint_converts_from_its_meta_graph(tmp_path):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        kernel = tf.compat.v1.get_variable("kernel", initializer=np.arange(12, dtype=np.float32).reshape(3, 4))
        tf.tanh(tf.matmul(x, kernel) / 10.0, name="y")
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = saver.save(session, str(tmp_path / "model"))
    proto = convert_checkpoint(prefix + ".meta", inputs=["x:0"], outputs=["y:0"], verify=True)
    x = np.ones((2, 3), np.float32)
    (actual,) = helpers.ort_session(proto).run(None, {"x:0": x})
    np.testing.assert_allclose(actual, np.tanh(x @ np.arange(12, dtype=np.float32).reshape(3, 4) / 10), atol=1e-6)


def test_the_command_line_converts_and_verifies_a_frozen_graph(tmp_path, capfd):
    from tf2onnx_rnn import convert as cli

    _, path, inputs, outputs = frozen_keras("tf_keras")
    output = tmp_path / "model.onnx"
    code = cli.main(["--graphdef", path, "--inputs", ",".join(inputs), "--outputs", ",".join(outputs),
                     "--output", str(output), "--verify"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "3 fused into native nodes" in out and "ONNX vs TensorFlow" in out, out
    assert helpers.op_types(onnx.load(str(output))).count("GRU") == 1  # one bidirectional node
