"""Models as they leave a GPU machine: cuDNN's recurrent ops become native nodes, and converting on a GPU
machine gives what converting on a CPU gives.

No GPU is needed (``cudnn_graphs``): TensorFlow is made to list one, as it does on a GPU machine, and the
cuDNN ops are written as Keras, tf_keras and TF 1.x write them. Nothing here runs a cuDNN op; each
converted model is compared with the CPU computation it stands for, weights and biases random, batch
unlike time:

1. Keras models converted on a GPU machine (``convert_keras``, Keras files), both flavors: the same nodes
   and report as on a CPU, equal to the model on the CPU for every mask.
2. tf_keras's ``CuDNNLSTM`` / ``CuDNNGRU`` (``go_backwards``, ``return_state``, ``Bidirectional`` in each
   merge mode, stacks, streaming), from the live model, an ``.h5`` file and an exported SavedModel: equal to
   the canonical ``LSTM`` / ``GRU`` tf_keras's own h5 loader converts their weights to.
3. TF 1.x graphs calling ``CudnnRNN``, V2 and V3 themselves: every op in every mode, one or several layers,
   one or both directions, time- or batch-major, with lengths and initial states, ``skip_input``: equal to
   Keras 3's canonical layers with the same weights.
4. What ONNX cannot compute is refused in one line naming the op.
5. Checks without a GPU: ``--verify`` names its reference (the graph with its cuDNN ops computed by CPU
   ops), passes, and fails on perturbed weights; the output shape check runs too.
6. Keras 3 models exported on a GPU machine in mixed precision and with a fixed signature; OpenVINO and
   tract run them (the portable form where a mask is).

Every Keras 3 parity model exported on a GPU machine: test_gpu_parity.py.
"""
from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import onnx
import pytest

import cudnn_graphs
import helpers
import parity
from cudnn_graphs import RawCase, gpu_machine

TOLERANCE = 1e-5


def _recurrent(proto) -> collections.Counter:
    return collections.Counter((n.op_type, helpers.direction_of(n))
                               for n in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS))


def _no_loops(proto) -> None:
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    assert not loops, f"Loop/Scan left: {[n.name for n in loops]}\n{parity.report_table(proto)}"


def _close(expected: list, actual: list, tolerance: float = TOLERANCE, label: str = "") -> None:
    problems, _ = parity.output_problems(label or "outputs", [f"output {i}" for i in range(len(expected))],
                                         [np.asarray(e) for e in expected], [np.asarray(a) for a in actual],
                                         tolerance)
    assert not problems, "\n".join(problems)


def _mixed_masks(batch_time=(7, 6)) -> np.ndarray:
    """Rows full, post-padded, pre-padded, holed, empty (and two more full ones): batch unlike time."""
    batch, time = batch_time
    mask = np.ones((batch, time), bool)
    mask[1, 4:] = False
    mask[2, :2] = False
    mask[3, [1, 3]] = False
    mask[4, :] = False
    return mask


# -- 1. Keras models converted on a GPU machine -------------------------------------------------------------

def _masked_model(flavor: str):
    """Masking -> LSTM (all steps) -> Bidirectional(GRU), every weight random: layers cuDNN takes."""
    K = parity.keras_module(flavor)
    x = K.Input((None, 3), name="x")
    hidden = K.layers.LSTM(4, return_sequences=True, name="lstm")(K.layers.Masking(name="masking")(x))
    gru = dict(reset_after=True, recurrent_activation="sigmoid") if flavor == "tf_keras" else {}
    out = K.layers.Bidirectional(K.layers.GRU(2, **gru), name="bidi")(hidden)
    model = K.Model(x, out)
    parity.randomize_weights(model, 7)
    return model


def _masked_batch(seed: int = 3) -> np.ndarray:
    mask = _mixed_masks()
    x = np.random.default_rng(seed).standard_normal(mask.shape + (3,)).astype(np.float32)
    return np.where(mask[..., None], x, 0.0).astype(np.float32)


