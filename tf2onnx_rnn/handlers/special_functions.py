"""Erfc, Expm1 and Bucketize: TF ops tf2onnx has no handler for (the table in :mod:`tf2onnx_rnn.handlers`)."""
from __future__ import annotations

import numpy as np

from .common import _cast, _finish, _float_input, _replace, _scalar


class _Erfc:
    """erfc(x) = 1 - erf(x), computed in float32 (onnxruntime's Erf is float32 only)."""

    @classmethod
    def version_9(cls, ctx, node, **kwargs):
        from onnx import TensorProto

        x, dtype = _float_input(ctx, node, allowed=(TensorProto.FLOAT,))
        erf = ctx.make_node("Erf", [x]).output[0]
        _finish(ctx, node, "Sub", [_scalar(ctx, 1.0, dtype, "erfc_one"), erf], dtype)


class _Expm1:
    """exp(x) - 1 without cancellation near 0 (W. Kahan's method).

    With ``u = exp(x)`` rounded, ``(u - 1) * (x / log(u))`` is accurate to a few ulps
    whenever ``u != 1``; where ``u == 1``, ``expm1(x) == x`` to working precision. For
    ``|x| > 0.5`` plain ``u - 1`` is as accurate and also right at overflow (``u = inf``)
    and underflow (``u = 0``), where the quotient is not.
    """

    @classmethod
    def version_11(cls, ctx, node, **kwargs):  # Equal on floating types: opset 11
        from onnx import TensorProto

        x, dtype = _float_input(ctx, node, allowed=(TensorProto.FLOAT, TensorProto.DOUBLE))
        one = _scalar(ctx, 1.0, dtype, "expm1_one")
        u = ctx.make_node("Exp", [x]).output[0]
        u_minus_1 = ctx.make_node("Sub", [u, one]).output[0]
        ratio = ctx.make_node("Div", [x, ctx.make_node("Log", [u]).output[0]]).output[0]
        kahan = ctx.make_node("Mul", [u_minus_1, ratio]).output[0]
        u_is_one = ctx.make_node("Equal", [u, one]).output[0]
        small = ctx.make_node("Where", [u_is_one, x, kahan]).output[0]
        abs_x = ctx.make_node("Abs", [x]).output[0]
        large = ctx.make_node("Greater", [abs_x, _scalar(ctx, 0.5, dtype, "expm1_half")]).output[0]
        _finish(ctx, node, "Where", [large, u_minus_1, small], dtype)


class _Bucketize:
    """Bucket index = how many boundaries ``b`` have ``not (x < b)``.

    TF finds the index with ``upper_bound`` over the sorted float boundaries, comparing
    ``x < b`` in ``x``'s type promoted with float (integers compare as float32, doubles
    against the boundaries widened to double); the count reproduces that, NaN included.
    """

    @classmethod
    def version_13(cls, ctx, node, **kwargs):  # Unsqueeze and ReduceSum take axes as inputs
        import onnx
        from onnx import TensorProto
        from tf2onnx import utils
        from tf2onnx.graph_builder import GraphBuilder

        x = node.input[0]
        dtype = ctx.get_dtype(x)
        if dtype != TensorProto.DOUBLE:
            if dtype != TensorProto.FLOAT:
                x = _cast(ctx, x, TensorProto.FLOAT)
            dtype = TensorProto.FLOAT
        boundaries = np.array(node.get_attr_value("boundaries") or [], dtype=np.float32)
        if not boundaries.size:  # one bucket; onnxruntime mis-shapes a sum over an empty axis
            shape = ctx.make_node("Shape", [x]).output[0]
            zero = onnx.helper.make_tensor("zero", TensorProto.INT32, [1], [0])
            _replace(ctx, node, "ConstantOfShape", [shape], attr={"value": zero})
            return
        bounds = ctx.make_const(utils.make_name("bucketize_boundaries"),
                                boundaries.astype(utils.map_onnx_to_numpy_type(dtype))).output[0]
        column = GraphBuilder(ctx).make_unsqueeze({"data": x, "axes": [-1]})
        below = ctx.make_node("Less", [column, bounds]).output[0]
        at_or_above = ctx.make_node("Not", [below]).output[0]
        counts = _cast(ctx, at_or_above, TensorProto.INT32)
        axes = ctx.make_const(utils.make_name("bucketize_axes"), np.array([-1], dtype=np.int64)).output[0]
        _replace(ctx, node, "ReduceSum", [counts, axes], attr={"keepdims": 0})
