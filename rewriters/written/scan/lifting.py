"""A step's node over whole sequences: the rules by which a node that treats a leading axis as one more
batch axis runs once over every step (:mod:`.hoisting` decides which nodes move; this module writes each
moved node's sequence form).

An elementwise op whose other operands broadcast from the right without reaching that axis, a MatMul or
Gemm by an outer matrix, a convolution by constant weights (the step axis folded into the batch), a
Transpose, Reshape, Unsqueeze, Squeeze, Slice or reduction with its axes shifted by one, and an op with
an axis attribute along a later axis.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import helper

from ..graph import attribute
from ..scope import TypeTable, fresh
from .constants import Constants

_UNARY = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor",
    "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal",
    "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
    "ThresholdedRelu", "Cast", "Celu", "Gelu"})
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu", "Where", "Clip", "CastLike", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor"})
_AXIS_ATTRIBUTE = {"Softmax": -1, "LogSoftmax": -1, "Hardmax": -1, "LayerNormalization": -1, "Concat": None,
                   "Split": 0, "Gather": 0, "Flatten": None}


class Lifter:
    """Builds the sequence form of one body node; None when its op does not treat a leading axis as a
    batch axis, or the ranks that would show it are unknown."""

    def __init__(self, constants: Constants, types: TypeTable, opset: int, seq: dict):
        self._seq = seq  # a per-step tensor -> its sequence outside (the rules add what they make)
        self.constants = constants
        self.value = constants.value  # a constant's value (the scope's, the body's own, or one made here)
        self.const = constants.const
        self.types = types
        self.opset = opset
        self.rank: dict = {}  # a row's (or a hoisted row's) rank at one step

    def outer_rank(self, name: str) -> Optional[int]:
        value = self.value(name)
        return value.ndim if value is not None else self.types.rank(name)

    def lift(self, node: onnx.NodeProto, seq: dict) -> Optional[list]:
        """``node`` over whole sequences (``seq``: a per-step tensor -> its sequence); its outputs are
        fresh sequence tensors, recorded in ``seq``."""
        varying = [bool(name) and name in seq for name in node.input]
        ranks = [self.rank.get(name) if v else (self.outer_rank(name) if name else None)
                 for name, v in zip(node.input, varying)]
        rule = self._rules().get(node.op_type)
        if rule is None or any(r is None for r, name in zip(ranks, node.input) if name):
            return None
        made = rule(node, varying, ranks)
        if made is None:
            return None
        nodes, out_rank = made
        for out in node.output:
            self.rank[out] = out_rank
        return nodes

    def _rules(self) -> dict:
        rules: dict = {op: self._broadcast for op in _UNARY | _BROADCAST}
        rules.update({"MatMul": self._matmul, "Gemm": self._gemm, "Conv": self._conv, "Transpose": self._transpose,
                      "Reshape": self._reshape, "Unsqueeze": self._axes_op, "Squeeze": self._axes_op,
                      "Slice": self._slice})
        for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
                   "ReduceSumSquare", "ReduceLogSumExp"):
            rules[op] = self._axes_op
        for op in _AXIS_ATTRIBUTE:
            rules[op] = self._axis_op
        return rules

    def _copy(self, node: onnx.NodeProto, seq: dict, inputs: Optional[list] = None, **changed) -> onnx.NodeProto:
        """``node`` with its per-step inputs read as sequences and fresh outputs (recorded in ``seq``)."""
        outputs = [fresh(out) if out else "" for out in node.output]
        for out, new in zip(node.output, outputs):
            if out:
                seq[out] = new
        names = inputs if inputs is not None else [seq.get(name, name) for name in node.input]
        copy = helper.make_node(node.op_type, names, outputs, name=fresh(node.name or node.op_type),
                                domain=node.domain)
        kept = [a for a in node.attribute if a.name not in changed]
        copy.attribute.extend(kept)
        for key, value in changed.items():
            if value is not None:
                copy.attribute.append(helper.make_attribute(key, value))
        return copy

    # each rule: (node, varying, ranks) -> (nodes, rank at one step) or None
    def _broadcast(self, node, varying, ranks):
        present = [r for r, name in zip(ranks, node.input) if name]
        top = max(present)
        if any(v and r != top for v, r in zip(varying, ranks)):
            return None  # a row of lower rank would broadcast its step axis onto another
        if node.op_type == "CastLike" and varying[1]:
            return None
        return [self._copy(node, self._seq)], top

    def float16(self, node) -> bool:
        """onnxruntime (1.32, measured) crashes creating a session for a float16 MatMul over a transposed
        sequence (its optimizers fuse the two): float16 products stay in the step."""
        names = [name for name in node.input if name] + [self._seq[name] for name in node.input if name in self._seq]
        return onnx.TensorProto.FLOAT16 in {self.types.elem_type(name) for name in names}

    def _matmul(self, node, varying, ranks):
        if self.float16(node):
            return None
        (va, vb), (ra, rb) = varying, ranks
        if va and not vb and ra >= 2 and rb <= ra:
            return [self._copy(node, self._seq)], max(ra, rb) if rb > 1 else ra - 1
        if va and vb and ra == rb and ra >= 2:
            return [self._copy(node, self._seq)], ra
        return None

    def _gemm(self, node, varying, ranks):
        if not varying[0] or any(varying[1:]) or attribute(node, "transA", 0) or self.float16(node):
            return None
        b = node.input[1]
        made = []
        if attribute(node, "transB", 0):
            made.append(helper.make_node("Transpose", [b], [fresh(b)], name=fresh("gemm_b"), perm=[1, 0]))
            b = made[-1].output[0]
        product = fresh(node.output[0])
        made.append(helper.make_node("MatMul", [self._seq[node.input[0]], b], [product], name=fresh("gemm")))
        alpha, beta = attribute(node, "alpha", 1.0), attribute(node, "beta", 1.0)
        dtype = helper.tensor_dtype_to_np_dtype(self.types.elem_type(node.input[0]) or onnx.TensorProto.FLOAT)
        if alpha != 1.0:
            scaled = fresh(node.output[0])
            made.append(helper.make_node("Mul", [product, self.const(np.array(alpha, dtype), "alpha")], [scaled],
                                         name=fresh("gemm_alpha")))
            product = scaled
        if len(node.input) > 2 and node.input[2]:
            c = node.input[2]
            if beta != 1.0:
                made.append(helper.make_node("Mul", [c, self.const(np.array(beta, dtype), "beta")], [fresh(c)],
                                             name=fresh("gemm_beta")))
                c = made[-1].output[0]
            summed = fresh(node.output[0])
            made.append(helper.make_node("Add", [product, c], [summed], name=fresh("gemm_c")))
            product = summed
        self._seq[node.output[0]] = product
        return made, 2

    def _conv(self, node, varying, ranks):
        """A convolution of each row by constant weights: the sequence's step axis folded into its batch
        axis (``[T, N, C, ...]`` as ``[T * N, C, ...]``), one Conv over every step, the two axes unfolded."""
        if not varying[0] or any(varying[1:]) or ranks[0] < 3:
            return None
        sequence, rank = self._seq[node.input[0]], ranks[0]
        made = []

        def add(op: str, inputs: list, **attrs) -> str:
            made.append(helper.make_node(op, inputs, [fresh(f"{node.output[0]}_{op.lower()}")],
                                         name=fresh(f"{node.name or 'Conv'}_{op.lower()}"), **attrs))
            return made[-1].output[0]

        def dims(tensor: str, start: int, end: int) -> str:
            return add("Slice", [add("Shape", [tensor]), self.const(np.array([start], np.int64), "start"),
                                 self.const(np.array([end], np.int64), "end")])

        folded_shape = add("Concat", [self.const(np.array([-1], np.int64), "folded"), dims(sequence, 2, rank + 1)],
                           axis=0)
        folded = add("Reshape", [sequence, folded_shape])
        convolved = add("Conv", [folded] + list(node.input[1:]))
        made[-1].attribute.extend(node.attribute)
        unfolded_shape = add("Concat", [dims(sequence, 0, 2), dims(convolved, 1, rank)], axis=0)
        out = fresh(node.output[0])
        made.append(helper.make_node("Reshape", [convolved, unfolded_shape], [out],
                                     name=fresh(f"{node.name or 'Conv'}_unfolded")))
        self._seq[node.output[0]] = out
        return made, rank

    def _transpose(self, node, varying, ranks):
        perm = attribute(node, "perm") or list(reversed(range(ranks[0])))
        return [self._copy(node, self._seq, perm=[0] + [p + 1 for p in perm])], ranks[0]

    def _reshape(self, node, varying, ranks):
        shape = self.value(node.input[1])
        if varying[1] or shape is None or attribute(node, "allowzero", 0):
            return None
        new_shape = self.const(np.concatenate([[0], shape.reshape(-1)]).astype(np.int64), "shape")
        return [self._copy(node, self._seq, [self._seq[node.input[0]], new_shape])], int(shape.size)

    def _shifted(self, axes) -> list:
        return [int(a) + 1 if int(a) >= 0 else int(a) for a in np.asarray(axes).reshape(-1)]

    def _axes_op(self, node, varying, ranks):
        """Unsqueeze, Squeeze and the reductions: their axes, as an attribute or a constant input."""
        if any(varying[1:]):
            return None
        rank = ranks[0]
        keep = attribute(node, "keepdims", 1)
        axes = attribute(node, "axes")
        inputs = [self._seq[node.input[0]]] + list(node.input[1:])
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = self.value(node.input[1])
            if axes is None:
                return None
            inputs[1] = self.const(np.array(self._shifted(axes), np.int64), "axes")
            changed = {}
        elif axes is not None:
            changed = {"axes": self._shifted(axes)}
        else:
            return None  # every axis (or, for Squeeze, every axis of size one): the step axis too
        count = len(np.asarray(axes).reshape(-1))
        reduced = rank if keep else rank - count
        out_rank = {"Unsqueeze": rank + count, "Squeeze": rank - count}.get(node.op_type, reduced)
        return [self._copy(node, self._seq, inputs, **changed)], out_rank

    def _slice(self, node, varying, ranks):
        if any(varying[1:]):
            return None
        starts = self.value(node.input[1])
        axes = self.value(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if starts is None or (len(node.input) > 3 and node.input[3] and axes is None):
            return None
        axes = np.arange(starts.size) if axes is None else axes
        inputs = list(node.input) + [""] * (4 - len(node.input))
        inputs[0] = self._seq[node.input[0]]
        inputs[3] = self.const(np.array(self._shifted(axes), np.int64), "axes")
        return [self._copy(node, self._seq, inputs)], ranks[0]

    def _axis_op(self, node, varying, ranks):
        if any(varying[1:]) and node.op_type != "Concat":
            return None
        if node.op_type == "Concat" and not all(v for v, name in zip(varying, node.input) if name):
            return None
        if node.op_type in ("Softmax", "LogSoftmax", "Hardmax") and self.opset < 13:
            return None  # before opset 13 these flatten from their axis on
        if node.op_type == "Flatten":
            return None
        axis = attribute(node, "axis", _AXIS_ATTRIBUTE[node.op_type])
        rank = ranks[0]
        out_rank = rank + ranks[1] - 1 if node.op_type == "Gather" else rank
        return [self._copy(node, self._seq, axis=self._shifted([axis])[0])], out_rank
