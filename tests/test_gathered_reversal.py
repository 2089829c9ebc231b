"""The portable form's ``ReverseSequence`` as an element gather (``rewriters.written.gathered_reversal``):
bit for bit what onnxruntime's ``ReverseSequence`` gives, for either axis order, ranks 2 to 4, rows of
full, partial, one-step and empty lengths, at a batch unlike the time length."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers


def _model(rank: int, time_axis: int, opset: int) -> onnx.ModelProto:
    dims = [None] * rank
    node = helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], name="reverse", time_axis=time_axis,
                            batch_axis=1 - time_axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
                                            helper.make_tensor_value_info("lengths", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("time_axis", [0, 1])
@pytest.mark.parametrize("rank", [2, 3, 4])
def test_gathered_reversal_equals_reverse_sequence(rank, time_axis, opset):
    from tf2onnx_rnn.rewriters.written.gathered_reversal import reverse_sequences_as_gathers

    original = _model(rank, time_axis, opset)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    assert reverse_sequences_as_gathers(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    assert "ReverseSequence" not in helpers.op_counts(rewritten)
    batch, time = 4, 6
    shape = [time, batch] if time_axis == 0 else [batch, time]
    shape += [3, 2][:rank - 2]
    x = np.random.default_rng(rank).standard_normal(shape).astype(np.float32)
    lengths = np.array([time, 3, 1, 0], np.int64)
    want = helpers.ort_session(original).run(None, {"x": x, "lengths": lengths})[0]
    got = helpers.ort_session(rewritten).run(None, {"x": x, "lengths": lengths})[0]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, x)  # the case reverses something
