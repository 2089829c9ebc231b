"""What the handlers share: small node builders (tf2onnx and onnx are imported only when a handler
runs; every helper takes tf2onnx's graph as ``ctx``)."""
from __future__ import annotations

import numpy as np


def _cast(ctx, name, to):
    return ctx.make_node("Cast", [name], attr={"to": to}).output[0]


def _scalar(ctx, value, onnx_dtype, hint):
    from tf2onnx import utils

    array = np.array(value, dtype=utils.map_onnx_to_numpy_type(onnx_dtype))
    return ctx.make_const(utils.make_name(hint), array).output[0]


def _replace(ctx, node, op_type, inputs, attr=None, dtypes=None, shapes=None):
    """Replace ``node`` by one ``op_type`` node with the same name and outputs (with the node's
    output types and shapes unless given)."""
    shapes = node.output_shapes if shapes is None else shapes
    dtypes = node.output_dtypes if dtypes is None else dtypes
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


_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)


def _op(ctx, op_type, inputs, **attr):
    """One new node's first output."""
    return ctx.make_node(op_type, inputs, attr=attr).output[0]


def _ints(ctx, values):
    """An int64 constant (a scalar for a scalar ``values``)."""
    from tf2onnx import utils

    return ctx.make_const(utils.make_name("const"), np.array(values, dtype=np.int64)).output[0]


def _reals(ctx, values, onnx_dtype):
    from tf2onnx import utils

    return ctx.make_const(utils.make_name("const"),
                          np.array(values, dtype=utils.map_onnx_to_numpy_type(onnx_dtype))).output[0]


def _dims(ctx, shape, start, end=_INT64_MAX):
    """``shape[start:end]`` of an int64 shape vector; ``start``/``end`` ints or int64 [1] tensors."""
    as_input = [_ints(ctx, [v]) if isinstance(v, int) else v for v in (start, end)]
    return _op(ctx, "Slice", [shape] + as_input)


def _product(ctx, dims):
    """The product of an int64 vector's entries as [1] (1 for an empty one)."""
    return _op(ctx, "ReduceProd", [_op(ctx, "Concat", [_ints(ctx, [1]), dims], axis=0)], keepdims=1)


def _as_scalar(ctx, vector):
    return _op(ctx, "Reshape", [vector, _ints(ctx, [])])


def _reshape(ctx, x, shape):
    """Reshape to a computed shape. Not ``allowzero=1``: tf2onnx's reshape optimizer rewrites computed
    shapes into constants whose 0 means "the input's dim", whatever ``allowzero`` says, so a tensor with
    a zero-size dim may come out with another shape (nothing else differs)."""
    return _op(ctx, "Reshape", [x, shape])


def _runtime_axis(ctx, axis, shape):
    """A TF axis tensor resolved against ``shape``'s rank (negative counts from the back), int64 [1]."""
    from onnx import TensorProto

    axis = _op(ctx, "Reshape", [_cast(ctx, axis, TensorProto.INT64), _ints(ctx, [1])])
    from_back = _op(ctx, "Add", [axis, _op(ctx, "Shape", [shape])])
    return _op(ctx, "Where", [_op(ctx, "Less", [axis, _ints(ctx, [0])]), from_back, axis])


def _is_const(ctx, name) -> bool:
    producer = ctx.get_node_by_output(name)
    return producer is not None and producer.is_const()
