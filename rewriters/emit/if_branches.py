"""A written model's ``If`` nodes made lean: each branch computes what only it reads.

A masked layer decides at run time whether its mask needs compaction (:class:`.mask_tensors.AtRunTime`):
an ``If`` whose lean branch reads the node's input or output as it is. tf2onnx's optimizers leave
around it what only one branch reads (the input's transpose to time-major, shapes), and Keras's graph
moves the If's output to batch-major order after it. On the written ModelProto, after those
optimizers:

- a ``Transpose`` that alone reads an ``If``'s output is moved into both branches (the heavy branch's
  row gather then takes it: :mod:`.transposed_gathers`);
- a node of the main graph whose outputs only one ``If``'s branches read is moved into the branches
  that read it, so that the other never pays for it (not a recurrent node: onnxruntime prepacks
  weights in the main graph only);
- an ``Identity`` of a tensor made in a branch is bypassed (it copies): its readers read the tensor,
  and a branch output it gave is written by the tensor's producer.

Each change keeps the model's outputs bit for bit: nodes only move to where their readers are (and a
mask's int64 flags are cast from its 0/1 uint8s, not through a bool).
"""
from __future__ import annotations

import logging
from collections import defaultdict

import onnx
from onnx import helper

from .transposed_gathers import fold_graph

logger = logging.getLogger(__name__)
_BRANCHES = ("then_branch", "else_branch")
# never moved into a branch: onnxruntime prepacks a recurrent node's weights in the main graph only (an
# LSTM inside an If ran 8% slower, measured), and a node with subgraphs of its own stays as written
_STAYS = {"LSTM", "GRU", "RNN", "If", "Loop", "Scan"}


def lean_branches(model_proto: onnx.ModelProto) -> int:
    """Apply the moves above to the main graph's ``If`` nodes; returns how many nodes moved. The model
    changes only once every move is made (on a copy of its nodes; its weights are not copied)."""
    if not any(node.op_type == "If" for node in model_proto.graph.node):
        return 0
    try:
        return _lean_copy(model_proto)
    except Exception as error:  # noqa: BLE001 - the model stays as written, exact
        logger.warning("the mask's If nodes stay as written: internal error: %s: %s", type(error).__name__, error,
                       exc_info=True)
        return 0


def _lean_copy(model_proto: onnx.ModelProto) -> int:
    """:func:`lean_branches` on a copy of the nodes, written back once every move is made."""
    graph = onnx.GraphProto()
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(model_proto.graph, field))
    graph.initializer.extend(onnx.TensorProto(name=t.name) for t in model_proto.graph.initializer)
    moved = _flags_from_uint8(graph) + _no_op_casts(graph) + _lean(graph)
    kept = {name for node in graph.node for name in node.output} | {v.name for v in graph.input}
    stale = [value for value in graph.value_info if value.name not in kept]
    for value in stale:
        graph.value_info.remove(value)
    for field in ("node", "value_info"):
        target = getattr(model_proto.graph, field)
        del target[:]
        target.extend(getattr(graph, field))
    return moved


def _flags_from_uint8(graph: onnx.GraphProto) -> int:
    """``Cast(Cast(r, bool), int64)`` where ``r = ReduceMax(Cast(b, uint8))`` (tf2onnx's ``Any`` as
    ``bool_masks`` writes it: 0/1 values) -> ``Cast(r, int64)``: the same values, one Cast fewer, and
    no Cast chain that onnxruntime's optimizer would try to merge and warn about when an If's branch
    reads the first Cast. Returns how many."""
    producer = {name: node for node in graph.node for name in node.output}

    def to(node) -> int:
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "to"), None)

    rewritten = 0
    for node in graph.node:
        squash = producer.get(node.input[0]) if node.op_type == "Cast" and to(node) == onnx.TensorProto.INT64 else None
        reduced = producer.get(squash.input[0]) if squash is not None and squash.op_type == "Cast" and \
            to(squash) == onnx.TensorProto.BOOL else None
        flags = producer.get(reduced.input[0]) if reduced is not None and reduced.op_type == "ReduceMax" else None
        if flags is not None and flags.op_type == "Cast" and to(flags) == onnx.TensorProto.UINT8:
            node.input[0] = reduced.output[0]
            rewritten += 1
    return rewritten


def _no_op_casts(graph: onnx.GraphProto) -> int:
    """A Cast of a graph input to the type it has, read inside an If's branch: its readers read the
    input (onnxruntime removes such a Cast itself, and warns that it cannot where a branch reads it)."""
    types = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    outputs = {value.name for value in graph.output}
    renamed = {}
    for node in list(graph.node):
        to = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and types.get(node.input[0]) == to and node.output[0] not in outputs:
            renamed[node.output[0]] = node.input[0]
            graph.node.remove(node)
    if renamed:
        _rename_reads(graph, renamed)
    return len(renamed)


def _rename_reads(graph: onnx.GraphProto, renamed: dict) -> None:
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in renamed:
                node.input[position] = renamed[name]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_reads(attribute.g, renamed)


def _lean(graph: onnx.GraphProto) -> int:
    """The moves on ``graph``, then within each branch of its ``If`` nodes (an If nested in a branch too)."""
    moved = _transposes_into_branches(graph)
    moved += _sink_into_branches(graph)
    for node in graph.node:
        if node.op_type == "If":
            for branch in _branch_graphs(node).values():
                moved += _lean(branch)
                _outputs_without_identity(branch)
                fold_graph(branch)
    return moved


def _branch_graphs(node: onnx.NodeProto) -> dict:
    return {attribute.name: attribute.g for attribute in node.attribute if attribute.name in _BRANCHES}


