"""Softsign, Softplus, Elu, Selu and LeakyRelu on float64: elementary ops in float64.

tf2onnx converts each to the ONNX op of its name, which onnxruntime implements for float32 only
below opset 18 (from 18 it expands the op's ONNX function, whose Softplus overflows past 709 and is 0
below -37, and whose Selu and LeakyRelu take their constants as float32 attributes: Selu is 3e-8 off at
every positive value): a float64 model using one, in a recurrent cell or anywhere else, did not load,
or was inexact. Each case computes what TensorFlow's kernel computes, in float64:

========== ===============================================================================
TF op      float64 form
========== ===============================================================================
Softsign   ``x / (1 + |x|)``
Softplus   ``x`` above 34.04, ``exp(x)`` below -34.04, else ``log1p(exp(x))`` (TF's thresholds,
           ``log(eps) + 2``); ``log1p(e) = e * log(u) / (u - 1)`` with ``u = 1 + e``, ``e``
           where ``u == 1`` (W. Kahan)
Elu        ``exp(x) - 1`` where ``x < 0``, else ``x``
Selu       ``1.7580993408473766 * (exp(x) - 1)`` where ``x < 0``, else ``1.0507009873554805 * x``
LeakyRelu  ``x`` where ``x > 0``, else ``alpha * x``
========== ===============================================================================

Elu and Selu take ``exp(x) - 1`` as TensorFlow's kernels do (not an expm1: Keras's own float64 elu of
-1e-12 is -9.99978e-13). Every other node of these ops goes to tf2onnx's handler.
"""
from __future__ import annotations

import numpy as np

from .common import _op, _replace, _scalar

SOFTPLUS_THRESHOLD = float(np.log(np.finfo(np.float64).eps) + 2.0)  # TF's: about -34.04
SELU_SCALE = 1.0507009873554804934193349852946
SELU_SCALE_ALPHA = 1.7580993408473768599402175208123


class _OnDouble:
    """A case of a TF activation op: its float64 nodes."""

    @staticmethod
    def applies(ctx, node):
        from onnx import TensorProto

        return ctx.get_dtype(node.input[0]) == TensorProto.DOUBLE


class _DoubleSoftsign(_OnDouble):
    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto

        x = node.input[0]
        one = _scalar(ctx, 1.0, TensorProto.DOUBLE, "softsign_one")
        _replace(ctx, node, "Div", [x, _op(ctx, "Add", [one, _op(ctx, "Abs", [x])])])


class _DoubleSoftplus(_OnDouble):
    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto

        x, double = node.input[0], TensorProto.DOUBLE
        one = _scalar(ctx, 1.0, double, "softplus_one")
        e = _op(ctx, "Exp", [x])
        u = _op(ctx, "Add", [one, e])
        kahan = _op(ctx, "Div", [_op(ctx, "Mul", [e, _op(ctx, "Log", [u])]), _op(ctx, "Sub", [u, one])])
        log1p = _op(ctx, "Where", [_op(ctx, "Equal", [u, one]), e, kahan])
        low = _op(ctx, "Less", [x, _scalar(ctx, SOFTPLUS_THRESHOLD, double, "softplus_low")])
        high = _op(ctx, "Greater", [x, _scalar(ctx, -SOFTPLUS_THRESHOLD, double, "softplus_high")])
        _replace(ctx, node, "Where", [high, x, _op(ctx, "Where", [low, e, log1p])])


def _exp_minus_one_below_zero(ctx, node, scale: float, above: str):
    """``scale * (exp(x) - 1)`` where the node's input ``x`` is negative, else ``above``."""
    from onnx import TensorProto

    x, double = node.input[0], TensorProto.DOUBLE
    below = _op(ctx, "Sub", [_op(ctx, "Exp", [x]), _scalar(ctx, 1.0, double, "exp_minus_one")])
    if scale != 1.0:
        below = _op(ctx, "Mul", [_scalar(ctx, scale, double, "exp_minus_one_scale"), below])
    negative = _op(ctx, "Less", [x, _scalar(ctx, 0.0, double, "activation_zero")])
    _replace(ctx, node, "Where", [negative, below, above])


class _DoubleElu(_OnDouble):
    @staticmethod
    def convert(ctx, node):
        _exp_minus_one_below_zero(ctx, node, 1.0, node.input[0])


class _DoubleSelu(_OnDouble):
    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto

        scaled = _op(ctx, "Mul", [_scalar(ctx, SELU_SCALE, TensorProto.DOUBLE, "selu_scale"), node.input[0]])
        _exp_minus_one_below_zero(ctx, node, SELU_SCALE_ALPHA, scaled)


class _DoubleLeakyRelu(_OnDouble):
    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto

        x, double = node.input[0], TensorProto.DOUBLE
        alpha = _scalar(ctx, float(node.get_attr_value("alpha", 0.2)), double, "leaky_relu_alpha")
        positive = _op(ctx, "Greater", [x, _scalar(ctx, 0.0, double, "leaky_relu_zero")])
        _replace(ctx, node, "Where", [positive, x, _op(ctx, "Mul", [alpha, x])])
