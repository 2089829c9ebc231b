"""Reading a gate's pre-activation as ``x @ W + h @ R + biases``: the affine half of :class:`.body.BodyView`.

:class:`AffineReading` decomposes a pre-activation into :class:`Term` (products, constants and
leaves that are neither), following Split/StridedSlice column blocks, a factor concatenated
from ``[x, h]`` and whatever tf2onnx folded into a ``Gemm`` (``alpha``, ``transB``, an added
``C``), so per-gate slices and fused kernels read the same way; :meth:`AffineReading.affine`
sorts the terms into an :class:`Affine`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..description import NoMatch, WeightSource, require
from .evaluate import NotEvaluable, evaluate

SUM_OPS = frozenset({"AddV2", "Add", "BiasAdd"})


@dataclass(frozen=True)
class Affine:
    """``x @ input_weight + h @ recurrent_weight + sum(biases)``; weights may be absent."""

    input_weight: Optional[WeightSource]
    recurrent_weight: Optional[WeightSource]
    biases: tuple[WeightSource, ...]

    def bias(self) -> Optional[WeightSource]:
        if not self.biases:
            return None
        parts = self.biases
        return lambda values: sum(part(values) for part in parts)


class AffineReading:
    """The affine reading of a pre-activation, mixed into :class:`.body.BodyView`, whose navigation
    it uses: ``graph``, ``resolve``, ``producer``, ``static_source``, ``unbroadcast`` and ``_blocks``
    (the column blocks the view names)."""

    def sum_terms(self, tensor: str) -> list[str]:
        """Flatten a tree of additions into its leaves (seen through batch-1 reshapes)."""
        tensor = self.unbroadcast(tensor)
        node = self.graph.get_node_by_output(tensor)
        if node is not None and node.type in SUM_OPS:
            return [leaf for operand in node.input for leaf in self.sum_terms(operand)]
        return [tensor]

    def terms(self, tensor: str, constant_slots: frozenset, transform: tuple = ()) -> list["Term"]:
        """Read a pre-activation as a sum of :class:`Term`: products ``operand @ weight``,
        constants, and leaves that are neither.

        Column blocks (Split, SplitV, StridedSlice) of sums are looked through, so fused kernels
        and per-gate slices read alike. A product is a ``MatMul`` or a ``Gemm``, whatever
        tf2onnx folded into it: ``alpha`` scales the weight, ``transB`` transposes it, and the
        added ``C`` (times ``beta``) is read as further terms. ``transform`` is what the
        enclosing blocks and scales do to a weight's columns.
        """
        found = []
        for leaf in self.sum_terms(tensor):
            found += self._leaf_terms(leaf, constant_slots, transform)
        return found

    def _leaf_terms(self, leaf: str, constant_slots: frozenset, transform: tuple) -> list["Term"]:
        constant = self.static_source(leaf, constant_slots)
        if constant is not None:
            return [Term(leaf, None, _transformed(_bias_row(constant, leaf), transform))]
        block = self._column_block(leaf)
        if block is not None:
            source, select = block
            return self.terms(source, constant_slots, transform + (select,))
        node = self.graph.get_node_by_output(leaf)
        if node is not None and node.type in _PRODUCT_OPS:
            return self._product_terms(node, constant_slots, transform)
        require(not transform, f"a {node.type if node else 'loop input'} term inside a column block or "
                "a scaled Gemm is not x @ W, h @ R or a bias", leaf)
        return [Term(leaf, None, None)]

    def _product_terms(self, node, constant_slots: frozenset, transform: tuple) -> list["Term"]:
        """``A @ B`` (MatMul) or ``alpha * A @ B + beta * C`` (Gemm), B constant across steps."""
        form = _PRODUCT_OPS[node.type]
        require(not node.get_attr_value(form.transpose_a, 0),
                f"{node.type} transposes its varying factor", node.name)
        weight = self.static_source(node.input[_WEIGHT], constant_slots)
        require(weight is not None, f"the weight of a {node.type} is not constant across steps", node.name)
        if node.get_attr_value(form.transpose_b, 0):
            weight = _transposed(weight)
        alpha = float(node.get_attr_value("alpha", 1.0)) if form.scaled else 1.0
        factor = self.unbroadcast(node.input[_FACTOR])
        parts = self._concatenated(factor) or [(factor, None)]
        products = [Term(node.output[0], operand, _transformed(_row_block(weight, parts, index),
                                                               transform + _scale(alpha)))
                    for index, (operand, _) in enumerate(parts)]
        if not form.scaled or len(node.input) <= _ADDEND or not node.input[_ADDEND]:
            return products
        beta = float(node.get_attr_value("beta", 1.0))
        return products + self.terms(node.input[_ADDEND], constant_slots, transform + _scale(beta))

    def _concatenated(self, tensor: str) -> Optional[list]:
        """A factor joined from column blocks (TF1's cells multiply ``concat([x, h])`` by one kernel):
        [(operand, its column count or None when unknown)], at most one count unknown; else None."""
        node = self.graph.get_node_by_output(tensor)
        if node is None or node.type not in ("ConcatV2", "Concat"):
            return None
        operands = list(node.input[:-1]) if node.type == "ConcatV2" else list(node.input)
        try:
            axis = int(evaluate(self.graph, node.input[-1])) if node.type == "ConcatV2" else node.get_attr_value("axis")
        except NotEvaluable:
            return None
        if len(operands) < 2 or not self._is_last_axis(tensor, axis):
            return None
        counts = [_columns(self.graph.get_shape(operand)) for operand in operands]
        if counts.count(None) > 1:
            return None
        return [(self.unbroadcast(operand), count) for operand, count in zip(operands, counts)]

    def affine(self, tensors, x_t: str, h_prev: str, constant_slots: frozenset) -> Affine:
        """Decompose ``tensors`` (one tensor, or a list to add up) as ``x_t @ W + h_prev @ R + biases``.

        Raises :class:`NoMatch` when a term is anything else.
        """
        tensors = [tensors] if isinstance(tensors, str) else list(tensors)
        return self.affine_of([t for tensor in tensors for t in self.terms(tensor, constant_slots)],
                              x_t, h_prev, tensors[0] if tensors else "")

    def affine_of(self, terms: list, x_t: str, h_prev: str, where: str = "") -> Affine:
        """Sort terms into ``x_t @ W``, ``h_prev @ R`` and biases; anything else is a :class:`NoMatch`."""
        x_t, h_prev = self.unbroadcast(x_t) if x_t else "", self.unbroadcast(h_prev)
        input_weights, recurrent_weights, biases = [], [], []
        for term in terms:
            if term.weight is None:
                node = self.graph.get_node_by_output(term.tensor)
                raise NoMatch(f"a gate pre-activation term ({node.type if node else 'input'}) is not x @ W, "
                              "h @ R or a bias", term.tensor)
            if term.operand is None:
                biases.append(term.weight)
            elif term.operand == x_t:
                input_weights.append(term.weight)
            elif term.operand == h_prev:
                recurrent_weights.append(term.weight)
            else:
                raise NoMatch("a product multiplies something other than x_t or the previous state", term.tensor)
        require(len(input_weights) <= 1, "more than one x_t @ W term in a gate", where)
        require(len(recurrent_weights) <= 1, "more than one h @ R term in a gate", where)
        return Affine(input_weights[0] if input_weights else None,
                      recurrent_weights[0] if recurrent_weights else None,
                      tuple(biases))

    def _column_block(self, tensor: str):
        """If ``tensor`` is a block of columns (last axis) of another tensor: (that tensor, selector)."""
        if tensor in self._blocks:
            return self._blocks[tensor]
        node = self.producer(tensor)
        if node is None:
            return None
        index = list(node.output).index(tensor) if tensor in node.output else 0
        try:
            if node.type == "Split":
                if not self._is_last_axis(node.input[1], evaluate(self.graph, node.input[0])):
                    return None
                parts = node.get_attr_value("num_split")
                return self.resolve(node.input[1]), lambda a: np.split(a, parts, axis=-1)[index]
            if node.type == "SplitV":
                if not self._is_last_axis(node.input[0], evaluate(self.graph, node.input[2])):
                    return None
                cuts = np.cumsum(evaluate(self.graph, node.input[1]).tolist())[:-1]
                return self.resolve(node.input[0]), lambda a: np.split(a, cuts, axis=-1)[index]
            if node.type == "StridedSlice":
                return self._strided_columns(node)
        except NotEvaluable:
            return None
        return None

    def _is_last_axis(self, tensor: str, axis) -> bool:
        """Whether ``axis`` is ``tensor``'s last axis (2-D when its rank is unknown)."""
        rank = len(self.graph.get_shape(tensor) or [None, None])
        return int(axis) in (-1, rank - 1)

    def _strided_columns(self, node):
        """A StridedSlice that takes every row (all axes but the last whole) and a range of columns."""
        begin, end, strides = (evaluate(self.graph, t).tolist() for t in node.input[1:4])
        rank = len(self.graph.get_shape(node.input[0]) or [None, None])
        if len(begin) != rank or any(node.get_attr_value(m, 0) for m in
                                     ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask")):
            return None
        begin_mask = node.get_attr_value("begin_mask", 0)
        end_mask = node.get_attr_value("end_mask", 0)
        last = rank - 1
        rows_whole = all((begin_mask >> axis & 1 or begin[axis] == 0) and end_mask >> axis & 1 and strides[axis] == 1
                         for axis in range(last))
        if not rows_whole:
            return None
        start = None if begin_mask >> last & 1 else int(begin[last])
        stop = None if end_mask >> last & 1 else int(end[last])
        step = int(strides[last])
        return self.resolve(node.input[0]), lambda a: a[..., start:stop:step]


@dataclass(frozen=True)
class Term:
    """One addend of a pre-activation, as :meth:`BodyView.terms` reads it.

    A product ``operand @ weight`` (``operand`` is the varying factor), a constant ``weight``
    (``operand`` None), or a leaf that is neither (``weight`` None; GRU's reset product), which
    the caller reads further from ``tensor``.
    """

    tensor: str
    operand: Optional[str]
    weight: Optional[WeightSource]


@dataclass(frozen=True)
class _ProductForm:
    """Attribute names of one op form of "x times a weight"."""

    transpose_a: str
    transpose_b: str
    scaled: bool  # alpha, beta and an added C (Gemm)


_PRODUCT_OPS = {
    "MatMul": _ProductForm("transpose_a", "transpose_b", scaled=False),
    "Gemm": _ProductForm("transA", "transB", scaled=True),
}
_FACTOR, _WEIGHT, _ADDEND = 0, 1, 2  # input positions of MatMul (A, B) and Gemm (A, B, C)
def _scale(factor: float) -> tuple:
    """A weight transform multiplying by ``factor`` (none for 1)."""
    return () if factor == 1.0 else (lambda a: a * np.asarray(factor, a.dtype),)


def _transformed(source: WeightSource, transform: tuple) -> WeightSource:
    """``source`` with ``transform``'s steps applied, innermost (last) first."""
    def value(values):
        array = np.asarray(source(values))
        for step in reversed(transform):
            array = step(array)
        return array

    return value


def _bias_row(source: WeightSource, where: str) -> WeightSource:
    """A constant addend as one row: tf2onnx may have folded a bias into a ``[1, N]`` or
    ``[B, N]`` tensor (a fixed batch broadcast); its rows must then be equal."""
    def value(values):
        array = np.asarray(source(values))
        if array.ndim < 2:
            return array
        rows = array.reshape(-1, array.shape[-1])
        require(bool(np.all(rows == rows[:1])), "a constant gate term differs between batch rows", where)
        return rows[0]

    return value


def _transposed(source: WeightSource) -> WeightSource:
    return lambda values: np.asarray(source(values)).T


def _columns(shape) -> Optional[int]:
    """The known size of a shape's last axis, else None."""
    return int(shape[-1]) if shape and shape[-1] is not None and shape[-1] >= 0 else None


def _row_block(weight: WeightSource, parts: list, index: int) -> WeightSource:
    """The rows of ``weight`` that multiply part ``index`` of a factor joined from ``parts`` ((operand,
    column count or None) each; the unknown count is the rest of the weight's rows)."""
    if len(parts) == 1:
        return weight

    def value(values):
        array = np.asarray(weight(values))
        counts = [count for _, count in parts]
        if None in counts:
            counts[counts.index(None)] = array.shape[0] - sum(c for c in counts if c is not None)
        start = sum(counts[:index])
        require(counts[index] >= 0 and sum(counts) == array.shape[0],
                "a kernel's rows do not fit the columns of the factor it multiplies")
        return array[start:start + counts[index]]

    return value