@parity.only_keras3
def test_a_gpu_machine_makes_keras3_trace_cudnn_and_the_converter_traces_loops():
    """The simulation is a GPU machine as Keras sees one: Keras 3 traces a cuDNN op under it (and a loop
    without it); the converter's trace under it holds the loop (tf2onnx_rnn.keras_kernels)."""
    import tensorflow as tf

    from tf2onnx_rnn.keras_kernels import cpu_kernels

    model = _masked_model("keras3")
    spec = [tf.TensorSpec([None, None, 3], tf.float32)]

    def ops_of_trace():
        graph = cudnn_graphs.traced(model, spec)
        return {n.op for n in list(graph.node) + [n for f in graph.library.function for n in f.node_def]}

    with gpu_machine():
        assert "CudnnRNNV3" in ops_of_trace()
        with cpu_kernels():
            traced = ops_of_trace()
    assert "CudnnRNNV3" not in traced and "While" in traced or "StatelessWhile" in traced
    assert "CudnnRNNV3" not in ops_of_trace()


@pytest.mark.parametrize("flavor", [f for f in parity.FLAVORS if f != "keras3"])
def test_the_converters_trace_of_tf_keras_registers_no_cudnn_variant(flavor: str):
    """tf_keras (and Keras 2) traces its loop and registers its cuDNN variant beside it for grappler (a
    function named ``gpu_lstm_with_fallback``); the converter's trace (tf2onnx_rnn.keras_kernels) calls the
    same loop and registers no variant, and leaves tf_keras registering as before."""
    import tensorflow as tf

    from tf2onnx_rnn.keras_kernels import cpu_kernels

    K = parity.keras_module(flavor)
    x = K.Input((None, 3))
    layer = K.layers.LSTM(4, return_sequences=True)
    if not layer._could_use_gpu_kernel:
        pytest.skip("this process imported tf_keras 2.15 beside Keras 2.15, whose LSTM then takes its plain loop "
                    "and registers nothing")
    model = K.Model(x, layer(x))
    spec = [tf.TensorSpec([None, None, 3], tf.float32)]

    def functions_of_trace() -> set:
        library = cudnn_graphs.traced(model, spec).library
        return {"gpu" if "gpu_lstm_with_fallback" in f.signature.name else
                "cpu" if "standard_lstm" in f.signature.name else "other" for f in library.function}

    assert {"cpu", "gpu"} <= functions_of_trace()
    with cpu_kernels():
        traced = functions_of_trace()
    assert "cpu" in traced and "gpu" not in traced, traced
    assert "gpu" in functions_of_trace()


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_convert_keras_on_a_gpu_machine_gives_what_a_cpu_gives(flavor: str):
    from tf2onnx_rnn import convert_keras, report_of

    model = _masked_model(flavor)
    on_cpu = convert_keras(model, check_shapes=False)
    with gpu_machine():
        on_gpu = convert_keras(model, verify=True)
    assert _recurrent(on_gpu) == _recurrent(on_cpu) == {("LSTM", "forward"): 1, ("GRU", "bidirectional"): 1}
    _no_loops(on_gpu)
    rows = [(o.layer, o.kind, o.direction, o.became, o.mask) for o in report_of(on_gpu).outcomes]
    assert rows == [(o.layer, o.kind, o.direction, o.became, o.mask) for o in report_of(on_cpu).outcomes]
    assert "its CPU kernels" in report_of(on_gpu).checked, report_of(on_gpu).checked
    x = _masked_batch()
    _close([np.asarray(model(x, training=False))], helpers.ort_session(on_gpu).run(None, {"x": x}))


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_keras_file_on_a_gpu_machine_converts_as_on_a_cpu(flavor: str, tmp_path):
    from tf2onnx_rnn.api import run
    from tf2onnx_rnn.sources.keras_file import KerasFile

    model = _masked_model(flavor)
    path = str(tmp_path / ("model.keras" if flavor != "tf_keras" else "model.h5"))
    model.save(path)
    with gpu_machine():
        proto = run(KerasFile(path), verify=True).model_proto
    assert _recurrent(proto) == {("LSTM", "forward"): 1, ("GRU", "bidirectional"): 1}
    x = _masked_batch(5)
    _close([np.asarray(model(x, training=False))], helpers.ort_session(proto).run(None, {"x": x}))


