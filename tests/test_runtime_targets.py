"""The runtime targets (``iree``, ``tvm``, ``ncnn``, ``rknn``) and the table of runtimes behind them.

Without any of those runtimes, this checks what can be checked in onnxruntime: every lowering rung
(a recurrent node as its steps, a Scan as its steps, forward nodes with a reversal, ``Y_h`` from ``Y``,
zero initial states) computes what the node or Scan computes, for every op, direction and attribute the
package writes; each target's model equals Keras (both flavors, random weights and biases, batch unlike
time, a mask mixing full, post-padded, pre-padded, holed and empty rows) and holds nothing its runtime's
row lacks; a dynamic signature is refused in one line naming ``inputs``; the report's "runs in" lines
follow the table; a stateful model over a fixed chunk, fed chunk after chunk, equals Keras over the whole
sequence, in onnxruntime and (with a runtime's interpreter named by ``TF2ONNX_RNN_<RUNTIME>_PYTHON``: CI's
runtime slice makes one environment per runtime) in its runtime. Every target's model runs in its runtime,
and in every other runtime its report names, in ``test_runtime_claims.py``.
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
from runtime_models import BATCH, FEATURES, MODELS, TARGETS, TIME, UNITS, converted, seed
from runtime_models import model as _model
from tf2onnx_rnn import ConversionError, convert_keras, report_of
from tf2onnx_rnn.rewriters.obstacles import node_obstacles, obstacles
from tf2onnx_rnn.rewriters.runtimes import BIDIRECTIONAL, BY_KEY, MODEL_KINDS, RUNTIMES
from tf2onnx_rnn.rewriters.written.builder import Writer
from tf2onnx_rnn.rewriters.written.graph import attribute
from tf2onnx_rnn.rewriters.written.lower.forward import (
    as_forward_nodes,
    last_step_as_y_h,
    read_merged,
    zero_initial_states,
)
from tf2onnx_rnn.rewriters.written.lower.scan_node import node_as_scan
from tf2onnx_rnn.rewriters.written.lower.steps import node_as_steps

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


@pytest.mark.parametrize("op,direction,lbr,states,peepholes", [c[:5] for c in NODE_CASES if not c[5]],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("sliced", (False, True), ids=("backwards", "sliced"))
def test_a_recurrent_node_as_a_scan_computes_the_node(op, direction, lbr, states, peepholes, sliced):
    """Its time and batch left dynamic: zero states made from the input's batch; a backward pass scanning
    backwards, or forwards over its input reversed by a Slice."""
    model, feeds = _node_model(op, direction, 5, lbr, states, peepholes, clip=1.5 if states else None)
    for value in model.graph.input:  # x [T, B, F]; the states [directions, B, H]
        dims = value.type.tensor_type.shape.dim
        dims[1].dim_param = "B"
        if value.name == "x":
            dims[0].dim_param = "T"
    before = onnx.ModelProto()
    before.CopyFrom(model)
    after = _rewritten(model, lambda g, n, c, w: node_as_scan(g, n, c, w, reversed_by_slices=sliced))
    assert not helpers.nodes_of_types(after, helpers.RECURRENT_OPS)
    assert len(helpers.nodes_of_types(after, ["Scan"])) == (2 if direction == "bidirectional" else 1)
    _assert_same(before, after, feeds)


# alpha and beta lists as onnxruntime reads them: consumed in order by the functions that take them
@pytest.mark.parametrize("direction,activations", [
    ("forward", dict(activations=["HardSigmoid", "Relu", "Elu"], activation_alpha=[0.3, 0.0],
                     activation_beta=[0.4])),
    ("forward", dict(activations=["HardSigmoid", "Tanh", "Elu"], activation_alpha=[0.3, 1.7],
                     activation_beta=[0.4])),
    ("forward", dict(activations=["Affine", "ScaledTanh", "Softsign"], activation_alpha=[0.5, 1.5],
                     activation_beta=[.1, .7])),
    ("forward", dict(activations=["Sigmoid", "LeakyRelu", "ThresholdedRelu"], activation_alpha=[0.2, 0.3])),
    ("bidirectional", dict(activations=["HardSigmoid", "Tanh", "Tanh"] * 2, activation_alpha=[1 / 6, 0.2],
                           activation_beta=[0.5, 0.4])),
    ("bidirectional", dict(activations=["Sigmoid", "LeakyRelu", "Tanh", "HardSigmoid", "Elu", "Elu"],
                           activation_alpha=[0.1, 0.3, 0.6, 2.0], activation_beta=[0.45]))],
    ids=lambda a: a if isinstance(a, str) else "-".join(a["activations"][:3]))
@pytest.mark.parametrize("rung", ("steps", "scan"))
def test_the_steps_and_the_scan_apply_the_nodes_activations(rung, direction, activations):
    model, feeds = _node_model("LSTM", direction, 2, activations=activations)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    rewrite = (lambda g, n, c, w: node_as_steps(g, n, TIME, BATCH, c, w)) if rung == "steps" else node_as_scan
    _assert_same(before, _rewritten(model, rewrite), feeds)


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
    without its empty constant, a Pad with its default mode written (each an obstacle of ncnn's row first)."""
    from tf2onnx_rnn.rewriters.written.lower.op_rungs import OP_RUNGS

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [TIME, BATCH, 2 * UNITS])
    index = np.broadcast_to(np.arange(TIME)[::-1, None, None], (TIME, BATCH, UNITS)).astype(np.int64)
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], ["a", "b"], axis=2),
         helper.make_node("GatherElements", ["a", "index"], ["y"], axis=0),
         helper.make_node("Concat", ["b", "empty"], ["c"], axis=0),
         helper.make_node("Pad", ["c", "pads"], ["p"])], "g", [x],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "p")],
        [numpy_helper.from_array(index, "index"), numpy_helper.from_array(np.zeros((0, BATCH, UNITS), np.float32),
                                                                          "empty"),
         numpy_helper.from_array(np.array([0, 0, 0, 2, 0, 1], np.int64), "pads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": np.random.default_rng(5).normal(size=(TIME, BATCH, 2 * UNITS)).astype(np.float32)}
    before = onnx.ModelProto()
    before.CopyFrom(model)
    shapes = {"x": [TIME, BATCH, 2 * UNITS], "a": [TIME, BATCH, UNITS]}
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = list(model.graph.node)
    assert [[o.kind for o in node_obstacles(n, BY_KEY["ncnn"], constants, True, {})] for n in nodes[1:]] == \
        [["gather"], ["empty"], ["pad"]]
    for node, kind in zip(nodes, ("split", "gather", "empty", "pad")):
        OP_RUNGS[node.op_type, kind](node, shapes, constants, Writer(model.graph, 17))
    assert all(attribute(n, "mode") == "constant" for n in helpers.nodes_of_types(model, ["Pad"]))
    assert not helpers.nodes_of_types(model, ["GatherElements"])
    assert not [n for n in model.graph.node if "empty" in n.input]
    assert all(len(n.input) == 2 for n in helpers.nodes_of_types(model, ["Split"]))
    _assert_same(before, model, feeds)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 2, 0], [10**9, 10**9, 10**9], [0, 1, 2], [1, 2, 1]),  # every other step from the third (a MinGRU's)
    ([0, 0, 0], [10**9, -1, 10**9], [0, 1, 2], [1, 2, 1]),  # every other step but the last
    ([-1], [-(2**63)], [0], [-1]),  # a whole axis reversed
    ([1, 5], [-1, 0], [2, 0], [2, -3]),  # two axes at once, one backwards by 3
])
def test_a_slice_of_any_step_as_its_pieces_computes_the_slice(starts, ends, axes, steps):
    """ncnn loads no Slice of a step over 1 (pnnx leaves Tensor.slice) and drops one of step -1: the rung writes
    the picked pieces concatenated, and a plain Slice for an axis of step 1."""
    from tf2onnx_rnn.rewriters.written.lower.op_rungs import OP_RUNGS

    shape = [TIME, BATCH, 2 * UNITS]
    params = [numpy_helper.from_array(np.array(v, np.int64), name)
              for v, name in ((starts, "starts"), (ends, "ends"), (axes, "axes"), (steps, "steps"))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    before = onnx.ModelProto()
    before.CopyFrom(model)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    (node,) = model.graph.node
    assert [o.kind for o in node_obstacles(node, BY_KEY["ncnn"], constants, True, {})] == ["slice"]
    OP_RUNGS["Slice", "slice"](node, {"x": shape}, constants, Writer(model.graph, 17))
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    left = [constants[n.input[4]] for n in helpers.nodes_of_types(model, ["Slice"]) if len(n.input) > 4]
    assert all((np.asarray(step) == 1).all() for step in left)
    assert not [o for n in model.graph.node for o in node_obstacles(n, BY_KEY["ncnn"], constants, True, {})]
    _assert_same(before, model, {"x": np.random.default_rng(5).normal(size=shape).astype(np.float32)})


@pytest.mark.parametrize("rank", [4, 5])
def test_a_gather_of_one_index_from_a_rank_5_tensor_is_ncnns_obstacle(rank):
    """pnnx makes such a Gather (an LMUFeedforward's spectrum) a torch.unbind ncnn does not load; at rank 4 it is
    mapped."""
    shape = [1, 1, 3, 4, 2][:rank]
    graph = helper.make_graph([helper.make_node("Gather", ["x", "k"], ["y"], axis=rank - 1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape[:-1])],
                              [numpy_helper.from_array(np.array(1, np.int64), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    found = [(o.kind, o.why) for o in obstacles(model, BY_KEY["ncnn"])]
    assert found == ([("op", "has no Gather of one index from a tensor of rank 5")] if rank == 5 else [])
    assert not obstacles(model, BY_KEY["openvino"])


REDUCTIONS = [("ReduceSum", 15, [1, 6, 10], 1, 0), ("ReduceSum", 15, [1, 6, 10], 2, 1),
              ("ReduceSum", 15, [1, 10], 1, 0), ("ReduceSum", 15, [12, 1, 5, 10], 3, 0),
              ("ReduceSum", 17, [1, 4, 6, 10], 1, 1), ("ReduceSum", 17, [1, 4, 6, 10], -1, 0),
              ("ReduceMean", 18, [1, 6, 10], 1, 0), ("ReduceMean", 18, [3, 1, 10], 0, 1)]


def _reduction(op: str, opset: int, shape: list, axis: int, keep: int):
    """A model computing ``op`` of x * x along ``axis``, given as an input, and its feeds."""
    graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["m"]),
                               helper.make_node(op, ["m", "axes"], ["y"], keepdims=keep)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([axis], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, {"x": np.random.default_rng(len(shape) + axis).normal(size=shape).astype(np.float32)}


def _rung_applied(model: onnx.ModelProto) -> onnx.ModelProto:
    from tf2onnx_rnn.rewriters.written.graph import static_shapes
    from tf2onnx_rnn.rewriters.written.lower.op_rungs import OP_RUNGS

    after = onnx.ModelProto()
    after.CopyFrom(model)
    constants = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    node = after.graph.node[1]
    writer = Writer(after.graph, after.opset_import[0].version)
    OP_RUNGS[node.op_type, "reduce"](node, static_shapes(after), constants, writer)
    return after


@pytest.mark.parametrize("op,opset,shape,axis,keep", REDUCTIONS, ids=str)
def test_a_reduction_of_one_axis_given_as_an_input_is_ncnns_silent_obstacle_and_its_rung_the_same(
        op, opset, shape, axis, keep):
    """pnnx writes a ReduceSum (ReduceMean from opset 18) of one axis given as an input as an ncnn Reduction of no
    axis, which reduces nothing (an LTC cell's sums: its output came out [1, 1, 24, 10, 10] for [1, 12, 2]);
    along two axes it reduces both. The rung adds an axis of size 1 to the reduction: the same values."""
    model, feeds = _reduction(op, opset, shape, axis, keep)
    def found(proto):  # the nodes' obstacles (a batch over 1 is the model's: ncnn computes a row at a time)
        return [(o.kind, o.silent) for o in obstacles(proto, BY_KEY["ncnn"]) if o.kind not in MODEL_KINDS]

    assert found(model) == [("reduce", True)] and not obstacles(model, BY_KEY["openvino"]), found(model)
    after = _rung_applied(model)
    assert not found(after), found(after)
    _assert_same(model, after, feeds)


def test_a_reduction_of_one_axis_rewritten_by_its_rung_equals_onnxruntime_in_its_runtime(tmp_path):
    """The rung's reductions in ncnn itself (each failed there as written, reducing nothing)."""
    python = _python("ncnn")
    if python is None:
        pytest.skip(f"{BY_KEY['ncnn'].name} is not installed (set TF2ONNX_RNN_NCNN_PYTHON)")
    from tf2onnx_rnn.runtime_check import RuntimeSession

    for k, case in enumerate(c for c in REDUCTIONS if c[2][0] == 1):  # ncnn's rows: a batch of one
        model, feeds = _reduction(*case)
        want = helpers.ort_session(model).run(None, feeds)[0]
        (tmp_path / str(k)).mkdir()
        runtime = RuntimeSession(_rung_applied(model), BY_KEY["ncnn"], python, str(tmp_path / str(k)))
        got = runtime.run(None, feeds)[0]
        # its blobs keep no rank: the axes of size 1 aside, the shape is the reduced one (unreduced, it is not)
        assert np.squeeze(got).shape == np.squeeze(want).shape, (case, got.shape, want.shape)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_moves_of_axes_of_size_1_merge_into_one_transpose():
    """A Transpose between Reshapes that only move axes of size 1 (a time-major [T, 1, ...] made batch-major and
    back) is one Transpose of the same values; a chain that keeps every axis in place goes."""
    from tf2onnx_rnn.rewriters.written.graph import static_shapes
    from tf2onnx_rnn.rewriters.written.lower.per_step import merged_transposes

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
    assert target in report.runs_in and report.consumers[0].startswith("runs in, as ONNX defines it:"), \
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


def test_ncnn_refuses_an_integer_input_in_one_line_and_its_report_does_not_name_it():
    """pnnx runs the model in onnxruntime on arbitrary values of an integer input (an Embedding's ids: its Gather
    fails): the ncnn target refuses such a model in one line, and no report names ncnn for it."""
    import tensorflow as tf

    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((TIME,), dtype="int32", name="x")
    model = K.Model(x, K.layers.LSTM(UNITS)(K.layers.Embedding(50, FEATURES)(x)))
    signature = [tf.TensorSpec((1, TIME), tf.int32, name="x")]
    with pytest.raises(ConversionError, match=r"^[^\n]*ncnn[^\n]*integer input \(x") as raised:
        convert_keras(model, input_signature=signature, target="ncnn")
    assert "\n" not in str(raised.value)
    report = report_of(convert_keras(model, input_signature=signature))
    assert "ncnn" not in report.runs_in and "onnxruntime" in report.runs_in, report.runs_in


def test_the_report_names_the_runtimes_and_the_silent_obstacles_of_the_default_form():
    """A few lines: where the model runs, the targets for the others, and a warning for each runtime that
    would compute it silently wrong; each runtime's reason on request."""
    K = parity.keras_module(parity.FLAVORS[0])
    report = report_of(convert_keras(_model(K, "masked", 12)))
    lines = report.consumers
    assert lines[0] == "runs in, as ONNX defines it: onnxruntime" and report.runs_in == ("onnxruntime",), lines
    assert lines[1].startswith("for the others, --target portable (openvino, tract, reference), iree, tvm"), lines
    warnings = lines[2:]
    assert all(line.startswith("warning: ") for line in warnings), lines
    # ncnn (through pnnx, at any fixed shape) reduces nothing in the mask's ReduceSum of its time axis
    assert {line.split(":")[1].strip().split(" ")[0] for line in warnings} == {"OpenVINO", "ONNX's", "IREE", "ncnn"}, \
        lines
    iree = next(line for line in warnings if line.startswith("warning: IREE"))
    assert "sequence_lens" in iree and "silently wrong" in iree and "--target iree" in iree, lines
    tvm = next(line for line in report.runtime_notes if line.startswith("Apache TVM"))
    assert "--target tvm" in tvm and "fixed shapes" in tvm, report.runtime_notes
    assert len(report.runtime_notes) == len(RUNTIMES) - 1, report.runtime_notes
    assert "Apache TVM" not in report.table() and tvm in report.table(runtime_notes=True)


def test_a_plain_conversion_has_at_most_three_lines_about_runtimes():
    """Plus one warning for each runtime that would compute it silently wrong."""
    K = parity.keras_module(parity.FLAVORS[0])
    for name in ("lstm", "simple_rnn", "bidirectional_concat", "gelu_scan"):
        proto = convert_keras(_model(K, name, 12))
        report = report_of(proto)
        table = report.table().splitlines()
        lines = [line for line in table if line.startswith(("runs in", "for the others", "note:"))]
        assert len(lines) <= 3, (name, lines)
        silent = {row.name for row in RUNTIMES if any(o.silent for o in obstacles(proto, row))}
        warned = [line for line in table if line.startswith("warning: ")]
        assert len(warned) == len(silent) and all(any(r in line for r in silent) for line in warned), (name, warned)
        assert set(report.runs_in) == {"onnxruntime", "openvino", "tract", "onnx2torch", "reference"} - (
            {"onnx2torch"} if name == "gelu_scan" else set()), (name, report.runs_in)


def test_a_model_of_more_steps_than_its_runtime_compiles_in_a_minute_says_so_and_names_the_chunked_road(monkeypatch):
    """The tvm target writes each layer out as its steps, whose nodes grow with the time length: past the nodes
    its row says TVM compiles in about a minute (lowered here to the model's size, so a short model crosses
    it), the report says so in one line naming the chunked road; under it, no such line."""
    import dataclasses

    import tensorflow as tf

    from tf2onnx_rnn.rewriters import runtimes

    K = parity.keras_module(parity.FLAVORS[0])
    model = _model(K, "lstm", seed("lstm"))
    signature = [tf.TensorSpec((1, TIME, FEATURES), tf.float32, name="x")]
    nodes = len(convert_keras(model, input_signature=signature, target="tvm").graph.node)
    for limit, said in ((nodes - 1, True), (nodes, False)):
        monkeypatch.setitem(runtimes.BY_KEY, "tvm", dataclasses.replace(BY_KEY["tvm"], nodes_in_a_minute=limit))
        report = report_of(convert_keras(model, input_signature=signature, target="tvm"))
        lines = [line for line in report.table().splitlines() if line.startswith("note: ") and "minute" in line]
        assert len(lines) == int(said), (limit, nodes, report.table())
        if said:
            assert f"{nodes} nodes" in lines[0] and f"about {limit} " in lines[0] and "chunk" in lines[0], lines
    assert all(row.nodes_in_a_minute for row in RUNTIMES if row.target == row.key), \
        [(r.key, r.nodes_in_a_minute) for r in RUNTIMES]  # measured for every runtime a target writes for
    # another runtime the report names for this form (rknn computes the steps too) past its own measure: named too
    from tf2onnx_rnn import consumers

    monkeypatch.setitem(runtimes.BY_KEY, "tvm", BY_KEY["tvm"])
    slower = tuple(dataclasses.replace(r, nodes_in_a_minute=nodes - 1) if r.key == "rknn" else r for r in RUNTIMES)
    monkeypatch.setattr(consumers, "RUNTIMES", slower)
    report = report_of(convert_keras(model, input_signature=signature, target="tvm"))
    lines = [line for line in report.table().splitlines() if line.startswith("note: ") and "minute" in line]
    assert "rknn" in report.runs_in and len(lines) == 1 and "rknn-toolkit2" in lines[0] and "TVM" not in lines[0], lines


def test_each_targets_minute_is_what_the_long_sequence_benchmark_measured():
    """A row's ``nodes_in_a_minute`` lies between the largest model its runtime compiled within a minute and the
    smallest it took longer on, in benchmarks/results/long_sequences.json: measured on both sides, not guessed."""
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results", "long_sequences.json")
    with open(path) as handle:
        measured = [row for row in json.load(handle)["rows"] if row.get("seconds") is not None]
    for target in TARGETS:
        runs = [row for row in measured if row["runtime"] == target]
        within = [row["nodes"] for row in runs if row["seconds"] <= 60]
        past = [row["nodes"] for row in runs if row["seconds"] > 60]
        assert within and past, (target, runs)  # the benchmark's lengths bracket the minute
        assert max(within) <= BY_KEY[target].nodes_in_a_minute < min(past), (target, BY_KEY[target].nodes_in_a_minute,
                                                                             runs)


def test_every_runtime_target_has_its_row_and_every_row_its_evidence():
    for target in TARGETS:
        row = BY_KEY[target]
        assert row.target == target and row.measured and row.package and row.static_shapes
    assert all(row.measured for row in RUNTIMES)


# -- in the runtimes themselves ---------------------------------------------------------------------------
def _python(target: str):
    from tf2onnx_rnn.runtime_check import python_for

    return python_for(BY_KEY[target])


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
        default = convert_keras(_model(parity.keras_module(flavor), name, seed(name)))
        note = next(line for line in report_of(default).consumers if line.startswith("warning: ONNX's reference"))
        assert "sequence_lens" in note and "silently wrong" in note and "--target portable" in note, note


# -- long sequences: a stateful model over a fixed chunk, fed chunk after chunk ----------------------------
CHUNK, CHUNKS = 8, 5  # a stream of 40 steps, 8 at a time


def _stateful_chunk_model(K):
    """(a GRU and an LSTM, stateful, over a fixed chunk of one row; the same layers over a whole sequence)"""
    def stacked(x, stateful):
        h = K.layers.GRU(UNITS, stateful=stateful, return_sequences=True, name="gru")(x)
        return K.layers.LSTM(UNITS, stateful=stateful, return_sequences=True, name="lstm")(h)

    chunk = K.Input(batch_shape=(1, CHUNK, FEATURES), name="x")
    model = K.Model(chunk, stacked(chunk, True))
    parity.randomize_weights(model, 31)
    whole = K.Input((None, FEATURES), name="x")
    twin = K.Model(whole, stacked(whole, False))
    twin.set_weights(model.get_weights())
    return model, twin


def _chunk_by_chunk(run, names: list, pairs: dict, x: np.ndarray) -> np.ndarray:
    """Output 0 over ``x``, chunk after chunk, each chunk starting from the states the one before ended with."""
    states = {name: np.zeros((1, UNITS), np.float32) for name in pairs}
    outputs = []
    for k in range(CHUNKS):
        result = dict(zip(names, run({"x": np.ascontiguousarray(x[:, k * CHUNK:(k + 1) * CHUNK]), **states})))
        outputs.append(np.asarray(result[names[0]]).reshape(1, CHUNK, UNITS))
        states = {name: np.asarray(result[output]).reshape(1, UNITS) for name, output in pairs.items()}
    return np.concatenate(outputs, axis=1)


@pytest.mark.parametrize("target", TARGETS)
def test_a_stateful_chunk_model_equals_keras_over_the_whole_sequence_in_its_runtime(target, tmp_path):
    """The road for long and unbounded sequences on the compiled and edge runtimes (docs/downstream.md): a
    stateful model over a fixed chunk, its states in and out, fed chunk after chunk, gives Keras's outputs
    over the whole sequence, in onnxruntime and in the runtime."""
    model, twin = _stateful_chunk_model(parity.keras_module(parity.FLAVORS[0]))
    proto = convert_keras(model, target=target)
    rows = report_of(proto).outcomes
    pairs = {i: o for row in rows for i, o in zip(row.state_inputs, row.state_outputs)}
    assert len(pairs) == 3 and not obstacles(proto, BY_KEY[target]), (pairs, obstacles(proto, BY_KEY[target]))
    names = [o.name for o in proto.graph.output]
    x = np.random.default_rng(5).normal(size=(1, CHUNK * CHUNKS, FEATURES)).astype(np.float32)
    want = np.asarray(twin(x, training=False))
    session = helpers.ort_session(proto)
    np.testing.assert_allclose(_chunk_by_chunk(lambda feeds: session.run(None, feeds), names, pairs, x), want,
                               rtol=1e-4, atol=1e-5)
    python = _python(target)
    if python is None:
        pytest.skip(f"{BY_KEY[target].name} is not installed (set TF2ONNX_RNN_{target.upper()}_PYTHON)")
    from tf2onnx_rnn.runtime_check import RuntimeSession

    runtime = RuntimeSession(proto, BY_KEY[target], python, str(tmp_path))
    tolerance = max(1e-4, BY_KEY[target].tolerance)
    np.testing.assert_allclose(_chunk_by_chunk(lambda feeds: runtime.run(None, feeds), names, pairs, x), want,
                               rtol=tolerance, atol=tolerance)