def _names_read(graph: onnx.GraphProto) -> set:
    """Every name ``graph``'s nodes read, those read inside their subgraphs from outside them included."""
    read, made = set(), set()
    for node in graph.node:
        read.update(name for name in node.input if name)
        made.update(node.output)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                read |= _names_read(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    read |= _names_read(sub)
    return read - made - {value.name for value in graph.input} - {t.name for t in graph.initializer}


def _readers(graph: onnx.GraphProto) -> dict:
    """name -> the nodes of ``graph`` that read it, directly or inside their subgraphs."""
    readers = defaultdict(list)
    for node in graph.node:
        names = {name for name in node.input if name}
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                names |= _names_read(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    names |= _names_read(sub)
        for name in names:
            readers[name].append(node)
    return readers


def _transposes_into_branches(graph: onnx.GraphProto) -> int:
    """Each ``Transpose`` that alone reads an ``If`` output (not a graph output) moves into the branches."""
    producer = {name: node for node in graph.node for name in node.output}
    readers = _readers(graph)
    outputs = {value.name for value in graph.output}
    moved = []
    for node in graph.node:
        source = producer.get(node.input[0]) if node.op_type == "Transpose" and node.input else None
        if source is None or source.op_type != "If" or node.input[0] in outputs \
                or [id(reader) for reader in readers[node.input[0]]] != [id(node)]:
            continue
        position = list(source.output).index(node.input[0])
        for branch in _branch_graphs(source).values():
            inner = branch.output[position].name
            transposed = node.output[0] + "_" + branch.name
            inside = helper.make_node("Transpose", [inner], [transposed], name=node.name + "_" + branch.name)
            inside.attribute.extend(node.attribute)
            branch.node.append(inside)
            value = helper.make_empty_tensor_value_info(transposed)
            value.type.CopyFrom(branch.output[position].type)
            value.type.tensor_type.ClearField("shape")
            branch.output[position].CopyFrom(value)
        source.output[position] = node.output[0]
        moved.append(node)
    for node in moved:
        graph.node.remove(node)
    return len(moved)


def _sink_into_branches(graph: onnx.GraphProto) -> int:
    """Nodes whose outputs only the branches of one ``If`` read move into those branches (a chain of
    them together, in the main graph's order)."""
    outputs = {value.name for value in graph.output}
    ifs = [node for node in graph.node if node.op_type == "If"]
    main_reads = defaultdict(int)  # name -> how many main-graph nodes read it
    branch_reads = defaultdict(set)  # name -> the (id of an If, branch name) that read it
    for node in graph.node:
        if node.op_type == "If":
            for branch_name, branch in _branch_graphs(node).items():
                for name in _names_read(branch):
                    branch_reads[name].add((id(node), branch_name))
            main_reads[node.input[0]] += 1
            continue
        for name in _names_read_by(node):
            main_reads[name] += 1
    by_id = {id(node): node for node in ifs}
    sunk = defaultdict(list)  # (id of an If, branch name) -> nodes, latest first
    for node in reversed(list(graph.node)):
        if node.op_type in _STAYS or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                         for a in node.attribute):
            continue
        places = set().union(*(branch_reads[name] for name in node.output)) if node.output else set()
        if not places or any(main_reads[name] or name in outputs for name in node.output) \
                or len({place[0] for place in places}) != 1:
            continue
        for name in _names_read_by(node):
            main_reads[name] -= 1
            branch_reads[name] |= places
        for place in places:
            sunk[place].append(node)
    moved = {id(node) for nodes in sunk.values() for node in nodes}
    if not moved:
        return 0
    for (if_id, branch_name), nodes in sunk.items():
        branch = _branch_graphs(by_id[if_id])[branch_name]
        copies = []
        for node in reversed(nodes):  # the main graph's order
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copies.append(copy)
        existing = list(branch.node)
        del branch.node[:]
        branch.node.extend(copies + existing)
    kept = [node for node in graph.node if id(node) not in moved]
    del graph.node[:]
    graph.node.extend(kept)
    return len(moved)


def _names_read_by(node: onnx.NodeProto) -> set:
    return {name for name in node.input if name}


def _outputs_without_identity(branch: onnx.GraphProto) -> None:
    """An ``Identity`` of a tensor made in the branch copies it: its readers read the tensor itself, and
    a branch output it gives is written by the tensor's producer (when nothing else reads the tensor)."""
    outputs = {value.name for value in branch.output}
    for identity in [node for node in branch.node if node.op_type == "Identity"]:
        producer = {name: node for node in branch.node for name in node.output}
        readers = _readers(branch)
        source = producer.get(identity.input[0])
        if source is None or identity.input[0] in outputs:
            continue
        if identity.output[0] in outputs:
            if len(readers[identity.input[0]]) != 1:
                continue
            position = list(source.output).index(identity.input[0])
            source.output[position] = identity.output[0]
        else:
            if any(name == identity.output[0] for reader in readers[identity.output[0]]
                   for name in _names_read(_only_subgraphs(reader))):
                continue  # read inside a nested graph: left as it is
            for reader in readers[identity.output[0]]:
                for position, name in enumerate(reader.input):
                    if name == identity.output[0]:
                        reader.input[position] = identity.input[0]
        branch.node.remove(identity)


def _only_subgraphs(node: onnx.NodeProto) -> onnx.GraphProto:
    """A graph of the nodes of ``node``'s subgraphs (what they read from outside, for :func:`_names_read`)."""
    holder = onnx.GraphProto()
    holder.node.extend(node for attribute in node.attribute if attribute.type == onnx.AttributeProto.GRAPH
                       for node in attribute.g.node)
    return holder
