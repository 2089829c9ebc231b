"""A written model's ``If`` nodes made lean: each branch computes what only it reads.

A masked layer decides at run time whether its mask needs compaction (:class:`.mask_tensors.AtRunTime`):
an ``If`` whose lean branch reads the node's input or output as it is. tf2onnx's optimizers leave
around it what only one branch reads (the input's transpose to time-major, shapes), and Keras's graph
moves the If's output to batch-major order after it. On the written ModelProto, after those
optimizers:

- a mask's int64 flags are cast from its 0/1 uint8s (not through a bool), and a Cast of a graph input
  to the type it has is dropped (onnxruntime cannot drop it itself where a branch reads it, and says so);
- a ``Concat`` of outputs of ``If`` nodes on one condition (a Bidirectional's halves, each restored by
  its own If) is computed in the branches of one If that replaces them;
- a ``Transpose`` that alone reads an ``If``'s output is moved into both branches (the heavy branch's
  row gather then takes it: :mod:`.transposed_gathers`);
- in a branch, a bidirectional node's halves gathered, concatenated and moved to batch-major are one
  ``Transpose`` of its output and a ``Reshape`` (one copy of the outputs instead of three);
- a node of the main graph whose outputs only one ``If``'s branches read is moved into the branches
  that read it, so that the other never pays for it (not a recurrent node: onnxruntime prepacks
  weights in the main graph only);
- an ``Identity`` of a tensor made in a branch is bypassed (it copies): its readers read the tensor,
  and a branch output it gave is written by the tensor's producer;
- a node of the main graph that nothing reads any more is dropped.

Each change keeps the model's outputs bit for bit: nodes move to where their readers are, and the one
fold moves the same values in one copy. Every
step is called by :func:`lean_branches` itself, which works on a copy of the nodes and writes them
back once every step has run: a failure anywhere leaves the model as written.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import attribute, attributes, producers_of, set_nodes, subgraphs
from .transposed_gathers import fold_graph

logger = logging.getLogger(__name__)
_BRANCHES = ("then_branch", "else_branch")
# never moved into a branch: onnxruntime prepacks a recurrent node's weights in the main graph only (an
# LSTM inside an If ran 8% slower, measured), and a node with subgraphs of its own stays as written
_STAYS = {"LSTM", "GRU", "RNN", "If", "Loop", "Scan"}


class _Reads(NamedTuple):
    """What a graph's nodes read, for one step (nodes are held so that ``id`` names each throughout)."""
    nodes: list
    by_node: dict  # id(node) -> the names it reads, directly or inside its subgraphs from outside them
    nested: dict  # id(node) -> the names its subgraphs read from outside them
    branches: dict  # id(If node) -> {branch attribute name: (the branch graph, the names it reads from outside)}
    outside: set  # the names the graph's nodes read from outside the graph
    readers: dict  # name -> how many of the graph's nodes read it, directly or inside their subgraphs


def lean_branches(model_proto: onnx.ModelProto) -> int:
    """Apply the moves above to the main graph's ``If`` nodes (and those nested in their branches);
    returns how many nodes moved or changed. The model changes only once every step has run."""
    if not any(node.op_type == "If" for node in model_proto.graph.node):
        return 0
    graph = _nodes_copy(model_proto)
    changed = _flags_from_uint8(graph) + _no_op_casts(graph)
    pending, branches = [graph], []
    while pending:  # top down: what moves into a branch may move on into an If nested there
        current = pending.pop()
        changed += _concats_into_branches(current, _reads(current))
        changed += _transposes_into_branches(current, _reads(current))
        changed += _sink_into_branches(current, _reads(current))
        inner = [branch for sides in _reads(current).branches.values() for branch, _ in sides.values()]
        branches += inner
        pending += inner
    sizes, scalars = _bidirectional_sizes(model_proto.graph), _int_scalars(model_proto.graph.initializer)
    for branch in branches:
        _outputs_without_identity(branch, _reads(branch))
        changed += _halves_as_one_transpose(branch, _reads(branch), sizes, scalars)
        fold_graph(branch)
    changed += _unread_nodes(graph, _reads(graph))
    _write_back(model_proto, graph)
    return changed


