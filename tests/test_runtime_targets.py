"""The runtime targets (``iree``, ``tvm``, ``ncnn``, ``rknn``) and the table of runtimes behind them.

Without any of those runtimes, this checks what can be checked in onnxruntime: every lowering rung
(a recurrent node as its steps, a Scan as its steps, forward nodes with a reversal, ``Y_h`` from ``Y``,
zero initial states) computes what the node or Scan computes, for every op, direction and attribute the
package writes; each target's model equals Keras (both flavors, random weights and biases, batch unlike
time, a mask mixing full, post-padded, pre-padded, holed and empty rows) and holds nothing its runtime's
row lacks; a dynamic signature is refused in one line naming ``inputs``; the report's "runs in" lines
follow the table. With a runtime's interpreter named by ``TF2ONNX_RNN_<RUNTIME>_PYTHON`` (CI's runtime
slice makes one environment per runtime), every target model also runs in its runtime against Keras.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import parity
from tf2onnx_rnn import ConversionError, convert_keras, report_of
from tf2onnx_rnn.rewriters.lower.build import Writer
from tf2onnx_rnn.rewriters.lower.forward import as_forward_nodes, last_step_as_y_h, read_merged, zero_initial_states
from tf2onnx_rnn.rewriters.lower.steps import node_as_steps
from tf2onnx_rnn.rewriters.runtimes import BIDIRECTIONAL, BY_KEY, RUNTIMES, obstacles

BATCH, TIME, FEATURES, UNITS = 3, 7, 5, 6  # batch unlike time
TARGETS = ("iree", "tvm", "ncnn", "rknn")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


# -- the rungs on single nodes, in onnxruntime -------------------------------------------------------------
def _node_model(op, direction, seed, lbr=0, states=False, peepholes=False, lengths=False, clip=None,
                activations=None):
    rng = np.random.default_rng(seed)
    gates, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array(rng.normal(0, .5, shape).astype(np.float32), name) for name, shape in
             (("W", (dirs, gates * UNITS, FEATURES)), ("R", (dirs, gates * UNITS, UNITS)),
              ("B", (dirs, 2 * gates * UNITS)))]
    inputs = ["x", "W", "R", "B", "L" if lengths else "", "h0" if states else "",
              "c0" if states and op == "LSTM" else "", "P" if peepholes else ""]
    while not inputs[-1]:
        inputs.pop()
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [TIME, BATCH, FEATURES])]
    if lengths:
        graph_inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, [BATCH]))
    for name in ("h0", "c0") if states else ():
        if name in inputs:
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [dirs, BATCH, UNITS]))
    if peepholes:
        inits.append(numpy_helper.from_array(rng.normal(0, .5, (dirs, 3 * UNITS)).astype(np.float32), "P"))
    attrs = dict(hidden_size=UNITS, direction=direction, **(activations or {}))
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    if clip:
        attrs["clip"] = clip
    outputs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    node = helper.make_node(op, inputs, outputs, name="recurrent", **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": rng.normal(size=(TIME, BATCH, FEATURES)).astype(np.float32)}
    if lengths:
        feeds["L"] = np.array([TIME, 0, 3], np.int32)  # a full row, an empty one, a short one
    for name in ("h0", "c0") if states else ():
        if name in inputs:
            feeds[name] = rng.normal(size=(dirs, BATCH, UNITS)).astype(np.float32)
    return model, feeds


def _run(model, feeds):
    return helpers.ort_session(model).run(None, feeds)


def _rewritten(model, rewrite):
    graph = model.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    rewrite(graph, graph.node[0], constants.get, Writer(graph, 17))
    return model


def _assert_same(before, after, feeds):
    for want, got in zip(_run(before, feeds), _run(after, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


NODE_CASES = [case for case in itertools.product(("LSTM", "GRU", "RNN"), ("forward", "reverse", "bidirectional"),
                                                 (0, 1), (False, True), (False, True), (False, True))
              if (case[0] == "GRU" or not case[2]) and (case[0] == "LSTM" or not case[4])
              and (case[1] == "forward" or not case[5])]


@pytest.mark.parametrize("op,direction,lbr,states,peepholes,lengths", NODE_CASES,
                         ids=lambda v: str(v))
def test_a_recurrent_node_as_its_steps_computes_the_node(op, direction, lbr, states, peepholes, lengths):
    model, feeds = _node_model(op, direction, 1, lbr, states, peepholes, lengths, clip=1.5 if states else None)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    after = _rewritten(model, lambda g, n, c, w: node_as_steps(g, n, TIME, BATCH, c, w))
    assert not helpers.nodes_of_types(after, helpers.RECURRENT_OPS)
    _assert_same(before, after, feeds)


@pytest.mark.parametrize("activations", [
    dict(activations=["HardSigmoid", "Relu", "Elu"], activation_alpha=[0.3, 0.0, 1.2], activation_beta=[0.4, 0, 0]),
    dict(activations=["Affine", "ScaledTanh", "Softsign"], activation_alpha=[0.5, 1.5, 0],
         activation_beta=[.1, .7, 0]),
    dict(activations=["LeakyRelu", "Softplus", "Tanh"], activation_alpha=[0.2, 0, 0])],
    ids=lambda a: a["activations"][0])
def test_the_steps_apply_the_nodes_activations(activations):
    model, feeds = _node_model("LSTM", "forward", 2, activations=activations)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    _assert_same(before, _rewritten(model, lambda g, n, c, w: node_as_steps(g, n, TIME, BATCH, c, w)), feeds)


@pytest.mark.parametrize("op,direction", itertools.product(("LSTM", "GRU", "RNN"), ("reverse", "bidirectional")))
def test_a_backward_node_as_forward_nodes_computes_the_node(op, direction):
    model, feeds = _node_model(op, direction, 3, states=True)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    after = _rewritten(model, lambda g, n, c, w: as_forward_nodes(g, n, c, w))
    assert {helpers.direction_of(n) for n in helpers.nodes_of_types(after, [op])} == {"forward"}
    _assert_same(before, after, feeds)


@pytest.mark.parametrize("op,direction", itertools.product(("LSTM", "GRU", "RNN"),
                                                           ("forward", "reverse", "bidirectional")))
def test_y_h_taken_from_y_and_zero_states_given_compute_the_node(op, direction):
    model, feeds = _node_model(op, direction, 4)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    after = _rewritten(model, lambda g, n, c, w: last_step_as_y_h(g, n, w))
    (node,) = helpers.nodes_of_types(after, [op])
    assert len(node.output) < 2 or not node.output[1]
    _assert_same(before, after, feeds)
    after = _rewritten(after, lambda g, n, c, w: zero_initial_states(
        g, next(x for x in g.node if x.op_type == op), BATCH, np.float32, w))
    (node,) = helpers.nodes_of_types(after, [op])
    assert node.input[5]
    _assert_same(before, after, feeds)


@pytest.mark.parametrize("op", ("LSTM", "GRU"))
def test_a_bidirectional_node_read_merged_computes_the_node(op):
    """Y read as [T, B, 2H] (ncnn's own bidirectional layer): each direction's Slice and Squeeze a part of it,
    another reader (a Neg) the [T, 2, B, H] made back, Y_h the halves' last and first steps."""
    model, feeds = _node_model(op, "bidirectional", 6)
    graph = model.graph
    y = graph.output[0].name
    axes = [numpy_helper.from_array(np.array([v], np.int64), f"c{v}") for v in (0, 1, 2)]
    graph.initializer.extend(axes)
    for d in (0, 1):
        graph.node.extend([helper.make_node("Slice", [y, f"c{d}", f"c{d + 1}", "c1"], [f"s{d}"]),
                           helper.make_node("Squeeze", [f"s{d}", "c1"], [f"part{d}"])])
    graph.node.append(helper.make_node("Neg", [y], ["negated"]))
    kept = [o for o in graph.output if o.name != y]
    del graph.output[:]
    graph.output.extend(kept + [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                for n in ("part0", "part1", "negated")])
    before = onnx.ModelProto()
    before.CopyFrom(model)
    _rewritten(model, lambda g, n, c, w: read_merged(
        g, n, {t.name: numpy_helper.to_array(t) for t in g.initializer}, [TIME, BATCH, FEATURES], w))
    (node,) = helpers.nodes_of_types(model, [op])
    assert (len(node.output) == 1 or not node.output[1]) and not helpers.nodes_of_types(model, ["Squeeze"])
    _assert_same(before, model, feeds)


def test_the_op_rungs_compute_the_ops_they_replace():
    """An unsized Split given its sizes, a GatherElements reversing an axis as its pieces concatenated, a Concat
    without its empty constant."""
    from tf2onnx_rnn.rewriters.lower.op_rungs import OP_RUNGS

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [TIME, BATCH, 2 * UNITS])
    index = np.broadcast_to(np.arange(TIME)[::-1, None, None], (TIME, BATCH, UNITS)).astype(np.int64)
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], ["a", "b"], axis=2),
         helper.make_node("GatherElements", ["a", "index"], ["y"], axis=0),
         helper.make_node("Concat", ["b", "empty"], ["c"], axis=0)], "g", [x],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "c")],
        [numpy_helper.from_array(index, "index"), numpy_helper.from_array(np.zeros((0, BATCH, UNITS), np.float32),
                                                                          "empty")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": np.random.default_rng(5).normal(size=(TIME, BATCH, 2 * UNITS)).astype(np.float32)}
    before = onnx.ModelProto()
    before.CopyFrom(model)
    shapes = {"x": [TIME, BATCH, 2 * UNITS], "a": [TIME, BATCH, UNITS]}
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node, kind in zip(list(model.graph.node), ("split", "gather", "empty")):
        OP_RUNGS[node.op_type, kind](node, shapes, constants, Writer(model.graph, 17))
    assert not helpers.nodes_of_types(model, ["GatherElements"])
    assert not [n for n in model.graph.node if "empty" in n.input]
    assert all(len(n.input) == 2 for n in helpers.nodes_of_types(model, ["Split"]))
    _assert_same(before, model, feeds)


def test_moves_of_axes_of_size_1_merge_into_one_transpose():
    """A Transpose between Reshapes that only move axes of size 1 (a time-major [T, 1, ...] made batch-major and
    back) is one Transpose of the same values; a chain that keeps every axis in place goes."""
    from tf2onnx_rnn.rewriters.lower.per_step import merged_transposes
    from tf2onnx_rnn.rewriters.runtimes import static_shapes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TIME, 3, 4])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "time_major"], ["a"]),
         helper.make_node("Transpose", ["a"], ["b"], perm=[0, 1, 3, 2]),
         helper.make_node("Reshape", ["b", "batch_major"], ["y"]),
         helper.make_node("Transpose", ["x"], ["c"], perm=[0, 2, 1, 3]),
         helper.make_node("Transpose", ["c"], ["d"], perm=[0, 2, 1, 3]), helper.make_node("Neg", ["d"], ["z"])],
        "g", [x], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "z")],
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
         (("time_major", [TIME, 1, 3, 4]), ("batch_major", [1, TIME, 4, 3]))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    before = onnx.ModelProto()
    before.CopyFrom(model)
    merged_transposes(model.graph, static_shapes(model))
    assert [(n.op_type, list(helpers.attribute(n, "perm") or [])) for n in model.graph.node] == \
        [("Transpose", [0, 1, 3, 2]), ("Neg", [])]
    _assert_same(before, model, {"x": np.random.default_rng(8).normal(size=(1, TIME, 3, 4)).astype(np.float32)})


