"""A Loop read as a per-step map (:mod:`.loop_reading`) written as a ``Scan`` of its own step.

The Scan's body is the loop's body without what made it a loop: the iteration number, the
condition, the counters, the per-step reads of the sequences (now the Scan's own slicing) and the
values passed through unchanged (now read from outside). What the step does to its input alone runs
once over the whole sequence before the Scan (:mod:`.hoisting`). The Scan node takes the Loop's name
and outputs, so the rest of the graph and the report's reconciliation see the same layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph_index import Scope, TypeTable, attribute, fresh, reads, topological
from .hoisting import hoist
from .loop_reading import LoopMap


@dataclass(frozen=True)
class Written:
    """One Scan written in place of a Loop."""

    loop: str  # the Loop's (and the Scan's) node name
    states: int
    sequences: int  # the Scan's scanned inputs
    hoisted: int  # body nodes that now run once over the whole sequence


def write_scan(loop: onnx.NodeProto, loop_map: LoopMap, scope: Scope, types: TypeTable, opset: int) -> Written:
    """Replace ``loop`` in ``scope``'s graph by the Scan of its step."""
    body = onnx.GraphProto()
    body.CopyFrom(attribute(loop, "body"))
    outer_nodes, initializers = [], _promoted_initializers(body, scope)
    nodes = [helper.make_node("Identity", [inv.initial], [inv.step_input], name=fresh("invariant"))
             for inv in loop_map.invariants]
    read_nodes = {read.node for read in loop_map.reads}
    nodes += [node for node in body.node if node.name not in read_nodes]
    outputs = [state.step_output for state in loop_map.states] + [out for out, _ in loop_map.step_outputs]
    nodes = _live(nodes, outputs)
    rows = {read.row: read.sequence for read in loop_map.reads}
    index_rows = _step_indices(nodes, loop_map, types, rows, outer_nodes)
    nodes = index_rows + nodes
    state_inputs = [state.step_input for state in loop_map.states]
    row_ranks = {row: _row_rank(row, sequence, types) for row, sequence in rows.items()}
    hoisted = hoist(topological(nodes, set(rows) | set(state_inputs)), rows, row_ranks, set(state_inputs),
                    scope, types, opset, keep=lambda name: name in outputs)
    outer_nodes += hoisted.outer
    initializers += hoisted.initializers
    rows = hoisted.rows or dict(list(rows.items())[:1])  # a Scan scans at least one sequence
    body_inputs = [_value_info(name, types, name) for name in state_inputs]
    body_inputs += [_value_info(row, types, sequence, drop_first=True) for row, sequence in rows.items()]
    old_outputs = {o.name: o for o in body.output}
    new_body = helper.make_graph(hoisted.body, body.name, body_inputs,
                                 [old_outputs.get(name) or _value_info(name, types, name) for name in outputs])
    kept = {name for node in hoisted.body for name in node.output} | set(state_inputs) | set(rows)
    new_body.value_info.extend(v for v in body.value_info if v.name in kept)
    finals = [state.final or fresh("final_state") for state in loop_map.states]
    scan = helper.make_node("Scan", [state.initial for state in loop_map.states] + list(rows.values()),
                            finals + [final for _, final in loop_map.step_outputs], name=loop.name,
                            body=new_body, num_scan_inputs=len(rows))
    after = [helper.make_node("Identity", [inv.initial], [inv.final], name=fresh("invariant"))
             for inv in loop_map.invariants if inv.final and scope.used(inv.final)]
    _replace(scope.graph, loop, outer_nodes + [scan] + after)
    scope.graph.initializer.extend(initializers)
    return Written(loop.name, len(loop_map.states), len(rows), hoisted.moved)


def _promoted_initializers(body: onnx.GraphProto, scope: Scope) -> list:
    """The body's initializers, moved to the graph around it (a hoisted node may read one); renamed
    where that graph has the name already."""
    moved = []
    for tensor in body.initializer:
        name = tensor.name
        if scope.local(name):
            name = fresh(tensor.name)
            for node in body.node:
                node.input[:] = [name if i == tensor.name else i for i in node.input]
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name = name
        moved.append(copy)
    del body.initializer[:]
    return moved


def _live(nodes: list, outputs: list) -> list:
    """``nodes`` that what ``outputs`` needs reads, in their order."""
    producer = {out: node for node in nodes for out in node.output}
    needed, pending, live = set(), list(outputs), set()
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None and id(node) not in live:
            live.add(id(node))
            pending.extend(reads(node))
    return [node for node in nodes if id(node) in live]


def _step_indices(nodes: list, loop_map: LoopMap, types: TypeTable, rows: dict, outer_nodes: list) -> list:
    """Where the step still reads its index (the cell computes with it), the index becomes a scanned
    input: ``Range(0, steps)`` before the Scan, one row per step. The nodes giving each index its name."""
    read = {name for node in nodes for name in reads(node)}
    wanted = [index for index in loop_map.indices if index in read]
    if not wanted:
        return []
    sequence = next(iter(rows.values()))
    shape = fresh("steps_shape")
    steps = fresh("steps")
    made = [helper.make_node("Shape", [sequence], [shape], name=fresh("steps_shape")),
            helper.make_node("Gather", [shape, _int_const(outer_nodes, 0)], [steps], name=fresh("steps"), axis=0)]
    indices = fresh("step_indices")
    made.append(helper.make_node("Range", [_int_const(outer_nodes, 0), steps, _int_const(outer_nodes, 1)], [indices],
                                 name=fresh("step_indices")))
    outer_nodes.extend(made)
    row = fresh("step_index")
    rows[row] = indices
    types.types[row] = helper.make_tensor_type_proto(onnx.TensorProto.INT64, [])
    in_body = []
    for index in wanted:
        to = types.elem_type(index) or onnx.TensorProto.INT64
        op = "Identity" if to == onnx.TensorProto.INT64 else "Cast"
        extra = {} if op == "Identity" else {"to": to}
        in_body.append(helper.make_node(op, [row], [index], name=fresh("step_index"), **extra))
    return in_body


def _int_const(outer_nodes: list, value: int) -> str:
    name = fresh("const")
    outer_nodes.append(helper.make_node("Constant", [], [name], name=name,
                                        value=numpy_helper.from_array(np.array(value, np.int64))))
    return name


def _row_rank(row: str, sequence: str, types: TypeTable):
    rank = types.rank(row)
    if rank is None and types.rank(sequence) is not None:
        rank = types.rank(sequence) - 1
    return rank


def _value_info(name: str, types: TypeTable, source: str, drop_first: bool = False) -> onnx.ValueInfoProto:
    """A body input or output's declared type: ``source``'s element type, and its shape less the step
    axis for a row (unknown dims stay unnamed)."""
    elem = types.elem_type(name) or types.elem_type(source)
    shape = types.shape(source)
    if shape is not None and drop_first:
        shape = shape[1:]
    if shape is not None:
        shape = [d if d else None for d in shape]
    return helper.make_tensor_value_info(name, elem, shape)


def _replace(graph: onnx.GraphProto, node: onnx.NodeProto, replacement: list) -> None:
    nodes = list(graph.node)
    position = next(i for i, n in enumerate(nodes) if n.name == node.name and n.op_type == node.op_type)
    nodes[position:position + 1] = replacement
    del graph.node[:]
    graph.node.extend(nodes)
