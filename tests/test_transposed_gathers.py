"""A row gather feeding a swap of its first two axes becomes one gather with its index transposed
(``rewriters.written.transposed_gathers``): same values, bit for bit, one pass fewer; every other
arrangement is left as it is. Hand-built graphs, run in onnxruntime; and a converted masked layer."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
from tf2onnx_rnn.rewriters.written.transposed_gathers import fold_transposed_gathers

T, B, H = 5, 3, 4


def _model(perm=(1, 0, 2), flatten=True, extra_reader=False, axis=0, where=None) -> onnx.ModelProto:
    """y [T, B, H] -> Flatten -> Gather(rows [T, B]) -> Transpose(perm) -> out; ``where``: a Where
    between the gather and the transpose, on a [T, B] mask unsqueezed at axis 2, against a scalar
    zero ("scalar") or a [B, H] tensor ("rows")."""
    rng = np.random.default_rng(0)
    rows = rng.integers(-T * B, T * B, (T, B)).astype(np.int64)
    nodes = [helper.make_node("Flatten", ["y"], ["flat"], axis=2) if flatten else
             helper.make_node("Reshape", ["y", "to_2d"], ["flat"]),
             helper.make_node("Gather", ["flat", "rows"], ["gathered"], axis=axis),
             helper.make_node("Transpose", ["selected" if where else "gathered"], ["out"], perm=list(perm))]
    extra = []
    if where:
        nodes[2:2] = [helper.make_node("Unsqueeze", ["kept", "axis_2"], ["kept_3d"]),
                      helper.make_node("Where", ["kept_3d", "gathered", "other"], ["selected"])]
        other = np.zeros((), np.float32) if where == "scalar" else rng.standard_normal((B, H)).astype(np.float32)
        extra = [numpy_helper.from_array(rng.random((T, B)) < 0.5, "kept"),
                 numpy_helper.from_array(np.array([2]), "axis_2"), numpy_helper.from_array(other, "other")]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["d0", "d1", "d2"])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["gathered"], ["also"]))
        outputs.append(helper.make_tensor_value_info("also", TensorProto.FLOAT, None))
    initializers = [numpy_helper.from_array(rows, "rows"), numpy_helper.from_array(np.array([T * B, H]), "to_2d")]
    initializers += extra
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, B, H])],
                              outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, y: np.ndarray) -> list:
    return helpers.ort_session(model).run(None, {"y": y})


def test_the_gather_takes_the_transposed_index_and_gives_the_same_tensor():
    model = _model()
    y = np.random.default_rng(1).standard_normal((T, B, H)).astype(np.float32)
    want = _run(model, y)
    assert fold_transposed_gathers(model) == 1
    assert helpers.op_types(model) == ["Flatten", "Transpose", "Gather"]
    transpose = helpers.nodes_of_types(model, ["Transpose"])[0]
    assert helpers.attribute(transpose, "perm") == [1, 0] and transpose.input[0] == "rows"
    onnx.checker.check_model(model, full_check=True)
    got = _run(model, y)
    assert got[0].shape == (B, T, H)
    np.testing.assert_array_equal(got[0], want[0])


def test_a_where_between_moves_with_the_gather_its_mask_transposed():
    model = _model(where="scalar")
    y = np.random.default_rng(1).standard_normal((T, B, H)).astype(np.float32)
    want = _run(model, y)
    assert fold_transposed_gathers(model) == 1
    assert helpers.op_types(model) == ["Flatten", "Unsqueeze", "Transpose", "Gather", "Transpose", "Where"]
    onnx.checker.check_model(model, full_check=True)
    got = _run(model, y)
    assert got[0].shape == (B, T, H)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("kwargs", [{"perm": (0, 2, 1)}, {"flatten": False}, {"extra_reader": True}, {"axis": 1},
                                    {"where": "rows"}],
                         ids=["another-perm", "data-not-a-flatten", "gather-read-twice", "gather-on-axis-1",
                              "where-against-a-tensor"])
def test_other_arrangements_are_left_as_they_are(kwargs):
    if kwargs.get("axis") == 1:  # a gather of columns: [T*B, H] -> [T*B, T, B]; a 4-axis perm would follow
        kwargs = {"axis": 1, "perm": (1, 0, 2)}
    model = _model(**kwargs)
    before = model.SerializeToString()
    assert fold_transposed_gathers(model) == 0
    assert model.SerializeToString() == before


def test_a_masked_layer_gives_batch_major_outputs_straight_from_its_gather():
    keras = pytest.importorskip("keras")
    from tf2onnx_rnn import convert_keras

    x = keras.Input((None, 3), name="x")
    model = keras.Model(x, keras.layers.LSTM(4, return_sequences=True)(keras.layers.Masking()(x)))
    rng = np.random.default_rng(2)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    proto = convert_keras(model)
    made_by = {output: node for node in proto.graph.node for output in node.output}
    last = made_by[proto.graph.output[0].name]
    # the restore is the heavy branch of an If (a batch with nothing masked reads the node's own
    # outputs): there the gather gives batch-major rows, and the lean branch transposes the node's Y
    assert last.op_type == "If", helpers.op_types(proto)
    branches = {a.name: a.g for a in last.attribute}
    for name, op in (("else_branch", "Gather"), ("then_branch", "Transpose")):
        made_in = {output: node for node in branches[name].node for output in node.output}
        assert made_in[branches[name].output[0].name].op_type == op, (name, helpers.op_types(branches[name]))
    batch = np.stack([rng.standard_normal((6, 3)) for _ in range(2)]).astype(np.float32)
    full = batch.copy()
    batch[0, :2] = 0.0  # pre-padded
    batch[1, 4:] = 0.0  # post-padded
    session = helpers.ort_session(proto)
    for x in (batch, full):  # the heavy branch, the lean one
        (got,) = session.run(None, {"x": x})
        np.testing.assert_allclose(got, np.asarray(model(x, training=False)), rtol=1e-5, atol=1e-6)
