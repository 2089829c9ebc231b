"""A Loop read as a per-step map (:mod:`.loop_reading`) written as a ``Scan`` of its own step.

The Scan's body is the loop's body without what made it a loop: the iteration number, the
condition, the counters, the per-step reads of the sequences (now the Scan's own slicing) and the
values passed through unchanged (now read from outside). What the step does to its input alone runs
once over the whole sequence before the Scan (:mod:`.hoisting`). The Scan node takes the Loop's name
and outputs, so the rest of the graph and the report's reconciliation see the same layer.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...description import NoMatch
from ..graph import attribute, outer_reads, producers_of, reads, set_nodes, subgraphs, topological, upstream
from ..scope import Scope, TypeTable, fresh
from .constants import Constants
from .folding import computed_reads, fold
from .hoisting import hoist
from .layouts import Layouts, carry_in_layouts, outside
from .loop_reading import LoopMap, zero_filled
from .normalisation import fuse_layer_normalisations


@dataclass(frozen=True)
class Written:
    """One Scan written in place of a Loop."""

    loop: str  # the Loop's (and the Scan's) node name
    states: int
    sequences: int  # the Scan's scanned inputs
    hoisted: int  # body nodes that now run once over the whole sequence
    normalisations: int = 0  # layer normalisations in the step written as one LayerNormalization node each
    unfused_normalisations: int = 0  # those left as their nodes: the opset (below 17) has no such node
    around: tuple = ()  # the names of the nodes written before and after the Scan
    lifted: dict = field(default_factory=dict)  # op type -> how many of the hoisted nodes were products of it
    merged: int = 0  # products merged into a sibling's node
    laid_out: int = 0  # states carried in another layout
    state_starts: tuple = ()  # each carried state's outer start, as the loop read it
    state_ends: tuple = ()  # each carried state's outer last value (present where used, or every_final)
    state_shapes: tuple = ()  # each carried state's shape at a step, as the loop's body declares it


def write_scan(loop: onnx.NodeProto, loop_map: LoopMap, scope: Scope, types: TypeTable, opset: int,
               every_final: bool = False) -> Written:
    """Replace ``loop`` in ``scope``'s graph by the Scan of its step; with ``every_final``, every carried
    state's last value is given in the layout the loop gives it (the states streamed out)."""
    body = onnx.GraphProto()
    body.CopyFrom(attribute(loop, "body"))
    outer_nodes, initializers = [], _promoted_initializers(body, scope)
    constants = Constants(scope, types, initializers)  # appends what the rewrite makes to initializers
    loop_map, twins = _merge_twin_states(loop_map, body, scope)
    outputs = [state.step_output for state in loop_map.states] + [out for out, _ in loop_map.step_outputs]
    declared = {}  # a body output -> the loop body's output whose type it has
    outputs, copies = _distinct_outputs(outputs, list(body.node), declared)
    body.node.extend(copies)
    invariant_outputs = {inv.step_input for inv in loop_map.invariants} & set(outputs)
    nodes = [helper.make_node("Identity", [inv.initial], [inv.step_input], name=fresh("invariant"))
             for inv in loop_map.invariants if inv.step_input in invariant_outputs]
    rows_read = {read.row for read in loop_map.reads}
    nodes += [node for node in body.node if not (node.op_type == "Gather" and node.output[0] in rows_read)]
    _rename(nodes, {inv.step_input: inv.initial for inv in loop_map.invariants
                    if inv.step_input not in invariant_outputs})
    nodes = _live(nodes, outputs)
    rows = {read.row: read.sequence for read in loop_map.reads}
    index_rows = _step_indices(nodes, loop_map, types, rows, outer_nodes)
    nodes = index_rows + nodes
    state_inputs = [state.step_input for state in loop_map.states]
    row_ranks = {row: _row_rank(row, sequence, types) for row, sequence in rows.items()}
    hoisted = hoist(topological(nodes, set(rows) | set(state_inputs)), rows, row_ranks, set(state_inputs),
                    constants, types, opset, keep=lambda name: name in outputs)
    outer_nodes += fold(hoisted.outer, constants, opset)
    rows = hoisted.rows or dict(list(rows.items())[:1])  # a Scan scans at least one sequence
    for name, source in declared.items():  # an output's copy has the type of what it copies
        if source in types.types and name not in types.types:
            types.types[name] = types.types[source]
    layouts = carry_in_layouts(hoisted.body, list(zip(state_inputs, outputs[:len(loop_map.states)])),
                               outputs[len(loop_map.states):], types, constants)
    hoisted.body = layouts.nodes
    state_inputs = [layouts.inputs.get(name, (name, None))[0] for name in state_inputs]
    unlaid, outputs = outputs, [layouts.outputs.get(name, (name, None))[0] for name in outputs]
    passed = _passed_on(hoisted.body, outputs, scope, {t.name for t in initializers} | set(state_inputs) | set(rows),
                        types)
    state_inputs += [inner for _, inner, _ in passed]
    outputs = outputs[:len(loop_map.states)] + [out for _, _, out in passed] + outputs[len(loop_map.states):]
    body_initializers = _constants_inside(hoisted.body, outputs, scope, initializers, set(state_inputs) | set(rows))
    body_inputs = [_value_info(name, types, name) for name in state_inputs]
    body_inputs += [_row_info(row, sequence, types, hoisted.ranks.get(row)) for row, sequence in rows.items()]
    # the body's types without the symbolic dims tf2onnx named: a consumer may unify names across graphs
    new_body = helper.make_graph(hoisted.body, body.name, body_inputs,
                                 [_value_info(name, types, declared.get(name, name), unnamed=True) for name in outputs],
                                 body_initializers)
    normalisations, unfused = fuse_layer_normalisations(new_body, scope, types, opset)
    untyped = [v.name for v in list(new_body.input) + list(new_body.output) if not v.type.tensor_type.elem_type]
    if untyped:
        raise NoMatch("the element type of a value the step carries or reads is not known", untyped[0])
    finals = [state.final or fresh("final_state") for state in loop_map.states] + [fresh("passed") for _ in passed]
    state_ends = tuple(finals[:len(loop_map.states)])  # each carried state's last value, as the loop lays it out
    initials = [state.initial for state in loop_map.states] + [outer for outer, _, _ in passed]
    sequences = [final for _, final in loop_map.step_outputs]
    after = _layout_transposes(loop_map, layouts, unlaid, (initials, finals, sequences), scope, every_final,
                               outer_nodes)
    scan = helper.make_node("Scan", initials + list(rows.values()), finals + sequences, name=loop.name,
                            body=new_body, num_scan_inputs=len(rows))
    after += [helper.make_node("Identity", [inv.initial], [inv.final], name=fresh("invariant"))
              for inv in loop_map.invariants if inv.final and scope.used(inv.final)]
    after += [helper.make_node("Identity", [kept], [merged], name=fresh("twin_state"))
              for merged, kept in twins if merged and scope.used(merged)]
    scope.replace(loop, outer_nodes + [scan] + after)
    constants.drop_unread(outer_nodes + [scan] + after)  # a layout trial's that lost, a constant folded away
    scope.add_initializers(initializers)
    lifted = {op: count for op, count in hoisted.lifted.items() if op in ("Conv", "MatMul", "Gemm")}
    return Written(loop.name, len(loop_map.states), len(rows), hoisted.moved, normalisations, unfused,
                   tuple(node.name for node in outer_nodes + after), lifted, hoisted.merged, len(layouts.inputs),
                   tuple(state.initial for state in loop_map.states), state_ends,
                   tuple(types.shape(state.step_input) for state in loop_map.states))