# -- 2. tf_keras's CuDNNLSTM / CuDNNGRU ----------------------------------------------------------------------

def _tf_keras_cudnn():
    from tf_keras.src.layers.rnn.cudnn_gru import CuDNNGRU
    from tf_keras.src.layers.rnn.cudnn_lstm import CuDNNLSTM

    return {"LSTM": CuDNNLSTM, "GRU": CuDNNGRU}


CUDNN_LAYER_CASES = [  # (kind, structure): what a Keras 2 model trained on a GPU holds
    ("LSTM", "plain"), ("GRU", "plain"), ("LSTM", "backwards-state"), ("GRU", "backwards-state"),
    ("LSTM", "bidi-concat"), ("GRU", "bidi-sum"), ("LSTM", "bidi-mul"), ("GRU", "bidi-ave"),
    ("LSTM", "bidi-none-state"), ("GRU", "stack"), ("LSTM", "initial-state"),
]


def _cudnn_layer_model(kind: str, structure: str, cudnn: bool):
    """The case's model with tf_keras's cuDNN layer (``cudnn``) or its canonical twin (LSTM, GRU with
    reset_after and a sigmoid recurrent activation), input x [batch, time, 3]."""
    import tf_keras as K

    def layer(**kwargs):
        if cudnn:
            return _tf_keras_cudnn()[kind](4, **kwargs)
        extra = dict(reset_after=True) if kind == "GRU" else {}
        return getattr(K.layers, kind)(4, recurrent_activation="sigmoid", **extra, **kwargs)

    x = K.Input((None, 3), name="x")
    inputs = [x]
    if structure == "plain":
        outputs = [layer(return_sequences=True)(x)]
    elif structure == "backwards-state":
        outputs = list(layer(go_backwards=True, return_state=True)(x))
    elif structure.startswith("bidi"):
        mode = structure.split("-")[1]
        state = structure.endswith("state")
        found = K.layers.Bidirectional(layer(return_sequences=True, return_state=state),
                                       merge_mode=None if mode == "none" else mode)(x)
        outputs = list(found) if isinstance(found, (list, tuple)) else [found]
    elif structure == "stack":
        outputs = [layer()(layer(return_sequences=True)(x))]
    else:  # initial states from inputs
        states = [K.Input((4,), name=f"s{i}") for i in range(2 if kind == "LSTM" else 1)]
        inputs += states
        outputs = [layer(return_sequences=True)(x, initial_state=states)]
    return K.Model(inputs, outputs)


def _canonical_twin(model, twin) -> None:
    """``twin`` given ``model``'s cuDNN weights as tf_keras's h5 loader converts them."""
    import tf_keras as K
    from tf_keras.src.saving.legacy.hdf5_format import _convert_rnn_weights

    for source, target in zip(model.layers, twin.layers):
        if isinstance(target, K.layers.Bidirectional):
            target.set_weights(_convert_rnn_weights(target.forward_layer, source.forward_layer.get_weights())
                               + _convert_rnn_weights(target.backward_layer, source.backward_layer.get_weights()))
        elif isinstance(target, (K.layers.LSTM, K.layers.GRU)):
            target.set_weights(_convert_rnn_weights(target, source.get_weights()))
        else:
            target.set_weights(source.get_weights())


_LAYER_CACHE: dict = {}


def _cudnn_layer_case(kind: str, structure: str):
    """(the cuDNN model, its canonical twin, its conversion), built once per process."""
    key = (kind, structure)
    if key not in _LAYER_CACHE:
        from tf2onnx_rnn import convert_keras

        model = _cudnn_layer_model(kind, structure, cudnn=True)
        parity.randomize_weights(model, len(_LAYER_CACHE) + 11)
        twin = _cudnn_layer_model(kind, structure, cudnn=False)
        _canonical_twin(model, twin)
        _LAYER_CACHE[key] = model, twin, convert_keras(model, verify=True)
    return _LAYER_CACHE[key]


def _cudnn_layer_feeds(model, seed: int, batch: int = 5, time: int = 3) -> list:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, time, 3) if len(i.shape) == 3 else (batch, i.shape[-1])).astype(np.float32)
            for i in model.inputs]


