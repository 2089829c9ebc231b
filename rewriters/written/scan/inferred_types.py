"""ONNX shape inference of the model the Scan pass rewrites, kept current loop after loop.

Each loop's rewrite reads the types shape inference finds for the model as it stands then
(:class:`.graph_index.TypeTable`, its own body's among them). Inferring the whole model again for each
loop made the pass's time grow faster than the square of its loops (a stack of 32 Scan-form layers spent
0.9 s CPU there against 0.02 s for 8, measured): the model grows with the loops, and inference of a larger
model costs more than its size. :class:`InferredTypes` infers the whole model once; then, before each
loop, it infers what the pass changed since (:meth:`.live_graph.LiveScope.changes`: the nodes added or
changed, and the readers of a tensor no node makes any more) as a model of its own, whose inputs are the
tensors those nodes read, typed as inference last typed them; where a type changes, the nodes reading that
tensor are inferred the same way, until none changes. Inference types a node from its inputs' types, the
values of the constants it reads and what is declared of its outputs, so a node none of these changed for
keeps its types. Types are compared without the names of symbolic dimensions: inference names the symbols
it makes by counting over the model it is given, and a size, known or not, and a rank, the only things the
table is read for, never come from such a name.

The whole model is inferred instead where it cannot be in parts (a node reads a tensor made after it; a tensor
two nodes make; the part's inference fails), and where the whole model's inference fails, each table is the
one :class:`~.graph_index.TypeTable` makes of the model, as before.
"""
from __future__ import annotations

import itertools
from typing import Optional

import onnx
from onnx import helper

from ..graph import attribute, subgraphs
from ..scope import TypeTable
from .live_graph import LiveScope


