"""Handlers for TensorFlow ops that Keras built-in layers and activations emit and tf2onnx lacks.

tf2onnx 1.16 and 1.17 have no handler for these ops, so a model using them converts with the
op left in the graph and does not load in onnxruntime:

========== ===================================== ===========================================
TF op      emitted by                            ONNX form (float32 error against TF)
========== ===================================== ===========================================
Erfc       exact GELU (``activation="gelu"``),   ``1 - Erf(x)``; absolute error <= 2.4e-7,
           Keras 3 and tf_keras on TF 2.21       relative error <= 8e-7 for x <= 1 (the
                                                 tail beyond is absolute only: erfc(4) is
                                                 below float32's spacing at 1)
Expm1      ``celu`` (Keras 3)                    ``Exp(x) - 1`` for ``|x| > 0.5``, else
                                                 Kahan's ``(u - 1) * x / log(u)`` with
                                                 ``u = Exp(x)`` (``x`` where ``u == 1``);
                                                 relative error <= 4e-7 everywhere
Bucketize  ``Discretization``                    count of boundaries ``b`` with ``not x < b``
                                                 (``Less``, ``Not``, ``ReduceSum``): exact,
                                                 NaN included (TF puts it in the last bucket)
========== ===================================== ===========================================

Erfc is computed in float32 for every input type (onnxruntime's Erf has no float64 kernel), so
float64 inputs get float32 accuracy; Expm1 runs in float64 for float64 (relative error about
4e-16). Erfc(NaN) is whatever onnxruntime's Erf gives: NaN in 1.31, 1.0 in some older releases.

Registration goes through tf2onnx's own registry (``tf2onnx.handler.tf_op``), so tf2onnx
picks these handlers by opset like its own. :func:`ensure_registered` is idempotent and never
replaces a handler tf2onnx already has for an op (a later tf2onnx that adds one wins).
TensorFlow and tf2onnx are imported only when it is called.
"""
from __future__ import annotations

import threading

import numpy as np

_LOCK = threading.Lock()
_REGISTERED: dict = {}  # op name -> True (ours) or False (tf2onnx's own was kept)


def ensure_registered() -> dict:
    """Register the handlers tf2onnx lacks; safe to call any number of times.

    Returns ``{op: registered}``: True where this package's handler is in use, False where
    tf2onnx already had one and it was left alone.
    """
    with _LOCK:
        if not _REGISTERED:
            _register()
        return dict(_REGISTERED)


def _register() -> None:
    import tf2onnx.tfonnx  # noqa: F401 - imports every handler module tf2onnx has
    from tf2onnx import handler

    existing = {name for opsets in handler.tf_op.get_opsets().values() for by_name in opsets for name in by_name}
    for name, cls in _handlers().items():
        ours = name not in existing
        if ours:
            handler.tf_op(name)(cls)
        _REGISTERED[name] = ours


def _handlers() -> dict:
    """The handler classes by TF op name."""
    return {"Erfc": _Erfc, "Expm1": _Expm1, "Bucketize": _Bucketize}


# -- what the handlers share (tf2onnx and onnx are imported only when a handler runs) ---------------
def _cast(ctx, name, to):
    return ctx.make_node("Cast", [name], attr={"to": to}).output[0]


def _scalar(ctx, value, onnx_dtype, hint):
    from tf2onnx import utils

    array = np.array(value, dtype=utils.map_onnx_to_numpy_type(onnx_dtype))
    return ctx.make_const(utils.make_name(hint), array).output[0]


def _replace(ctx, node, op_type, inputs, attr=None):
    """Replace ``node`` by one ``op_type`` node with the same name and outputs."""
    shapes, dtypes = node.output_shapes, node.output_dtypes
    ctx.remove_node(node.name)
    return ctx.make_node(op_type, inputs, attr=attr or {}, name=node.name, outputs=node.output,
                         shapes=shapes, dtypes=dtypes)


def _float_input(ctx, node, allowed):
    """The node's input, cast to float32 unless its type is in ``allowed``; and that type."""
    from onnx import TensorProto
    from tf2onnx import utils

    x = node.input[0]
    dtype = ctx.get_dtype(x)
    utils.make_sure(dtype in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16),
                    "%s: unsupported input type %s", node.type, dtype)
    if dtype in allowed:
        return x, dtype
    return _cast(ctx, x, TensorProto.FLOAT), TensorProto.FLOAT


def _finish(ctx, node, op_type, inputs, compute_dtype):
    """Replace ``node`` by ``op_type(inputs)``, cast back to the node's type if needed."""
    out_dtype = node.output_dtypes[0]
    if compute_dtype == out_dtype:
        _replace(ctx, node, op_type, inputs)
    else:
        result = ctx.make_node(op_type, inputs).output[0]
        _replace(ctx, node, "Cast", [result], attr={"to": out_dtype})


# -- the handlers --------------------------------------------------------------------------------
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
