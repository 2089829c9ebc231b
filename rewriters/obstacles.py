"""Why a runtime does not compute a written model as ONNX defines it, read from its row of the table.

:func:`obstacles` walks a written model (its subgraphs included) and gives, for one row of
:mod:`.runtimes`, every :class:`Obstacle`: the node, why, whether the runtime's result is silently wrong,
and the kind of what it lacks (``op``, ``direction``, ``y_h``, ``initial_states``, ``activations``, ...).
The report's lines read them (where the model runs, and a warning for each silent one), and the lowering
(:mod:`.lower`) asks :func:`node_obstacles` which rung a node must stand on, by the kinds, never by the
runtime's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import onnx

from .runtimes import (
    BIDIRECTIONAL,
    DEFAULT_ACTIVATIONS,
    FORWARD,
    INITIAL_C,
    INITIAL_H,
    MASK_BOOLS,
    PEEPHOLES,
    RECURRENT_OPS,
    REVERSE,
    SEQUENCE_LENS,
    Y_C,
    Y_H,
    Kind,
    Runtime,
    Y,
)
from .written.graph import attribute, constant_values, nodes_of, readers_of, slot, static_shapes

_COMPACTION = frozenset({"ScatterND", "GatherND", "CumSum"})  # the portable form's mask: compaction and restore


class OwnStep(NamedTuple):
    """Whether a runtime's masked layers are each written as their own step, the mask applied at each step,
    rather than as a native node with the mask around it; and why (the report's reason, "" where not)."""

    needed: bool
    why: str = ""


def masked_own_step(row: Optional[Runtime]) -> OwnStep:
    """Whether a masked layer is written as its own step for ``row``'s runtime (not where a native node's mask
    runs there, nor without a runtime), and why: the runtime lacks ops the mask's compaction around a native
    node needs."""
    missing = sorted(row.lacks & _COMPACTION) if row is not None else []
    missing += ["the mask's bool ops"] if row is not None and row.lacks & MASK_BOOLS else []
    if not missing:
        return OwnStep(False)
    return OwnStep(True, f"{row.name} has no {', '.join(missing)}, which a native node's mask needs: the masked "
                         "layer is its own step, the mask applied at each step")


@dataclass(frozen=True)
class Obstacle:
    """Why ``runtime`` does not compute a node of a written model as ONNX defines it."""

    node: str
    why: str
    silent: bool = False  # the runtime gives a wrong result, no error
    kind: Kind = Kind.OP  # what about the node (or the model's inputs)


_INTEGERS = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                       onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                       onnx.TensorProto.UINT64})


def obstacles(model_proto: onnx.ModelProto, row: Runtime, steps_written: bool = False) -> list:
    """What keeps ``row``'s runtime from computing ``model_proto`` as ONNX defines it (empty: nothing
    among the facts the table holds). ``steps_written``: a layer of the model is written out as its steps."""
    constants: dict = {}
    found: list = []
    static = _static_inputs(model_proto)
    ops = {n.op_type for n in model_proto.graph.node}
    asked = (not row.batched_conv and "Conv" in ops) or (not row.rank5_gather and "Gather" in ops) \
        or (static and not row.squeezes_unknown and "Squeeze" in ops) \
        or (not row.if_unranked and "If" in ops)
    shapes = static_shapes(model_proto) if asked else None  # shape inference only where a fact asks for it
    whole = readers_of(model_proto.graph)
    readers: dict = {}  # id of a graph -> what reads each name, its own outputs read by None
    for graph, node in nodes_of(model_proto.graph):
        if id(graph) not in readers:
            constants.update(constant_values(graph))
            readers[id(graph)] = {**whole, **{o.name: whole.get(o.name, []) + [None] for o in graph.output}} \
                if graph is not model_proto.graph else whole
        found.extend(node_obstacles(node, row, constants, static, readers[id(graph)],
                                    shapes if graph is model_proto.graph else None))
    if not row.qdq_steps and steps_written and "QuantizeLinear" in ops:
        found.append(Obstacle("inputs", "fails on a model holding QDQ whose layers are written out as their steps",
                              kind=Kind.OP))
    if not row.qdq_computed_recurrent_weights and "QuantizeLinear" in ops:
        found.extend(Obstacle(node.name or node.output[0], f"fails on {node.op_type} whose weights are computed in a "
                                                           "model holding QDQ (they must be constants)", kind=Kind.OP)
                     for node in model_proto.graph.node if node.op_type in RECURRENT_OPS
                     and any(w and w not in constants for w in node.input[1:3]))
    ranks = [len(i.type.tensor_type.shape.dim) for i in model_proto.graph.input]
    if row.max_input_rank and max(ranks, default=0) > row.max_input_rank:
        found.insert(0, Obstacle("inputs", f"takes no input of rank {max(ranks)}", kind=Kind.RANK))
    if not row.integer_inputs:
        given = {t.name for t in model_proto.graph.initializer}
        ints = [i.name for i in model_proto.graph.input if i.name not in given
                and i.type.tensor_type.elem_type in _INTEGERS]
        if ints:
            why = f"takes no integer input ({ints[0]}: its converter runs the model on arbitrary values there)"
            found.insert(0, Obstacle("inputs", why, kind=Kind.INTEGER))
    batched = batched_input(model_proto) if row.batch_one and static else None
    if batched is not None:
        found.insert(0, Obstacle("inputs", f"computes one batch row at a time: input {batched.name} has batch "
                                           f"{batched.type.tensor_type.shape.dim[0].dim_value}", kind=Kind.BATCH))
    if row.static_shapes and not static:
        found.insert(0, Obstacle("inputs", "compiles fixed shapes only: the model's inputs have dynamic dimensions",
                                    kind=Kind.INPUTS))
    return found