class InferredTypes:
    """The types inference finds for ``model``, whose graph is changed through ``scope`` only."""

    def __init__(self, model: onnx.ModelProto, scope: LiveScope):
        self.model = model
        self.scope = scope
        self.failed = False  # the whole model's inference fails: each table infers the whole model
        self._types: dict = {}  # a tensor the graph makes -> its type as inferred (any kind of type)
        self._tensors: dict = {}  # those of them that are tensor types
        self._held: dict = {}  # id(node) -> (node, the node as inference leaves it), for nodes holding subgraphs
        self._io: Optional[tuple] = None  # the declared inputs and outputs as last inferred
        self._initializers: dict = {}  # initializer -> its type

    def table(self, node: onnx.NodeProto) -> TypeTable:
        """``TypeTable(model, within=node.name)`` of the model as it stands (its scope read again first)."""
        self.scope.refresh()
        rebuilt, touched, unmade = self.scope.changes()
        if not self.failed and (rebuilt or self._io is None or self.scope.duplicated
                                or not self._infer_changes(touched, unmade)):
            self._infer_whole()
        types = None if self.failed else self._assembled(node.name)
        if types is None and not self.failed:  # a node of that name not inferred as it stands
            self._infer_whole()
            types = None if self.failed else self._assembled(node.name)
        return TypeTable(self.model, within=node.name) if types is None else TypeTable.of(types)

    # -- inference ---------------------------------------------------------------------------------
    def _infer_whole(self) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model)
        except Exception:  # noqa: BLE001 - as TypeTable: inference is a help, not a need
            inferred = None
        nodes = list(self.model.graph.node)
        if inferred is None or len(inferred.graph.node) != len(nodes):
            self.failed = True
            return
        self._types, self._tensors = {}, {}
        for value in itertools.chain(inferred.graph.output, inferred.graph.value_info):
            self._typed(value.name, value.type)
        self._held = {id(node): (node, found) for node, found in zip(nodes, inferred.graph.node)
                      if node.attribute and subgraphs(node)}
        self._io = self._declared()
        self._initializers = {name: _tensor_type(tensor) for name, tensor in self.scope.initializers.items()}

    def _typed(self, name: str, found: Optional[onnx.TypeProto]) -> None:
        """``name``'s inferred type ``found`` (None: none)."""
        if found is None:
            self._types.pop(name, None)
            self._tensors.pop(name, None)
            return
        self._types[name] = found
        if found.HasField("tensor_type"):
            self._tensors[name] = found
        else:
            self._tensors.pop(name, None)

    def _declared(self) -> tuple:
        graph = self.model.graph
        return ({value.name: value.SerializeToString() for value in graph.input},
                {value.name: value.SerializeToString() for value in graph.output})

    def _infer_changes(self, touched: list, unmade: set) -> bool:
        """Infer the nodes changed, and in turn those whose inputs' types changed; False where this cannot be
        done in parts. ``unmade``: the tensors no node makes any more, and the initializers added or removed."""
        scope, graph = self.scope, self.model.graph
        before, self._io = self._io, self._declared()
        changed = set(unmade)
        for was, now in zip(before, self._io):
            changed |= {name for name in set(was) | set(now) if was.get(name) != now.get(name)}
        for name in changed:
            if name in scope.initializers:
                self._initializers[name] = _tensor_type(scope.initializers[name])
            else:
                self._initializers.pop(name, None)
            if name not in scope.producers:
                self._typed(name, None)
        outputs = {value.name for value in graph.output}
        pending = {id(node): node for node in touched if scope.holds(node)}
        for name in changed:
            pending.update((id(node), node) for node in scope.readers.get(name, ()))
            if name in outputs and name in scope.producers:  # its declaration changed: its producer again
                pending[id(scope.producers[name])] = scope.producers[name]
        while pending:
            changed = self._infer_part(pending)
            if changed is None:
                return False
            pending = {id(node): node for name in changed for node in scope.readers.get(name, ())}
        return True

    def _infer_part(self, part: dict) -> Optional[set]:
        """Infer the nodes of ``part`` (by id) as a model of their own; the tensors whose types changed, or None
        where the part cannot be inferred so."""
        built = self._part_model(part)
        if built is None:
            return None
        sub, nodes = built
        try:
            inferred = onnx.shape_inference.infer_shapes(sub)
        except Exception:  # noqa: BLE001 - the whole model is inferred instead
            return None
        if len(inferred.graph.node) != len(nodes):
            return None
        found = {value.name: value.type for value in itertools.chain(inferred.graph.output, inferred.graph.value_info)}
        changed = set()
        for node, result in zip(nodes, inferred.graph.node):
            if id(node) not in part:
                continue  # a constant read from outside the part
            if node.attribute and subgraphs(node):
                self._held[id(node)] = (node, result)
            for out in filter(None, node.output):
                if _plain(found.get(out)) != _plain(self._types.get(out)):
                    changed.add(out)
                self._typed(out, found.get(out))
        return changed

    def _part_model(self, part: dict) -> Optional[tuple]:
        """(a model of the nodes of ``part`` (by id): the tensors they read typed as inferred, the constants and
        initializers they read, the graph's outputs and value infos among what they make; its nodes), or None
        where they cannot be inferred apart from the graph. A tensor they read that inference left untyped is
        read from its producer, added to ``part``."""
        scope, graph, model = self.scope, self.model.graph, self.model
        declared = {value.name: value for value in graph.input}
        while True:
            nodes = sorted(part.values(), key=scope.key)
            made = {out for node in nodes for out in node.output if out}
            first_read: dict = {}
            for node in nodes:
                for name in scope.reads_of(node):
                    if name not in made and name not in first_read:
                        first_read[name] = scope.key(node)
            inputs, initializers, constants, more = [], [], {}, {}
            for name, key in first_read.items():
                producer = scope.producers.get(name)
                if name in declared or name in scope.initializers or producer is None:
                    inputs += [declared[name]] if name in declared else []
                    initializers += [scope.initializers[name]] if name in scope.initializers else []
                elif scope.key(producer) > key:
                    return None  # read before it is made: inference sees no type for it there
                elif producer.op_type == "Constant":
                    constants[id(producer)] = producer
                elif name in self._types:
                    inputs.append(helper.make_value_info(name, self._types[name]))
                else:
                    more[id(producer)] = producer
            if not more:
                break
            part.update(more)
        nodes = sorted(list(constants.values()) + nodes, key=scope.key)
        sub = onnx.ModelProto(ir_version=model.ir_version)
        sub.opset_import.extend(model.opset_import)
        sub.functions.extend(model.functions)
        sub.graph.name = graph.name
        sub.graph.node.extend(nodes)
        sub.graph.input.extend(inputs)
        sub.graph.initializer.extend(initializers)
        sub.graph.output.extend(value for value in graph.output if value.name in made)
        sub.graph.value_info.extend(value for value in graph.value_info if value.name in made)
        return sub, nodes

    # -- the table ----------------------------------------------------------------------------------
    def _assembled(self, within: str) -> Optional[dict]:
        """What ``TypeTable(model, within)`` holds: the declared types (inputs, outputs and value infos, the
        initializers', the constants', ``within``'s subgraphs' in the graph's order), then the inferred ones
        (the graph's, then the same in the same order, ``within``'s subgraphs as inferred)."""
        graph = self.model.graph
        declared = _tensors((value.name, value.type) for value in itertools.chain(graph.input, graph.output,
                                                                                  graph.value_info))
        inferred = _tensors(itertools.chain(((value.name, value.type) for value in graph.input),
                                            ((value.name, self._types.get(value.name, value.type))
                                             for value in graph.output)))
        inferred.update(self._tensors)
        first, second = [declared, self._initializers], [inferred, self._initializers]
        for node in graph.node:
            if node.op_type == "Constant":
                value = attribute(node, "value")
                if value is not None:
                    constant = {node.output[0]: helper.make_tensor_type_proto(value.data_type, list(value.dims))}
                    first.append(constant)
                    second.append(constant)
            if node.name == within:
                held = self._held.get(id(node), (None, None)) if node.attribute and subgraphs(node) else (node, node)
                if held[0] is not node:
                    return None
                first.append(TypeTable.collected(subgraphs(node)))
                second.append(TypeTable.collected(subgraphs(held[1])))
        types: dict = {}
        for part in first + second:
            types.update(part)
        return types


def _tensor_type(tensor: onnx.TensorProto) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))


def _tensors(pairs) -> dict:
    """(name, type) pairs in order as a table takes them: a later tensor type in place of an earlier one."""
    return {name: found for name, found in pairs if found.HasField("tensor_type")}


def _plain(found: Optional[onnx.TypeProto]) -> Optional[bytes]:
    """A type without the names of its symbolic dimensions, for comparing."""
    if found is None:
        return None
    copy = onnx.TypeProto()
    copy.CopyFrom(found)
    _unnamed(copy)
    return copy.SerializeToString()


def _unnamed(found: onnx.TypeProto) -> None:
    kind = found.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        for dim in getattr(found, kind).shape.dim:
            dim.ClearField("dim_param")
    elif kind in ("sequence_type", "optional_type"):
        _unnamed(getattr(found, kind).elem_type)
    elif kind == "map_type":
        _unnamed(found.map_type.value_type)
