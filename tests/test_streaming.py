"""Streaming: recurrent states in and out of the ONNX model.

The property: with ``streaming=True`` every recurrent layer takes ``<layer>/h_in`` (and
``c_in`` for LSTM) and gives ``<layer>/h_out`` (``c_out``), [batch, units]. Running the ONNX
model over a sequence cut into chunks of uneven sizes (chunks of one step among them), each
chunk's ``*_out`` fed as the next chunk's ``*_in`` from zeros, gives Keras's outputs on the whole
sequence within 1e-5, masked rows (full, post-padded, pre-padded, holed, empty) included. A
``stateful=True`` model converts in that form by itself, and its ONNX model fed chunk by chunk
reproduces the stateful Keras model's successive calls. What cannot stream (a backward pass, a
layer left as a Loop) is a ``ConversionError`` naming the layer.
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest

import helpers
import parity
import tf2onnx_rnn
from test_parity_masking import ROW_KINDS, mask_batch
from tf2onnx_rnn import ConversionError

FEATURES = 3
TIME = 13
CHUNKS = (1, 4, 1, 2, 5)  # uneven, one-step chunks among them; they add up to TIME
TOLERANCE = 1e-5
assert sum(CHUNKS) == TIME


def _layers(K, last_sequences: bool):
    """LSTM -> GRU (reset_after) -> GRU (reset before) -> SimpleRNN: every kind and GRU mode."""
    return [K.layers.LSTM(4, return_sequences=True, name="lstm"),
            K.layers.GRU(5, return_sequences=True, reset_after=True, name="gru_after"),
            K.layers.GRU(3, return_sequences=True, reset_after=False, name="gru_before"),
            K.layers.SimpleRNN(2, return_sequences=last_sequences, name="rnn")]


MODELS = ("stack-sequences", "stack-last", "masked-sequences", "masked-last")
_BUILT: dict = {}


def build(flavor: str, name: str):
    """A stack of every kind over a dynamic batch and time; ``masked`` models start with Masking;
    ``last`` models output only the last step."""
    key = (flavor, name)
    if key not in _BUILT:
        K = parity.keras_module(flavor)
        x = K.Input((None, FEATURES), name="x")
        h = K.layers.Masking(0.0, name="masking")(x) if name.startswith("masked") else x
        for layer in _layers(K, name.endswith("sequences")):
            h = layer(h)
        model = K.Model(x, h, name=name.replace("-", "_"))
        parity.randomize_weights(model, zlib.crc32(f"stream/{flavor}/{name}".encode()))
        _BUILT[key] = (model, tf2onnx_rnn.convert_keras(model, streaming=True))
    return _BUILT[key]


def sequence(name: str, batch: int = len(ROW_KINDS)) -> np.ndarray:
    x = np.random.default_rng(zlib.crc32(name.encode())).standard_normal((batch, TIME, FEATURES))
    if name.startswith("masked"):
        x = x * mask_batch(ROW_KINDS, TIME)[:, :, None]
    return x.astype(np.float32)


def state_inputs(model_proto) -> dict:
    """Streamed state input name -> units, from the graph."""
    return {i.name: i.type.tensor_type.shape.dim[1].dim_value for i in model_proto.graph.input
            if i.name.endswith(("/h_in", "/c_in"))}


def run_chunks(model_proto, x: np.ndarray, chunks=CHUNKS, states=None):
    """Outputs of every chunk (ONNX output 0), states carried from zeros (or ``states``)."""
    session = helpers.ort_session(model_proto)
    names = [o.name for o in session.get_outputs()]
    inputs = state_inputs(model_proto)
    states = states or {name: np.zeros((x.shape[0], units), np.float32) for name, units in inputs.items()}
    outputs, start = [], 0
    for size in chunks:
        result = dict(zip(names, session.run(None, {"x": x[:, start:start + size], **states})))
        outputs.append(result[names[0]])
        states = {name: result[name[:-len("in")] + "out"] for name in inputs}
        start += size
    return outputs, states


@pytest.mark.parametrize("flavor, name", [(f, n) for f in parity.FLAVORS for n in MODELS])
def test_chunked_equals_whole(flavor, name):
    model, model_proto = build(flavor, name)
    assert not helpers.nodes_of_types(model_proto, helpers.LOOP_OPS)
    x = sequence(name)
    whole = np.asarray(model(x, training=False))
    outputs, _ = run_chunks(model_proto, x)
    if name.endswith("sequences"):
        chunked = np.concatenate(outputs, axis=1)
    else:  # the last step's output is the last chunk's
        chunked = outputs[-1]
    assert chunked.shape == whole.shape
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_states_are_named_after_the_layers_and_reported(flavor):
    _, model_proto = build(flavor, "masked-sequences")
    expected = {"lstm": ("h", "c"), "gru_after": ("h",), "gru_before": ("h",), "rnn": ("h",)}
    units = {"lstm": 4, "gru_after": 5, "gru_before": 3, "rnn": 2}
    ins = [f"{layer}/{s}_in" for layer, states in expected.items() for s in states]
    outs = [f"{layer}/{s}_out" for layer, states in expected.items() for s in states]
    assert state_inputs(model_proto) == {name: units[name.split("/")[0]] for name in ins}
    graph_outputs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model_proto.graph.output}
    for name in outs:
        assert graph_outputs[name][1:] == [units[name.split("/")[0]]], (name, graph_outputs)
    rows = {o.layer: o for o in tf2onnx_rnn.report_of(model_proto).outcomes}  # the model's metadata
    for layer, states in expected.items():
        assert rows[layer].state_inputs == tuple(f"{layer}/{s}_in" for s in states)
        assert rows[layer].state_outputs == tuple(f"{layer}/{s}_out" for s in states)
    table = tf2onnx_rnn.report_of(model_proto).table()
    assert "states in: lstm/h_in, lstm/c_in, out: lstm/h_out, lstm/c_out" in table


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_chunk_ending_on_padding_hands_on_its_last_kept_state(flavor):
    """Rows whose chunk ends masked (or is masked throughout) pass on the state of the last kept
    step: the next chunk goes on as the whole sequence does."""
    model, model_proto = build(flavor, "masked-last")
    x = sequence("masked-last")
    x[:, 4:9] = 0.0  # a stretch of padding across a chunk boundary, for every row
    whole = np.asarray(model(x, training=False))
    outputs, states = run_chunks(model_proto, x, chunks=(4, 3, 6))
    np.testing.assert_allclose(outputs[-1], whole, rtol=0, atol=TOLERANCE)
    empty = ROW_KINDS.index("empty")
    assert all(not np.any(value[empty]) for value in states.values()), "an empty row's states moved"


# -- stateful=True ----------------------------------------------------------------------------

BATCH = 2


def _reset(model) -> None:
    for layer in model.layers:
        reset = getattr(layer, "reset_states", None) or getattr(layer, "reset_state", None)
        if getattr(layer, "stateful", False) and reset is not None:
            reset()


@pytest.fixture(scope="module", params=parity.FLAVORS)
def stateful(request):
    K = parity.keras_module(request.param)
    x = K.Input(batch_shape=(BATCH, None, FEATURES), name="x")
    h = K.layers.GRU(4, stateful=True, return_sequences=True, name="gru")(x)
    h = K.layers.LSTM(3, stateful=True, return_sequences=True, name="lstm")(h)
    model = K.Model(x, h, name="stateful")
    parity.randomize_weights(model, zlib.crc32(f"stateful/{request.param}".encode()))
    return request.param, model, tf2onnx_rnn.convert_keras(model)


def test_stateful_model_streams_like_successive_keras_calls(stateful):
    _, model, model_proto = stateful
    x = sequence("stateful", batch=BATCH)
    _reset(model)
    expected = []
    start = 0
    for size in CHUNKS:
        expected.append(np.asarray(model(x[:, start:start + size], training=False)))
        start += size
    _reset(model)
    outputs, _ = run_chunks(model_proto, x)
    for index, (got, want) in enumerate(zip(outputs, expected)):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE, err_msg=f"chunk {index}")
    rows = tf2onnx_rnn.report_of(model_proto).outcomes
    assert {o.layer for o in rows if o.stateful} == {"gru", "lstm"}
    assert all(o.state_outputs for o in rows)
    assert "; stateful" in tf2onnx_rnn.report_of(model_proto).table()
    assert [d.dim_value for d in model_proto.graph.input[0].type.tensor_type.shape.dim][0] == BATCH


def test_stateful_model_without_streaming_is_refused(stateful):
    _, model, _ = stateful
    with pytest.raises(ConversionError, match=r"stateful layer\(s\) gru, lstm: without streaming"):
        tf2onnx_rnn.convert_keras(model, streaming=False)


# -- what cannot stream ---------------------------------------------------------------------------

def _refusal(flavor: str, build_layer) -> str:
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    model = K.Model(x, build_layer(K)(x))
    parity.randomize_weights(model, 7)
    with pytest.raises(ConversionError) as raised:
        tf2onnx_rnn.convert_keras(model, streaming=True)
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_what_cannot_stream_is_refused_naming_the_layer(flavor):
    message = _refusal(flavor, lambda K: K.layers.Bidirectional(K.layers.GRU(3), name="both_ways"))
    assert "cannot stream" in message and "both_ways" in message and "backward pass" in message
    message = _refusal(flavor, lambda K: K.layers.LSTM(3, go_backwards=True, name="backwards"))
    assert "backwards" in message and "backward pass" in message
    message = _refusal(flavor, lambda K: K.layers.Bidirectional(K.layers.SimpleRNN(3, activation="selu"),
                                                                name="selu_both"))
    assert "cannot stream" in message and "selu_both" in message and "backward pass" in message


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_a_scan_form_layer_streams_chunk_by_chunk(flavor, masked):
    """Layers no native node computes (a selu SimpleRNN, a gelu LSTM) are Scans of their own step whose
    carried states stream: chunk by chunk from zeros equals Keras on the whole sequence."""
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    h = K.layers.Masking(0.0)(x) if masked else x
    h = K.layers.SimpleRNN(3, activation="selu", return_sequences=True, name="selu_simple_rnn")(h)
    model = K.Model(x, K.layers.LSTM(2, activation="gelu", return_sequences=True, name="gelu_lstm")(h))
    parity.randomize_weights(model, zlib.crc32(f"stream-scan/{flavor}/{masked}".encode()))
    model_proto = tf2onnx_rnn.convert_keras(model, streaming=True)
    rows = tf2onnx_rnn.report_of(model_proto).outcomes
    assert [row.became for row in rows] == ["Scan", "Scan"] and all(row.state_outputs for row in rows)
    if not masked:
        assert [row.state_inputs for row in rows] == [("selu_simple_rnn/h_in",), ("gelu_lstm/h_in", "gelu_lstm/c_in")]
    pairs = {i: o for row in rows for i, o in zip(row.state_inputs, row.state_outputs)}
    dims = {i.name: [d.dim_value or None for d in i.type.tensor_type.shape.dim] for i in model_proto.graph.input}
    data = sequence("masked-sequences" if masked else "stack-sequences")
    states = {name: np.zeros([data.shape[0]] + dims[name][1:], np.float32) for name in pairs}
    outputs = helpers.run_in_chunks(model_proto, data, CHUNKS, pairs, states)
    whole = np.asarray(model(data, training=False))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), whole, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_state_the_model_gives_stays_the_models(flavor):
    """A layer fed ``initial_state`` by the model keeps that input; it still gives its final state."""
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    h0 = K.Input((4,), name="h0")
    y = K.layers.GRU(4, return_sequences=True, name="gru")(x, initial_state=[h0])
    model = K.Model([x, h0], y)
    parity.randomize_weights(model, 8)
    model_proto = tf2onnx_rnn.convert_keras(model, streaming=True)
    assert [i.name for i in model_proto.graph.input] == ["x", "h0"]
    (row,) = tf2onnx_rnn.report_of(model_proto).outcomes
    assert row.state_inputs == ("",) and row.state_outputs == ("gru/h_out",)
    xs = sequence("given", batch=3)
    start = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    session = helpers.ort_session(model_proto)
    names = [o.name for o in session.get_outputs()]
    result = dict(zip(names, session.run(None, {"x": xs, "h0": start})))
    np.testing.assert_allclose(result[names[0]], np.asarray(model([xs, start], training=False)),
                               rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(result["gru/h_out"], result[names[0]][:, -1], rtol=0, atol=TOLERANCE)


# -- the other roads: SavedModel, CLI, verification -------------------------------------------------

def test_cli_streams_a_saved_model_and_verifies(tmp_path, capfd):
    """``--saved-model DIR --streaming --verify``: states named after the graph's layer scopes,
    verified against TensorFlow from zero states, chunked == whole."""
    import onnx

    from tf2onnx_rnn import convert

    model, _ = build(parity.FLAVORS[0], "masked-sequences")
    helpers.save_serving(model, tmp_path / "saved", FEATURES)
    output = tmp_path / "streamed.onnx"
    code = convert.main(["--saved-model", str(tmp_path / "saved"), "--output", str(output), "--streaming", "--verify"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "states in: " in out and "verification" in out
    model_proto = onnx.load(str(output))
    assert len(state_inputs(model_proto)) == 5  # LSTM h, c; two GRUs; SimpleRNN
    x = sequence("masked-sequences")
    outputs, _ = run_chunks(model_proto, x)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), np.asarray(model(x, training=False)),
                               rtol=0, atol=TOLERANCE)


def test_cli_refuses_what_cannot_stream_with_exit_2(tmp_path, capfd):
    import keras

    from tf2onnx_rnn import convert

    x = keras.Input((None, FEATURES), name="x")
    model = keras.Model(x, keras.layers.Bidirectional(keras.layers.LSTM(2), name="bidi")(x))
    path = tmp_path / ("model.keras" if parity.KERAS3 else "model.h5")
    model.save(str(path))
    output = tmp_path / "out.onnx"
    code = convert.main(["--keras", str(path), "--output", str(output), "--streaming"])
    err = capfd.readouterr().err
    assert code == 2 and not output.exists()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "cannot stream" in lines[0] and "bidi" in lines[0], err


def test_verify_keras_feeds_zero_states_and_keeps_a_stateful_models_states(stateful):
    _, model, model_proto = stateful
    x = sequence("stateful-verify", batch=BATCH)
    model(x[:, :3], training=False)  # the model has stored states now
    stored = [np.array(v.numpy()) for layer in model.layers for v in (getattr(layer, "states", None) or [])
              if getattr(layer, "stateful", False)]
    assert stored and any(np.any(value) for value in stored)
    result = tf2onnx_rnn.verify.verify_keras(model, model_proto, tolerance=TOLERANCE)
    assert result.passed, result.table()
    assert [c.name for c in result.checks] == [model_proto.graph.output[0].name]
    after = [np.array(v.numpy()) for layer in model.layers for v in (getattr(layer, "states", None) or [])
             if getattr(layer, "stateful", False)]
    for before, now in zip(stored, after):
        np.testing.assert_array_equal(before, now)


# -- state inputs that default ------------------------------------------------------------------------

def _stored(model) -> list:
    return [np.array(v.numpy()) for layer in model.layers for v in (getattr(layer, "states", None) or [])
            if getattr(layer, "stateful", False)]


def _stateful_model(flavor: str, batch: int):
    K = parity.keras_module(flavor)
    x = K.Input(batch_shape=(batch, None, FEATURES), name="x")
    h = K.layers.GRU(4, stateful=True, return_sequences=True, name="gru")(x)
    h = K.layers.LSTM(3, stateful=True, return_sequences=True, name="lstm")(h)
    model = K.Model(x, h, name="stateful_defaults")
    parity.randomize_weights(model, zlib.crc32(f"defaults/{flavor}/{batch}".encode()))
    return model


@pytest.mark.parametrize("flavor, batch", [(f, b) for f in parity.FLAVORS for b in (1, 3)])
def test_a_stateful_model_runs_on_its_data_alone_as_keras_predicts(flavor, batch):
    """Each state input defaults to the layer's stored state (an initializer of its name, [batch, units]):
    fed only the data, the model converted fresh equals ``predict`` on the fresh model, and the model
    converted after a call equals Keras's next ``predict``. Fed its states, it is today's model."""
    model = _stateful_model(flavor, batch)
    _reset(model)
    first, second = sequence("defaults-1", batch=batch)[:, :6], sequence("defaults-2", batch=batch)[:, :4]
    fresh = tf2onnx_rnn.convert_keras(model)
    defaults = {t.name: onnx_numpy(t) for t in fresh.graph.initializer if t.name in state_inputs(fresh)}
    assert sorted(defaults) == ["gru/h_in", "lstm/c_in", "lstm/h_in"]
    units = state_inputs(fresh)
    assert all(value.shape == (batch, units[name]) and not value.any() for name, value in defaults.items())
    assert [i.name for i in helpers.ort_session(fresh).get_inputs()] == ["x"]
    got = helpers.ort_session(fresh).run(None, {"x": first})[0]
    want = np.asarray(model.predict(first, verbose=0))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
    assert any(np.any(value) for value in _stored(model)), "predict did not advance the states"
    advanced = tf2onnx_rnn.convert_keras(model)
    stored = {t.name: onnx_numpy(t) for t in advanced.graph.initializer if t.name in state_inputs(advanced)}
    assert all(np.any(value) for value in stored.values())
    got = helpers.ort_session(advanced).run(None, {"x": second})[0]
    want = np.asarray(model.predict(second, verbose=0))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
    # a streaming caller feeds the states and overrides the defaults: zeros give the fresh model's outputs
    outputs, _ = run_chunks(advanced, np.concatenate([first, second], axis=1), chunks=(6, 4))
    np.testing.assert_allclose(outputs[0], helpers.ort_session(fresh).run(None, {"x": first})[0], rtol=0, atol=0)
    np.testing.assert_allclose(outputs[1], got, rtol=0, atol=TOLERANCE)
    onnx.checker.check_model(advanced, full_check=True)
    onnx.shape_inference.infer_shapes(advanced, check_type=True, strict_mode=True)


def onnx_numpy(tensor) -> np.ndarray:
    return onnx.numpy_helper.to_array(tensor)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_streamed_states_default_to_zeros_only_where_the_batch_is_fixed(flavor):
    """A streamed non-stateful model: with a fixed batch its states default to zeros and the data
    alone gives Keras's outputs; with a dynamic batch no initializer can hold zeros of every batch,
    and the state inputs stay required."""
    dynamic, _ = build(flavor, "stack-last")
    model_proto = tf2onnx_rnn.convert_keras(dynamic, streaming=True, inputs={"x": [len(ROW_KINDS), None, FEATURES]})
    x = sequence("stack-last")
    assert set(state_inputs(model_proto)) <= {t.name for t in model_proto.graph.initializer}
    got = helpers.ort_session(model_proto).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, np.asarray(dynamic(x, training=False)), rtol=0, atol=TOLERANCE)
    _, streamed = build(flavor, "stack-last")
    assert not set(state_inputs(streamed)) & {t.name for t in streamed.graph.initializer}
    with pytest.raises(Exception, match="missing from input feed"):
        helpers.ort_session(streamed).run(None, {"x": x})


def test_without_state_defaults_the_states_are_required(stateful):
    _, model, _ = stateful
    model_proto = tf2onnx_rnn.convert_keras(model, state_defaults=False)
    assert not {t.name for t in model_proto.graph.initializer} & set(state_inputs(model_proto))
    assert {i.name for i in helpers.ort_session(model_proto).get_inputs()} == {"x", *state_inputs(model_proto)}
    with pytest.raises(ConversionError, match="state_defaults"):
        tf2onnx_rnn.convert_keras(model, state_defaults="yes")


def test_the_portable_target_leaves_the_states_required_unless_asked(stateful):
    """The portable form is for OpenVINO and tract, which read an input with a default as a constant."""
    _, model, _ = stateful
    portable = tf2onnx_rnn.convert_keras(model, target="portable")
    assert state_inputs(portable) and not {t.name for t in portable.graph.initializer} & set(state_inputs(portable))
    asked = tf2onnx_rnn.convert_keras(model, target="portable", state_defaults=True)
    assert set(state_inputs(asked)) <= {t.name for t in asked.graph.initializer}


def test_openvino_and_tract_take_the_defaults_as_constants(stateful, tmp_path):
    """OpenVINO and tract run a stateful model on its data alone from its defaults, but read an input
    that has an initializer as that constant: it is no longer an input, and states cannot be fed.
    tract 0.23 also stops on an LSTM whose default states are zeros ("Clashing resolution", as when
    they are absent); stored states that are not zeros run. Converted with ``state_defaults=False``
    the states are inputs there, and stream exactly (docs/downstream.md). Fails the day either lets
    a feed override a default, or tract runs the zeros."""
    openvino = pytest.importorskip("openvino")
    tract = pytest.importorskip("tract")
    _, model, _ = stateful
    _reset(model)
    x = sequence("stateful-downstream", batch=BATCH)
    fresh, advanced = str(tmp_path / "fresh.onnx"), str(tmp_path / "advanced.onnx")
    onnx.save(tf2onnx_rnn.convert_keras(model), fresh)
    want_fresh = np.asarray(model.predict(x[:, :5], verbose=0))
    onnx.save(tf2onnx_rnn.convert_keras(model), advanced)
    want_next = np.asarray(model.predict(x[:, 5:], verbose=0))
    _reset(model)
    core = openvino.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
    for path, chunk, want in ((fresh, x[:, :5], want_fresh), (advanced, x[:, 5:], want_next)):
        read = core.read_model(path)
        assert [i.get_any_name() for i in read.inputs] == ["x"]
        compiled = core.compile_model(read, "CPU", config)
        np.testing.assert_allclose(np.asarray(compiled([chunk])[compiled.outputs[0]]), want, rtol=0, atol=1e-4)
    loaded = tract.onnx().load(advanced)
    assert loaded.input_count() == 1
    loaded.set_input_fact(0, f"{BATCH},{TIME - 5},{FEATURES},f32")
    got = loaded.into_model().into_runnable().run([x[:, 5:]])[0].to_numpy()
    np.testing.assert_allclose(got, want_next, rtol=0, atol=1e-4)
    loaded = tract.onnx().load(fresh)
    loaded.set_input_fact(0, f"{BATCH},5,{FEATURES},f32")
    with pytest.raises(tract.TractError, match="Clashing resolution"):
        loaded.into_model().into_runnable().run([x[:, :5]])
    # required states: OpenVINO streams chunk by chunk as onnxruntime does
    path = str(tmp_path / "required.onnx")
    onnx.save(tf2onnx_rnn.convert_keras(model, state_defaults=False), path)
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    names = [o.get_any_name() for o in compiled.outputs]
    states = {i.get_any_name(): np.zeros(list(i.get_partial_shape().to_shape()), np.float32)
              for i in compiled.inputs if i.get_any_name() != "x"}
    assert len(states) == 3
    expected, _ = run_chunks(onnx.load(path), x)
    start = 0
    for size, chunk in zip(CHUNKS, expected):
        result = compiled({"x": x[:, start:start + size], **states})
        got = {name: np.asarray(result[output]) for name, output in zip(names, compiled.outputs)}
        np.testing.assert_allclose(got[names[0]], chunk, rtol=0, atol=1e-4)
        states = {name: got[name[:-len("in")] + "out"] for name in states}
        start += size
