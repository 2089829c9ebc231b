"""The toolkit's indexed graph: a :class:`Scope` (one graph and the scopes around it: producers, readers,
constants, changed through it), a :class:`TypeTable` (element types and shapes), and fresh names.

It reads ``onnx`` protos as tf2onnx wrote them (after its optimizers), so it holds only ONNX
semantics: a subgraph's reads of an outer value count as reads by the node that holds the subgraph.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import attribute, producers_of, reads, subgraphs

_COUNTER = itertools.count()


def fresh(base: str) -> str:
    """A name no converted graph holds: ``base`` and a suffix of this module's own."""
    return f"{base}__scan{next(_COUNTER)}"


class TypeTable:
    """Element types and shapes of a model's tensors, as ONNX shape inference finds them (tf2onnx's own
    value infos where inference finds nothing): the main graph's, and those of the subgraphs of the node
    named ``within`` (all subgraphs when None). Loop bodies name their tensors alike (tf_keras's bodies
    all have a ``while_placeholder_2:0``, one layer's h of 2 units, the next one's of 1): a table over
    every body would give one loop another's shapes."""

    def __init__(self, model: onnx.ModelProto, within: Optional[str] = None):
        self.types: dict = {}
        self._collect(model.graph, within)
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - inference is a help, not a need: ranks stay unknown
            inferred = None
        if inferred is not None:
            self._collect(inferred.graph, within)

    @classmethod
    def of(cls, types: dict) -> "TypeTable":
        """A table of ``types`` (tensor -> ``TypeProto``) as they are."""
        table = cls.__new__(cls)
        table.types = types
        return table

    @classmethod
    def collected(cls, graphs: Iterable[onnx.GraphProto]) -> dict:
        """The types ``graphs`` declare, theirs and their subgraphs' (as a table over a node's subgraphs holds them)."""
        table = cls.of({})
        for graph in graphs:
            table._collect(graph)
        return table.types

    def _collect(self, graph: onnx.GraphProto, within: Optional[str] = None) -> None:
        for value in itertools.chain(graph.input, graph.output, graph.value_info):
            if value.type.HasField("tensor_type"):
                self.types[value.name] = value.type
        for tensor in graph.initializer:
            self.types[tensor.name] = helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))
        for node in graph.node:
            if node.op_type == "Constant":
                value = attribute(node, "value")
                if value is not None:
                    self.types[node.output[0]] = helper.make_tensor_type_proto(value.data_type, list(value.dims))
            if within is None or node.name == within:
                for sub in subgraphs(node):
                    self._collect(sub)

    def elem_type(self, name: str) -> int:
        found = self.types.get(name)
        return found.tensor_type.elem_type if found is not None else onnx.TensorProto.UNDEFINED

    def shape(self, name: str) -> Optional[list]:
        """Dims (an int, or None where unknown), or None when the rank is unknown."""
        found = self.types.get(name)
        if found is None or not found.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else None for d in found.tensor_type.shape.dim]

    def rank(self, name: str) -> Optional[int]:
        shape = self.shape(name)
        return None if shape is None else len(shape)


class Scope:
    """One graph and the scopes around it: producers, readers and constants of the tensors it sees.

    The graph is changed through its scope (:meth:`replace`, :meth:`remove`, :meth:`append`, :meth:`reread`
    after a node is changed in place, and the initializers' edits); the index reads the graph again at
    :meth:`refresh` (the main graph's, :class:`.live_graph.LiveScope`, enters only what changed)."""

    def __init__(self, graph: onnx.GraphProto, outer: Optional["Scope"] = None):
        self.graph = graph
        self.outer = outer
        self.aliases: dict = {}  # a body input -> the outer tensor it always holds (a loop's invariant)
        self.refresh()

    def refresh(self) -> None:
        self.producers = producers_of(self.graph)
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.inputs = {i.name for i in self.graph.input}
        self.readers: dict = {}
        for node in self.graph.node:
            for name in self.reads_of(node):
                self.readers.setdefault(name, []).append(node)
        self.graph_outputs = {o.name for o in self.graph.output}

    def reads_of(self, node: onnx.NodeProto) -> set:
        """What ``node`` of this graph reads (:func:`reads`)."""
        return reads(node) if node.attribute and subgraphs(node) else {name for name in node.input if name}

    def replace(self, node: onnx.NodeProto, replacement: list) -> list:
        """``replacement`` in ``node``'s place, in place: the graph's other nodes stay the same objects. Returns
        the nodes as the graph holds them (copies of ``replacement``'s)."""
        position = self._position(node)
        del self.graph.node[position]
        for offset, new in enumerate(replacement):
            self.graph.node.insert(position + offset, new)
        return [self.graph.node[position + offset] for offset in range(len(replacement))]

    def _position(self, node: onnx.NodeProto) -> int:
        return next(i for i, n in enumerate(self.graph.node) if n.name == node.name and n.op_type == node.op_type)

    def remove(self, nodes: list) -> None:
        """Remove ``nodes`` (the graph's own) from the graph, in place: the others stay the same objects."""
        gone = {id(node) for node in nodes}
        for position in reversed([i for i, n in enumerate(list(self.graph.node)) if id(n) in gone]):
            del self.graph.node[position]

    def append(self, nodes: list) -> list:
        """``nodes`` after the graph's; returns them as the graph holds them."""
        self.graph.node.extend(nodes)
        return list(self.graph.node[len(self.graph.node) - len(nodes):])

    def reread(self, node: onnx.NodeProto) -> None:
        """``node`` (of this graph) was changed in place: its inputs, or what its subgraphs read."""

    def add_initializers(self, tensors: list) -> list:
        """``tensors`` after the graph's initializers; returns them as the graph holds them."""
        self.graph.initializer.extend(tensors)
        return list(self.graph.initializer[len(self.graph.initializer) - len(tensors):])

    def drop_initializers(self, names: set) -> None:
        """Remove the initializers named in ``names``, in place: the others stay the same objects."""
        for position in reversed([i for i, t in enumerate(self.graph.initializer) if t.name in names]):
            del self.graph.initializer[position]

    def local(self, name: str) -> bool:
        """Whether ``name`` is made in this graph (an input, an initializer or a node's output)."""
        return name in self.producers or name in self.initializers or name in self.inputs

    def producer(self, name: str) -> Optional[onnx.NodeProto]:
        return self.producers.get(name)

    def resolve(self, name: str) -> str:
        """``name`` seen through Identity nodes of this graph (and an invariant input, as the outer tensor)."""
        seen = set()
        while name in self.producers and self.producers[name].op_type == "Identity" and name not in seen:
            seen.add(name)
            name = self.producers[name].input[0]
        return self.aliases.get(name, name)

    def constant(self, name: str) -> Optional[np.ndarray]:
        """The value of a constant tensor (an initializer or a Constant node, here or in an outer scope)."""
        name = self.aliases.get(name, name)
        scope = self
        while scope is not None:
            if name in scope.initializers:
                return numpy_helper.to_array(scope.initializers[name])
            node = scope.producers.get(name)
            if node is not None:
                if node.op_type == "Constant" and attribute(node, "value") is not None:
                    return numpy_helper.to_array(attribute(node, "value"))
                if node.op_type == "Identity":
                    return scope.constant(node.input[0])
                return None
            if name in scope.inputs:
                return None
            scope = scope.outer
        return None

    def scalar(self, name: str):
        value = self.constant(name)
        return value.reshape(-1)[0].item() if value is not None and value.size == 1 else None

    def used(self, name: str) -> bool:
        return bool(self.readers.get(name)) or name in self.graph_outputs