def _layout_transposes(loop_map: LoopMap, layouts: Layouts, unlaid: list, ends: tuple, scope: Scope,
                       every_final: bool, outer_nodes: list) -> list:
    """The transposes around the Scan where its step carries a state, or stacks an output, in a layout of
    its own (``unlaid``: the step's outputs before :mod:`.layouts`): a state's start transposed on its way in
    (appended to ``outer_nodes``), its last value (where read, or ``every_final``) and a stacked output on
    their way out (returned). ``ends``: the Scan's (initial states, final states, sequences), renamed here
    where a transpose stands between."""
    initials, finals, sequences = ends
    after = []
    for index, state in enumerate(loop_map.states):
        if state.step_input in layouts.inputs:
            initial, perm = initials[index], layouts.inputs[state.step_input][1]
            initials[index] = fresh(initial)
            outer_nodes.append(helper.make_node("Transpose", [initial], [initials[index]], name=fresh("layout_in"),
                                                perm=perm))
            final, finals[index] = finals[index], fresh(finals[index])
            if scope.used(final) or every_final:
                after.append(helper.make_node("Transpose", [finals[index]], [final], name=fresh("layout_out"),
                                              perm=layouts.outputs[unlaid[index]][1]))
    for index, step_output in enumerate(unlaid[len(loop_map.states):]):
        if step_output in layouts.outputs:
            sequence, sequences[index] = sequences[index], fresh(sequences[index])
            after.append(helper.make_node("Transpose", [sequences[index]], [sequence], name=fresh("layout_out"),
                                          perm=outside(True, layouts.outputs[step_output][1])))
    return after


