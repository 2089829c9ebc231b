"""Keras's mask arithmetic without float Casts.

Keras's ``Masking`` layer computes ``any(x != v, axis=-1)`` and multiplies its input by that mask
cast to the input's float type (``x * cast(mask, float)``). tf2onnx converts ``Any`` through a
float Cast too. Both are rewritten here with the same values, bit for bit, and no float Cast:

- ``x * cast(mask, float)`` -> ``Where(mask, x, x * 0)`` (``x * 1`` is ``x``; the masked steps keep
  ``x * 0``, so an infinite input still gives NaN there, as in Keras);
- ``Any(b, axes)`` -> ``Cast(ReduceMax(Cast(b, uint8), axes), bool)`` (onnxruntime reduces uint8
  faster than the float tf2onnx uses, and far faster than int64);
- ``SelectV2(mask, x, y)`` (Keras 3's Masking: ``where(mask, x, 0)``) becomes ONNX ``Where``:
  tf2onnx otherwise writes ``cast(mask) * x + cast(!mask) * y``, with float Casts, and NaN
  wherever the branch not taken is infinite or NaN.

float16 conversion (onnxconverter-common's ``convert_float_to_float16``) retypes a Cast's output
but not its target type, which onnxruntime then refuses: without float Casts a masked model
converts.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from tf2onnx import utils

_FLOATS = frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE})


def select_bool_products(graph) -> int:
    """Rewrite every ``Mul(x, Cast(bool -> x's float type))`` of ``graph``; returns how many."""
    rewritten = 0
    for mul in [node for node in graph.get_nodes() if node.type == "Mul"]:
        found = _bool_factor(graph, mul)
        if found is None or mul.output[0] in graph.outputs:
            continue
        mask, x = found
        dtype, shape = graph.get_dtype(mul.output[0]), graph.get_shape(mul.output[0])
        zero = graph.make_const(utils.make_name(mul.name + "_zero"),
                                np.array(0, helper.tensor_dtype_to_np_dtype(dtype))).output[0]
        masked = graph.make_node("Mul", [x, zero], shapes=[shape], dtypes=[dtype]).output[0]
        where = graph.make_node("Where", [mask, x, masked], shapes=[shape], dtypes=[dtype])
        graph.replace_all_inputs(mul.output[0], where.output[0])
        rewritten += 1
    return rewritten


def exact_selects(graph) -> int:
    """Mark every float ``Select``/``SelectV2`` of ``graph`` for tf2onnx's exact ``Where`` form (its
    ``handles_nan`` attribute); returns how many."""
    marked = 0
    for node in graph.get_nodes():
        if node.type in ("Select", "SelectV2") and graph.get_dtype(node.output[0]) in _FLOATS \
                and not node.get_attr_value("handles_nan", False):
            node.set_attr("handles_nan", True)
            marked += 1
    return marked


def integer_any(graph) -> int:
    """Rewrite every TensorFlow ``Any`` of ``graph`` over a constant axis list; returns how many."""
    rewritten = 0
    for node in [n for n in graph.get_nodes() if n.type == "Any"]:
        axes = graph.get_node_by_output(node.input[1])
        if axes is None or not axes.is_const() or node.output[0] in graph.outputs:
            continue
        shape = graph.get_shape(node.output[0])
        flags = graph.make_node("Cast", [node.input[0]], attr={"to": TensorProto.UINT8}).output[0]
        axis_list = [int(a) for a in np.atleast_1d(axes.get_tensor_value(as_list=False))]
        keepdims = int(bool(node.get_attr_value("keep_dims", 0)))
        if graph.opset >= 18:  # ReduceMax takes its axes as an input from opset 18 on
            axes_input = graph.make_const(utils.make_name(node.name + "_axes"), np.array(axis_list, np.int64))
            largest = graph.make_node("ReduceMax", [flags, axes_input.output[0]], attr={"keepdims": keepdims})
        else:
            largest = graph.make_node("ReduceMax", [flags], attr={"axes": axis_list, "keepdims": keepdims})
        some = graph.make_node("Cast", [largest.output[0]], attr={"to": TensorProto.BOOL}, shapes=[shape],
                               dtypes=[TensorProto.BOOL])
        graph.replace_all_inputs(node.output[0], some.output[0])
        rewritten += 1
    return rewritten


def _bool_factor(graph, mul):
    """(the bool, the other factor) when one factor of ``mul`` is a bool cast to the product's float
    type and the other already has that type; else None."""
    dtype = graph.get_dtype(mul.output[0])
    if dtype not in _FLOATS or len(mul.input) != 2:
        return None
    for index in (0, 1):
        cast, other = graph.get_node_by_output(mul.input[index]), mul.input[1 - index]
        if (cast is not None and cast.type == "Cast" and cast.get_attr_value("to") == dtype
                and graph.get_dtype(cast.input[0]) == TensorProto.BOOL and graph.get_dtype(other) == dtype):
            return cast.input[0], other
    return None
