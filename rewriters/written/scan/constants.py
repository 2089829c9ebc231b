"""The constants one Scan rewrite sees and makes, in one place.

A rewrite reads constants (the scope's initializers and Constant nodes, and the loop body's own
initializers it moves outside) and makes new ones: hoisting's rules, the regrouped products' blocks, the
merged siblings' weights, folded nodes' values, the layout trials' axes. Each is readable back as soon as
it is made, typed where it is made under a fresh name, and listed in the order made; :meth:`Constants.drop_unread`
forgets those no node reads (a layout trial that lost), so they are never written.
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..builder import Writer
from ..graph import reads
from ..scope import Scope, TypeTable, fresh


class Constants(Writer):
    """``scope``'s constants, then ``tensors`` (the rewrite's initializers, appended to as constants are
    made: the list the Scan's graph is given). The rewrite's own :class:`.builder.Writer`, its names fresh
    (:func:`.scope.fresh`) rather than checked against the graph's, and what it makes typed as it is made."""

    def __init__(self, scope: Scope, types: TypeTable, tensors: list):
        super().__init__(scope.graph, 0, taken=set())
        self.scope = scope
        self.types = types
        self.initializers = self.tensors = tensors
        self._values = {tensor.name: tensor for tensor in tensors}

    def name(self, base: str) -> str:
        return fresh(base)

    def value(self, name: str) -> Optional[np.ndarray]:
        """The value of a constant (None: not a constant here)."""
        tensor = self._values.get(name)
        return numpy_helper.to_array(tensor) if tensor is not None else self.scope.constant(name)

    def const(self, array: np.ndarray, base: str) -> str:
        """A new constant of ``array`` under a fresh name from ``base``, typed."""
        return self.tensor(array, base)

    def _hold(self, array: np.ndarray, name: str) -> None:
        tensor = numpy_helper.from_array(array, name)
        self._add(tensor)
        self.types.types[tensor.name] = helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))

    def named(self, name: str, array: np.ndarray) -> None:
        """``array`` as the value of ``name``, a node's output folded (its type is the node's)."""
        self._add(numpy_helper.from_array(array, name))

    def _add(self, tensor: onnx.TensorProto) -> None:
        self.tensors.append(tensor)
        self._values[tensor.name] = tensor

    def drop_unread(self, nodes: Iterable[onnx.NodeProto]) -> None:
        """Forget the constants here that none of ``nodes`` (their subgraphs included) reads."""
        read = {name for node in nodes for name in reads(node)}
        kept = [tensor for tensor in self.tensors if tensor.name in read]
        del self.tensors[:]
        self.tensors.extend(kept)
        self._values = {tensor.name: tensor for tensor in kept}