def _static_inputs(model_proto: onnx.ModelProto) -> bool:
    constants = {t.name for t in model_proto.graph.initializer}
    return all(d.HasField("dim_value") for i in model_proto.graph.input if i.name not in constants
               for d in i.type.tensor_type.shape.dim)


def batched_input(model_proto: onnx.ModelProto):
    """The first input (of fixed shape) whose batch axis is not 1, or None."""
    constants = {t.name for t in model_proto.graph.initializer}
    return next((i for i in model_proto.graph.input if i.name not in constants and i.type.tensor_type.shape.dim
                 and i.type.tensor_type.shape.dim[0].dim_value != 1), None)


def node_obstacles(node: onnx.NodeProto, row: Runtime, constants: dict, static: bool, readers: dict,
                   shapes: Optional[dict] = None) -> list:
    """The obstacles of one node (``constants``: name -> value of the constants it may read; ``readers``:
    name -> the nodes that read it, None for a graph output; ``shapes``: name -> its static dimensions, where
    the row asks for them)."""
    name = node.name or node.output[0]
    if node.domain not in ("", "ai.onnx"):
        return [] if node.domain in row.domains else [Obstacle(name, f"has no {node.domain} op {node.op_type}")]
    if node.op_type in row.lacks:
        kind = {"ReverseSequence": Kind.REVERSAL, "GatherElements": Kind.GATHER}.get(
            node.op_type, Kind.BOOL if node.op_type in MASK_BOOLS else Kind.OP)
        return [Obstacle(name, f"has no {node.op_type}", kind=kind)]
    if node.op_type in RECURRENT_OPS:
        return _recurrent(node, row, constants, readers, name)
    if node.op_type == "Cast" and not row.float64 and attribute(node, "to") == onnx.TensorProto.DOUBLE:
        return [Obstacle(name, "has no float64", kind=Kind.FLOAT64)]
    if node.op_type == "Pad" and not row.pad_default_mode and attribute(node, "mode") is None:
        return [Obstacle(name, "takes no Pad without its mode", kind=Kind.PAD)]
    if node.op_type == "Scan":
        if row.scan == "none":
            return [Obstacle(name, "has no Scan", kind=Kind.SCAN)]
        if row.scan == "static" and not static:
            return [Obstacle(name, "gives a Scan with dynamic dimensions the wrong output shape", True, Kind.SCAN)]
        if row.scan_backward != "exact" and any(any(attribute(node, f"scan_{kind}_directions", []))
                                                for kind in ("input", "output")):
            silent = row.scan_backward == "wrong"
            return [Obstacle(name, "computes a Scan running backwards otherwise than ONNX" if silent
                             else "has no Scan running backwards", silent, Kind.SCAN)]
        if not row.scan_squeeze and any(n.op_type == "Squeeze" for n in _body(node)):
            return [Obstacle(name, "fails to compile a Squeeze in a Scan's step", kind=Kind.SCAN)]
    if shapes is not None and static and node.op_type == "Squeeze" and not row.squeezes_unknown and \
            (shapes.get(node.input[0]) is None or None in shapes[node.input[0]]):
        return [Obstacle(name, "fails to compile a Squeeze of a tensor whose shape it cannot fix "
                               "('tensor.collapse_shape')", kind=Kind.SHAPE)]
    if node.op_type == "If" and (not row.if_shapes and any(n.op_type == "Shape" for n in _body(node))
                                 or shapes is not None and not row.if_unranked
                                 and any(o and o not in shapes for o in node.output)):
        return [Obstacle(name, "fails on an If whose branches compute shapes" if not row.if_shapes else
                               "fails on an If whose outputs' rank shape inference leaves unknown", kind=Kind.IF)]
    if node.op_type == "Conv" and not row.computed_conv_weight and node.input[1] not in constants:
        return [Obstacle(name, "takes a Conv's weight only as a constant (KeyError converting a computed one)",
                         kind=Kind.OP)]
    if node.op_type == "Gemm" and not row.computed_gemm_bias and len(node.input) > 2 and node.input[2] \
            and node.input[2] not in constants:
        return [Obstacle(name, "has no Gemm whose C is computed", kind=Kind.GEMM)]
    if node.op_type == "Conv" and not row.batched_conv and _batch_past_one((shapes or {}).get(node.input[0])):
        return [Obstacle(name, "takes a Conv's axis 0 for the batch axis its blobs lack: a Conv over several "
                               "images at once does not load", kind=Kind.BATCHED)]
    if node.op_type == "Concat" and not row.empty_concat and any(
            name in constants and np.size(constants[name]) == 0 for name in node.input):
        return [Obstacle(name, "loads a Concat of an empty constant wrongly or not at all", True, Kind.EMPTY)]
    if node.op_type == "Split" and not row.unsized_split and not slot(node.input, 1) \
            and attribute(node, "split") is None:
        return [Obstacle(name, "crashes on a Split whose sizes are not given", kind=Kind.SPLIT)]
    if node.op_type == "Slice" and row.negative_step_slice == "dropped" and _negative_step(node, constants):
        return [Obstacle(name, "drops a Slice with step -1", True, Kind.SLICE)]
    if node.op_type == "Gather" and not row.rank5_gather and np.ndim(constants.get(node.input[1], [])) == 0 \
            and len((shapes or {}).get(node.input[0]) or []) == 5:
        return [Obstacle(name, "has no Gather of one index from a tensor of rank 5", kind=Kind.OP)]
    if node.op_type in ("ReduceSum", "ReduceMean") and not row.reduces_one_axis_input and slot(node.input, 1) \
            and np.size(constants.get(node.input[1], [])) == 1:
        return [Obstacle(name, f"reduces nothing in a {node.op_type} of one axis given as an input", True,
                         Kind.REDUCE)]
    if node.op_type == "Slice" and not row.strided_slice and _strided(node, constants):
        return [Obstacle(name, "has no Slice of a step other than 1 and -1", kind=Kind.SLICE)]
    return []


