"""``TimeDistributed`` around and inside recurrent layers, and the check that keeps a wrong axis out.

Keras 3's ``TimeDistributed`` traced over a dynamic time axis computes its output over as many steps
as the batch has rows (TensorFlow itself does, in the traced graph); the conversion traces it as
tf_keras does, the inner layer once over the merged batch and time axes. Every model here is built in
both Keras flavors, with a dynamic and a fixed time axis, every weight random, converted once per
process, and checked for:

- no ``Loop`` or ``Scan`` anywhere; one native node per recurrent layer; for a ``Dense`` inside a
  ``TimeDistributed``, one ``MatMul`` (or ``Gemm``) per Dense whatever T is;
- onnxruntime equal to ``model(x, training=False)`` within 1e-5 at batch 1 and batch 3, time 5 and 7
  (batch never equal to time), masked inputs mixing full, post-padded, pre-padded, holed and empty rows;
- the default output shape check, which ran against Keras (the report says so).

Then the check itself: a conversion broken on purpose (Keras 3's own trace; an output whose time axis
follows the batch, for every source) is refused naming the output, nothing written; a source that may
not run under safe mode is not run and the report says the check was skipped and why; a Keras 3
SavedModel holding the mistraced layer is refused in one line; a TensorFlow error while reading a
model is a ``ConversionError``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import onnx
import pytest

import helpers
import parity
import tf2onnx_rnn
from tf2onnx_rnn import ConversionError, VerificationError, api, convert
from tf2onnx_rnn.report import REMOVED
from tf2onnx_rnn.sources.keras_file import KerasFile

TOLERANCE = 1e-5
ROUNDS = ((1, 5), (3, 7))  # (batch, time): batch never equals time
FIXED_TIME = 6
WORDS = 4  # words per sentence in the hierarchical models (fixed where time is fixed)
VOCAB = 12


# -- the models ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """A model around TimeDistributed: ``build(K, time)`` with ``time`` None (dynamic) or fixed."""

    name: str
    build: Callable
    recurrent: tuple  # (ONNX op, node count) of the recurrent nodes
    matmuls: Optional[int] = None  # MatMul + Gemm nodes the whole model must have (None: not counted)
    tokens: bool = False  # integer inputs (an Embedding reads them); 0 is padding
    masked: bool = False  # zeros (or token 0) in the inputs mask steps
    hierarchical: bool = False  # input (batch, sentences, words, ...): the mask is per word
    only: Optional[str] = None  # the flavor the model exists in (a Keras-version-specific form)


def _lstm_dense(K, time):
    x = K.Input((time, 8), name="x")
    h = K.layers.LSTM(6, return_sequences=True)(x)
    return K.Model(x, K.layers.TimeDistributed(K.layers.Dense(3))(h))


def _bilstm_softmax(K, time):
    x = K.Input((time, 8), name="x")
    h = K.layers.Bidirectional(K.layers.LSTM(6, return_sequences=True))(x)
    return K.Model(x, K.layers.TimeDistributed(K.layers.Dense(5, activation="softmax"))(h))


def _embedding_gru_dense(K, time):
    x = K.Input((time,), dtype="int32", name="tokens")
    h = K.layers.Embedding(VOCAB, 8, mask_zero=True)(x)
    h = K.layers.GRU(6, return_sequences=True)(h)
    return K.Model(x, K.layers.TimeDistributed(K.layers.Dense(4))(h))


def _masking_gru_dense(K, time):
    x = K.Input((time, 8), name="x")
    h = K.layers.GRU(6, return_sequences=True)(K.layers.Masking(0.0)(x))
    return K.Model(x, K.layers.TimeDistributed(K.layers.Dense(3))(h))


def _words(time):
    return None if time is None else WORDS


def _hierarchical_lstm(K, time):
    x = K.Input((time, _words(time), 8), name="x")
    h = K.layers.TimeDistributed(K.layers.LSTM(6))(x)
    return K.Model(x, K.layers.LSTM(4)(h))


def _hierarchical_gru(K, time):
    x = K.Input((time, _words(time), 8), name="x")
    h = K.layers.TimeDistributed(K.layers.GRU(5, reset_after=False))(x)
    return K.Model(x, K.layers.GRU(3, return_sequences=True)(h))


def _hierarchical_masked(K, time):
    """Words masked inside each sentence: a Masking layer inside the wrapped model."""
    x = K.Input((time, _words(time), 8), name="x")
    words = K.Sequential([K.layers.Masking(0.0), K.layers.LSTM(6)])
    h = K.layers.TimeDistributed(words)(x)
    return K.Model(x, K.layers.LSTM(4)(h))


def _hierarchical_embedding(K, time):
    """tf_keras's TimeDistributed reduces the word mask to a sentence mask for the next layer
    (Keras 3 hands the next layer the word mask, which its LSTM cannot take)."""
    x = K.Input((time, _words(time)), dtype="int32", name="tokens")
    h = K.layers.Embedding(VOCAB, 8, mask_zero=True)(x)
    h = K.layers.TimeDistributed(K.layers.LSTM(6))(h)
    return K.Model(x, K.layers.LSTM(4)(h))


def _conv1d(K, time):
    x = K.Input((time, 10, 3), name="x")
    h = K.layers.TimeDistributed(K.layers.Conv1D(4, 3))(x)
    h = K.layers.TimeDistributed(K.layers.Flatten())(h)
    return K.Model(x, K.layers.LSTM(5)(h))


def _sequential(K, time):
    x = K.Input((time, 8), name="x")
    h = K.layers.LSTM(6, return_sequences=True)(x)
    head = K.Sequential([K.layers.Dense(6, activation="relu"), K.layers.Dense(3)])
    return K.Model(x, K.layers.TimeDistributed(head)(h))


MODELS = [
    Model("lstm-dense", _lstm_dense, ("LSTM", 1), matmuls=1),
    Model("bilstm-dense-softmax", _bilstm_softmax, ("LSTM", 1), matmuls=1),
    Model("embedding-gru-dense", _embedding_gru_dense, ("GRU", 1), matmuls=1, tokens=True, masked=True),
    Model("masking-gru-dense", _masking_gru_dense, ("GRU", 1), matmuls=1, masked=True),
    Model("hierarchical-lstm", _hierarchical_lstm, ("LSTM", 2), matmuls=0),
    Model("hierarchical-gru", _hierarchical_gru, ("GRU", 2), matmuls=0),
    Model("hierarchical-masked", _hierarchical_masked, ("LSTM", 2), matmuls=0, masked=True, hierarchical=True),
    Model("hierarchical-embedding", _hierarchical_embedding, ("LSTM", 2), matmuls=0, tokens=True, masked=True,
          hierarchical=True, only="tf_keras"),
    Model("conv1d", _conv1d, ("LSTM", 1), matmuls=0),
    Model("sequential-head", _sequential, ("LSTM", 1), matmuls=2),
]


@dataclass(frozen=True)
class Case:
    model: Model
    fixed: bool

    @property
    def id(self) -> str:
        return f"{self.model.name}-{'fixed' if self.fixed else 'dynamic'}-time"


def build(flavor: str, case: Case):
    K = parity.keras_module(flavor)
    model = case.model.build(K, FIXED_TIME if case.fixed else None)
    parity.randomize_weights(model, parity.case_seed(flavor, case))
    return model


CASES = [pytest.param(flavor, Case(model, fixed), id=f"{flavor}-{Case(model, fixed).id}")
         for flavor in parity.FLAVORS for model in MODELS for fixed in (False, True)
         if model.only in (None, flavor)]


# -- inputs ----------------------------------------------------------------------------------------

# how each row of a masked batch is kept: full, post-padded, pre-padded, holed, empty
ROW_KINDS = ("full", "post", "pre", "holed", "empty")


def _kept(kind: str, length: int) -> np.ndarray:
    kept = np.ones(length, bool)
    if kind == "post":
        kept[max(1, length // 2):] = False
    elif kind == "pre":
        kept[:max(1, length // 2)] = False
    elif kind == "holed":
        kept[1:length - 1:2] = False
    elif kind == "empty":
        kept[:] = False
    return kept


def inputs_for(model: Model, shape: tuple, seed: int) -> np.ndarray:
    """Random inputs of ``shape``; masked models get rows of every kind (over the words of each
    sentence in a hierarchical model, over the steps otherwise), batch 1 a post-padded row."""
    rng = np.random.default_rng(seed)
    if model.tokens:
        x = rng.integers(1, VOCAB, shape).astype(np.int32)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    if not model.masked:
        return x
    rows = x.reshape((-1,) + shape[2:]) if model.hierarchical else x
    for index, row in enumerate(rows):
        kind = "post" if len(rows) == 1 else ROW_KINDS[index % len(ROW_KINDS)]
        row[~_kept(kind, row.shape[0])] = 0
    return x


def shape_of(case: Case, batch: int, time: int) -> tuple:
    time = FIXED_TIME if case.fixed else time
    words = WORDS if case.fixed else time + 1  # words differ from sentences too
    inner = {"lstm-dense": (8,), "bilstm-dense-softmax": (8,), "embedding-gru-dense": (),
             "masking-gru-dense": (8,), "hierarchical-lstm": (words, 8), "hierarchical-gru": (words, 8),
             "hierarchical-masked": (words, 8), "hierarchical-embedding": (words,), "conv1d": (10, 3),
             "sequential-head": (8,)}[case.model.name]
    return (batch, time) + inner


# -- parity ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", CASES)
def test_time_distributed_converts_exactly_and_lean(flavor, case):
    entry = parity.converted_with(flavor, case, build)
    model, proto = entry.model, entry.proto
    table = parity.report_table(proto)
    counts = helpers.op_counts(proto)
    assert not helpers.nodes_of_types(proto, helpers.LOOP_OPS), table
    assert {op: counts[op] for op in helpers.RECURRENT_OPS if counts[op]} == dict([case.model.recurrent]), table
    if case.model.matmuls is not None:
        assert counts["MatMul"] + counts["Gemm"] == case.model.matmuls, dict(counts)
    report = tf2onnx_rnn.report_of(proto)
    # Keras 2.15 may trace a masked inner model twice (once for its mask); tf2onnx drops that copy
    assert report.fused and all(row.fused or row.became == REMOVED for row in report.outcomes), table
    assert {row.layer for row in report.outcomes} == {row.layer for row in report.fused}, table
    assert report.checked.startswith("output shapes checked against Keras"), report.checked
    session = helpers.ort_session(proto)
    name = session.get_inputs()[0].name
    for index, (batch, time) in enumerate(ROUNDS):
        x = inputs_for(case.model, shape_of(case, batch, time), seed=index)
        expected = [np.asarray(model(x, training=False))]
        actual = session.run(None, {name: x})
        problems, _ = parity.output_problems(f"batch {batch}, input {x.shape}", ["y"], expected, actual, TOLERANCE)
        assert not problems, "\n".join(problems) + "\n" + table


def test_the_inner_layers_rows_carry_the_wrappers_name():
    """A recurrent layer inside a TimeDistributed is reported under the wrapper's name, as a
    Bidirectional's halves are."""
    flavor = parity.FLAVORS[0]
    case = Case(MODELS[4], False)  # hierarchical-lstm
    proto = parity.converted_with(flavor, case, build).proto
    names = [row.layer for row in tf2onnx_rnn.report_of(proto).outcomes]
    wrapper = [layer.name for layer in parity.converted_with(flavor, case, build).model.layers
               if type(layer).__name__ == "TimeDistributed"][0]
    assert wrapper in names and len(names) == 2, names