def _nodes_copy(model_proto: onnx.ModelProto) -> onnx.GraphProto:
    """The main graph's nodes, inputs, outputs and value infos, copied (initializers by name only)."""
    graph = onnx.GraphProto()
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(model_proto.graph, field))
    graph.initializer.extend(onnx.TensorProto(name=t.name) for t in model_proto.graph.initializer)
    return graph


def _write_back(model_proto: onnx.ModelProto, graph: onnx.GraphProto) -> None:
    """``graph``'s nodes into the model, and its value infos but those of names no longer made."""
    kept = {name for node in graph.node for name in node.output} | {v.name for v in graph.input}
    value_info = [value for value in graph.value_info if value.name in kept]
    set_nodes(model_proto.graph, graph.node)
    del model_proto.graph.value_info[:]
    model_proto.graph.value_info.extend(value_info)


def _reads(graph: onnx.GraphProto) -> _Reads:
    """What ``graph``'s nodes read (see :class:`_Reads`)."""
    nodes = list(graph.node)
    by_node, nested, branches = {}, {}, {}
    made = set()
    for node in nodes:
        inside = set()
        for a in node.attribute:
            for subgraph in [a.g] if a.type == onnx.AttributeProto.GRAPH else \
                    list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []:
                outside = _reads(subgraph).outside
                inside |= outside
                if node.op_type == "If" and a.name in _BRANCHES:
                    branches.setdefault(id(node), {})[a.name] = (subgraph, outside)
        nested[id(node)] = inside
        by_node[id(node)] = inside | {name for name in node.input if name}
        made.update(node.output)
    read = set().union(*by_node.values()) if by_node else set()
    local = made | {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    readers: dict = {}
    for names in by_node.values():
        for name in names:
            readers[name] = readers.get(name, 0) + 1
    return _Reads(nodes, by_node, nested, branches, read - local, readers)


def _flags_from_uint8(graph: onnx.GraphProto) -> int:
    """``Cast(Cast(r, bool), int64)`` where ``r = ReduceMax(Cast(b, uint8))`` (tf2onnx's ``Any`` as
    ``bool_masks`` writes it: 0/1 values) -> ``Cast(r, int64)``: the same values, one Cast fewer, and
    no Cast chain that onnxruntime's optimizer would try to merge and warn about when an If's branch
    reads the first Cast. Returns how many."""
    producer = producers_of(graph)
    casts = {name: node for name, node in producer.items() if node.op_type == "Cast"}
    to = {id(cast): attribute(cast, "to") for cast in casts.values() if attribute(cast, "to") is not None}
    rewritten = 0
    for node in casts.values():
        squash = casts.get(node.input[0])
        reduced = producer.get(squash.input[0]) if squash is not None else None
        flags = casts.get(reduced.input[0]) if reduced is not None and reduced.op_type == "ReduceMax" else None
        if flags is not None and [to.get(id(c)) for c in (node, squash, flags)] == \
                [onnx.TensorProto.INT64, onnx.TensorProto.BOOL, onnx.TensorProto.UINT8]:
            node.input[0] = reduced.output[0]
            rewritten += 1
    return rewritten


def _no_op_casts(graph: onnx.GraphProto) -> int:
    """A Cast of a graph input to the type it has: its readers, in the graph and in any subgraph, read
    the input (onnxruntime removes such a Cast itself, and warns that it cannot where a branch reads it).
    Not one whose output a graph, or a subgraph, gives as an output."""
    graphs, pending = [], [graph]
    while pending:
        current = pending.pop()
        graphs.append(current)
        for node in current.node:
            pending += subgraphs(node)
    types = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    outputs = {value.name for current in graphs for value in current.output}
    renamed = {}
    for node in list(graph.node):
        to = attribute(node, "to", None)
        if node.op_type == "Cast" and types.get(node.input[0]) == to and node.output[0] not in outputs:
            renamed[node.output[0]] = node.input[0]
            graph.node.remove(node)
    for node in (node for current in graphs for node in current.node):
        if any(name in renamed for name in node.input):
            node.input[:] = [renamed.get(name, name) for name in node.input]
    return len(renamed)


def _concats_into_branches(graph: onnx.GraphProto, reads: _Reads) -> int:
    """A ``Concat`` of outputs of ``If`` nodes on one condition, each output read by it alone (not a graph
    output), is computed in the branches: those Ifs become one, whose branches each hold the nodes of the
    Ifs' same branches and the Concat of what they gave (a Bidirectional's halves, each restored by its
    own If, meet in Keras's Concat). Returns how many Ifs were merged away."""
    producer = {name: node for node in reads.nodes for name in node.output}
    outputs = {value.name for value in graph.output}
    readers = reads.readers
    merged = 0
    for concat in [node for node in reads.nodes if node.op_type == "Concat"]:
        sources = [producer.get(name) for name in concat.input]
        if len(set(concat.input)) != len(concat.input) or any(
                source is None or source.op_type != "If" or len(source.output) != 1 for source in sources) \
                or len({source.input[0] for source in sources}) != 1 \
                or any(readers.get(name) != 1 or name in outputs for name in concat.input):
            continue
        sides = [reads.branches[id(source)] for source in sources]
        if any(set(side) != set(_BRANCHES) for side in sides):
            continue
        joined = {}
        for branch_name in _BRANCHES:
            parts = [side[branch_name][0] for side in sides]
            branch = onnx.GraphProto(name=parts[0].name)
            for part in parts:
                branch.node.extend(part.node)
                branch.initializer.extend(part.initializer)
                branch.value_info.extend(part.value_info)
            inside = f"{concat.output[0]}_{branch.name}"
            node = helper.make_node("Concat", [part.output[0].name for part in parts], [inside],
                                    name=f"{concat.name}_{branch.name}")
            node.attribute.extend(concat.attribute)
            branch.node.append(node)
            value = helper.make_empty_tensor_value_info(inside)
            value.type.CopyFrom(parts[0].output[0].type)
            value.type.tensor_type.ClearField("shape")
            branch.output.append(value)
            joined[branch_name] = branch
        one = helper.make_node("If", [sources[0].input[0]], [concat.output[0]], name=sources[0].name,
                               then_branch=joined["then_branch"], else_branch=joined["else_branch"])
        position = list(graph.node).index(concat)
        graph.node.insert(position, one)
        for node in sources + [concat]:
            graph.node.remove(node)
        merged += len(sources) - 1
    return merged


def _bidirectional_sizes(graph: onnx.GraphProto) -> dict:
    """The Y [T, 2, B, H] of each bidirectional recurrent node of ``graph`` -> its H."""
    found = {}
    for node in graph.node:
        given = attributes(node)
        if node.op_type in ("LSTM", "GRU", "RNN") and node.output and node.output[0] \
                and given.get("direction") == "bidirectional" and given.get("hidden_size"):
            found[node.output[0]] = given["hidden_size"]
    return found


def _int_scalars(initializers) -> dict:
    """The integer scalars among ``initializers``, by name."""
    return {tensor.name: int(numpy_helper.to_array(tensor)) for tensor in initializers
            if not tensor.dims and tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)}