# -- Keras models through each target, in onnxruntime and (where installed) the runtime -------------------
def _model(K, name: str, seed: int):
    layers = K.layers
    x = K.Input(_step_shape(name), name="x")
    if name == "lstm":
        y = layers.LSTM(UNITS, return_sequences=True)(x)
    elif name == "gru_reset_before":
        y = layers.GRU(UNITS, return_sequences=True, reset_after=False)(x)
    elif name == "gru":
        y = layers.GRU(UNITS, return_sequences=True)(x)
    elif name == "simple_rnn":
        y = layers.SimpleRNN(UNITS, return_sequences=True)(x)
    elif name == "go_backwards":
        y = layers.LSTM(UNITS, go_backwards=True)(x)
    elif name == "bidirectional_concat":
        y = layers.Bidirectional(layers.LSTM(UNITS, return_sequences=True))(x)
    elif name == "bidirectional_gru_sum":
        y = layers.Bidirectional(layers.GRU(UNITS, return_sequences=True), merge_mode="sum")(x)
    elif name == "bidirectional_mul_ave":  # two merge modes, stacked
        h = layers.Bidirectional(layers.SimpleRNN(UNITS, return_sequences=True), merge_mode="mul")(x)
        y = layers.Bidirectional(layers.GRU(UNITS, reset_after=False), merge_mode="ave")(h)
    elif name == "bidirectional_none":  # no merge: each direction an output of its own
        y = layers.Bidirectional(layers.LSTM(UNITS, return_sequences=True), merge_mode=None)(x)
    elif name == "states_returned":
        y = layers.LSTM(UNITS, return_sequences=True, return_state=True)(x)
    elif name == "stack_states":
        seq, h, c = layers.LSTM(UNITS, return_sequences=True, return_state=True)(x)
        y = layers.GRU(UNITS)(seq, initial_state=h)
    elif name == "masked":
        y = layers.LSTM(UNITS, return_sequences=True)(layers.Masking(0.0)(x))
    elif name == "masked_bidirectional_gru":
        y = layers.Bidirectional(layers.GRU(UNITS, return_sequences=True))(layers.Masking(0.0)(x))
    elif name == "gelu_scan":
        y = layers.SimpleRNN(UNITS, activation="gelu", return_sequences=True)(x)
    elif name == "stacked_cells":
        y = layers.RNN(layers.StackedRNNCells([layers.LSTMCell(UNITS), layers.GRUCell(UNITS)]),
                       return_sequences=True)(x)
    elif name == "conv_lstm":
        y = layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True)(x)
    elif name == "conv_lstm_last":  # its last output: the Scan form pads a full-length output with an empty one
        y = layers.ConvLSTM2D(3, 3, padding="same")(x)
    model = K.Model(x, list(y) if isinstance(y, (list, tuple)) else y)
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.5, tuple(weight.shape)).astype(np.float32))
    return model


