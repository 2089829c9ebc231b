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

:func:`masking_source` proves that a recurrent layer's input is such a Masking output, seen
through the same moves of the batch and time axes as the layer's own mask: at every step that
mask keeps, the input equals the Masking layer's input there, so a node that reads kept steps only
can read that instead (:meth:`.emitter.EmitContext.input_of`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
from onnx import TensorProto, helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from ..readers.adapt import constant_list, reverses_nothing

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


class MaskingSource(NamedTuple):
    """A layer's input as a Keras ``Masking`` layer's output seen through moves of its batch and
    time axes: ``select`` is the Masking layer's output, ``source`` its input, ``moves`` the moves
    from ``select`` to the layer's input (:func:`moved` applies them to another tensor)."""

    select: str
    source: str
    moves: tuple


SWAP = "swap"  # a move: the first two axes exchanged (batch-major <-> time-major)


def masking_source(graph, x: str, mask: str) -> Optional[MaskingSource]:
    """``x``, a layer's time-major input, as a Keras ``Masking`` layer's output, when ``mask``, the
    layer's mask in the order of ``x``, is that same Masking layer's mask: ``any(source != value)``
    over the last axis of the very tensor the select reads, seen through the same moves as ``x``.
    Then at every step ``mask`` keeps, ``x`` equals ``source`` moved alike, bit for bit (``Masking``
    gives ``x`` where its mask holds: ``SelectV2(m, x, 0)`` in Keras 3, ``x * cast(m)`` in tf_keras,
    and ``x * 1`` is ``x``). None otherwise."""
    select, moves = axis_moves(graph, x)
    node = graph.get_node_by_output(select)
    if node is None or not moves:
        return None
    if node.type == "SelectV2" and len(node.input) == 3:
        condition, source = node.input[0], node.input[1]
        otherwise = graph.get_node_by_output(node.input[2])
        if otherwise is None or not otherwise.is_const() or np.size(otherwise.get_tensor_value(as_list=False)) != 1:
            return None  # a wider value would broadcast the select past its input's shape
    elif node.type == "Mul":
        found = _bool_factor(graph, node)
        if found is None:
            return None
        condition, source = found
    else:
        return None
    # [B, T, 1]: broadcast against [B, T, F] step by step (a [B, T] would align with [T, F])
    shape = graph.get_shape(condition)
    value = _any_not_equal(graph, condition, source)
    if value is None or shape is None or len(shape) != 3 or shape[-1] != 1:
        return None
    mask_root, mask_moves = _moves(graph, mask, units=True)
    if mask_moves != moves or _any_not_equal(graph, mask_root, source) != value:
        return None
    return MaskingSource(select, _through_identities(graph, source), moves)


def moved(graph, tensor: str, moves: tuple) -> str:
    """``tensor`` [B, T, F] (or [T, B, F]) through ``moves`` as :func:`masking_source` found them."""
    builder = GraphBuilder(graph)
    for move in moves:
        if move == SWAP:
            tensor = graph.make_node("Transpose", [tensor], attr={"perm": [1, 0, 2]}).output[0]
        else:
            _, axes = move
            tensor = builder.make_slice({"data": tensor, "starts": [-1] * len(axes), "ends": [-(2 ** 62)] * len(axes),
                                         "steps": [-1] * len(axes), "axes": list(axes)})
    return tensor


def axis_moves(graph, tensor: str) -> tuple:
    """(root, moves): ``tensor`` as ``root`` seen through exchanges of its first two axes and reversals."""
    return _moves(graph, tensor, units=False)


def unit_axis_moves(graph, mask: str) -> tuple:
    """(root, moves): a mask as ``root`` seen through exchanges of its first two axes, reversals, Casts
    of a bool to bool and the expansion or squeeze of a last unit axis (its [B, T] <-> [B, T, 1])."""
    return _moves(graph, mask, units=True)


def _through_identities(graph, tensor: str) -> str:
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type == "Identity":
        tensor, node = node.input[0], graph.get_node_by_output(node.input[0])
    return tensor


def _rank(graph, tensor: str) -> Optional[int]:
    shape = graph.get_shape(tensor)
    return None if shape is None else len(shape)


def _moves(graph, tensor: str, units: bool) -> tuple:
    """(root, moves): ``tensor`` as ``root`` seen through ops that only exchange its first two axes
    (a Transpose [1, 0, ...]) or reverse them (ReverseV2 on axis 0 or 1), moves listed from ``root``
    on; ``units``: also through a Cast to bool and an ExpandDims or Squeeze of a last axis of size
    one after the first two (a mask's [B, T] <-> [B, T, 1])."""
    moves = []
    while True:
        node = graph.get_node_by_output(tensor)
        if node is None:
            break
        rank = _rank(graph, node.input[0]) if node.input else None
        if node.type == "Identity" or reverses_nothing(graph, node):
            pass
        elif node.type == "Transpose":
            perm = constant_list(graph, node.input[1]) if len(node.input) > 1 else node.get_attr_value("perm")
            if perm is None or len(perm) < 2 or list(perm) != [1, 0] + list(range(2, len(perm))):
                break
            moves.append(SWAP)
        elif node.type == "ReverseV2" and len(node.input) == 2:
            axes = constant_list(graph, node.input[1])
            if axes is None or rank is None:
                break
            axes = sorted({int(axis) % rank for axis in axes}) if rank else None
            if not axes or any(axis > 1 for axis in axes):
                break
            moves.append(("reverse", tuple(axes)))
        elif units and node.type == "Cast" and node.get_attr_value("to") == TensorProto.BOOL \
                and graph.get_dtype(node.input[0]) == TensorProto.BOOL:
            pass
        elif units and node.type == "ExpandDims" and rank is not None and rank >= 2 \
                and constant_list(graph, node.input[1]) in ([-1], [rank]):
            pass
        elif units and node.type == "Squeeze" and rank is not None and rank >= 3 \
                and [int(a) % rank for a in node.get_attr_value("squeeze_dims", [])] == [rank - 1] \
                and (graph.get_shape(node.input[0]) or [None])[-1] == 1:
            pass
        else:
            break
        tensor = node.input[0]
    return tensor, tuple(reversed(moves))


def _any_not_equal(graph, tensor: str, source: str):
    """The value compared when ``tensor`` (through Casts to bool and a last unit axis's ExpandDims or
    Squeeze) is ``Any(NotEqual(source, value), last axis)`` of ``source`` [B, T, F], for a constant
    value: (its dtype, shape and bytes); else None."""
    root, moves = _moves(graph, tensor, units=True)
    node = graph.get_node_by_output(root)
    if moves or node is None or node.type != "Any" or len(node.input) != 2:
        return None
    rank = _rank(graph, source)
    if rank != 3 or constant_list(graph, node.input[1]) not in ([-1], [rank - 1]):
        return None
    compare = graph.get_node_by_output(node.input[0])
    if compare is None or compare.type != "NotEqual" or len(compare.input) != 2:
        return None
    source = _through_identities(graph, source)
    for index in (0, 1):
        if _through_identities(graph, compare.input[index]) != source:
            continue
        other = graph.get_node_by_output(compare.input[1 - index])
        while other is not None and other.type == "Identity":
            other = graph.get_node_by_output(other.input[0])
        if other is not None and other.is_const():
            value = np.asarray(other.get_tensor_value(as_list=False))
            return str(value.dtype), value.shape, value.tobytes()
    return None
