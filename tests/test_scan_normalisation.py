"""A layer normalisation in a Scan's step written as one ``LayerNormalization`` node
(``rewriters/written/scan/normalisation.py``), on hand-built graphs of the nodes tf2onnx writes for
TensorFlow's moments-based normalisation, in the arrangements it takes:

- each arrangement that computes ``gamma * (x - mean) / sqrt(var + eps) + beta`` (beta added inside
  or last, the mean negated or subtracted, no gamma, no beta) becomes one node, and onnxruntime gives
  the decomposed graph's values within 1e-6;
- graphs that compute something else keep every node: the mean added instead of subtracted, a
  mean over another axis, an intermediate read outside, beta of another width, float64;
- below opset 17 (no LayerNormalization node) nothing is replaced, and the normalisation is counted.

Keras models with such cells are converted end to end in test_scan_form.py.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import helpers
from tf2onnx_rnn.rewriters.written.scan.normalisation import fuse_layer_normalisations
from tf2onnx_rnn.rewriters.written.scope import Scope, TypeTable

WIDTH = 6


def _graph(arrangement: str, opset: int = 18, dtype=np.float32) -> onnx.ModelProto:
    """y from x [B, WIDTH] by the decomposed normalisation, in ``arrangement``."""
    rng = np.random.default_rng(3)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    consts = {"gamma": rng.uniform(0.5, 1.5, WIDTH), "beta": rng.standard_normal(WIDTH),
              "eps": np.array(1e-3), "beta_wide": rng.standard_normal(WIDTH + 1)}
    initializers = [numpy_helper.from_array(v.astype(dtype), k) for k, v in consts.items()]
    axis = 0 if arrangement == "other_axis" else -1
    initializers.append(numpy_helper.from_array(np.array([axis], np.int64), "axes"))

    def mean_of(source, out):
        if opset >= 18:
            return helper.make_node("ReduceMean", [source, "axes"], [out], keepdims=1)
        return helper.make_node("ReduceMean", [source], [out], axes=[axis], keepdims=1)

    n = helper.make_node
    nodes = [mean_of("x", "mean"), n("Sub", ["x", "mean"], ["d"]), n("Mul", ["d", "d"], ["sq"]),
             mean_of("sq", "var"), n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["root"]),
             n("Reciprocal", ["root"], ["inv"])]
    m = "inv"
    if arrangement != "no_gamma":
        nodes.append(n("Mul", ["inv", "gamma"], ["m"]))
        m = "m"
    beta = "beta_wide" if arrangement == "wide_beta" else "beta"
    nodes.append(n("Mul", ["x", m], ["xm"]))
    if arrangement in ("keras3", "no_gamma", "other_axis", "read_outside", "wide_beta"):
        # what tf2onnx writes for Keras 3: x*m + (Neg(mean)*m + beta)
        nodes += [n("Neg", ["mean"], ["neg"]), n("Mul", ["neg", m], ["nm"]), n("Add", ["nm", beta], ["shift"]),
                  n("Add", ["xm", "shift"], ["y"])]
    elif arrangement == "subtracted":  # x*m + (beta - mean*m)
        nodes += [n("Mul", ["mean", m], ["mm"]), n("Sub", [beta, "mm"], ["shift"]), n("Add", ["xm", "shift"], ["y"])]
    elif arrangement == "beta_last":  # (x*m - mean*m) + beta
        nodes += [n("Mul", [m, "mean"], ["mm"]), n("Sub", ["xm", "mm"], ["centred"]),
                  n("Add", ["centred", beta], ["y"])]
    elif arrangement == "no_beta":  # x*m - mean*m
        nodes += [n("Mul", ["mean", m], ["mm"]), n("Sub", ["xm", "mm"], ["y"])]
    elif arrangement == "mean_added":  # x*m + mean*m + beta: not a normalisation
        nodes += [n("Mul", ["mean", m], ["mm"]), n("Add", ["xm", "mm"], ["s"]), n("Add", ["s", beta], ["y"])]
    else:
        raise AssertionError(arrangement)
    outputs = [helper.make_tensor_value_info("y", elem, [None, WIDTH])]
    if arrangement == "read_outside":
        outputs.append(helper.make_tensor_value_info("var", elem, [None, 1]))
    graph = helper.make_graph(nodes, "step", [helper.make_tensor_value_info("x", elem, [None, WIDTH])], outputs,
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _fused(model: onnx.ModelProto, opset: int) -> tuple:
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    counts = fuse_layer_normalisations(fused.graph, Scope(model.graph), TypeTable(model), opset)
    return fused, counts


def _run(model: onnx.ModelProto, x: np.ndarray) -> list:
    return helpers.ort_session(model).run(None, {"x": x})


FUSED = ("keras3", "subtracted", "beta_last", "no_beta", "no_gamma")


@pytest.mark.parametrize("opset", (17, 18))
@pytest.mark.parametrize("arrangement", FUSED)
def test_a_normalisation_becomes_one_node(arrangement: str, opset: int):
    model = _graph(arrangement, opset)
    fused, counts = _fused(model, opset)
    assert counts == (1, 0)
    assert [node.op_type for node in fused.graph.node] == ["LayerNormalization"]
    onnx.checker.check_model(fused, full_check=True)
    x = np.random.default_rng(5).standard_normal((4, WIDTH)).astype(np.float32) * 3 + 2
    np.testing.assert_allclose(_run(fused, x)[0], _run(model, x)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("arrangement", ("mean_added", "other_axis", "read_outside", "wide_beta"))
def test_other_computations_keep_their_nodes(arrangement: str):
    model = _graph(arrangement)
    fused, counts = _fused(model, 18)
    assert counts == (0, 0)
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node]


def test_float64_keeps_its_nodes():
    model = _graph("keras3", dtype=np.float64)
    assert _fused(model, 18)[1] == (0, 0)


def test_below_opset_17_it_is_counted_not_replaced():
    model = _graph("keras3", opset=15)
    fused, counts = _fused(model, 15)
    assert counts == (0, 1)
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node]
