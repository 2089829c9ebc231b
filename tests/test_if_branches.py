"""The written model's If nodes made lean (``rewriters.written.if_branches``), on hand-built graphs: what
only one branch reads moves into it, a Transpose of an If's output moves into both branches, a branch
output passed through an Identity is made by its producer, a recurrent node never moves, a
Bidirectional's halves chosen by Ifs on one condition meet in one If whose lean branch transposes the
node's output once; the outputs
stay the same bit for bit for either branch. The masked layers built this way are the parity tests'
(test_parity_masking runs every converted model on batches that take each branch)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers
from tf2onnx_rnn.rewriters.written.if_branches import lean_branches

T, B, F = 5, 3, 2


def _branch(name: str, nodes: list, output: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])


def _as_model(nodes: list, outputs: list, initializers=(), conditions=("c",)) -> onnx.ModelProto:
    """A model of ``nodes`` over x [batch, T, F] and the bool scalars ``conditions``; ``outputs`` are names."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, F])] + [
        helper.make_tensor_value_info(name, TensorProto.BOOL, []) for name in conditions]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


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
    outputs = ["y"]
    if unread:
        nodes[1:1] = [helper.make_node("Abs", ["x"], ["unread_abs"]),
                      helper.make_node("Neg", ["unread_abs"], ["unread"])]
    if shared_reader:
        nodes.append(helper.make_node("Abs", ["x_tm"], ["z"]))
        outputs.append("z")
    return _as_model(nodes, outputs)


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
    model = _as_model(nodes, ["y"], weights + [helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    want = _runs(model)
    assert lean_branches(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Transpose", "RNN", "If"]
    for before, after in zip(want, _runs(model)):
        np.testing.assert_array_equal(after[0], before[0])


def test_the_mask_flags_are_read_from_keras_any_as_uint8s():
    """``Cast(Cast(r, bool), int64)`` of ``r = ReduceMax(Cast(b, uint8))`` (Keras's ``Any`` as the rewriter
    writes it, whose flags the emitter cannot see: the rewrite of ``Any`` comes after the loops) reads
    ``r``: the same 0/1 values, no Cast chain. A chain from anything else stays."""
    def chain(source_type):
        nodes = [helper.make_node("Not", ["padding"], ["kept"]),
                 helper.make_node("Cast", ["kept"], ["kept_u8"], to=source_type),
                 helper.make_node("ReduceMax", ["kept_u8"], ["any_u8"], axes=[2], keepdims=0),
                 helper.make_node("Cast", ["any_u8"], ["any"], to=TensorProto.BOOL),
                 helper.make_node("Cast", ["any"], ["flags"], to=TensorProto.INT64),
                 helper.make_node("ReduceSum", ["flags"], ["counts"], keepdims=0, axes=[1]),
                 helper.make_node("Cast", ["counts"], ["counted"], to=TensorProto.FLOAT),
                 helper.make_node("If", ["c"], ["y"], then_branch=_branch(
                     "then", [helper.make_node("Identity", ["counted"], ["then_out"])], "then_out"),
                     else_branch=_branch("else", [helper.make_node("Neg", ["counted"], ["else_out"])], "else_out"))]
        inputs = [helper.make_tensor_value_info("padding", TensorProto.BOOL, [B, T, F]),
                  helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
        graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
        model.ir_version = 8
        return model

    padding = np.random.default_rng(2).random((B, T, F)) < 0.6

    def run(model):
        return np.concatenate([helpers.ort_session(model).run(None, {"padding": padding, "c": np.array(c)})[0]
                               for c in (True, False)])

    model = chain(TensorProto.UINT8)
    want = run(model)
    assert lean_branches(model) >= 1
    flags = next(n for n in helpers.all_nodes(model) if n.output[0] == "flags")
    assert list(flags.input) == ["any_u8"], flags
    np.testing.assert_array_equal(run(model), want)
    assert want[:B].max() > 0 and want[:B].min() < T  # the batch has kept and masked steps
    model = chain(TensorProto.INT32)  # not the rewriter's uint8 flags: left as it is
    lean_branches(model)
    assert next(n for n in helpers.all_nodes(model) if n.output[0] == "flags").input[0] == "any"


@pytest.mark.parametrize("shared_reader", [False, True])
def test_a_model_without_if_is_left_as_it_is(shared_reader):
    model = _model(shared_reader)
    model.graph.node.remove(model.graph.node[1])  # the If
    model.graph.node[1].input[0] = "x_tm"
    before = model.SerializeToString()
    assert lean_branches(model) == 0
    assert model.SerializeToString() == before


H = 4


def _bidirectional_model(same_condition: bool = True, order=(0, 1)) -> onnx.ModelProto:
    """A bidirectional LSTM's Y [T, 2, B, H] split into its halves, each chosen by its own If (then: the
    half as it is, gathered from Y; else: the half negated), Keras's Concat of the halves and its
    transpose to batch-major [B, T, 2H]. Both Ifs test ``c`` (``same_condition``), or the second ``d``."""
    rng = np.random.default_rng(3)
    weights = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())
               for name, shape in (("W", [2, 4 * H, F]), ("R", [2, 4 * H, H]))]
    ifs = []
    for direction in (0, 1):
        index = helper.make_tensor(f"i{direction}", TensorProto.INT64, [], [order[direction]])
        then = _branch(f"then{direction}", [helper.make_node("Gather", ["y4", f"i{direction}"], [f"half{direction}"],
                                                              axis=1)], f"half{direction}")
        then.initializer.append(index)
        negated = [helper.make_node("Gather", ["y4", f"i{direction}"], [f"g{direction}"], axis=1),
                   helper.make_node("Neg", [f"g{direction}"], [f"neg{direction}"])]
        other = _branch(f"else{direction}", negated, f"neg{direction}")
        other.initializer.append(index)
        condition = "c" if same_condition or direction == 0 else "d"
        ifs.append(helper.make_node("If", [condition], [f"chosen{direction}"], then_branch=then, else_branch=other,
                                    name=f"if{direction}"))
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
             helper.make_node("LSTM", ["x_tm", "W", "R"], ["y4"], hidden_size=H, direction="bidirectional"),
             *ifs,
             helper.make_node("Concat", ["chosen0", "chosen1"], ["both"], axis=2, name="concat"),
             helper.make_node("Transpose", ["both"], ["y"], perm=[1, 0, 2], name="to_batch_major")]
    return _as_model(nodes, ["y"], weights, conditions=("c", "d"))


def _bidirectional_runs(model) -> list:
    x = np.random.default_rng(0).standard_normal((B, T, F)).astype(np.float32)
    session = helpers.ort_session(model)
    return [session.run(None, {"x": x, "c": np.array(c), "d": np.array(d)})
            for c in (True, False) for d in (True, False)]


def test_a_bidirectional_layers_halves_meet_in_one_if_and_the_lean_branch_transposes_once():
    model = _bidirectional_model()
    want = _bidirectional_runs(model)
    lean_branches(model)
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    assert len(ifs) == 1 and "Concat" not in [n.op_type for n in model.graph.node], model.graph.node
    branches = {a.name: a.g for a in ifs[0].attribute}
    # the lean branch: Y transposed to [B, T, 2, H] and reshaped, no half gathered, no index constant left
    assert [n.op_type for n in branches["then_branch"].node] == ["Transpose", "Constant", "Reshape"]
    assert not branches["then_branch"].initializer
    assert [n.op_type for n in branches["else_branch"].node].count("Concat") == 1
    got = _bidirectional_runs(model)
    for before, after in zip(want, got):
        np.testing.assert_array_equal(before[0], after[0])


@pytest.mark.parametrize("same_condition, order", [(False, (0, 1)), (True, (1, 0))],
                         ids=["two-conditions", "backward-first"])
def test_halves_on_two_conditions_stay_apart_and_other_orders_are_gathered(same_condition, order):
    """Ifs on different conditions are not merged; halves concatenated backward first are merged but
    still gathered (the one transpose would put them forward first)."""
    model = _bidirectional_model(same_condition, order)
    want = _bidirectional_runs(model)
    lean_branches(model)
    ifs = [n for n in helpers.all_nodes(model) if n.op_type == "If"]
    assert len(ifs) == (1 if same_condition else 2)
    assert "Gather" in [n.op_type for n in helpers.all_nodes(model)]
    got = _bidirectional_runs(model)
    for before, after in zip(want, got):
        np.testing.assert_array_equal(before[0], after[0])


def test_what_the_same_branch_of_ifs_on_one_condition_reads_moves_into_each():
    """A chain only the else-branches of two Ifs on ``c`` read (a mask's post-padding test, read by a
    layer's input and output Ifs) moves into both: a run that takes the then-branches computes none of it.
    Read by the then-branch of one and the else-branch of the other, it stays."""
    for sides, moves in ((("else", "else"), True), (("then", "else"), False)):
        ifs = []
        for index, side in enumerate(sides):
            reader = helper.make_node("Add", ["x", "test"], [f"read{index}"])
            branches = {side: _branch(f"{side}{index}", [reader], f"read{index}"),
                        {"then": "else", "else": "then"}[side]: _branch(
                            f"plain{index}", [helper.make_node("Neg", ["x"], [f"neg{index}"])], f"neg{index}")}
            ifs.append(helper.make_node("If", ["c"], [f"y{index}"], then_branch=branches["then"],
                                        else_branch=branches["else"], name=f"if{index}"))
        nodes = [helper.make_node("Abs", ["x"], ["absolute"]), helper.make_node("Exp", ["absolute"], ["test"])] + ifs
        model = _as_model(nodes, ["y0", "y1"])
        want = _runs(model)
        lean_branches(model)
        main = [n.op_type for n in model.graph.node]
        assert main == (["If", "If"] if moves else ["Abs", "Exp", "If", "If"]), main
        if moves:
            for node in model.graph.node:
                branches = {a.name: a.g for a in node.attribute}
                assert [n.op_type for n in branches["else_branch"].node] == ["Abs", "Exp", "Add"]
        for before, after in zip(want, _runs(model)):
            for a, b in zip(before, after):
                np.testing.assert_array_equal(a, b)
