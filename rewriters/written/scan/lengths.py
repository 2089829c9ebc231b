"""Lengths as the graph states them: a scalar integer tensor read as a symbolic dimension.

``value(name)`` is ``("const", n)`` for a constant and ``("dim", tensor, axis)`` for a dimension the
graph reads off a tensor's shape (through casts, reshapes to one element, slices and gathers of a
``Shape``); ``axis(tensor, k)`` names axis ``k`` of a tensor the same way, seen through transposes and
elementwise ops of one operand, so that a trip count computed from a layer's input and the rows of
the time-major sequence it steps through compare equal. None where the graph does not say.
"""
from __future__ import annotations

from typing import Optional

from ..graph import attribute
from ..scope import Scope, TypeTable

_SAME_SHAPE = frozenset({"Identity", "Cast", "Neg", "Abs", "Relu", "Tanh", "Sigmoid", "Exp", "Log", "Not", "Sqrt",
                         "Erf", "Floor", "Ceil", "Round", "Sign", "Reciprocal", "IsNaN", "Softplus", "Elu", "Selu",
                         "LeakyRelu", "HardSigmoid", "ReverseSequence"})
_ONE_ELEMENT = frozenset({"Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})


class Lengths:
    def __init__(self, scope: Scope, types: TypeTable):
        self.scope = scope
        self.types = types

    def value(self, name: str, scope: Optional[Scope] = None):
        scope = scope or self.scope
        name = scope.resolve(name)
        constant = scope.constant(name)
        if constant is not None:
            return ("const", int(constant.reshape(-1)[0])) if constant.size == 1 else None
        while scope is not None and not scope.local(name):
            scope = scope.outer
        if scope is None:
            return None
        node = scope.producer(name)
        if node is None:
            return None
        if node.op_type in _ONE_ELEMENT:
            return self.value(node.input[0], scope)
        if node.op_type in ("Slice", "Gather"):
            return self._shape_entry(node, scope)
        if node.op_type == "Min" and len(node.input) == 2:
            return self._bounded(node, scope)
        return None

    def _bounded(self, node, scope: Scope):
        """``Min(n, Max(k, n))`` is ``n`` (TF 1.x's ``dynamic_rnn`` bounds its loop so): the Max is never
        below ``n``."""
        for first, second in (node.input, reversed(node.input)):
            length = self.value(first, scope)
            other = scope.producer(scope.resolve(second))
            if length is not None and other is not None and other.op_type == "Max" and \
                    any(self.value(name, scope) == length for name in other.input):
                return length
        return None

    def _shape_entry(self, node, scope: Scope):
        """The dimension a Slice of one element (or a Gather of one index) of a ``Shape`` reads."""
        source = scope.producer(scope.resolve(node.input[0]))
        while source is not None and source.op_type == "Cast":
            source = scope.producer(scope.resolve(source.input[0]))
        if source is None or source.op_type != "Shape":
            return None
        if node.op_type == "Gather":
            index = scope.scalar(node.input[1])
        else:
            starts, ends = scope.constant(node.input[1]), scope.constant(node.input[2])
            axes = scope.constant(node.input[3]) if len(node.input) > 3 and node.input[3] else None
            steps = scope.constant(node.input[4]) if len(node.input) > 4 and node.input[4] else None
            if starts is None or ends is None or starts.size != 1 or (axes is not None and int(axes.reshape(-1)[0]))\
                    or (steps is not None and int(steps.reshape(-1)[0]) != 1):
                return None
            index = int(starts.reshape(-1)[0])
            if int(ends.reshape(-1)[0]) != index + 1 or index < 0:
                return None
        if not isinstance(index, int) or index < 0:
            return None
        index += attribute(source, "start", 0) or 0
        return self.axis(source.input[0], index, scope)

    def axis(self, tensor: str, k: int, scope: Optional[Scope] = None):
        """Axis ``k`` of ``tensor``, by a canonical name."""
        scope = scope or self.scope
        shape = self.types.shape(tensor)
        if shape is not None and k < len(shape) and shape[k]:
            return ("const", shape[k])
        while scope is not None and not scope.local(tensor):
            scope = scope.outer
        node = scope.producer(tensor) if scope is not None else None
        if node is not None and node.op_type == "Transpose":
            perm = attribute(node, "perm")
            if perm is not None and k < len(perm):
                return self.axis(node.input[0], perm[k], scope)
        if node is not None and node.op_type in _SAME_SHAPE:
            return self.axis(node.input[0], k, scope)
        return ("dim", tensor, k)
