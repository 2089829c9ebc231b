"""Facts of the table of runtimes measured again where the runtime is installed (OpenVINO and tract are test
extras): the graph a fact was measured on still fails in that runtime, and the obstacles read from the row
name it. A runtime that starts computing it fails the test: the fact is then to be dropped."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tf2onnx_rnn.rewriters.obstacles import obstacles
from tf2onnx_rnn.rewriters.runtimes import BY_KEY, RUNTIMES, Kind


def _if_of_two_ranks(path: str) -> onnx.ModelProto:
    """An If whose branches give tensors of different ranks (x flattened, or x as it is): ONNX's shape inference
    leaves its output's rank unknown, as a MinGRU layer's Ifs of computed shapes."""
    flat = helper.make_graph([helper.make_node("Reshape", ["x", "flat"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    same = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                             [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
             helper.make_node("Greater", ["sum", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["either"], then_branch=flat, else_branch=same),
             helper.make_node("ReduceSum", ["either"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "if_of_two_ranks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              [helper.make_tensor("flat", TensorProto.INT64, [1], [-1]),
                               helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return model


def _openvino(path: str, x: np.ndarray):
    import openvino

    core = openvino.Core()
    return core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})([x])[0]


def _tract(path: str, x: np.ndarray):
    import tract

    model = tract.onnx().load(path)
    model.set_input_fact(0, "3,4,f32")
    return model.into_model().into_runnable().run([x])[0].to_numpy()


@pytest.mark.parametrize("key,run", [("openvino", _openvino), ("tract", _tract)])
def test_an_if_of_unknown_rank_fails_where_the_row_says_so(key, run, tmp_path):
    pytest.importorskip(BY_KEY[key].package)
    path = str(tmp_path / "if.onnx")
    model = _if_of_two_ranks(path)
    assert not BY_KEY[key].if_unranked
    assert [o.kind for o in obstacles(model, BY_KEY[key])] == [Kind.IF]
    with pytest.raises(Exception):  # noqa: B017 - each runtime raises its own: any failure is the fact
        run(path, np.ones((3, 4), np.float32))


def test_the_rows_that_compute_an_if_of_unknown_rank_are_not_told_otherwise(tmp_path):
    model = _if_of_two_ranks(str(tmp_path / "if.onnx"))
    for row in [row for row in RUNTIMES if "If" not in row.lacks]:  # (the others have no If at all)
        found = [o.kind for o in obstacles(model, row)]
        assert (Kind.IF in found) == (not row.if_unranked), row.key