def _recurrent(node, row: Runtime, constants: dict, readers: dict, name: str) -> list:
    op, found = node.op_type, []
    direction = attribute(node, "direction", FORWARD)
    if direction == REVERSE and row.reverse_runs_forward and op in row.recurrent:
        found.append(Obstacle(name, f"computes a reverse {op} forward", True, Kind.DIRECTION))
    elif direction not in row.recurrent.get(op, ()):
        found.append(Obstacle(name, f"has no {op}" if op not in row.recurrent else f"has no {direction} {op}",
                              kind=Kind.DIRECTION if op in row.recurrent else Kind.OP))
        return found
    if op == "GRU" and not attribute(node, "linear_before_reset", 0) and row.gru_linear_before_reset_0 != "exact":
        silent = row.gru_linear_before_reset_0 == "as 1"
        found.append(Obstacle(name, ("computes a GRU of linear_before_reset=0 as 1" if silent else
                                     "has no GRU with linear_before_reset=0") + " (Keras's reset_after=False)",
                              silent, Kind.OP))
    found.extend(_activations(node, row.activations.get(op), 2 if direction == BIDIRECTIONAL else 1, name))
    lengths = slot(node.input, SEQUENCE_LENS)
    if lengths:
        if row.sequence_lens == "ignored" and lengths not in constants:
            found.append(Obstacle(name, f"ignores {op}'s computed sequence_lens", True, Kind.SEQUENCE_LENS))
        elif row.sequence_lens == "constant" and lengths not in constants:
            found.append(Obstacle(name, f"takes {op}'s sequence_lens only as a constant", kind=Kind.SEQUENCE_LENS))
        elif row.sequence_lens == "none":
            found.append(Obstacle(name, f"has no {op} with sequence_lens", kind=Kind.SEQUENCE_LENS))
    if op == "LSTM" and slot(node.input, PEEPHOLES) and row.peepholes != "exact":
        found.append(Obstacle(name, "computes LSTM peepholes otherwise than ONNX", row.peepholes == "wrong",
                              Kind.PEEPHOLES))
    if slot(node.output, Y_H) and slot(node.output, Y_H) in readers and op not in row.reads_y_h:
        found.append(Obstacle(name, f"fails on a read Y_h of {op}", kind=Kind.Y_H))
    if op == "LSTM" and slot(node.output, Y_C) and slot(node.output, Y_C) in readers and not row.reads_y_c:
        found.append(Obstacle(name, "fails on a read Y_c of LSTM", kind=Kind.OP))
    if row.y_read_squeezed and direction == FORWARD and not _squeezed(node.output[Y], readers,
                                                                                          constants):
        found.append(Obstacle(name, f"maps {op} only when its Y alone is read, by a Squeeze of its axis 1",
                              kind=Kind.Y_H))
    if row.y_read_squeezed and direction == BIDIRECTIONAL and not _merged(node, readers, constants):
        found.append(Obstacle(name, f"maps a bidirectional {op} only when its Y alone is read, by a Transpose(0, 2, "
                                    "1, 3) and a Reshape to [T, B, 2H]", kind=Kind.Y_H))
    if not row.transposes_shared_y and shared_y_transposes(node, readers, constants):
        found.append(Obstacle(name, f"computes a Transpose of {op}'s squeezed Y wrongly where another recurrent node "
                                    "reads that Y too", True, Kind.Y_H))
    if not row.given_states and any(slot(node.input, s) for s in (INITIAL_H, INITIAL_C)):
        found.append(Obstacle(name, f"maps {op} only without initial states", kind=Kind.GIVEN_STATES))
    if op in row.initial_states_needed and not slot(node.input, INITIAL_H):
        found.append(Obstacle(name, f"fails on {op} without initial states", kind=Kind.INITIAL_STATES))
    elif op in row.all_states_need_initial and not slot(node.input, INITIAL_H) and \
            all(slot(node.output, k) in readers for k in (Y, Y_H, Y_C)):
        found.append(Obstacle(name, f"fails on {op} without initial states whose Y, Y_h and Y_c are all read",
                              kind=Kind.INITIAL_STATES))
    return found


