"""Numeric evaluation of small TensorFlow subgraphs held in a tf2onnx graph.

Two things need numbers out of a graph before it is converted:
- weights, which reach a loop body as loop inputs and may be sliced, split or unstacked
  on the way to a MatMul;
- activation chains, which are a handful of element-wise ops between a gate's
  pre-activation and its value (for example Keras 3's hard_sigmoid is several ops).

Both are evaluated here with numpy. Only the ops listed in ``_OPS`` are known; anything
else raises :class:`NotEvaluable`, which the matchers turn into a reason.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np


class NotEvaluable(Exception):
    """The subgraph uses an op, or a form of an op, that this module cannot evaluate."""

    def __init__(self, reason: str, node_name: str):
        super().__init__(f"{reason} (node {node_name})")
        self.reason = reason
        self.node_name = node_name


def attr(node, key: str, default=None):
    """A tf2onnx node's attribute ``key`` (strings decoded), or ``default``: the readers' one attribute reader."""
    value = node.get_attr_value(key, default)
    return value.decode() if isinstance(value, bytes) else value


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _strided_slice(node, data, begin, end, strides):
    for mask in ("ellipsis_mask", "new_axis_mask"):
        if node.get_attr_value(mask, 0):
            raise NotEvaluable(f"StridedSlice with {mask}", node.name)
    begin_mask = node.get_attr_value("begin_mask", 0)
    end_mask = node.get_attr_value("end_mask", 0)
    shrink_mask = node.get_attr_value("shrink_axis_mask", 0)
    index = []
    for axis, (b, e, s) in enumerate(zip(begin.tolist(), end.tolist(), strides.tolist())):
        if shrink_mask >> axis & 1:
            index.append(int(b))
            continue
        start = None if begin_mask >> axis & 1 else int(b)
        stop = None if end_mask >> axis & 1 else int(e)
        index.append(slice(start, stop, int(s)))
    return data[tuple(index)]


def _split(node, axis, value):
    return tuple(np.split(value, node.get_attr_value("num_split"), axis=int(axis)))


def _split_v(node, value, sizes, axis):
    cuts = np.cumsum(sizes.tolist())[:-1]
    return tuple(np.split(value, cuts, axis=int(axis)))


def _unpack(node, value):
    axis = node.get_attr_value("axis", 0)
    return tuple(np.moveaxis(value, axis, 0))


def _squeeze(node, value):
    dims = node.get_attr_value("squeeze_dims", None) or None
    return np.squeeze(value, axis=tuple(dims) if dims else None)


def _leaky_relu(node, x):
    alpha = node.get_attr_value("alpha", 0.2)
    return np.where(x >= 0, x, x * np.asarray(alpha, x.dtype))


def _elu(node, x):
    return np.where(x > 0, x, np.expm1(x))


def _selu(node, x):
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    return scale * np.where(x > 0, x, alpha * np.expm1(x))


def _cast(node, x):
    from onnx import helper

    return x.astype(helper.tensor_dtype_to_np_dtype(node.get_attr_value("to")))


def _matmul(node, a, b):
    a = a.T if node.get_attr_value("transpose_a", 0) else a
    b = b.T if node.get_attr_value("transpose_b", 0) else b
    return a @ b


def _gemm(node, a, b, c=None):
    a = a.T if node.get_attr_value("transA", 0) else a
    b = b.T if node.get_attr_value("transB", 0) else b
    result = np.asarray(node.get_attr_value("alpha", 1.0), a.dtype) * (a @ b)
    if c is not None:
        result = result + np.asarray(node.get_attr_value("beta", 1.0), a.dtype) * c
    return result


def _dequantize(node, x):
    """TFLite's DEQUANTIZE: a float16 constant widened, or integers scaled (per channel along
    ``quantized_dimension`` when there are several scales)."""
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    scale = np.asarray(node.get_attr_value("scale"), np.float32)
    zero = np.asarray(node.get_attr_value("zero_point"), np.float32)
    if scale.size > 1:
        shape = [1] * x.ndim
        shape[int(node.get_attr_value("quantized_dimension", 0))] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((x.astype(np.float32) - zero) * scale).astype(np.float32)


# op type -> function(node, *input values) -> value or tuple of values
_OPS: dict[str, Callable] = {
    "Identity": lambda n, x: x,
    "ReadVariableOp": lambda n, x: x,
    "StopGradient": lambda n, x: x,
    "AddV2": lambda n, a, b: a + b,
    "Add": lambda n, a, b: a + b,
    "BiasAdd": lambda n, a, b: a + b,
    "Sub": lambda n, a, b: a - b,
    "Mul": lambda n, a, b: a * b,
    "RealDiv": lambda n, a, b: a / b,
    "Div": lambda n, a, b: a / b,
    "DivNoNan": lambda n, a, b: np.where(b == 0, 0, a / np.where(b == 0, 1, b)),
    "Maximum": lambda n, a, b: np.maximum(a, b),
    "Minimum": lambda n, a, b: np.minimum(a, b),
    "ClipByValue": lambda n, x, lo, hi: np.clip(x, lo, hi),
    "Neg": lambda n, x: -x,
    "Abs": lambda n, x: np.abs(x),
    "Exp": lambda n, x: np.exp(x),
    "Square": lambda n, x: x * x,
    "Sigmoid": lambda n, x: _sigmoid(x),
    "Tanh": lambda n, x: np.tanh(x),
    "Relu": lambda n, x: np.maximum(x, 0),
    "Relu6": lambda n, x: np.clip(x, 0, 6),
    "Softplus": lambda n, x: np.logaddexp(x, 0),
    "Softsign": lambda n, x: x / (1 + np.abs(x)),
    "LeakyRelu": _leaky_relu,
    "Elu": _elu,
    "Selu": _selu,
    "Cast": _cast,
    "Squeeze": _squeeze,
    "ExpandDims": lambda n, x, axis: np.expand_dims(x, int(axis)),
    "Reshape": lambda n, x, shape: np.reshape(x, shape.tolist()),
    "Transpose": lambda n, x, perm=None: np.transpose(x, n.get_attr_value("perm") if perm is None else perm.tolist()),
    "StridedSlice": _strided_slice,
    "Split": _split,
    "SplitV": _split_v,
    "Unpack": _unpack,
    "ConcatV2": lambda n, *args: np.concatenate(args[:-1], axis=int(args[-1])),
    "GatherV2": lambda n, x, idx, axis: np.take(x, idx, axis=int(axis)),
    "MatMul": _matmul,
    "Gemm": _gemm,
    "SelectV2": lambda n, c, a, b: np.where(c, a, b),
    "Select": lambda n, c, a, b: np.where(c.reshape(c.shape + (1,) * (a.ndim - c.ndim)), a, b),
    "Tile": lambda n, x, multiples: np.tile(x, multiples.tolist()),
    "BroadcastTo": lambda n, x, shape: np.broadcast_to(x, shape.tolist()),
    "ZerosLike": lambda n, x: np.zeros_like(x),
    "TFL_DEQUANTIZE": _dequantize,
    "OnesLike": lambda n, x: np.ones_like(x),
    "Fill": lambda n, shape, value: np.full(shape.tolist(), value),
    "LogicalAnd": lambda n, a, b: np.logical_and(a, b),
    "LogicalNot": lambda n, x: np.logical_not(x),
}

# element-wise ops that may make up an activation function (one varying operand)
ELEMENTWISE_OPS = frozenset({
    "Identity", "AddV2", "Add", "Sub", "Mul", "RealDiv", "Div", "Maximum", "Minimum",
    "ClipByValue", "Neg", "Abs", "Exp", "Square", "Sigmoid", "Tanh", "Relu", "Relu6",
    "Softplus", "Softsign", "LeakyRelu", "Elu", "Selu",
})


def evaluate(graph, tensor: str, bindings: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """Value of ``tensor`` in ``graph``.

    ``bindings`` gives values for tensors that are not constants (for example a loop body's
    inputs). Anything that is neither bound nor computable from constants raises
    :class:`NotEvaluable`.
    """
    cache: dict[str, np.ndarray] = dict(bindings or {})

    def value_of(name: str) -> np.ndarray:
        if name in cache:
            return cache[name]
        node = graph.get_node_by_output(name)
        if node is None:
            raise NotEvaluable("tensor has no producer", name)
        if node.is_const():
            result = node.get_tensor_value(as_list=False)
        else:
            func = _OPS.get(node.type)
            if func is None:
                raise NotEvaluable(f"cannot evaluate a {node.type} op", node.name)
            result = func(node, *(value_of(i) for i in node.input))
            if isinstance(result, tuple):
                for out, val in zip(node.output, result):
                    cache[out] = np.asarray(val)
                result = result[list(node.output).index(name)]
        cache[name] = np.asarray(result)
        return cache[name]

    return value_of(tensor)