def _halves_as_one_transpose(branch: onnx.GraphProto, reads: _Reads, sizes: dict, outer_scalars: dict) -> int:
    """``Transpose(Concat(Gather(Y, 0, axis=1), Gather(Y, 1, axis=1), axis=2), [1, 0, 2])`` of a bidirectional
    node's Y [T, 2, B, H] (both halves, forward first, to batch-major [B, T, 2H]) ->
    ``Reshape(Transpose(Y, [2, 0, 1, 3]), [0, 0, 2H])``: one copy of the outputs instead of three, the
    same values (a Bidirectional's lean branch). Each Gather and the Concat read by the next alone.
    ``sizes``: :func:`_bidirectional_sizes`; ``outer_scalars``: the main graph's integer scalars (the
    branch's own are read here). Returns how many."""
    producer = {name: node for node in reads.nodes for name in node.output}
    outputs = {value.name for value in branch.output}
    readers = reads.readers

    scalars = {**outer_scalars, **_int_scalars(branch.initializer)}
    for transpose in [node for node in reads.nodes if node.op_type == "Transpose"]:
        concat = producer.get(transpose.input[0])
        if attribute(transpose, "perm") != [1, 0, 2] or concat is None or concat.op_type != "Concat" \
                or attribute(concat, "axis") not in (2, -1) or len(concat.input) != 2:
            continue
        gathers = [producer.get(name) for name in concat.input]
        if any(g is None or g.op_type != "Gather" or attribute(g, "axis", 0) != 1 for g in gathers) \
                or len({g.input[0] for g in gathers}) != 1 or gathers[0].input[0] not in sizes \
                or [scalars.get(g.input[1]) for g in gathers] != [0, 1] \
                or any(readers.get(name) != 1 or name in outputs for name in list(concat.input) + [concat.output[0]]):
            continue
        y, name = gathers[0].input[0], transpose.output[0]
        nodes = list(branch.node)
        position = nodes.index(transpose)
        replacement = [
            helper.make_node("Transpose", [y], [f"{name}_halves"], name=f"{transpose.name}_halves", perm=[2, 0, 1, 3]),
            helper.make_node("Constant", [], [f"{name}_shape"], name=f"{transpose.name}_shape",
                             value=numpy_helper.from_array(np.array([0, 0, 2 * sizes[y]], np.int64))),
            helper.make_node("Reshape", [f"{name}_halves", f"{name}_shape"], [name], name=transpose.name)]
        gone = {id(node) for node in gathers + [concat]}
        kept = [node for node in nodes[:position] if id(node) not in gone]
        set_nodes(branch, kept + replacement + nodes[position + 1:])
        still_read = set().union(*_reads(branch).by_node.values())
        indices = {g.input[1] for g in gathers} - still_read  # the branch's own index constants go with them
        unread = [tensor for tensor in branch.initializer if tensor.name in indices]
        for tensor in unread:
            branch.initializer.remove(tensor)
        # the next, on the graph as it now is
        return 1 + _halves_as_one_transpose(branch, _reads(branch), sizes, outer_scalars)
    return 0