# (each model's weights are seeded by its place here: new models go last)
MODELS = ("lstm", "gru", "gru_reset_before", "simple_rnn", "go_backwards", "bidirectional_concat",
          "bidirectional_gru_sum", "stack_states", "masked", "masked_bidirectional_gru", "gelu_scan",
          "stacked_cells", "conv_lstm", "bidirectional_mul_ave", "bidirectional_none", "states_returned",
          "conv_lstm_last")
MASKED = ("masked", "masked_bidirectional_gru")
_CONVERTED: dict = {}


def _step_shape(name: str) -> tuple:
    """(time, the shape of one step) of the model's input."""
    return (TIME, 4, 4, 2) if name.startswith("conv_lstm") else (TIME, FEATURES)


def _inputs(name: str) -> np.ndarray:
    """A batch unlike the time length; a masked model's rows full, post-padded, pre-padded, holed and empty
    (5 of them), the pre-padded one third: a runtime taking one row at a time (ncnn) gets it alone."""
    if name in MASKED:
        x = np.random.default_rng(7).normal(size=(5,) + _step_shape(name)).astype(np.float32)
        x[1, 5:] = 0
        x[2, :2] = 0
        x[3, 2] = x[3, 4] = 0
        x[4] = 0
        return x
    return np.random.default_rng(7).normal(size=(BATCH,) + _step_shape(name)).astype(np.float32)