def _activations(node: onnx.NodeProto, facts, directions: int, name: str) -> list:
    """The obstacle of ``node``'s activation functions for a runtime computing ``facts`` of them (none: every
    list, or the list written is one it computes)."""
    op, written = node.op_type, attribute(node, "activations", [])
    if facts is None or not written:
        return []
    defaults = list(DEFAULT_ACTIVATIONS[op]) * directions
    wrong = {n for n, d in zip(written, defaults) if n != d} if facts.defaults_only else set()
    wrong |= set() if facts.computes is None else set(written) - facts.computes
    half = len(written) // directions
    if not wrong and not facts.per_direction and directions == 2 and written[:half] != written[half:]:
        return [Obstacle(name, f"computes both directions of {op} with the forward one's functions", True,
                         Kind.ACTIVATIONS)]
    if not wrong:
        return []
    silent = facts.silent is True or (bool(facts.silent) and wrong <= facts.silent)
    what = ", ".join(sorted(wrong))
    return [Obstacle(name, f"computes {op}'s {what} otherwise than ONNX" if silent else f"has no {op} with {what}",
                     silent, Kind.ACTIVATIONS)]


def _negative_step(node: onnx.NodeProto, constants: dict) -> bool:
    return _steps_may(node, constants, lambda steps: steps < 0)


def _strided(node: onnx.NodeProto, constants: dict) -> bool:
    return _steps_may(node, constants, lambda steps: np.abs(steps) > 1)


def _steps_may(node: onnx.NodeProto, constants: dict, test) -> bool:
    """Whether a Slice's steps are given and, computed or constant, may pass ``test`` (on their array)."""
    given = slot(node.input, 4)
    steps = constants.get(given) if given else None
    return bool(given) and (steps is None or bool(test(np.asarray(steps)).any()))


def _body(node: onnx.NodeProto) -> list:
    return [n for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for _, n in nodes_of(a.g)]