def _transposes_into_branches(graph: onnx.GraphProto, reads: _Reads) -> int:
    """Each ``Transpose`` that alone reads an ``If`` output (not a graph output) moves into the branches."""
    producer = {name: node for node in reads.nodes for name in node.output}
    outputs = {value.name for value in graph.output}
    moved = []
    for node in reads.nodes:
        source = producer.get(node.input[0]) if node.op_type == "Transpose" and node.input else None
        if source is None or source.op_type != "If" or node.input[0] in outputs \
                or [id(reader) for reader in reads.nodes if node.input[0] in reads.by_node[id(reader)]] != [id(node)]:
            continue
        position = list(source.output).index(node.input[0])
        for branch, _ in reads.branches[id(source)].values():
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


def _sink_into_branches(graph: onnx.GraphProto, reads: _Reads) -> int:
    """Nodes whose outputs only the branches of one ``If`` read move into those branches (a chain of
    them together, in the main graph's order); so do those only the same branch of several Ifs on one
    condition reads, into each of them: a run that takes the other branch never computes them (a
    mask's post-padding test, which a layer's input and output Ifs both read)."""
    outputs = {value.name for value in graph.output}
    main_reads = {}  # name -> how many nodes of the graph itself read it (an If's condition included)
    branch_reads = {}  # name -> the (id of an If, branch name) that read it
    for node in reads.nodes:
        sides = reads.branches.get(id(node), {})
        for branch_name, (_, names) in sides.items():
            for name in names:
                branch_reads.setdefault(name, set()).add((id(node), branch_name))
        for name in (node.input[:1] if sides else reads.by_node[id(node)]):
            main_reads[name] = main_reads.get(name, 0) + 1
    conditions = {id(node): node.input[0] for node in reads.nodes if id(node) in reads.branches}
    sunk = {}  # (id of an If, branch name) -> nodes, latest first
    for node in reversed(reads.nodes):
        if node.op_type in _STAYS or reads.nested[id(node)] or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        places = set().union(*(branch_reads.get(name, set()) for name in node.output)) if node.output else set()
        if not places or any(main_reads.get(name) or name in outputs for name in node.output) \
                or (len({place[0] for place in places}) != 1
                    and (len({place[1] for place in places}) != 1 or len({conditions[p[0]] for p in places}) != 1)):
            continue
        for name in reads.by_node[id(node)]:
            main_reads[name] = main_reads.get(name, 0) - 1
            branch_reads.setdefault(name, set()).update(places)
        for place in places:
            sunk.setdefault(place, []).append(node)
    if not sunk:
        return 0
    for (if_id, branch_name), nodes in sunk.items():
        branch = reads.branches[if_id][branch_name][0]
        copies = []
        for node in reversed(nodes):  # the main graph's order
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copies.append(copy)
        existing = list(branch.node)
        set_nodes(branch, copies + existing)
    moved = {id(node) for nodes in sunk.values() for node in nodes}
    kept = [node for node in reads.nodes if id(node) not in moved]
    set_nodes(graph, kept)
    return len(moved)