@pytest.mark.parametrize("kind, structure", CUDNN_LAYER_CASES, ids=[f"{k}-{s}" for k, s in CUDNN_LAYER_CASES])
def test_tf_keras_cudnn_layers_equal_their_canonical_twins(kind: str, structure: str):
    model, twin, proto = _cudnn_layer_case(kind, structure)
    _no_loops(proto)
    assert sum(_recurrent(proto).values()) == len(helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)) >= 1
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    for seed, (batch, time) in enumerate(((5, 3), (1, 8), (2, 1))):
        arrays = _cudnn_layer_feeds(model, seed, batch, time)
        _close(parity.keras_outputs(twin, arrays), session.run(None, dict(zip(names, arrays))),
               label=f"batch {batch}, time {time}")


def test_tf_keras_cudnn_layers_from_files(tmp_path):
    """A CuDNNLSTM model saved as .h5 (tf_keras loads it as CuDNNLSTM) and exported as a SavedModel converts
    as the live model does."""
    from tf2onnx_rnn import convert_saved_model
    from tf2onnx_rnn.api import run
    from tf2onnx_rnn.sources.keras_file import KerasFile

    model, twin, live = _cudnn_layer_case("LSTM", "bidi-concat")
    h5 = str(tmp_path / "cudnn.h5")
    model.save(h5)
    exported = str(tmp_path / "cudnn_savedmodel")
    model.export(exported)
    arrays = _cudnn_layer_feeds(model, 4)
    expected = parity.keras_outputs(twin, arrays)
    for proto in (run(KerasFile(h5), verify=True).model_proto, convert_saved_model(exported, verify=True)):
        assert _recurrent(proto) == _recurrent(live) == {("LSTM", "bidirectional"): 1}
        _close(expected, helpers.ort_session(proto).run(None, {proto.graph.input[0].name: arrays[0]}))


def test_a_stateful_cudnn_layer_streams():
    """A stateful CuDNNLSTM converts with its states as inputs and outputs: two chunks with the states
    carried equal the canonical twin over the whole sequence."""
    import tf_keras as K

    from tf2onnx_rnn import convert_keras

    layers = _tf_keras_cudnn()
    x = K.Input((None, 3), batch_size=2, name="x")
    model = K.Model(x, layers["LSTM"](4, stateful=True, return_sequences=True)(x))
    parity.randomize_weights(model, 21)
    twin_x = K.Input((None, 3), batch_size=2)
    twin = K.Model(twin_x, K.layers.LSTM(4, recurrent_activation="sigmoid", return_sequences=True)(twin_x))
    _canonical_twin(model, twin)
    proto = convert_keras(model)
    _no_loops(proto)
    session = helpers.ort_session(proto)
    names = [i.name for i in proto.graph.input]  # x, then h and c, defaulting to the stored states
    assert len(names) == 3, names
    sequence = np.random.default_rng(2).standard_normal((2, 7, 3)).astype(np.float32)
    states = [np.zeros((2, 4), np.float32)] * 2
    chunks = []
    for part in (sequence[:, :3], sequence[:, 3:]):
        y, *states = session.run(None, dict(zip(names, [part] + states)))
        chunks.append(y)
    _close(parity.keras_outputs(twin, [sequence]), [np.concatenate(chunks, axis=1)])


# -- 3. TF 1.x graphs calling the ops -------------------------------------------------------------------------

RAW_CASES = [RawCase(op=op, mode=mode) for op in ("CudnnRNN", "CudnnRNNV2", "CudnnRNNV3")
             for mode in ("lstm", "gru", "rnn_tanh", "rnn_relu")] + [
    RawCase(mode="lstm", lengths=True, initial_state=True),
    RawCase(mode="gru", lengths=True, time_major=False),
    RawCase(mode="rnn_relu", time_major=False, initial_state=True),
    RawCase(op="CudnnRNN", mode="lstm", bidirectional=True, initial_state=True),
    RawCase(op="CudnnRNNV2", mode="gru", layers=3),
    RawCase(mode="lstm", layers=2, bidirectional=True, lengths=True, initial_state=True),
    RawCase(mode="gru", layers=2, bidirectional=True, time_major=False, lengths=True),
    RawCase(mode="rnn_tanh", layers=2, bidirectional=True, time_major=False, initial_state=True),
    RawCase(op="CudnnRNN", mode="lstm", skip_input=True),
    RawCase(op="CudnnRNN", mode="gru", skip_input=True, layers=2, bidirectional=True),
]


