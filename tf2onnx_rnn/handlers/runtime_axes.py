"""GatherV2, ConcatV2 and StridedSlice where an axis or a rank is known only when the graph runs, and an
NCHW BiasAdd whose bias a loop's step reads from outside (the table in :mod:`tf2onnx_rnn.handlers`).

Why MinGRU needs the last three rows (mingru-keras 0.1.3 on Keras 3.15). Keras's TensorFlow
``associative_scan`` resolves the scan axis as ``tf.where(axis >= 0, axis, tf.rank(a) + axis)``,
which ``tf.get_static_value`` cannot evaluate, so the axis stays a tensor and is captured by the
``tf.cond`` that interleaves each level's results. Grappler folds it to a constant outside, but in
the branch functions it is an argument, and tf2onnx converts the branch functions on their own,
before the graph that calls them: its GatherV2 and ConcatV2 refuse the non-constant axis (leaving a
Gather and a Concat with three inputs, which onnxruntime rejects). The If has no output rank either
(TensorFlow's has none: the interleave reshapes to a shape computed from that axis), so at even
time lengths tf2onnx's StridedSlice refuses the scan's ``[..., 2::2, :]`` of it: it needs the rank
to place the specs after an ellipsis. That is the "could not convert: StridedSlice" a MinGRU model
reports; no StridedSlice form fails on a tensor of known rank. The model's output keeps no rank in
the ONNX graph (onnxruntime runs it; the ONNX checker wants a shape on a graph output): the output's
shape can be given with ``shape_override`` until the Keras source takes it from the model. Reshapes
to computed shapes here carry no ``allowzero=1``: tf2onnx's reshape optimizer rewrites computed
shapes into constants whose 0 means "the input's dim" whatever ``allowzero`` says, so a tensor with
a zero-size dimension may come out with another shape (nothing else differs).
"""
from __future__ import annotations

import numpy as np

from .common import _INT64_MAX, _INT64_MIN, _dims, _ints, _is_const, _op, _product, _replace, _reshape, _runtime_axis


class _GatherAtRuntimeAxis:
    """GatherV2 whose axis is a tensor (ONNX Gather's axis is an attribute): ``params`` is viewed as
    [outer, size, inner] around the axis, gathered on its middle axis, and reshaped back."""

    @staticmethod
    def applies(ctx, node):
        return not _is_const(ctx, node.input[2]) and not node.get_attr_value("batch_dims", 0)

    @staticmethod
    def convert(ctx, node):
        params, indices, axis = node.input
        shape = _op(ctx, "Shape", [params])
        at = _runtime_axis(ctx, axis, shape)
        after = _op(ctx, "Add", [at, _ints(ctx, [1])])
        before_dims, after_dims = _dims(ctx, shape, 0, at), _dims(ctx, shape, after)
        blocks = [_product(ctx, before_dims), _dims(ctx, shape, at, after), _product(ctx, after_dims)]
        block = _reshape(ctx, params, _op(ctx, "Concat", blocks, axis=0))
        picked = _op(ctx, "Gather", [block, indices], axis=1)
        out_shape = _op(ctx, "Concat", [before_dims, _op(ctx, "Shape", [indices]), after_dims], axis=0)
        _replace(ctx, node, "Reshape", [picked, out_shape])


class _ConcatAtRuntimeAxis:
    """ConcatV2 whose axis is a tensor (ONNX Concat's axis is an attribute): each value is viewed as
    [outer, rest] (the axis and every one after it flattened), joined on axis 1, reshaped back."""

    @staticmethod
    def applies(ctx, node):
        return not _is_const(ctx, node.input[-1])

    @staticmethod
    def convert(ctx, node):
        values, axis = node.input[:-1], node.input[-1]
        shape = _op(ctx, "Shape", [values[0]])
        at = _runtime_axis(ctx, axis, shape)
        after = _op(ctx, "Add", [at, _ints(ctx, [1])])
        outer = _product(ctx, _dims(ctx, shape, 0, at))
        flat, total = [], None
        for value in values:
            value_shape = _op(ctx, "Shape", [value])
            rest = _product(ctx, _dims(ctx, value_shape, at))
            flat.append(_reshape(ctx, value, _op(ctx, "Concat", [outer, rest], axis=0)))
            size = _dims(ctx, value_shape, at, after)
            total = size if total is None else _op(ctx, "Add", [total, size])
        joined = _op(ctx, "Concat", flat, axis=1)
        out_shape = _op(ctx, "Concat", [_dims(ctx, shape, 0, at), total, _dims(ctx, shape, after)], axis=0)
        _replace(ctx, node, "Reshape", [joined, out_shape])