# -- the check --------------------------------------------------------------------------------------

def _time_follows_batch(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its first output cut to as many steps (axis 1) as the batch has rows: the wrong
    axis a mistranslated loop gives, right wherever batch equals time."""
    graph = model_proto.graph
    output = graph.output[0]
    cut = output.name + "_cut"
    for node in graph.node:
        node.output[:] = [cut if name == output.name else name for name in node.output]
    graph.initializer.extend([onnx.numpy_helper.from_array(np.array([0], np.int64), "cut_zero"),
                              onnx.numpy_helper.from_array(np.array([1], np.int64), "cut_axis"),
                              onnx.numpy_helper.from_array(np.array([0], np.int64), "cut_batch_axis")])
    graph.node.extend([onnx.helper.make_node("Shape", [cut], ["cut_shape"]),
                       onnx.helper.make_node("Gather", ["cut_shape", "cut_batch_axis"], ["cut_batch"]),
                       onnx.helper.make_node("Slice", [cut, "cut_zero", "cut_batch", "cut_axis"], [output.name])])
    for dim in output.type.tensor_type.shape.dim[1:2]:
        dim.ClearField("dim_value")
        dim.dim_param = "cut"
    return model_proto


@pytest.fixture
def broken(monkeypatch):
    """Every conversion in the test comes out with its first output's time axis following the batch."""
    convert_graph = api.to_onnx

    def converted(*args):
        model_proto, nchw, findings = convert_graph(*args)
        return _time_follows_batch(model_proto), nchw, findings

    monkeypatch.setattr(api, "to_onnx", converted)


def _tagger(K, time=None):
    model = _lstm_dense(K, time)
    parity.randomize_weights(model, 7)
    return model


def _refused(call, output_path=None) -> str:
    with pytest.raises(VerificationError) as caught:
        call()
    message = str(caught.value)
    assert message.startswith("the output shape check failed: output "), message
    assert output_path is None or not output_path.exists()
    return message


@parity.only_keras3
def test_keras3s_own_trace_of_time_distributed_is_caught_by_the_default_check(monkeypatch, tmp_path):
    """Without the conversion's own trace of TimeDistributed, Keras 3's gives an output whose time
    axis is the batch size: the check refuses it, naming the output and both shapes."""
    import keras

    from tf2onnx_rnn.sources import keras_model

    monkeypatch.setattr(keras_model, "merged_time_axis", lambda model: contextlib.nullcontext())
    with pytest.raises(ConversionError, match=r"^time_distributed\S*: a Keras 3 TimeDistributed traced over"):
        tf2onnx_rnn.convert_keras(_tagger(keras))
    monkeypatch.setattr(api, "refuse_mistraced", lambda graph_def: None)  # and without the graph's refusal
    output = tmp_path / "model.onnx"
    message = _refused(lambda: tf2onnx_rnn.convert_keras(_tagger(keras), output_path=str(output)), output)
    assert "shape (2, 2, 3) vs Keras (2, 5, 3)" in message, message


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_broken_keras_conversion_is_refused(flavor, broken, tmp_path):
    output = tmp_path / "model.onnx"
    K = parity.keras_module(flavor)
    message = _refused(lambda: tf2onnx_rnn.convert_keras(_tagger(K), output_path=str(output)), output)
    assert "vs Keras (2, 5, 3)" in message, message


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tagger (LSTM -> Dense) as a .keras file, a SavedModel, a frozen graph and a TFLite file (batch 1,
    dynamic time)."""
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    folder = tmp_path_factory.mktemp("tagger")
    x = keras.Input((None, 8), name="x")
    model = keras.Model(x, keras.layers.Dense(3)(keras.layers.LSTM(6, return_sequences=True)(x)))
    parity.randomize_weights(model, 5)
    paths = {"keras": str(folder / "tagger.keras"), "saved_model": str(folder / "saved_model"),
             "graphdef": str(folder / "frozen.pb"), "tflite": str(folder / "tagger.tflite")}
    model.save(paths["keras"])
    function = tf.function(lambda x: model(x, training=False))
    concrete = function.get_concrete_function(tf.TensorSpec([None, None, 8], tf.float32, name="x"))
    module = tf.Module()
    module.model, module.serve = model, function
    tf.saved_model.save(module, paths["saved_model"], signatures={"serving_default": concrete})
    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=False)
    tf.io.write_graph(frozen.graph.as_graph_def(), str(folder), "frozen.pb", as_text=False)
    x_one = keras.Input((None, 8), batch_size=1, name="x")
    at_batch_one = keras.Model(x_one, model(x_one))
    with open(paths["tflite"], "wb") as stream:
        stream.write(helpers.keras_tflite(at_batch_one))
    inputs = [t.name for t in frozen.inputs]
    outputs = [t.name for t in frozen.outputs]
    return paths, inputs, outputs


@parity.only_keras3
def test_a_broken_conversion_is_refused_from_every_file(files, broken, tmp_path, capfd):
    paths, inputs, outputs = files
    output = tmp_path / "model.onnx"
    _refused(lambda: api.run(KerasFile(paths["keras"]), output_path=str(output)), output)
    _refused(lambda: tf2onnx_rnn.convert_saved_model(paths["saved_model"], output_path=str(output)), output)
    _refused(lambda: tf2onnx_rnn.convert_graph_def(paths["graphdef"], inputs, outputs, output_path=str(output)),
             output)
    message = _refused(lambda: tf2onnx_rnn.convert_tflite(paths["tflite"], output_path=str(output)), output)
    assert "vs TFLite" in message, message
    code = convert.main(["--saved-model", paths["saved_model"], "--output", str(output)])
    err = helpers.without_tf_log(capfd.readouterr().err)
    assert code == convert.EXIT_VERIFICATION_FAILED and not output.exists(), err
    assert "error: the output shape check failed: output " in err, err


@parity.only_keras3
def test_the_check_can_be_turned_off_and_says_so(files, broken, tmp_path, capfd):
    paths, _, _ = files
    proto = tf2onnx_rnn.convert_saved_model(paths["saved_model"], check_shapes=False)
    assert tf2onnx_rnn.report_of(proto).checked == "output shapes not checked (the check was turned off)"
    output = tmp_path / "model.onnx"
    code = convert.main(["--saved-model", paths["saved_model"], "--output", str(output), "--no-check-shapes"])
    out = capfd.readouterr().out
    assert code == convert.EXIT_OK and output.exists() and "output shapes not checked" in out, out


@parity.only_keras3
def test_every_source_says_what_was_checked(files):
    paths, inputs, outputs = files
    for proto, against in ((api.run(KerasFile(paths["keras"])).model_proto, "Keras"),
                           (tf2onnx_rnn.convert_saved_model(paths["saved_model"]), "TensorFlow"),
                           (tf2onnx_rnn.convert_graph_def(paths["graphdef"], inputs, outputs), "TensorFlow"),
                           (tf2onnx_rnn.convert_tflite(paths["tflite"]), "TFLite")):
        checked = tf2onnx_rnn.report_of(proto).checked
        assert checked.startswith(f"output shapes checked against {against} at input shapes "), checked
    verified = tf2onnx_rnn.convert_saved_model(paths["saved_model"], verify=True)
    assert tf2onnx_rnn.report_of(verified).checked.startswith("outputs verified against TensorFlow")


def test_a_source_that_may_not_run_is_not_run_and_the_report_says_why(tmp_path, capfd):
    """Safe mode: the signature writes a file, so the check does not run it; the report names the op.
    Trusted, the check runs it."""
    import keras
    import tensorflow as tf

    canary = tmp_path / "canary"
    module = tf.Module()
    module.lstm = keras.layers.LSTM(4, return_sequences=True)
    module.lstm.build((None, None, 3))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.float32)])
    def serve(x):
        y = module.lstm(x)
        tf.io.write_file(str(canary), "ran")
        return {"y": y}

    module.serve = serve
    path = str(tmp_path / "writes")
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    checked = tf2onnx_rnn.report_of(tf2onnx_rnn.convert_saved_model(path)).checked
    assert checked.startswith("output shapes not checked: ") and "WriteFile" in checked, checked
    assert not canary.exists()
    output = tmp_path / "model.onnx"
    assert convert.main(["--saved-model", path, "--output", str(output)]) == convert.EXIT_OK
    assert "output shapes not checked: " in capfd.readouterr().out and not canary.exists()
    checked = tf2onnx_rnn.report_of(tf2onnx_rnn.convert_saved_model(path, safe_mode=False)).checked
    assert checked.startswith("output shapes checked against TensorFlow") and canary.exists(), checked


@parity.only_keras3
def test_a_keras3_saved_model_holding_the_mistraced_layer_is_refused(tmp_path, capfd):
    """Keras 3's own export of a dynamic-time TimeDistributed computes the wrong shape in TensorFlow:
    refused in one line naming the layer and what to convert instead."""
    import keras

    model = _tagger(keras)
    path = str(tmp_path / "exported")
    model.export(path, verbose=False)
    with pytest.raises(ConversionError, match=r"^time_distributed\S*: a Keras 3 TimeDistributed traced over a "
                                              r"dynamic time axis.*\.keras file"):
        tf2onnx_rnn.convert_saved_model(path)
    output = tmp_path / "model.onnx"
    code = convert.main(["--saved-model", path, "--output", str(output)])
    line = helpers.assert_one_error_line(helpers.without_tf_log(capfd.readouterr().err))
    assert code == convert.EXIT_BAD_INPUT and "TimeDistributed" in line and not output.exists()
    fixed = tmp_path / "fixed"
    with_fixed_time = _tagger(keras, FIXED_TIME)
    with_fixed_time.export(str(fixed), verbose=False)
    proto = tf2onnx_rnn.convert_saved_model(str(fixed), verify=True)
    assert helpers.op_counts(proto)["LSTM"] == 1 and not helpers.nodes_of_types(proto, helpers.LOOP_OPS)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_tensorflow_error_while_reading_a_model_is_a_conversion_error(flavor, monkeypatch):
    """What TensorFlow raises on a model while it is traced and frozen reaches the user as one
    ConversionError, never as TensorFlow's own exception."""
    import tensorflow as tf
    from tf2onnx import tf_loader

    def fails(*args, **kwargs):
        return tf.reshape(tf.zeros([2]), [3])  # InvalidArgumentError, raised inside TensorFlow

    monkeypatch.setattr(tf_loader, "from_trackable", fails)
    with pytest.raises(ConversionError, match=r"^cannot read the model \(keras_model\): InvalidArgumentError"):
        tf2onnx_rnn.convert_keras(_tagger(parity.keras_module(flavor)))