@pytest.mark.parametrize("case", RAW_CASES, ids=lambda case: case.id)
def test_tf1_graphs_of_cudnn_ops_equal_the_canonical_layers(case: RawCase):
    from tf2onnx_rnn import convert_graph_def, report_of

    path, inputs, outputs, weights = cudnn_graphs.raw_graph(case, seed=len(case.id))
    proto = convert_graph_def(path, inputs, outputs, check_shapes=False)
    _no_loops(proto)
    op = {"lstm": "LSTM", "gru": "GRU"}.get(case.mode, "RNN")
    nodes = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    assert [n.op_type for n in nodes] == [op] * case.layers, parity.report_table(proto)
    assert all(helpers.direction_of(n) == ("bidirectional" if case.bidirectional else "forward") for n in nodes)
    if case.mode == "gru":
        assert all(helpers.attribute(n, "linear_before_reset") == 1 for n in nodes)
    rows = report_of(proto).outcomes
    assert len(rows) == case.layers * case.directions and all(case.op in row.activations for row in rows)
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    for seed, (batch, time) in enumerate(((3, 5), (1, 7), (4, 2))):
        feeds = cudnn_graphs.raw_feeds(case, batch, time, seed)
        expected = cudnn_graphs.canonical_outputs(case, weights, feeds)
        actual = session.run(None, {name: feeds[name.split(":")[0]] for name in names})
        _close(expected, actual, label=f"batch {batch}, time {time}")


# -- 4. refusals ---------------------------------------------------------------------------------------------