def converted(flavor: str, name: str, target: str):
    """(the input, the Keras model's outputs, the target's model or the ConversionError), once per process;
    where ``TF2ONNX_RNN_SHARED_MODELS`` names a folder, once per folder: CI's runtimes slice runs the models
    its main suite converted."""
    key = (flavor, name, target)
    if key not in _CONVERTED:
        _CONVERTED[key] = _shared(key) or _converted(*key)
    return _CONVERTED[key]


def _converted(flavor: str, name: str, target: str):
    import tensorflow as tf

    model = _model(parity.keras_module(flavor), name, 11 + MODELS.index(name))
    x = _inputs(name)
    if target in BY_KEY and BY_KEY[target].batch_one:  # ncnn: one row at a time, the pre-padded masked one
        x = x[2:3]
    want = [np.asarray(o) for o in tf.nest.flatten(model(x, training=False))]
    try:
        proto = convert_keras(model, input_signature=[tf.TensorSpec(x.shape, tf.float32, name="x")],
                              target=target)
    except ConversionError as error:
        proto = error
    folder = os.environ.get("TF2ONNX_RNN_SHARED_MODELS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, "-".join((flavor, name, target)))
        arrays = {"x": x, **{f"want{k}": w for k, w in enumerate(want)}}
        arrays["refused"] = np.array(str(proto) if isinstance(proto, ConversionError) else "")
        if not isinstance(proto, ConversionError):
            onnx.save(proto, stem + ".onnx")
        np.savez(stem + ".partial.npz", **arrays)
        os.replace(stem + ".partial.npz", stem + ".npz")  # the model's file first, then its arrays: whole or absent
    return x, want, proto


def _shared(key: tuple):
    folder = os.environ.get("TF2ONNX_RNN_SHARED_MODELS")
    stem = os.path.join(folder, "-".join(key)) if folder else ""
    if not folder or not os.path.exists(stem + ".npz"):
        return None
    stored = np.load(stem + ".npz")
    want = [stored[f"want{k}"] for k in range(len(stored.files) - 2)]
    refused = str(stored["refused"])
    return stored["x"], want, ConversionError(refused) if refused else onnx.load(stem + ".onnx")


# what a target refuses, each with the measured reason the refusal names (docs/downstream.md): nothing now
REFUSED: dict = {}


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_a_target_model_equals_keras_and_holds_nothing_its_runtime_lacks(target, name, flavor):
    x, want, proto = converted(flavor, name, target)
    if (target, name) in REFUSED:
        assert isinstance(proto, ConversionError), f"{target} {name} was expected to be refused"
        message = str(proto)
        assert "\n" not in message and message.startswith(f"target {target}: {BY_KEY[target].name} cannot compute")
        assert REFUSED[(target, name)] in message, message
        return
    assert not isinstance(proto, ConversionError), proto
    assert not obstacles(proto, BY_KEY[target]), obstacles(proto, BY_KEY[target])
    assert not helpers.nodes_of_types(proto, ["Loop"])
    got = _run(proto, {"x": x})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    report = report_of(proto)
    assert report.consumers[0].startswith("runs in, as ONNX defines it:") and target in report.consumers[0], \
        report.table()


@pytest.mark.parametrize("name", ("bidirectional_concat", "bidirectional_gru_sum", "bidirectional_none"))
@pytest.mark.parametrize("target", TARGETS)
def test_a_bidirectional_layer_stays_one_node_where_its_runtime_maps_one(target, name):
    """ncnn's own bidirectional LSTM and GRU layers (its Y read merged, [T, B, 2H]), IREE's LSTM, rknn's."""
    _, _, proto = converted(parity.FLAVORS[0], name, target)
    op = "GRU" if "gru" in name else "LSTM"
    nodes = helpers.nodes_of_types(proto, [op])
    if BIDIRECTIONAL in BY_KEY[target].recurrent.get(op, ()):
        assert [helpers.direction_of(n) for n in nodes] == [BIDIRECTIONAL], helpers.op_counts(proto)
    else:
        assert BIDIRECTIONAL not in {helpers.direction_of(n) for n in nodes}, helpers.op_counts(proto)


@pytest.mark.parametrize("target", TARGETS)
def test_a_target_refuses_a_dynamic_signature_in_one_line_naming_inputs(target):
    """And ncnn, whose blobs have no batch axis, a batch other than 1."""
    K = parity.keras_module(parity.FLAVORS[0])
    model = _model(K, "lstm", 3)
    with pytest.raises(ConversionError) as raised:
        convert_keras(model, target=target)
    message = str(raised.value)
    assert "\n" not in message and "fixed shapes" in message and "inputs" in message, message
    if BY_KEY[target].batch_one:
        import tensorflow as tf

        with pytest.raises(ConversionError, match=r"one batch row at a time.*batch size 1.*x\[1,7,5\]"):
            convert_keras(model, input_signature=[tf.TensorSpec((2, TIME, FEATURES), tf.float32, name="x")],
                          target=target)


def test_the_report_names_the_runtimes_and_the_silent_obstacles_of_the_default_form():
    K = parity.keras_module(parity.FLAVORS[0])
    proto = convert_keras(_model(K, "masked", 12))
    lines = report_of(proto).consumers
    assert lines[0].startswith("runs in, as ONNX defines it: onnxruntime"), lines
    iree = next(line for line in lines if line.startswith("note: IREE"))
    assert "sequence_lens" in iree and "silently wrong" in iree and "--target iree" in iree, lines
    tvm = next(line for line in lines if line.startswith("note: Apache TVM"))
    assert "--target tvm" in tvm, lines
    assert "openvino" not in lines[0] and "iree" not in lines[0], lines


def test_every_runtime_target_has_its_row_and_every_row_its_evidence():
    for target in TARGETS:
        row = BY_KEY[target]
        assert row.target == target and row.measured and row.package and row.static_shapes
    assert all(row.measured for row in RUNTIMES)


# -- in the runtimes themselves ---------------------------------------------------------------------------
def _python(target: str):
    from tf2onnx_rnn.runtime_check import python_for

    return python_for(BY_KEY[target])


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_a_target_model_equals_keras_in_its_runtime(target, name, flavor, tmp_path):
    python = _python(target)
    if python is None:
        pytest.skip(f"{BY_KEY[target].name} is not installed (set TF2ONNX_RNN_{target.upper()}_PYTHON to an "
                    f"interpreter that has {BY_KEY[target].package})")
    if (target, name) in REFUSED:
        pytest.skip("refused: the test above checks the refusal")
    x, want, proto = converted(flavor, name, target)
    from tf2onnx_rnn.runtime_check import RuntimeSession

    session = RuntimeSession(proto, BY_KEY[target], python, str(tmp_path))
    got = session.run(None, {"x": x})
    tolerance = max(1e-4, BY_KEY[target].tolerance)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g).reshape(w.shape), w, rtol=tolerance, atol=tolerance)