def _squeezed(y: str, readers: dict, constants: dict) -> bool:
    """A recurrent node's Y read once, by a Squeeze of axis 1 (its axes given as an attribute or a constant)."""
    found = readers.get(y, []) if y else []
    return len(found) == 1 and squeezes_axis_1(found[0], constants)


def shared_y_transposes(node: onnx.NodeProto, readers: dict, constants: dict, shapes: Optional[dict] = None) -> list:
    """(the Squeeze, the Transpose, the Transposes back) reading a one-direction recurrent node's Y batch-major, as
    Transpose(1, 0, 2) of its Squeeze of axis 1, where a recurrent node reads that Squeeze too: directly, or
    through the batch-major Transpose and a Transpose(1, 0, 2) back (listed third; with ``shapes``, a Reshape back
    to the squeezed sequence's own static shape counts too: tf2onnx's swap back at batch 1)."""
    if attribute(node, "direction", FORWARD) == BIDIRECTIONAL or not slot(node.output, Y):
        return []
    found = []
    for squeeze in [r for r in readers.get(node.output[Y], []) if squeezes_axis_1(r, constants)]:
        after = [r for r in readers.get(squeeze.output[0], []) if r is not None]
        for swap in [r for r in after if _swaps_0_1(r)]:
            back = [r for r in readers.get(swap.output[0], []) if _swaps_0_1(r) or _swapped_back(
                r, (shapes or {}).get(squeeze.output[0]), shapes or {})]
            recurrent = any(r.op_type in RECURRENT_OPS for r in after) or any(
                r is not None and r.op_type in RECURRENT_OPS for b in back for r in readers.get(b.output[0], []))
            if recurrent:
                found.append((squeeze, swap, back))
    return found


def _swapped_back(node: Optional[onnx.NodeProto], shape: Optional[list], shapes: dict) -> bool:
    """Whether ``node`` is a Reshape back to the static ``shape`` [T, B, H] of a sequence it reads swapped, where
    T or B is 1: the same values as the swap back (tf2onnx's at batch 1)."""
    if node is None or node.op_type != "Reshape" or not shape or None in shape or len(shape) != 3:
        return False
    return (shape[0] == 1 or shape[1] == 1) and shapes.get(node.output[0]) == list(shape)


def _swaps_0_1(node: Optional[onnx.NodeProto]) -> bool:
    return node is not None and node.op_type == "Transpose" and list(attribute(node, "perm", [])) == [1, 0, 2]


def _merged(node: onnx.NodeProto, readers: dict, constants: dict) -> bool:
    """A bidirectional node's Y read once, by a Transpose(0, 2, 1, 3) read once, by a Reshape to [T, B, 2H]."""
    found = readers.get(node.output[Y], []) if node.output and node.output[Y] else []
    if len(found) != 1 or found[0] is None or not found[0].output:
        return False
    after = readers.get(found[0].output[0], [])
    return len(after) == 1 and merges_directions(found[0], after[0], int(attribute(node, "hidden_size", 0)),
                                                 constants)


def _batch_past_one(shape) -> bool:
    """Whether a tensor of ``shape`` (None: unknown rank) may hold more than one row on axis 0: a dimension
    shape inference leaves unknown may."""
    return bool(shape) and (shape[0] is None or shape[0] > 1)


def squeezes_axis_1(node: Optional[onnx.NodeProto], constants: Optional[dict] = None) -> bool:
    """Whether ``node`` is a Squeeze of axis 1 alone (its axes an attribute or a constant input)."""
    if node is None or node.op_type != "Squeeze":
        return False
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and constants is not None:
        axes = constants.get(node.input[1])
    return axes is not None and [int(a) for a in np.asarray(axes).ravel()] == [1]


def merges_directions(transpose: Optional[onnx.NodeProto], reshape: Optional[onnx.NodeProto], hidden: int,
                      constants: dict) -> bool:
    """Whether ``transpose`` then ``reshape`` read a bidirectional Y [T, 2, B, H] as [T, B, 2H]."""
    if transpose is None or reshape is None or transpose.op_type != "Transpose" or reshape.op_type != "Reshape":
        return False
    shape = constants.get(reshape.input[1]) if len(reshape.input) > 1 else None
    return list(attribute(transpose, "perm", [])) == [0, 2, 1, 3] and shape is not None and \
        np.size(shape) == 3 and int(np.ravel(shape)[2]) == 2 * hidden and all(int(d) > 0 for d in np.ravel(shape))
