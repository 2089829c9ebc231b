"""Work a step does on its own input, taken out of the step and done once over the whole sequence.

A body node whose inputs are all rows of the scanned sequences, outer values or constants (or what
such nodes make) computes the same at step ``t`` whether it runs inside the step or once over the
sequence, sliced at ``t`` afterwards, when its op treats a leading axis as one more batch axis: an
elementwise op whose other operands broadcast from the right without reaching that axis, a MatMul by
an outer matrix, a normalisation or a split along a later axis. Such nodes move out; what the rest
of the step reads of them becomes the Scan's inputs. A node reading only outer values and constants
moves out as it is. Nothing else moves, so what stays computes exactly what the loop computed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph_index import Scope, TypeTable, attribute, fresh, reads, subgraphs
from .siblings import fuse_siblings

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


@dataclass
class Hoisted:
    """What hoisting did: the nodes now before the Scan, the step's nodes, and the scanned rows (the
    body input of each row -> the outer sequence it is a row of)."""

    outer: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    body: list = field(default_factory=list)
    rows: dict = field(default_factory=dict)
    moved: int = 0  # how many nodes now run once over the sequence
    merged: int = 0  # sibling products merged into one node with another (:mod:`.siblings`)
    lifted: dict = field(default_factory=dict)  # op type -> how many nodes of it now run over the sequence
    ranks: dict = field(default_factory=dict)  # each row's rank at one step, where known


class _Lifter:
    """Builds the sequence form of one body node; None when its op does not treat a leading axis as a
    batch axis, or the ranks that would show it are unknown."""

    def __init__(self, scope: Scope, types: TypeTable, opset: int, hoisted: Hoisted, seq: dict,
                 value: Optional[Callable[[str], Optional[np.ndarray]]] = None):
        self._seq = seq  # a per-step tensor -> its sequence outside (the rules add what they make)
        self.scope = scope
        self.value = value or scope.constant  # a constant's value: the scope's, or one the body held
        self.types = types
        self.opset = opset
        self.hoisted = hoisted
        self.rank: dict = {}  # a row's (or a hoisted row's) rank at one step

    def const(self, value: np.ndarray, base: str) -> str:
        tensor = numpy_helper.from_array(np.asarray(value), fresh(base))
        self.hoisted.initializers.append(tensor)
        self.types.types[tensor.name] = helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))
        return tensor.name

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

    def _float16(self, node) -> bool:
        """onnxruntime (1.32, measured) crashes creating a session for a float16 MatMul over a transposed
        sequence (its optimizers fuse the two): float16 products stay in the step."""
        names = [name for name in node.input if name] + [self._seq[name] for name in node.input if name in self._seq]
        return onnx.TensorProto.FLOAT16 in {self.types.elem_type(name) for name in names}

    def _matmul(self, node, varying, ranks):
        if self._float16(node):
            return None
        (va, vb), (ra, rb) = varying, ranks
        if va and not vb and ra >= 2 and rb <= ra:
            return [self._copy(node, self._seq)], max(ra, rb) if rb > 1 else ra - 1
        if va and vb and ra == rb and ra >= 2:
            return [self._copy(node, self._seq)], ra
        return None

    def _gemm(self, node, varying, ranks):
        if not varying[0] or any(varying[1:]) or attribute(node, "transA", 0) or self._float16(node):
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


def hoist(body: list, rows: dict, row_ranks: dict, step_inputs: set, scope: Scope, types: TypeTable,
          opset: int, keep: Callable[[str], bool], promoted: tuple = ()) -> Hoisted:
    """Move out of a step's ``body`` nodes what only its rows and outer values feed (see the module).

    ``rows``: each row's body input -> its outer sequence; ``step_inputs``: the body's other inputs
    (its carried states); ``keep(name)``: whether a body tensor is a body output; ``promoted``: the
    body's own initializers, now outer ones the scope does not hold yet.
    """
    hoisted = Hoisted()
    seq = dict(rows)  # per-step tensor -> its sequence outside

    def width(name: str) -> Optional[int]:  # the last dim of a body tensor (a row's: its sequence's)
        shape = types.shape(name) or (types.shape(rows[name]) if name in rows else None)
        return shape[-1] if shape else None

    moved_out = {tensor.name: tensor for tensor in promoted}

    def value(name: str) -> Optional[np.ndarray]:
        found = moved_out.get(name)
        return numpy_helper.to_array(found) if found is not None else scope.constant(name)

    lifter = _Lifter(scope, types, opset, hoisted, seq, value)

    body = regroup_input_only_work(body, step_inputs, keep, types,
                                   _Weights(value, lifter.const, width, lifter._float16))
    body, hoisted.merged = fuse_siblings(body, value, lifter.const, types, opset, keep)
    lifter.rank.update(row_ranks)
    invariant: set = set()  # body tensors now made outside, unchanged
    varying = set(step_inputs)  # what depends on a carried state
    local = {out for node in body for out in node.output} | set(rows) | set(step_inputs)
    stays = []
    for node in body:
        names = reads(node)
        depends = [name for name in names if name in local]
        if subgraphs(node) or any(name in varying for name in depends) or node.op_type == "Shape":
            stays.append(node)
            varying.update(node.output)
            continue
        if all(name in invariant for name in depends):
            hoisted.outer.append(node)
            invariant.update(node.output)
            hoisted.moved += 1
            continue
        lifted = lifter.lift(node, seq) if all(name in seq or name in invariant for name in depends) else None
        if lifted is None:
            stays.append(node)
            varying.update(node.output)
            continue
        hoisted.outer.extend(lifted)
        hoisted.moved += 1
        hoisted.lifted[node.op_type] = hoisted.lifted.get(node.op_type, 0) + 1
    needed = {name for node in stays for name in reads(node)} | {name for name in seq if keep(name)}
    hoisted.rows = {name: sequence for name, sequence in seq.items() if name in needed}
    hoisted.body = stays
    hoisted.ranks = dict(lifter.rank)
    return hoisted


@dataclass(frozen=True)
class _Weights:
    """What splitting a product by a constant matrix needs: the matrix's value, a new constant's name, the
    width of a part (None where unknown), and whether a product stays whole (float16)."""

    value: Callable[[str], Optional[np.ndarray]]
    const: Callable[[np.ndarray, str], str]
    width: Callable[[str], Optional[int]]
    whole: Callable[[onnx.NodeProto], bool]


def regroup_input_only_work(body: list, step_inputs: set, keep: Callable[[str], bool], types: TypeTable,
                            weights: Optional[_Weights] = None) -> list:
    """Input-only work a step does apart, regrouped so that it moves out, repeatedly:

    - ``MatMul(Concat(x, h), W)`` along the last axis, ``W`` a constant matrix, ``h`` depending on a
      carried state and ``x`` not (a TF 1.x cell's ``[x, h] @ W``), becomes ``x @ W_x + h @ W_h``: the same
      products, summed in another order (rounding only);
    - ``Mul(Neg(a), c)`` with ``c`` not depending on a carried state becomes ``Mul(a, Neg(c))``, bit for
      bit (Keras's gelu is ``0.5 * x * erfc(-x / sqrt(2))``);
    - ``Add(Add(u, v), c)`` where ``v`` depends on a carried state and ``u`` and ``c`` do not (a cell's
      ``x @ W + h @ U + b``) becomes ``Add(Add(u, c), v)``: the same sum up to rounding (one float
      addition regrouped, well within the parity tolerance).

    The node replaced (the Neg, the inner sum) is read by the outer one alone and is no body output; its
    replacement takes the outer node's place in the step (``c`` may be made after ``a`` or ``u``)."""
    body = list(body)
    while True:
        varying = set(step_inputs)
        for node in body:
            if subgraphs(node) or node.op_type == "Shape" or reads(node) & varying:
                varying.update(node.output)
        made_by = {out: node for node in body for out in node.output}
        readers: dict = {}
        for node in body:
            for name in reads(node):
                readers[name] = readers.get(name, 0) + 1

        def read_once(name: str) -> bool:  # by the outer node alone, and no body output
            return readers.get(name) == 1 and not keep(name)

        for index, outer in enumerate(body):
            found = (_negated_factor(outer, made_by, varying, read_once, types)
                     or _split_sum(outer, made_by, varying, read_once, types)
                     or (weights and _split_product(outer, made_by, varying, read_once, types, weights)))
            if found is not None:
                replaced, made = found
                body = [n for n in body[:index] if n is not replaced] + made + body[index + 1:]
                break
        else:
            return body


def _negated_factor(node: onnx.NodeProto, made_by: dict, varying: set, read_once, types: TypeTable):
    """``Mul(Neg(a), c)``, ``a`` depending on a carried state and ``c`` not: (the Neg, ``Neg(c)`` and the
    product that replace it and ``node``); else None."""
    if node.op_type != "Mul" or len(node.input) != 2:
        return None
    for at in (0, 1):
        neg, factor = made_by.get(node.input[at]), node.input[1 - at]
        if neg is not None and neg.op_type == "Neg" and neg.input[0] in varying and factor not in varying \
                and read_once(neg.output[0]):
            flipped = helper.make_node("Neg", [factor], [fresh(factor)], name=fresh(neg.name or "Neg"))
            _typed_as(types, flipped.output[0], factor)
            return neg, [flipped, helper.make_node("Mul", [neg.input[0], flipped.output[0]], list(node.output),
                                                   name=node.name)]
    return None


def _split_sum(node: onnx.NodeProto, made_by: dict, varying: set, read_once, types: TypeTable):
    """``Add(Add(u, v), c)``, ``v`` depending on a carried state and ``u`` and ``c`` not: (the inner sum,
    ``Add(u, c)`` and the sum with ``v`` that replace it and ``node``); else None. ``u + c`` is typed as
    ``u`` where that is as wide as the whole sum, else as the sum."""
    if node.op_type != "Add" or len(node.input) != 2:
        return None
    for at in (0, 1):
        inner, addend = made_by.get(node.input[at]), node.input[1 - at]
        if inner is None or inner.op_type != "Add" or len(inner.input) != 2 or addend in varying \
                or not read_once(inner.output[0]) or (inner.input[0] in varying) == (inner.input[1] in varying):
            continue
        fixed, moving = (inner.input[1], inner.input[0]) if inner.input[0] in varying else inner.input
        regrouped = helper.make_node("Add", [fixed, addend], [fresh(inner.output[0])], name=fresh(inner.name or "Add"))
        wide = types.shape(fixed) is not None and types.shape(fixed) == types.shape(node.output[0])
        _typed_as(types, regrouped.output[0], fixed if wide else node.output[0])
        return inner, [regrouped, helper.make_node("Add", [regrouped.output[0], moving], list(node.output),
                                                   name=node.name)]
    return None


def _split_product(node: onnx.NodeProto, made_by: dict, varying: set, read_once, types: TypeTable,
                   weights: _Weights):
    """``MatMul(Concat(p_1 .. p_n), W)`` along the parts' last axis (or a Gemm of it, ``alpha`` and
    ``beta`` 1), ``W`` a constant matrix, some parts depending on a carried state and some not: (the
    Concat, the products of each part by its rows of ``W``, summed apart for the two kinds, then added,
    and the Gemm's ``C`` added last, that replace it and ``node``); else None."""
    gemm = node.op_type == "Gemm" and not attribute(node, "transA", 0) and \
        attribute(node, "alpha", 1.0) == 1.0 and attribute(node, "beta", 1.0) == 1.0
    if not (node.op_type == "MatMul" or gemm) or weights.whole(node):
        return None
    concat, matrix = made_by.get(node.input[0]), weights.value(node.input[1])
    if concat is None or concat.op_type != "Concat" or matrix is None or matrix.ndim != 2 or \
            not read_once(concat.output[0]):
        return None
    if gemm and attribute(node, "transB", 0):
        matrix = matrix.T
    parts = list(concat.input)
    ranks = {types.rank(p) for p in parts}
    widths = [weights.width(p) for p in parts]
    rank = ranks.pop() if len(ranks) == 1 else None
    if rank is None or rank < 2 or attribute(concat, "axis") not in (-1, rank - 1) or None in widths or \
            sum(widths) != matrix.shape[0] or all(p in varying for p in parts) or not any(p in varying for p in parts):
        return None
    made, sums = [], {}

    def add(a: str, b: str, out: Optional[str] = None) -> str:
        total = helper.make_node("Add", [a, b], [out or fresh(node.output[0])], name=fresh(node.name or "Add"))
        _typed_as(types, total.output[0], node.output[0])
        made.append(total)
        return total.output[0]

    start = 0
    for part, rows in zip(parts, widths):
        block = weights.const(np.ascontiguousarray(matrix[start:start + rows]), node.input[1])
        start += rows
        product = helper.make_node("MatMul", [part, block], [fresh(node.output[0])], name=fresh(node.name or "MatMul"))
        _typed_as(types, product.output[0], node.output[0])
        made.append(product)
        kind = part in varying
        sums[kind] = add(sums[kind], product.output[0]) if kind in sums else product.output[0]
    bias = node.input[2] if gemm and len(node.input) > 2 and node.input[2] else ""
    add(sums[False], sums[True], None if bias else node.output[0])
    if bias:
        add(made[-1].output[0], bias, node.output[0])
    return concat, made


def _typed_as(types: TypeTable, name: str, like: str) -> None:
    """Record ``name``'s type as ``like``'s, where that is known (a Scan's inputs must be typed)."""
    if like in types.types:
        types.types[name] = types.types[like]
