"""What a pass over the written model writes into a graph: nodes and constants under names no other tensor has.

A :class:`Writer` collects the nodes and initializers one rewrite makes; the graph changes only when the
rewrite has built all of them (:meth:`Writer.replace`), so a rewrite that fails leaves the graph as it was.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import names_of, set_nodes

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


class Writer:
    """Nodes and constants of one rewrite of ``graph``, named apart from everything the graph holds."""

    def __init__(self, graph: onnx.GraphProto, opset: int, taken: Optional[set] = None):
        self.graph, self.opset = graph, opset
        self.taken = taken if taken is not None else names_of(graph)
        self.nodes: list = []
        self.initializers: list = []
        self._counter = itertools.count()
        self._made: dict = {}  # key -> the name of the constant made for it
        self.placed: list = []
        self.dtype = np.dtype(np.float32)  # the element type of the float constants a rewrite makes

    def float(self, value: float):
        return np.asarray(value, self.dtype)

    def name(self, base: str) -> str:
        name = base
        while name in self.taken:
            name = f"{base}_{next(self._counter)}"
        self.taken.add(name)
        return name

    def const(self, value, base: str, dtype=None, key=None) -> str:
        """A constant of ``value``: made once per ``key`` (small ones once per value), so that the steps of
        a layer share their weights rather than each holding a copy."""
        array = np.asarray(value, dtype=dtype)
        if key is None and array.size <= 16:
            key = ("value", array.dtype.str, array.shape, array.tobytes())
        if key is not None and key in self._made:
            return self._made[key]
        name = self.tensor(array, base)
        if key is not None:
            self._made[key] = name
        return name

    def tensor(self, array: np.ndarray, base: str) -> str:
        """A new constant of ``array`` under a new name from ``base``, every time."""
        name = self.name(base)
        self._hold(np.asarray(array), name)
        return name

    def _hold(self, array: np.ndarray, name: str) -> None:
        """Where a constant made is kept: an initializer of the graph."""
        self.initializers.append(numpy_helper.from_array(array, name))

    def const_like(self, tensor: onnx.TensorProto, base: str) -> str:
        """A copy of ``tensor`` under a new name."""
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name = self.name(base)
        self.initializers.append(copy)
        return copy.name

    def ints(self, values: Iterable[int], base: str = "ints") -> str:
        return self.const(np.array(list(values), np.int64), base)

    def op(self, op_type: str, inputs: list, base: str, outputs: int = 1, output_names=None, **attrs):
        """Add a node; returns its output name (or the list of them with ``outputs`` > 1)."""
        names = list(output_names) if output_names else [self.name(f"{base}_{k}" if outputs > 1 else base)
                                                          for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(f"{base}_{op_type}"), **attrs))
        return names if outputs > 1 else names[0]

    def split(self, x: str, parts: list, axis: int, base: str) -> list:
        """``x`` split along ``axis`` into pieces of the sizes ``parts``."""
        if len(parts) == 1:
            return [x]
        if self.opset >= 13:
            return self.op("Split", [x, self.ints(parts, f"{base}_sizes")], base, len(parts), axis=axis)
        return self.op("Split", [x], base, len(parts), axis=axis, split=list(parts))

    def squeeze(self, x: str, axes: list, base: str, output_names=None) -> str:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes, f"{base}_axes")], base, output_names=output_names)
        return self.op("Squeeze", [x], base, output_names=output_names, axes=list(axes))

    def unsqueeze(self, x: str, axes: list, base: str) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes, f"{base}_axes")], base)
        return self.op("Unsqueeze", [x], base, axes=list(axes))

    def slice(self, x: str, start: int, end: int, axis: int, base: str, step: int = 1) -> str:
        inputs = [x, self.ints([start], f"{base}_starts"), self.ints([end], f"{base}_ends"),
                  self.ints([axis], f"{base}_axes")] + ([self.ints([step], f"{base}_steps")] if step != 1 else [])
        return self.op("Slice", inputs, base)

    def replace(self, old: list) -> None:
        """Put the built nodes where the first of ``old`` stood and remove ``old``; add the constants."""
        nodes = list(self.graph.node)
        keys = {_key(n) for n in old}
        position = next(k for k, n in enumerate(nodes) if _key(n) in keys)
        kept = [n for n in nodes[:position] if _key(n) not in keys] + self.nodes + \
               [n for n in nodes[position:] if _key(n) not in keys]
        set_nodes(self.graph, kept)
        self.graph.initializer.extend(self.initializers)
        self.placed = self.nodes  # what the rewrite put into the graph, for its caller to read
        self.nodes, self.initializers = [], []


def _key(node: onnx.NodeProto) -> tuple:
    return node.op_type, tuple(node.input), tuple(node.output)