class _StridedSliceOfUnknownRank:
    """StridedSlice with an ellipsis on a tensor of unknown rank (tf2onnx needs the rank to place the
    specs after the ellipsis): those take negative ONNX axes, the ones before it positive axes."""

    @staticmethod
    def applies(ctx, node):
        return (bool(node.get_attr_value("ellipsis_mask", 0)) and not node.get_attr_value("new_axis_mask", 0)
                and ctx.get_rank(node.input[0]) is None and all(_is_const(ctx, i) for i in node.input[1:4]))

    @staticmethod
    def convert(ctx, node):
        from tf2onnx import utils

        begin, end, strides = (np.ravel(ctx.get_tensor_value(i, as_list=False)).astype(np.int64).tolist()
                               for i in node.input[1:4])
        begin_mask, end_mask, ellipsis_mask, shrink_mask = (
            node.get_attr_value(a, 0) for a in ("begin_mask", "end_mask", "ellipsis_mask", "shrink_axis_mask"))
        count = len(begin)
        ellipsis = (ellipsis_mask & -ellipsis_mask).bit_length() - 1  # TF allows one ellipsis
        axes, starts, ends, steps, squeeze = [], [], [], [], []
        for i in range(count):
            if i == ellipsis:
                continue
            axis = i if i < ellipsis else i - count
            axes.append(axis)
            if shrink_mask >> i & 1:  # TF takes begin[i] alone
                starts.append(begin[i])
                ends.append(begin[i] + 1 if begin[i] != -1 else _INT64_MAX)
                steps.append(1)
                squeeze.append(axis)
                continue
            step = strides[i]
            utils.make_sure(step != 0, "StridedSlice %s: stride 0", node.name)
            starts.append((0 if step > 0 else _INT64_MAX) if begin_mask >> i & 1 else begin[i])
            ends.append((_INT64_MAX if step > 0 else _INT64_MIN) if end_mask >> i & 1 else end[i])
            steps.append(step)
        x = node.input[0]
        if not axes:
            _replace(ctx, node, "Identity", [x])
            return
        inputs = [x, _ints(ctx, starts), _ints(ctx, ends), _ints(ctx, axes), _ints(ctx, steps)]
        if squeeze:
            _replace(ctx, node, "Squeeze", [_op(ctx, "Slice", inputs), _ints(ctx, squeeze)])
        else:
            _replace(ctx, node, "Slice", inputs)


class _ChannelsFirstBias:
    """BiasAdd in NCHW of a bias that is no constant where it is added (a loop's step reads it from
    outside: tf_keras's ConvLSTM2D with ``data_format="channels_first"``). tf2onnx's handler reshapes only
    a constant bias to ``[C, 1, ...]``; any other it adds as it is, which broadcasts over the last axis
    (wrong, and refused by ONNX's shape inference where the sizes differ). Here the bias is reshaped to
    ``[C, 1, ...]`` for the value's rank, or, where the rank is unknown, for the rank the value has at run
    time: exact."""

    @staticmethod
    def applies(ctx, node):
        fmt = node.get_attr_value("data_format", b"NHWC")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        return fmt == "NCHW" and not _is_const(ctx, node.input[1])

    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto, numpy_helper

        x, bias = node.input[0], node.input[1]
        rank = ctx.get_rank(x)
        if rank is not None:
            shape = _ints(ctx, [-1] + [1] * (rank - 2))
        else:
            rank_left = _op(ctx, "Sub", [_op(ctx, "Shape", [_op(ctx, "Shape", [x])]), _ints(ctx, [2])])
            ones = ctx.make_node("ConstantOfShape", [rank_left], attr={
                "value": numpy_helper.from_array(np.array([1], np.int64))}, dtypes=[TensorProto.INT64]).output[0]
            shape = _op(ctx, "Concat", [_ints(ctx, [-1]), ones], axis=0)
        _replace(ctx, node, "Add", [x, _op(ctx, "Reshape", [bias, shape])])
