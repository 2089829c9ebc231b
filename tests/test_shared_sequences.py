"""A stack whose first sequence is also read batch-major (a skip connection): OpenVINO 2026.4 computes a
``Transpose(1, 0, 2)`` of a recurrent node's squeezed ``Y`` wrongly where another recurrent node reads that ``Y``
too. Its row says so (a silent obstacle), and every form reads that sequence from the node's 4-D ``Y`` instead
(``rewriters.written.shared_sequences``), which OpenVINO computes exactly."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import parity
from runtime_models import converted
from test_runtime_claims import _problems
from tf2onnx_rnn import report_of
from tf2onnx_rnn.rewriters.obstacles import obstacles
from tf2onnx_rnn.rewriters.runtimes import BY_KEY, Kind
from tf2onnx_rnn.rewriters.written.shared_sequences import batch_major_from_4d


def _stack(op: str, gates: int, back: bool) -> onnx.ModelProto:
    """x [3, 40, 16] -> a node over time-major x -> its Y squeezed, read batch-major (r1) and by a second node
    (straight, or through r1 swapped back): Concat(x, r1, the second node's sequence batch-major)."""
    rng = np.random.default_rng(1)

    def weight(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, rng.normal(0, .2, shape).astype(np.float32).ravel())

    outs = ["", ""] if op != "LSTM" else ["", "", ""]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node(op, ["xt", "W", "R"], ["Y"] + outs[1:], hidden_size=32),
             helper.make_node("Squeeze", ["Y", "axes"], ["s"]),
             helper.make_node("Transpose", ["s"], ["r1"], perm=[1, 0, 2])]
    if back:
        nodes.append(helper.make_node("Transpose", ["r1"], ["s_again"], perm=[1, 0, 2]))
    nodes += [helper.make_node(op, ["s_again" if back else "s", "W2", "R"], ["Y2"] + outs[1:], hidden_size=32),
              helper.make_node("Squeeze", ["Y2", "axes"], ["s2"]),
              helper.make_node("Transpose", ["s2"], ["r2"], perm=[1, 0, 2]),
              helper.make_node("Concat", ["x", "r1", "r2"], ["y"], axis=2)]
    inits = [weight("W", [1, gates * 32, 16]), weight("R", [1, gates * 32, 32]), weight("W2", [1, gates * 32, 32]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 40, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 40, 80])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("back", [False, True], ids=["straight", "swapped-back"])
@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_the_batch_major_read_comes_from_the_4d_y_the_same_values(op, gates, back):
    model = _stack(op, gates, back)
    silent = [o for o in obstacles(model, BY_KEY["openvino"]) if o.silent and o.kind == Kind.Y_H]
    assert silent, "OpenVINO's row names the Transpose it computes wrongly"
    x = np.random.default_rng(0).normal(size=(3, 40, 16)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert batch_major_from_4d(model) == 1
    onnx.checker.check_model(model)
    after = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(after, before)
    assert not [o for o in obstacles(model, BY_KEY["openvino"]) if o.silent], "nothing OpenVINO computes wrongly"
    # the swap back is gone: the second node reads the squeezed sequence itself
    assert [n.op_type for n in model.graph.node].count("Transpose") == 3


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("form", ["default", "portable", "default-dynamic"])
def test_a_stack_read_batch_major_is_claimed_for_openvino_and_computed_there(form, flavor, tmp_path):
    pytest.importorskip("openvino")
    x, want, proto = converted(flavor, "skip_stack", form)
    assert "openvino" in report_of(proto).runs_in
    assert _problems("openvino", proto, x, want, str(tmp_path)) == []