def _unread_nodes(graph: onnx.GraphProto, reads: _Reads) -> int:
    """Drop the main graph's nodes that nothing reads (no node, no branch, no graph output), and then
    those only they read: a mask's bool that the branches now take from its 0/1 ints (the Cast
    tf2onnx wrote for ``Any``). Returns how many."""
    outputs = {value.name for value in graph.output}
    readers = dict(reads.readers)  # counted down as nodes go
    dropped = set()
    for node in reversed(reads.nodes):  # a reader comes after what it reads
        if node.output and not any(readers.get(name) or name in outputs for name in node.output):
            dropped.add(id(node))
            for name in reads.by_node[id(node)]:
                readers[name] -= 1
    if dropped:
        kept = [node for node in reads.nodes if id(node) not in dropped]
        set_nodes(graph, kept)
    return len(dropped)


def _outputs_without_identity(branch: onnx.GraphProto, reads: _Reads) -> int:
    """An ``Identity`` of a tensor made in the branch copies it: its readers read the tensor itself, and
    a branch output it gives is written by the tensor's producer (when nothing else reads the tensor).
    Returns how many were bypassed."""
    outputs = {value.name for value in branch.output}
    producer = {name: node for node in reads.nodes for name in node.output}
    readers = {}  # name -> the nodes reading it, kept up to date as identities go
    for node in reads.nodes:
        for name in reads.by_node[id(node)]:
            readers.setdefault(name, []).append(node)
    bypassed = []
    for identity in [node for node in reads.nodes if node.op_type == "Identity"]:
        source, tensor, copy = producer.get(identity.input[0]), identity.input[0], identity.output[0]
        if source is None or tensor in outputs:
            continue
        if copy in outputs:
            if len(readers.get(tensor, [])) != 1:
                continue
            source.output[list(source.output).index(tensor)] = copy
            producer[copy] = source
        else:
            copy_readers = readers.get(copy, [])
            if any(copy in reads.nested[id(reader)] for reader in copy_readers):
                continue  # read inside a nested graph: left as it is
            for reader in copy_readers:
                reader.input[:] = [tensor if name == copy else name for name in reader.input]
            readers[tensor] = [node for node in readers.get(tensor, []) if node is not identity] + copy_readers
        bypassed.append(identity)
    for identity in bypassed:
        branch.node.remove(identity)
    return len(bypassed)