def test_a_runtime_child_serves_one_run_after_another_and_a_crashed_one_is_replaced(tmp_path):
    """Runs in a runtime share one child process (the runtime imported once); a run the runtime fails on
    is a line and leaves the child serving; one that ends the child is a line too, and the next run gets
    a new child. (This interpreter as the runtime's: a model file that does not exist fails in any runtime,
    installed or not, and feeds that are no file end the child.)"""
    from tf2onnx_rnn import runtime_check

    row = BY_KEY["iree"]
    feeds, outputs = str(tmp_path / "feeds.npz"), str(tmp_path / "outputs.npz")
    np.savez(feeds, x=np.zeros((1, 2, 3), np.float32))
    missing = str(tmp_path / "missing.onnx")
    child = runtime_check._child(row, sys.executable)
    try:
        failures = [child.run([missing, feeds, outputs]) for _ in range(2)]
        assert all(failure and "\n" not in failure for failure in failures), failures
        assert runtime_check._child(row, sys.executable) is child and child.alive()
        crashed = child.run([missing, str(tmp_path / "no-feeds.npz"), outputs])
        assert crashed == f"{row.name} crashed (exit 1) on the model" and not child.alive(), crashed
        replacement = runtime_check._child(row, sys.executable)
        assert replacement is not child and replacement.alive()
        assert replacement.run([missing, feeds, outputs]) == failures[0]
    finally:
        runtime_check._child(row, sys.executable).close()