def _odd_graph(tmp_path, what: str) -> tuple:
    """A one-op graph of something ONNX cannot compute exactly (``what``): (path, inputs, outputs)."""
    import tensorflow as tf

    features, hidden = 3, 4
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, features], name="x")
        batch = tf.shape(x)[1]
        layers = 2 if what == "dropout" else 1
        h0 = tf.zeros(tf.stack([layers, batch, hidden]))
        inputs = ["x:0"]
        weights = cudnn_graphs.draw_weights(RawCase(mode="lstm", layers=layers), 0)
        params = tf.constant(cudnn_graphs.params_of(weights))
        kwargs = dict(rnn_mode="lstm", is_training=False)
        if what == "params":
            params = tf.compat.v1.placeholder(tf.float32, [None], name="p")
            inputs.append("p:0")
        elif what == "layers":
            h0 = tf.compat.v1.placeholder(tf.float32, [None, None, hidden], name="h0")
            inputs.append("h0:0")
        elif what == "dropout":
            kwargs.update(dropout=0.5, is_training=True)
        elif what == "skip":
            kwargs.update(input_mode="skip_input")
        if what == "float64":
            x = tf.compat.v1.placeholder(tf.float64, [None, None, features], name="x64")
            inputs = ["x64:0"]
            h0 = tf.zeros(tf.stack([1, tf.shape(x)[1], hidden]), tf.float64)
            params = tf.constant(cudnn_graphs.params_of(weights).astype(np.float64))
        if what == "projection":
            proj = 2
            h0 = tf.zeros(tf.stack([1, batch, proj]))
            params = tf.constant(np.zeros(4 * hidden * (features + proj) + proj * hidden + 8 * hidden, np.float32))
            y = tf.raw_ops.CudnnRNNV3(input=x, input_h=h0, input_c=tf.zeros(tf.stack([1, batch, hidden])),
                                      params=params, sequence_lengths=tf.fill([batch], tf.shape(x)[0]),
                                      num_proj=proj, **kwargs)[0]
        else:
            y = tf.raw_ops.CudnnRNN(input=x, input_h=h0, input_c=h0, params=params, **kwargs)[0]
        tf.identity(y, name="y")
    path = str(tmp_path / f"{what}.pb")
    with open(path, "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())
    return path, inputs, ["y:0"]


REFUSED = {"projection": "projects its output", "skip": "skip_input", "dropout": "drops out",
           "params": "params are not constant", "layers": "number of layers is not known",
           "float64": "computes in float64"}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_what_onnx_cannot_compute_exactly_is_refused_in_one_line(what: str, tmp_path):
    from tf2onnx_rnn import ConversionError, convert_graph_def

    path, inputs, outputs = _odd_graph(tmp_path, what)
    output = tmp_path / "model.onnx"
    with pytest.raises(ConversionError) as refused:
        convert_graph_def(path, inputs, outputs, output_path=str(output))
    message = str(refused.value)
    assert "\n" not in message and "CudnnRNN" in message and "(lstm)" in message and REFUSED[what] in message, message
    assert not output.exists()


def test_the_command_line_refuses_a_cudnn_op_with_exit_code_2(tmp_path):
    path, inputs, outputs = _odd_graph(tmp_path, "dropout")
    output = tmp_path / "model.onnx"
    done = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--graphdef", path, "--inputs", inputs[0],
                           "--outputs", outputs[0], "--output", str(output)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2, (done.returncode, done.stderr[-800:])
    line = helpers.assert_one_error_line(done.stderr)
    assert "CudnnRNN" in line and "drops out" in line, line
    assert not output.exists()


# -- 5. checks without a GPU ---------------------------------------------------------------------------------

_EXPORTED: dict = {}


def _exported(name: str):
    """(a Keras 3 model, its SavedModel exported on a GPU machine), built once per process: "masked" is
    Masking -> LSTM (all steps) -> Bidirectional(GRU); "backwards" an Embedding(mask_zero) -> go_backwards
    LSTM (all steps) -> GRU returning its state; "mixed" the masked model in mixed_float16; "fixed" a Bidirectional LSTM
    over a fixed batch of 1 and 7 steps."""
    if name not in _EXPORTED:
        import keras

        if name == "mixed":
            keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            if name in ("masked", "mixed"):
                model = _masked_model("keras3")
            elif name == "backwards":
                ids = keras.Input((None,), dtype="int32", name="ids")
                embedded = keras.layers.Embedding(6, 3, mask_zero=True)(ids)
                hidden = keras.layers.LSTM(4, go_backwards=True, return_sequences=True)(embedded)
                model = keras.Model(ids, keras.layers.GRU(3, return_state=True)(hidden))
            else:
                x = keras.Input((7, 3), batch_size=1, name="x")
                model = keras.Model(x, keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True))(x))
        finally:
            keras.mixed_precision.set_global_policy("float32")
        parity.randomize_weights(model, 31)
        _EXPORTED[name] = model, cudnn_graphs.export_on_gpu_machine(model, name)
    return _EXPORTED[name]


@parity.only_keras3
def test_verify_without_a_gpu_names_its_reference_passes_and_fails_on_perturbed_weights():
    from tf2onnx_rnn import api, cudnn_reference
    from tf2onnx_rnn.options import Options
    from tf2onnx_rnn.sources.saved_model import SavedModel

    _, path = _exported("masked")
    source = SavedModel(path)
    conversion = api.run(source, verify=True)
    assert conversion.verification.passed
    assert conversion.verification.reference == cudnn_reference.NAME
    assert cudnn_reference.NAME in conversion.report.checked and "verified" in conversion.report.checked
    checked = cudnn_reference.checked_source(source, api.freeze(source, Options()), conversion.keras_masks)
    perturbed = onnx.ModelProto.FromString(conversion.model_proto.SerializeToString())
    weight = next(init for init in perturbed.graph.initializer if init.name.endswith("_W") or "_W__" in init.name)
    values = onnx.numpy_helper.to_array(weight).copy()
    values.flat[0] += 0.05
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    failed = checked.verify(perturbed, 1e-4)
    assert not failed.passed and "max abs error" in failed.table()


@parity.only_keras3
def test_the_output_shape_check_runs_without_a_gpu():
    from tf2onnx_rnn import convert_saved_model, cudnn_reference, report_of

    _, path = _exported("backwards")
    checked = report_of(convert_saved_model(path)).checked
    assert checked.startswith("output shapes checked against " + cudnn_reference.NAME), checked