def _merge_twin_states(loop_map: LoopMap, body: onnx.GraphProto, scope: Scope) -> tuple:
    """One state where the loop carries two that always hold the same value: both start as zeros and each
    step updates them by the same node, reading the same tensors but for the state itself (Keras 3's
    masked layers carry their previous output beside h, both ``Where(mask_t, new, old)`` from zeros).
    (the loop map with one of each pair, [(the dropped state's final, the kept state's final)])."""
    producer = producers_of(body)

    def update(state):
        name = state.step_output
        while name in producer and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        return producer.get(name)

    states, twins = list(loop_map.states), []
    for kept in list(states):
        for other in list(states):
            if other is kept or other not in states or kept not in states:
                continue
            a, b = update(kept), update(other)
            if a is None or b is None or a is b or not _same_step(a, b, kept.step_input, other.step_input) or \
                    not (zero_filled(scope, kept.initial) and zero_filled(scope, other.initial)):
                continue
            _rename(list(body.node), {other.step_input: kept.step_input, b.output[0]: a.output[0]})
            keep = [node for node in body.node if node is not b and node.output[0] != b.output[0]]
            set_nodes(body, keep)
            producer = producers_of(body)
            states.remove(other)
            twins.append((other.final, kept.final))
    return dataclasses.replace(loop_map, states=tuple(states)), twins


def _same_step(a: onnx.NodeProto, b: onnx.NodeProto, state_a: str, state_b: str) -> bool:
    """Whether ``b`` computes from ``state_b`` what ``a`` computes from ``state_a`` (one node, one output)."""
    if a.op_type != b.op_type or a.domain != b.domain or len(a.output) != 1 or len(b.output) != 1 or \
            len(a.input) != len(b.input) or subgraphs(a) or subgraphs(b):
        return False
    if sorted(x.SerializeToString() for x in a.attribute) != sorted(x.SerializeToString() for x in b.attribute):
        return False
    return all(x == y or (x == state_a and y == state_b) for x, y in zip(a.input, b.input)) and \
        state_a in a.input


def _distinct_outputs(outputs: list, nodes: list, declared: dict) -> tuple:
    """The body's outputs as the tensors that compute them (through Identity nodes), each computed value
    given once: a later output of the same value (a state the step also stacks) is an Identity of the
    first. tract maps a body's outputs by the value they hold, and mixes up two outputs of one value
    that reach it through different Identity chains. (outputs, the Identity nodes added)."""
    producer = {out: node for node in nodes for out in node.output}
    seen, resolved, copies = set(), [], []
    for original in outputs:
        name = original
        while name in producer and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        if name in seen:
            copy = fresh(name)
            copies.append(helper.make_node("Identity", [name], [copy], name=fresh("output_copy")))
            name = copy
        seen.add(name)
        resolved.append(name)
        declared[name] = original
    return resolved, copies


