"""A layer normalisation in a Scan's step as one ``LayerNormalization`` node (opset 17 and later).

TensorFlow normalises over the last axis from the moments: ``mean = ReduceMean(x)``, ``variance =
ReduceMean((x - mean)^2)``, then the affine ``x * m + (beta - mean * m)`` with ``m = gamma /
sqrt(variance + epsilon)`` (Keras 3's ``LayerNormalization``, ``tf.nn.moments`` with
``tf.nn.batch_normalization``). tf2onnx writes that as a dozen nodes, and a Scan pays each of them at
every step; ONNX's ``LayerNormalization`` computes the same as one.

The match is read from the values, not from an order of nodes: the affine part is summed into terms
(``x * m``, ``mean * m`` and constants, through Add, Sub and Neg in any arrangement) and must come to
``x * m - mean * m + beta``. Every node it replaces must be read only inside it. Only float32 is
fused (the benchmark's and the tests' case); anything else keeps its nodes, which are exact.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...description import NoMatch
from ..graph import attribute, reads, set_nodes
from ..scope import Scope, TypeTable, fresh

logger = logging.getLogger("tf2onnx_rnn")

LAYER_NORMALIZATION_OPSET = 17


@dataclass(frozen=True)
class Normalisation:
    """One layer normalisation found in a graph."""

    x: str
    output: str  # the tensor the fused node computes
    gamma: np.ndarray  # [H]
    beta: np.ndarray  # [H]
    epsilon: float
    nodes: frozenset  # names of the nodes it replaces


def fuse_layer_normalisations(body: onnx.GraphProto, outer: Scope, types: TypeTable, opset: int) -> tuple:
    """Replace each layer normalisation of ``body`` (a Scan's step) by one ``LayerNormalization``
    node: (the number replaced, the number found but left as they are because the opset is below 17,
    which has no such node)."""
    if opset < LAYER_NORMALIZATION_OPSET:
        return 0, len(find_normalisations(body, outer, types, opset))
    fused = 0
    while True:
        found = find_normalisations(body, outer, types, opset, first=True)
        if not found:
            return fused, 0
        _replace(body, found[0])
        fused += 1


def find_normalisations(body: onnx.GraphProto, outer: Scope, types: TypeTable, opset: int,
                        first: bool = False) -> list:
    """The layer normalisations of ``body`` (only the first one with ``first``)."""
    scope, found = Scope(body, outer), []
    for node in body.node:
        if node.op_type != "ReduceMean":
            continue
        try:
            found.append(read_normalisation(node, scope, types, opset))
        except NoMatch as no_match:
            logger.debug("not a layer normalisation at %s: %s", node.name, no_match.reason)
            continue
        if first:
            break
    return found


def read_normalisation(mean: onnx.NodeProto, scope: Scope, types: TypeTable, opset: int) -> Normalisation:
    """The layer normalisation whose mean ``mean`` computes, or :class:`NoMatch` with the reason."""
    x = mean.input[0]
    if types.elem_type(x) != onnx.TensorProto.FLOAT:
        raise NoMatch("not float32", mean.name)
    shape = types.shape(x)
    if not shape or shape[-1] is None:
        raise NoMatch("the normalised axis has no known size", mean.name)
    width = shape[-1]
    if not _reduces_last_axis(mean, scope, len(shape), opset):
        raise NoMatch("not a mean over the last axis, dimensions kept", mean.name)
    readers = _Readers(scope)
    difference = readers.one(mean.output[0], "Sub", lambda n: list(n.input) == [x, mean.output[0]])
    square = readers.one(difference.output[0], "Mul", lambda n: list(n.input) == [difference.output[0]] * 2)
    variance = readers.one(square.output[0], "ReduceMean",
                           lambda n: _reduces_last_axis(n, scope, len(shape), opset))
    shifted = readers.one(variance.output[0], "Add")
    epsilon = scope.scalar(_other(shifted, variance.output[0]))
    if epsilon is None or not epsilon > 0:
        raise NoMatch("the variance's addend is not a positive constant", shifted.name)
    root = readers.one(shifted.output[0], "Sqrt")
    inverse = readers.one(root.output[0], "Reciprocal")
    m, gamma, scaling = inverse.output[0], np.ones(width, np.float32), ()
    gamma_mul = readers.only(m, "Mul")
    if gamma_mul is not None and scope.constant(_other(gamma_mul, m)) is not None:
        gamma = _per_feature(scope.constant(_other(gamma_mul, m)), width, gamma_mul)
        m, scaling = gamma_mul.output[0], (gamma_mul,)
    scaled = readers.all(m)
    if len(scaled) != 2 or any(n.op_type != "Mul" for n in scaled):
        raise NoMatch("the scale is not read by two products (x's and the mean's)", inverse.name)
    products = {_other(n, m): n for n in scaled}
    if x not in products:
        raise NoMatch("x is not scaled", inverse.name)
    x_scaled = products.pop(x)
    (mean_term, mean_product), = products.items()
    negated = scope.producer(mean_term)
    if mean_term == mean.output[0]:
        mean_sign, negation = 1.0, ()
    elif negated is not None and negated.op_type == "Neg" and negated.input[0] == mean.output[0]:
        mean_sign, negation = -1.0, (negated,)
    else:
        raise NoMatch("the mean's product is not of the mean", mean_product.name)
    terms = {x_scaled.output[0]: "x", mean_product.output[0]: "mean"}
    output, beta, affine = _affine_output(x_scaled, terms, mean_sign, scope, readers, width)
    nodes = (mean, difference, square, variance, shifted, root, inverse, x_scaled, mean_product) + scaling + \
        negation + affine
    names = frozenset(n.name for n in nodes)
    for node in nodes:
        for out in node.output:
            if out == output:
                continue
            if out in scope.graph_outputs or any(r.name not in names for r in scope.readers.get(out, [])):
                raise NoMatch(f"{out} is read outside the normalisation", node.name)
    return Normalisation(x, output, gamma, beta, float(epsilon), names)


def _affine_output(x_scaled, terms: dict, mean_sign: float, scope: Scope, readers, width: int) -> tuple:
    """(the normalisation's output, its [H] beta, the Add/Sub/Neg nodes that sum it): the first tensor
    down the chain of single readers from ``x * m`` that sums to ``x * m - mean * m`` (+ a constant),
    extended over an Add or Sub of a constant that follows."""
    name, found = x_scaled.output[0], None
    while True:
        reader = readers.only(name)
        if reader is None or reader.op_type not in ("Add", "Sub", "Neg"):
            if found is not None:
                return found
            raise NoMatch("x * m does not reach x * m - mean * m through Add, Sub and Neg", x_scaled.name)
        name = reader.output[0]
        summed = _beta_of(name, terms, mean_sign, scope, width)
        if summed is not None:
            found = (name,) + summed
        elif found is not None:
            return found


def _beta_of(name: str, terms: dict, mean_sign: float, scope: Scope, width: int) -> Optional[tuple]:
    """([H] beta, the nodes summing it) when ``name`` sums to ``x * m - mean * m + beta``, else None."""
    nodes: list = []
    summed = _terms(name, terms, scope, 8, nodes)
    if summed is None:
        return None
    coefficients, constant = summed
    if coefficients.get("x") != 1.0 or coefficients.get("mean", 0.0) * mean_sign != -1.0:
        return None
    try:
        return _per_feature(constant, width, None), tuple(nodes)
    except NoMatch:
        return None


def _terms(name: str, terms: dict, scope: Scope, depth: int, nodes: list) -> Optional[tuple]:
    """``name`` as ({term: coefficient}, a constant array) through Add, Sub and Neg (``nodes``: those
    met), else None."""
    if name in terms:
        return {terms[name]: 1.0}, np.zeros((), np.float32)
    value = scope.constant(name)
    if value is not None:
        return {}, value.astype(np.float32)
    node = scope.producer(name)
    if depth == 0 or node is None or node.op_type not in ("Add", "Sub", "Neg"):
        return None
    nodes.append(node)
    parts = [_terms(part, terms, scope, depth - 1, nodes) for part in node.input]
    if any(part is None for part in parts):
        return None
    if node.op_type == "Neg":
        (coefficients, constant), = parts
        return {k: -v for k, v in coefficients.items()}, -constant
    sign = -1.0 if node.op_type == "Sub" else 1.0
    (left, left_constant), (right, right_constant) = parts
    summed = dict(left)
    for key, value in right.items():
        summed[key] = summed.get(key, 0.0) + sign * value
    return summed, left_constant + sign * right_constant


def _per_feature(value: np.ndarray, width: int, where) -> np.ndarray:
    """A constant as the [H] vector it broadcasts to over the last axis."""
    if value.size == 1:
        return np.full(width, value.reshape(-1)[0], np.float32)
    if value.shape[-1] != width or value.size != width:
        raise NoMatch(f"a constant of shape {list(value.shape)} is not one value per feature", where and where.name)
    return value.reshape(width).astype(np.float32)


def _reduces_last_axis(node: onnx.NodeProto, scope: Scope, rank: int, opset: int) -> bool:
    if attribute(node, "keepdims", 1) != 1:
        return False
    axes = attribute(node, "axes") if opset < 18 else \
        (scope.constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None)
    return axes is not None and [int(a) % rank for a in np.asarray(axes).reshape(-1)] == [rank - 1]


def _other(node: onnx.NodeProto, name: str) -> str:
    """The other input of a two-input node, one of whose inputs is ``name``."""
    first, second = node.input
    return second if first == name else first


class _Readers:
    """The nodes reading a tensor of one graph."""

    def __init__(self, scope: Scope):
        self.scope = scope

    def all(self, name: str) -> list:
        return list(self.scope.readers.get(name, []))

    def only(self, name: str, op: Optional[str] = None) -> Optional[onnx.NodeProto]:
        found = self.all(name)
        if len(found) != 1 or (op is not None and found[0].op_type != op):
            return None
        return found[0]

    def one(self, name: str, op: str, check=lambda node: True) -> onnx.NodeProto:
        matching = [n for n in self.all(name) if n.op_type == op and check(n)]
        if len(matching) != 1:
            raise NoMatch(f"{name} is not read by one {op} of the normalisation", name)
        return matching[0]


def _replace(body: onnx.GraphProto, found: Normalisation) -> None:
    """The found nodes out, one LayerNormalization (with its scale and bias as initializers) in, at the
    place of the first of them."""
    gamma, beta = (numpy_helper.from_array(v, fresh(name)) for v, name in ((found.gamma, "gamma"),
                                                                          (found.beta, "beta")))
    node = helper.make_node("LayerNormalization", [found.x, gamma.name, beta.name], [found.output],
                            name=fresh("layer_normalization"), axis=-1, epsilon=found.epsilon)
    kept, placed = [], False
    for existing in body.node:
        if existing.name in found.nodes:
            if not placed:
                kept.append(node)
                placed = True
            continue
        kept.append(existing)
    set_nodes(body, kept)
    read = {name for n in body.node for name in reads(n)} | {o.name for o in body.output}
    initializers = [t for t in body.initializer if t.name in read] + [gamma, beta]
    del body.initializer[:]
    body.initializer.extend(initializers)
