"""Input-only work a step does apart, regrouped so that :mod:`.hoisting` moves it out of the step: a
product by a constant matrix of a concatenation split by the parts' kinds, a negated factor moved onto
the factor that does not vary, and a sum of an input-only term and a varying one reassociated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper

from ..graph import attribute, reads, subgraphs
from ..scope import TypeTable, fresh
from .constants import Constants


@dataclass(frozen=True)
class Weights:
    """What splitting a product by a constant matrix needs: the rewrite's constants (the matrix's value, a
    new one for each block), the width of a part (None where unknown), and whether a product stays whole
    (float16)."""

    constants: Constants
    width: Callable[[str], Optional[int]]
    whole: Callable[[onnx.NodeProto], bool]


def regroup_input_only_work(body: list, step_inputs: set, keep: Callable[[str], bool], types: TypeTable,
                            weights: Optional[Weights] = None) -> list:
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
                   weights: Weights):
    """``MatMul(Concat(p_1 .. p_n), W)`` along the parts' last axis (or a Gemm of it, ``alpha`` and
    ``beta`` 1), ``W`` a constant matrix, some parts depending on a carried state and some not: (the
    Concat, the products of each part by its rows of ``W``, summed apart for the two kinds, then added,
    and the Gemm's ``C`` added last, that replace it and ``node``); else None."""
    gemm = node.op_type == "Gemm" and not attribute(node, "transA", 0) and \
        attribute(node, "alpha", 1.0) == 1.0 and attribute(node, "beta", 1.0) == 1.0
    if not (node.op_type == "MatMul" or gemm) or weights.whole(node):
        return None
    concat, matrix = made_by.get(node.input[0]), weights.constants.value(node.input[1])
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
        block = weights.constants.const(np.ascontiguousarray(matrix[start:start + rows]), node.input[1])
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