def _rename(nodes: list, renames: dict) -> None:
    """Every read of a renamed tensor in ``nodes`` and the subgraphs they hold reads its new name."""
    for node in nodes:
        node.input[:] = [renames.get(name, name) for name in node.input]
        for graph in subgraphs(node):
            _rename(list(graph.node), renames)


def _constants_inside(body_nodes: list, outputs: list, scope: Scope, initializers: list, local: set) -> list:
    """Copies, under names of their own, of the initializers the step reads from outside, for the body to
    hold: onnxruntime hands a Scan's body each outer tensor it reads at every step, which costs more than
    the step's own work in a small cell (measured: 1.6x the floor's time for SimpleRNN(gelu) at batch 1).
    The body's nodes read the copies; an outer initializer nothing else reads is dropped afterwards."""
    available = {t.name: t for t in list(scope.graph.initializer) + initializers}
    probe = helper.make_graph(body_nodes, "probe", [], [helper.make_tensor_value_info(o, 0, None) for o in outputs])
    copies, renames = [], {}
    for name in sorted(outer_reads(probe) - local):
        if name in available:
            copy = onnx.TensorProto()
            copy.CopyFrom(available[name])
            copy.name = renames[name] = fresh(name)
            copies.append(copy)
    _rename(body_nodes, renames)
    return copies


def _passed_on(body_nodes: list, outputs: list, scope: Scope, known: set, types: TypeTable) -> list:
    """The computed outer tensors the step reads (see :mod:`.folding`), each made a state the step passes
    on unchanged: (outer tensor, its body input, its body output). The body's nodes read the input.
    ``known``: what is no such tensor (the body's own inputs, the initializers added for it)."""
    probe = helper.make_graph(body_nodes, "probe", [], [helper.make_tensor_value_info(o, 0, None) for o in outputs])
    passed = []
    for name in computed_reads(probe, scope, known):
        inner, out = fresh(name), fresh(name)
        types.types[inner] = types.types.get(name) or helper.make_tensor_type_proto(types.elem_type(name), None)
        types.types[out] = types.types[inner]
        passed.append((name, inner, out))
    if passed:
        _rename(body_nodes, {name: inner for name, inner, _ in passed})
        body_nodes.extend(helper.make_node("Identity", [inner], [out], name=fresh("passed_on"))
                          for _, inner, out in passed)
    return passed


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
    _, live = upstream(outputs, producer.get)
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


def _value_info(name: str, types: TypeTable, source: str, drop_first: bool = False,
                unnamed: bool = False) -> onnx.ValueInfoProto:
    """A body input or output's declared type: ``source``'s element type, and its shape less the step
    axis for a row (unknown dims stay unnamed)."""
    elem = types.elem_type(name) or types.elem_type(source)
    shape = types.shape(source)
    if shape is not None and drop_first:
        shape = shape[1:]
    if shape is not None:
        shape = [d if d else None for d in shape]
    if unnamed and shape is not None:  # the rank alone: a later Scan reading this one's output knows its
        shape = [None] * len(shape)    # rank; sizes and names are the step's, unified by some consumers
    return helper.make_tensor_value_info(name, elem, shape)


def _row_info(row: str, sequence: str, types: TypeTable, rank) -> onnx.ValueInfoProto:
    """A row's declared type: the sequence's shape less its step axis, else the row's own (a hoisted
    row's, as the loop's body declared it), else its rank with unknown dims."""
    elem = types.elem_type(row) or types.elem_type(sequence)
    shape = types.shape(sequence)
    shape = shape[1:] if shape is not None else None
    if shape is None and rank is not None:
        shape = [None] * rank
    return helper.make_tensor_value_info(row, elem, None if shape is None else [d if d else None for d in shape])
