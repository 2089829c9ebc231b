"""The written model's If nodes made lean (``rewriters.emit.if_branches``), on hand-built graphs: what
only one branch reads moves into it, a Transpose of an If's output moves into both branches, a branch
output passed through an Identity is made by its producer, a recurrent node never moves; the outputs
stay the same bit for bit for either branch. The masked layers built this way are the parity tests'
(test_parity_masking runs every converted model on batches that take each branch)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers
from tf2onnx_rnn.rewriters.emit.if_branches import lean_branches

T, B, F = 5, 3, 2


def _branch(name: str, nodes: list, output: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])


def _model(shared_reader: bool = False, unread: bool = False) -> onnx.ModelProto:
    """x [B, T, F] -> Transpose (time-major) read by both branches of an If on ``c``: then passes it
    through an Identity, else negates it; the If's output is transposed back to batch-major. With
    ``shared_reader`` the main graph reads the time-major tensor too (a second output); with
    ``unread``, a chain of two nodes nothing reads (an Abs of x, a Neg of it)."""
    then = _branch("then", [helper.make_node("Identity", ["x_tm"], ["then_out"])], "then_out")
    other = _branch("else", [helper.make_node("Neg", ["x_tm"], ["else_out"])], "else_out")
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2], name="to_time_major"),
             helper.make_node("If", ["c"], ["chosen"], then_branch=then, else_branch=other, name="if"),
             helper.make_node("Transpose", ["chosen"], ["y"], perm=[1, 0, 2], name="to_batch_major")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if unread:
        nodes[1:1] = [helper.make_node("Abs", ["x"], ["unread_abs"]),
                      helper.make_node("Neg", ["unread_abs"], ["unread"])]
    if shared_reader:
        nodes.append(helper.make_node("Abs", ["x_tm"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, F]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _runs(model) -> list:
    x = np.random.default_rng(0).standard_normal((B, T, F)).astype(np.float32)
    session = helpers.ort_session(model)
    return [session.run(None, {"x": x, "c": np.array(c)}) for c in (True, False)]


def test_what_only_the_branches_read_moves_into_them():
    model = _model()
    want = _runs(model)
    assert lean_branches(model) == 2  # the transposes in, the outer one into both branches
    (if_node,) = model.graph.node
    branches = {a.name: a.g for a in if_node.attribute}
    assert [n.op_type for n in branches["else_branch"].node] == ["Transpose", "Neg", "Transpose"]
    # the lean branch: the input's transpose, then the output's, no Identity left
    assert [n.op_type for n in branches["then_branch"].node] == ["Transpose", "Transpose"]
    assert list(if_node.output) == ["y"]
    for before, after in zip(want, _runs(model)):
        np.testing.assert_array_equal(after[0], before[0])


def test_nodes_nothing_reads_are_dropped():
    model = _model(unread=True)
    want = _runs(model)
    assert lean_branches(model) == 4  # the two transposes, and the unread chain
    assert [n.op_type for n in model.graph.node] == ["If"]
    for before, after in zip(want, _runs(model)):
        np.testing.assert_array_equal(after[0], before[0])


def test_a_node_the_main_graph_reads_stays():
    model = _model(shared_reader=True)
    want = _runs(model)
    lean_branches(model)
    assert [n.name for n in model.graph.node if n.op_type == "Transpose"] == ["to_time_major"]
    for before, after in zip(want, _runs(model)):
        for a, b in zip(after, before):
            np.testing.assert_array_equal(a, b)


def test_a_recurrent_node_never_moves():
    """onnxruntime prepacks a recurrent node's weights in the main graph only."""
    hidden = 2
    rng = np.random.default_rng(1)
    weights = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())
               for name, shape in (("W", [1, hidden, F]), ("R", [1, hidden, hidden]))]
    then = _branch("then", [helper.make_node("Squeeze", ["Y", "one"], ["then_out"])], "then_out")
    other = _branch("else", [helper.make_node("Squeeze", ["Y", "one"], ["s"]),
                             helper.make_node("Neg", ["s"], ["else_out"])], "else_out")
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
             helper.make_node("RNN", ["x_tm", "W", "R"], ["Y"], hidden_size=hidden),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, F]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              weights + [helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    want = _runs(model)
    assert lean_branches(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Transpose", "RNN", "If"]
    for before, after in zip(want, _runs(model)):
        np.testing.assert_array_equal(after[0], before[0])


@pytest.mark.parametrize("shared_reader", [False, True])
def test_a_model_without_if_is_left_as_it_is(shared_reader):
    model = _model(shared_reader)
    model.graph.node.remove(model.graph.node[1])  # the If
    model.graph.node[1].input[0] = "x_tm"
    before = model.SerializeToString()
    assert lean_branches(model) == 0
    assert model.SerializeToString() == before
