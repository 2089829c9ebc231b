"""A loop that ends at the longest row of a lengths tensor (TF 1.x's ``dynamic_rnn`` given
``sequence_length``), read and written as a Scan over every step, on hand-built ONNX loops: exact
where past each row's length the step keeps its state and stacks zeros, declined with the reason
where it does not. No TensorFlow: the rule is checked on the structure alone."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers

FEATURES = 4


def _loop_model(gated_state: bool = True, zero_stack: bool = True, stack_used: bool = False) -> onnx.ModelProto:
    """x [T, B, F], lengths [B], h0 [B, F] -> h: a Loop of T steps (``h = tanh(h + x_t)``) whose
    condition ends it at ``Min(T, Max(1, ReduceMax(lengths)))``; past a row's length the state is kept
    (``gated_state``) and zeros are stacked (``zero_stack``)."""
    const = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
             (("zero_i", 0, np.int64), ("one_i", 1, np.int64), ("zero_f", 0.0, np.float32),
              ("ones_f", np.ones(FEATURES), np.float32), ("axis1", [1], np.int64))]
    outer = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero_i"], ["steps"], axis=0),
        helper.make_node("ReduceMax", ["lengths"], ["longest"], keepdims=0),
        helper.make_node("Max", ["one_i", "longest"], ["at_least_one"]),
        helper.make_node("Min", ["steps", "at_least_one"], ["bound"]),
        helper.make_node("Less", ["zero_i", "bound"], ["go"]),
    ]
    body_nodes = [
        helper.make_node("Gather", ["x", "i"], ["x_t"], axis=0),
        helper.make_node("Add", ["h", "x_t"], ["sum"]),
        helper.make_node("Tanh", ["sum"], ["h_new"]),
        helper.make_node("GreaterOrEqual", ["i", "lengths"], ["past"]),
        helper.make_node("Unsqueeze", ["past", "axis1"], ["past_rows"]),
        helper.make_node("Where", ["past_rows", "h", "h_new"], ["h_kept"]),
        helper.make_node("Identity", ["h_kept" if gated_state else "h_new"], ["h_out"]),
        helper.make_node("Where", ["past_rows", "zero_f" if zero_stack else "ones_f", "h_new"], ["y_out"]),
        helper.make_node("Add", ["i", "one_i"], ["i_next"]),
        helper.make_node("Less", ["i_next", "bound"], ["go_on"]),
    ]
    body = helper.make_graph(
        body_nodes, "step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("go_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [None, FEATURES])],
        [helper.make_tensor_value_info("go_on", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [None, FEATURES]),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [None, FEATURES])])
    loop = helper.make_node("Loop", ["steps", "go", "h0"], ["h_final", "ys"], name="rnn/while_loop", body=body)
    outputs = [helper.make_tensor_value_info("h_final", TensorProto.FLOAT, [None, FEATURES])]
    if stack_used:
        outputs.append(helper.make_tensor_value_info("ys", TensorProto.FLOAT, [None, None, FEATURES]))
    graph = helper.make_graph(outer + [loop], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, FEATURES]),
                               helper.make_tensor_value_info("lengths", TensorProto.INT64, [None]),
                               helper.make_tensor_value_info("h0", TensorProto.FLOAT, [None, FEATURES])],
                              outputs, const)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _read(model: onnx.ModelProto):
    from tf2onnx_rnn.rewriters.written.scan.loop_reading import read_loop
    from tf2onnx_rnn.rewriters.written.scope import Scope, TypeTable

    scope, types = Scope(model.graph), TypeTable(model)
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    return read_loop(loop, scope, types), loop, scope, types


def _run(model: onnx.ModelProto, x, lengths, h0) -> list:
    return helpers.ort_session(model).run(None, {"x": x, "lengths": lengths, "h0": h0})


@pytest.mark.parametrize("lengths", [[5, 0, 2], [2, 1, 0], [0, 0, 0], [5, 5, 5], [3]])
def test_a_loop_ending_at_the_longest_row_is_a_scan_of_every_step(lengths):
    from tf2onnx_rnn.rewriters.written.scan.rewrite import write_scan

    model = _loop_model()
    loop_map, loop, scope, types = _read(model)
    assert loop_map.longest_of == "lengths"
    rows, time = len(lengths), 5
    x = np.random.default_rng(rows).standard_normal((time, rows, FEATURES)).astype(np.float32)
    h0 = np.random.default_rng(7).standard_normal((rows, FEATURES)).astype(np.float32)
    feeds = (x, np.asarray(lengths, np.int64), h0)
    want = _run(model, *feeds)
    write_scan(loop, loop_map, scope, types, 17)
    ops = helpers.op_counts(model)
    assert ops["Scan"] == 1 and not ops["Loop"]
    got = _run(model, *feeds)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("broken, reason", [
    (dict(gated_state=False), "a state it carries changes past a row's length"),
    (dict(zero_stack=False, stack_used=True), "what it stacks past a row's length is not zeros"),
    (dict(stack_used=True), "a stack it returns is not padded to the sequence's length"),
])
def test_a_loop_ending_at_the_longest_row_otherwise_stays_a_loop_saying_why(broken, reason):
    from tf2onnx_rnn.rewriters.description import NoMatch

    with pytest.raises(NoMatch) as declined:
        _read(_loop_model(**broken))
    assert reason in declined.value.reason