@parity.only_keras3
def test_verify_on_the_command_line_names_its_reference(tmp_path):
    _, path = _exported("masked")
    output = tmp_path / "model.onnx"
    done = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--saved-model", path, "--output", str(output),
                           "--verify"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-1500:]
    assert "cuDNN ops computed by CPU ops" in done.stdout and output.exists()


# -- 6. Keras 3 models exported on a GPU machine: masks, mixed precision, fixed signatures, downstream -------

@parity.only_keras3
@pytest.mark.parametrize("name", ["masked", "backwards", "mixed", "fixed"])
def test_keras3_exported_on_a_gpu_machine_equals_keras_on_the_cpu(name: str):
    from tf2onnx_rnn import convert_saved_model

    model, path = _exported(name)
    proto = convert_saved_model(path, verify=True, tolerance=1e-2 if name == "mixed" else 1e-4)
    _no_loops(proto)
    assert _recurrent(proto) == _recurrent(_cpu_conversion(name))
    if name == "fixed":
        arrays = [np.random.default_rng(1).standard_normal((1, 7, 3)).astype(np.float32)]
    elif name == "backwards":
        mask = _mixed_masks()
        ids = np.random.default_rng(2).integers(1, 6, mask.shape)
        arrays = [np.where(mask, ids, 0).astype(np.int32)]
    else:
        arrays = [_masked_batch(4)]
    expected = parity.keras_outputs(model, arrays)
    actual = helpers.ort_session(proto).run(None, {proto.graph.input[0].name: arrays[0]})
    _close(expected, actual, 1e-2 if name == "mixed" else TOLERANCE)


def _cpu_conversion(name: str):
    from tf2onnx_rnn import convert_keras

    return convert_keras(_exported(name)[0], check_shapes=False)


@parity.only_keras3
@pytest.mark.parametrize("name", ["masked", "backwards", "fixed"])
def test_openvino_and_tract_run_what_a_gpu_machine_exported(name: str, tmp_path):
    """The portable form (a masked model's needs it: tract takes constant sequence_lens only, OpenVINO
    ignores computed ones under dynamic shapes) in OpenVINO (f32) and tract, within 1e-4 of Keras, on rows
    full, post-padded, pre-padded and holed (empty ones: onnxruntime's LSTM ends the process on a batch of
    none, and tract's zero states want a row)."""
    pytest.importorskip("openvino")
    pytest.importorskip("tract")
    from test_downstream import run_openvino, run_tract
    from tf2onnx_rnn import convert_saved_model

    model, path = _exported(name)
    output = str(tmp_path / "model.onnx")
    proto = convert_saved_model(path, output_path=output, target="portable")
    if name == "backwards":
        mask = _mixed_masks()[:4]  # rows full, post-padded, pre-padded, holed
        x = np.where(mask, np.random.default_rng(5).integers(1, 6, mask.shape), 0).astype(np.int32)
    else:
        x = _masked_batch(6)[:4] if name == "masked" else np.random.default_rng(6).standard_normal(
            (1, 7, 3)).astype(np.float32)
    expected = parity.keras_outputs(model, [x])
    _close(expected, helpers.ort_session(proto).run(None, {proto.graph.input[0].name: x}), 1e-4, "onnxruntime")
    _close(expected, run_openvino(output, x), 1e-4, "OpenVINO")
    if name == "backwards":  # token ids [B, T]: the time fixed, as a go_backwards layer's step-order outputs are
        import tract  # reversed by a Slice (so in the model's CPU conversion too: docs/downstream.md)

        runnable = tract.onnx().load(output)
        runnable.set_input_fact(0, f"B,{x.shape[1]},i32")
        actual = [t.to_numpy() for t in runnable.into_model().into_runnable().run([x])]
    else:
        actual = run_tract(output, x, batch=name == "fixed", time=name == "fixed")
    _close(expected, actual, 1e-4, "tract")


# -- 7. TF 1.x checkpoints holding canonical weights ---------------------------------------------------------

CHECKPOINT_CASES = [RawCase(op="CudnnRNN", mode="lstm"), RawCase(op="CudnnRNN", mode="lstm", layers=2),
                    RawCase(op="CudnnRNN", mode="lstm", bidirectional=True),
                    RawCase(op="CudnnRNN", mode="lstm", layers=3, bidirectional=True)]