def test_verify_with_a_target_runs_in_that_runtime_or_says_it_is_missing(tmp_path):
    """``--verify --target tvm``: verified in TVM where the runtime is there, else the check line says so."""
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "lstm_gru_savedmodel")
    output = str(tmp_path / "m.onnx")
    done = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--saved-model", example, "--output", output,
                           "--target", "tvm", "--inputs", "sequence[2,12,8]", "--verify"],
                          capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode == 2 and "inputs" in text:  # the example's input has another name or shape
        pytest.skip(text.strip().splitlines()[-1])
    assert done.returncode == 0, text
    if _python("tvm"):
        assert "ONNX in Apache TVM" in text and "verified in Apache TVM" in text, text
    else:
        assert "is not installed here" in text and "verified in onnxruntime only" in text, text


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("name", ("masked", "masked_bidirectional_gru", "go_backwards", "stack_states", "gelu_scan",
                                  "bidirectional_none"))
def test_the_portable_form_is_exact_under_onnx_reference_evaluator(name, flavor):
    """ONNX's reference evaluator ignores ``sequence_lens``: its row's target, the portable form, computes
    without it (the default form's masked layers would come out wrong there, and the report says so)."""
    from onnx.reference import ReferenceEvaluator

    x, want, proto = converted(flavor, name, "portable")
    assert not obstacles(proto, BY_KEY["reference"]), obstacles(proto, BY_KEY["reference"])
    got = ReferenceEvaluator(proto).run(None, {"x": x})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    if name.startswith("masked"):
        default = convert_keras(_model(parity.keras_module(flavor), name, 11 + MODELS.index(name)))
        note = next(line for line in report_of(default).consumers if line.startswith("note: ONNX's reference"))
        assert "sequence_lens" in note and "silently wrong" in note and "--target portable" in note, note
