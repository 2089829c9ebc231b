"""The graph toolkit of the passes over the written model: what every pass asks of an ``onnx`` graph.

Who makes a tensor and who reads it (a subgraph's reads of an outer value count as reads by the node that
holds the subgraph), a walk over subgraphs, a node's attributes, constants and their values, shapes, the
opset, and the sweep of what nothing reads. It knows ONNX alone: nothing of recurrent layers or runtimes.
Nodes are built by :class:`.builder.Writer`; a graph with its producers and readers indexed is a
:class:`.scope.Scope`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import onnx
from onnx import helper, numpy_helper

DEFAULT_OPSET = 13  # a model that names no ai.onnx opset (tf2onnx always names one)


def attribute(node: onnx.NodeProto, name: str, default=None):
    """``node``'s attribute ``name`` as a Python value (strings decoded), or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return _decoded(helper.get_attribute_value(a))
    return default


def attributes(node: onnx.NodeProto) -> dict:
    """Every attribute of ``node``: name -> its Python value (strings decoded)."""
    return {a.name: _decoded(helper.get_attribute_value(a)) for a in node.attribute}


def _decoded(value):
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value.decode() if isinstance(value, bytes) else value


def opset_of(model_proto: onnx.ModelProto) -> int:
    """The model's ai.onnx opset."""
    return next((o.version for o in model_proto.opset_import if o.domain in ("", "ai.onnx")), DEFAULT_OPSET)


def slot(names, index: int) -> str:
    """The name at ``index`` of a node's inputs or outputs ("" where absent)."""
    return names[index] if len(names) > index else ""


def subgraphs(node: onnx.NodeProto) -> list:
    """The graphs a node holds (a Loop's or Scan's body, an If's branches)."""
    found = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            found.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            found.extend(a.graphs)
    return found


def nodes_of(graph: onnx.GraphProto) -> Iterable:
    """(graph, node) of every node of ``graph`` and of its subgraphs, each node before its subgraphs' nodes."""
    for node in graph.node:
        yield graph, node
        for sub in subgraphs(node):
            yield from nodes_of(sub)


def reads(node: onnx.NodeProto) -> set:
    """Every tensor ``node`` reads: its inputs and what its subgraphs take from outside themselves."""
    names = {name for name in node.input if name}
    for graph in subgraphs(node):
        names |= outer_reads(graph)
    return names


def outer_reads(graph: onnx.GraphProto) -> set:
    """The tensors ``graph`` reads from the scopes around it."""
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    local |= {out for node in graph.node for out in node.output}
    return {name for node in graph.node for name in reads(node)} - local


def producers_of(graph: onnx.GraphProto) -> dict:
    """name -> the node of ``graph`` (not its subgraphs) that makes it."""
    return {out: node for node in graph.node for out in node.output if out}


def readers_of(main: onnx.GraphProto, graph: Optional[onnx.GraphProto] = None) -> dict:
    """name -> the nodes (of ``main`` and its subgraphs) that read it; a graph output is read by None."""
    readers: dict = {}
    for _, n in nodes_of(main):
        for name in n.input:
            if name:
                readers.setdefault(name, []).append(n)
    for output in list(main.output) + (list(graph.output) if graph is not None else []):
        readers.setdefault(output.name, []).append(None)
    return readers


def names_of(graph: onnx.GraphProto) -> set:
    """Every tensor and node name of ``graph`` and its subgraphs."""
    names = {t.name for t in graph.initializer} | {v.name for v in graph.input} | {v.name for v in graph.output}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for sub in subgraphs(node):
            names |= names_of(sub)
    return names


def constant_values(graph: onnx.GraphProto) -> dict:
    """name -> value of ``graph``'s initializers and Constant nodes."""
    values = {t.name: t for t in graph.initializer}
    values.update({n.output[0]: n.attribute[0].t for n in graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return {name: numpy_helper.to_array(t) for name, t in values.items()}


def static_shapes(model_proto: onnx.ModelProto) -> dict:
    """name -> its dimensions (an int, or None where not static), by ONNX's shape inference (the main graph's)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model_proto, data_prop=True)
    except Exception:  # noqa: BLE001 - without inference, only the declared shapes are known
        inferred = model_proto
    found = {}
    graph = inferred.graph
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.tensor_type.HasField("shape"):
            found[value.name] = [d.dim_value if d.HasField("dim_value") else None
                                 for d in value.type.tensor_type.shape.dim]
    for tensor in graph.initializer:
        found[tensor.name] = list(tensor.dims)
    return found


def set_nodes(graph: onnx.GraphProto, nodes: list) -> None:
    """``graph``'s nodes made ``nodes``, at once: a rewrite built whole before the graph changes."""
    del graph.node[:]
    graph.node.extend(nodes)


def sweep(graph: onnx.GraphProto, nodes: bool = False) -> None:
    """Drop what nothing reads any more: with ``nodes``, the nodes of ``graph`` whose outputs nothing reads
    (until none is left); then the initializers nothing reads (the graph's and its subgraphs' nodes, its
    outputs)."""
    while nodes:
        read = set(readers_of(graph))
        kept = [n for n in graph.node if any(o and o in read for o in n.output)]
        nodes = len(kept) != len(graph.node)
        set_nodes(graph, kept)
    read = {o.name for o in graph.output}
    for sub in [graph] + [g for _, node in nodes_of(graph) for g in subgraphs(node)]:
        read.update(name for node in sub.node for name in node.input)
        read.update(o.name for o in sub.output)
    inputs = {i.name for i in graph.input}
    kept = [t for t in graph.initializer if t.name in read or t.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def upstream(names: Iterable[str], producer: Callable[[str], Optional[onnx.NodeProto]],
             reads_of: Optional[Callable[[onnx.NodeProto], set]] = None) -> tuple:
    """Everything ``names`` are computed from: (the tensors, the nodes by ``id``) met walking producers
    back (a node's reads include what its subgraphs take from outside: ``reads_of``, :func:`reads` by default)."""
    reads_of = reads_of or reads
    tensors, nodes, pending = set(), {}, list(names)
    while pending:
        name = pending.pop()
        if name in tensors:
            continue
        tensors.add(name)
        node = producer(name)
        if node is not None and id(node) not in nodes:
            nodes[id(node)] = node
            pending.extend(reads_of(node))
    return tensors, nodes


def topological(nodes: Iterable[onnx.NodeProto], available: set) -> list:
    """``nodes`` in an order where each comes after those making what it reads (``available``: what
    exists before them); nodes whose reads never become available keep their relative order last."""
    pending, ordered, have = list(nodes), [], set(available)
    made = {out for node in pending for out in node.output}
    progress = True
    while pending and progress:
        progress, rest = False, []
        for node in pending:
            if all(name in have or name not in made for name in reads(node)):
                ordered.append(node)
                have.update(node.output)
                progress = True
            else:
                rest.append(node)
        pending = rest
    return ordered + pending