@pytest.mark.parametrize("source", ["checkpoint", "saved_model"])
@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=lambda case: case.id)
def test_a_tf1_checkpoint_of_canonical_weights_converts_to_them(case: RawCase, source: str, tmp_path):
    """A TF 1.x cuDNN layer's checkpoint (or TF1 SavedModel) holds canonical weights
    (``CudnnCompatibleLSTMCell`` kernels) and restores its opaque params through
    ``CudnnRNNCanonicalToParams``, which TensorFlow runs on a GPU only: restored here on the CPU, the model
    equals the canonical layers over those weights, several layers and both directions included, whatever
    cuDNN's own layout of the buffer (the buffer is written and read by the same documented one)."""
    from tf2onnx_rnn import convert_checkpoint, convert_saved_model

    if source == "checkpoint":
        meta, inputs, outputs, canonical = cudnn_graphs.contrib_checkpoint(case, 3, str(tmp_path))
        proto = convert_checkpoint(meta, inputs, outputs)
    else:
        path, canonical = cudnn_graphs.contrib_saved_model(case, 3, str(tmp_path))
        proto = convert_saved_model(path)
    _no_loops(proto)
    assert len(helpers.nodes_of_types(proto, {"LSTM"})) == case.layers
    session = helpers.ort_session(proto)
    gates = cudnn_graphs.gates_of_canonical(case, canonical)
    for seed, (batch, time) in enumerate(((3, 5), (1, 2))):
        feeds = cudnn_graphs.raw_feeds(case, batch, time, seed)
        expected = cudnn_graphs.canonical_outputs(case, gates, feeds)[:1]
        _close(expected, session.run(None, {session.get_inputs()[0].name: feeds["x"]}), label=f"batch {batch}")


def test_a_tf1_backward_op_over_rows_reversed_within_lengths(tmp_path):
    """TF 1.x's way to a backward layer from a one-direction op: ``reverse_sequence`` of the input by the
    lengths, the op with those lengths, ``reverse_sequence`` of its output back: ONNX's reverse direction
    with ``sequence_lens``, equal to Keras's backward layer over the rows' kept steps."""
    import tensorflow as tf

    from tf2onnx_rnn import convert_graph_def

    case = RawCase(mode="gru", time_major=False, lengths=True)
    weights = cudnn_graphs.draw_weights(case, 4)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, case.features], name="x")
        lengths = tf.compat.v1.placeholder(tf.int32, [None], name="seq_len")
        zeros = tf.zeros(tf.stack([tf.shape(x)[0], 1, case.hidden]))
        reversed_x = tf.reverse_sequence(x, lengths, seq_axis=1, batch_axis=0)
        y, h = tf.raw_ops.CudnnRNNV3(input=reversed_x, input_h=zeros, input_c=zeros,
                                     params=tf.constant(cudnn_graphs.params_of(weights)), sequence_lengths=lengths,
                                     rnn_mode="gru", time_major=False, is_training=False)[:2]
        tf.identity(tf.reverse_sequence(y, lengths, seq_axis=1, batch_axis=0), name="y")
        tf.identity(h, name="h")
    path = str(tmp_path / "backward.pb")
    with open(path, "wb") as stream:
        stream.write(graph.as_graph_def().SerializeToString())
    proto = convert_graph_def(path, ["x:0", "seq_len:0"], ["y:0", "h:0"])
    _no_loops(proto)
    assert [helpers.direction_of(n) for n in helpers.nodes_of_types(proto, {"GRU"})] == ["reverse"]
    feeds = cudnn_graphs.raw_feeds(case, 4, 6, 1)
    kept = np.arange(6)[None, :] < feeds["seq_len"][:, None]
    y, h, _ = cudnn_graphs.run_layer(case, weights[0], feeds["x"] * kept[..., None], kept, True, None)
    session = helpers.ort_session(proto)
    actual = session.run(None, {i.name: feeds[i.name.split(":")[0]] for i in session.get_inputs()})
    _close([y, h[:, None]], actual)
