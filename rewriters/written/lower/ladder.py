"""A written model lowered, node by node, only as far as one runtime's row of the table needs.

Fixed input shapes first fold what they decide (:mod:`.fold`). The rungs, highest first: the node as
it is; its absent initial states given as zeros and a read
``Y_h`` taken from ``Y`` (:mod:`.forward`); a backward pass as a forward node over its input reversed
(:mod:`.forward`); its steps written out for the fixed time length (:mod:`.steps`, :mod:`.scan_steps`).
Each node climbs down one rung at a time while :func:`..obstacles.node_obstacles` names something its
runtime lacks, by the obstacle's kind, never by the runtime's name. Other ops a runtime lacks or reads
otherwise than ONNX are written in ops it computes (:mod:`.op_rungs`: a ``Slice`` of step -1 it drops as
its pieces' ``Concat`` in reverse order, a ``Split`` given its sizes, ...). What is left is returned: the
conversion refuses it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx

from ...obstacles import Obstacle, node_obstacles, obstacles
from ...runtimes import INITIAL_C, INITIAL_H, RECURRENT_OPS, Kind, Runtime
from ..builder import Writer
from ..graph import (
    attribute,
    constant_values,
    names_of,
    opset_of,
    producers_of,
    readers_of,
    static_shapes,
    sweep,
)
from .float_masks import bools_as_floats
from .fold import fold_static
from .forward import zero_states_given
from .per_step import merged_transposes
from .rungs import Place, one_rung
from .scan_node import node_as_scan
from .steps import CannotLower

logger = logging.getLogger(__name__)
_ROUNDS = 6  # a node climbs down at most this many rungs


@dataclass
class Lowered:
    """What lowering left and did: the :class:`Obstacle` s no rung removes (a rung that cannot write a node
    adds its reason), and per recurrent node or Scan of the written model (by its name there) how the
    runtime now computes it and by which node ("" where its steps are written out); ``errors``: the internal
    errors a step was left out for, in words (the graph stays exact without that step)."""

    left: list = field(default_factory=list)
    forms: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)


def lower_for(model_proto: onnx.ModelProto, row: Runtime) -> Lowered:
    """Lower ``model_proto`` in place for ``row``'s runtime."""
    graph = model_proto.graph
    opset = opset_of(model_proto)
    reasons: list = []
    done, origin = Lowered(), {}  # origin: a node a rung made -> the written model's node it computes
    try:
        for _ in range(_ROUNDS):  # a branch taken may hold more that the fixed shapes decide
            if not fold_static(model_proto, static_shapes(model_proto)):
                break
    except Exception as error:  # noqa: BLE001 - folding only simplifies: the graph stays as it was
        done.errors.append(_contained("folding fixed shapes", error))
    for _ in range(_ROUNDS):
        shapes, constants = static_shapes(model_proto), constant_values(graph)
        changed = _parts_read_straight(graph, shapes, constants) > 0
        readers = readers_of(graph)  # read again after each rung: a rung rewrites what reads what
        for node in list(graph.node):
            found = node_obstacles(node, row, constants, True, readers, shapes)
            if not found:
                continue
            w = Writer(graph, opset, names_of(graph))
            try:
                rung = one_rung(Place(graph, node, frozenset(o.kind for o in found), row, shapes, constants, w,
                                      *_time_and_batch(node, shapes)))
            except CannotLower as error:
                reasons.append(Obstacle(node.name or node.output[0], f"cannot be written in its ops: {error}"))
            except Exception as error:  # noqa: BLE001 - the node stays as it is; the conversion refuses it
                why = _contained(f"lowering {node.name} for {row.name}", error)
                done.errors.append(why)
                reasons.append(Obstacle(node.name or node.output[0], why))
            else:
                changed |= bool(rung)
                if isinstance(rung, str) and rung:
                    _record(done, origin, node.name, rung, w.placed)
            readers = readers_of(graph)
        if not changed:
            break
    if any(o.kind == Kind.BOOL for o in obstacles(model_proto, row)):
        try:
            bools_as_floats(model_proto, opset)
        except CannotLower as error:
            reasons.append(Obstacle("mask", f"cannot write its bool arithmetic in float ops: {error}"))
    if row.batch_one:  # the size-1 batch axis kept first through moves of axes, where pnnx looks for it
        merged_transposes(graph, static_shapes(model_proto))
    _lean_nodes(graph, row, constant_values(graph))
    if not row.shared_weights:
        unshared_weights(graph)
    done.left = reasons + obstacles(model_proto, row)
    return done


def kernels_as_scans(model_proto: onnx.ModelProto, rows: list) -> list:
    """Each recurrent node of ``model_proto``'s main graph whose activations one of ``rows``' runtimes does not
    compute in its kernel written as a Scan of its own step, in place, at any time length and batch (the
    portable form: OpenVINO refuses a HardSigmoid gate, tract and onnx.reference compute the default functions
    whatever is written); returns {the node's name: (its Scans' names, a forward pass's first, why)}. A node
    with no Scan form here (a ``sequence_lens``) stays, and the report's runtimes say where it runs."""
    graph = model_proto.graph
    opset = opset_of(model_proto)
    constants, readers, written = constant_values(graph), readers_of(graph), {}
    for node in [n for n in graph.node if n.op_type in RECURRENT_OPS]:
        why = [f"{row.name} {o.why}" for row in rows for o in node_obstacles(node, row, constants, False, readers)
               if o.kind == Kind.ACTIVATIONS]
        if not why:
            continue
        w = Writer(graph, opset, names_of(graph))
        try:
            node_as_scan(graph, node, constants.get, w)
        except CannotLower as error:
            logger.info("%s stays a %s node: %s", node.name, node.op_type, error)
            continue
        written[node.name] = (tuple(n.name for n in w.placed if n.op_type == "Scan"), "; ".join(why))
    return written


def _contained(step: str, error: Exception) -> str:
    """``error`` in words, logged (its traceback at debug level): the step it stopped is left out."""
    logger.debug("%s raised", step, exc_info=True)
    why = f"internal error while {step}: {type(error).__name__}: {error}"
    logger.warning("%s", why)
    return why


def _record(done: Lowered, origin: dict, name: str, rung: str, placed: list) -> None:
    """Note that ``name`` (or the written node it stands for) is now computed as ``rung`` says, by the
    recurrent nodes among ``placed``."""
    first = origin.get(name, name)
    made = [n.name for n in placed if n.op_type in RECURRENT_OPS + ("Scan",)]
    for new in made:
        origin[new] = first
    done.forms[first] = rung if first not in done.forms or not made else f"{done.forms[first]}; {rung}"
    done.nodes[first] = made[0] if made else ""


def _lean_nodes(graph: onnx.GraphProto, row: Runtime, constants: dict) -> None:
    """Every recurrent node without what it need not compute: initial states of constant zeros (ONNX's
    default; the portable form gives them for tract) where the runtime does not need them given, and
    outputs nothing reads. The same values, less work."""
    readers = readers_of(graph)
    for node in graph.node:
        if node.op_type not in RECURRENT_OPS:
            continue
        if node.op_type not in row.initial_states_needed and zero_states_given(node, constants):
            for slot in (INITIAL_H, INITIAL_C):
                if len(node.input) > slot:
                    node.input[slot] = ""
        for k in range(1, len(node.output)):
            if node.output[k] and node.output[k] not in readers:
                node.output[k] = ""
        for names in (node.input, node.output):
            while names and not names[-1]:
                del names[-1]
    sweep(graph)


def unshared_weights(graph: onnx.GraphProto) -> int:
    """Each ``MatMul`` or ``Gemm`` of a constant weight that another one reads too given a copy of its own;
    returns how many copies were made."""
    initializers = {t.name: t for t in graph.initializer}
    seen, copies = set(), 0
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in initializers:
            continue
        if node.input[1] in seen:
            copy = onnx.TensorProto()
            copy.CopyFrom(initializers[node.input[1]])
            copy.name = f"{node.input[1]}_for_{node.name or node.output[0]}"
            graph.initializer.append(copy)
            node.input[1] = copy.name
            copies += 1
        else:
            seen.add(node.input[1])
    return copies


def _parts_read_straight(graph: onnx.GraphProto, shapes: dict, constants: dict) -> int:
    """A ``Slice`` that takes exactly one input of a ``Concat`` back (a Bidirectional layer's merge reading
    the directions its forward nodes were concatenated from) read as that input, and what is left unread
    removed; returns how many were. Exact: the same values."""
    producer = producers_of(graph)
    outputs = {o.name for o in graph.output}
    renames = {}
    for node in graph.node:
        source = producer.get(node.input[0]) if node.op_type == "Slice" else None
        if source is None or source.op_type != "Concat" or node.output[0] in outputs:
            continue
        values = [constants.get(name) for name in node.input[1:4]]
        step = constants.get(node.input[4]) if len(node.input) > 4 and node.input[4] else np.array([1])
        if any(v is None or np.size(v) != 1 for v in values) or step is None or int(np.ravel(step)[0]) != 1:
            continue
        start, end, axis = (int(np.ravel(v)[0]) for v in values)
        rank = len(shapes.get(node.input[0]) or [])
        if not rank or axis % rank != int(attribute(source, "axis")) % rank:
            continue
        sizes = [(shapes.get(name) or [None] * rank)[axis % rank] for name in source.input]
        if any(not size for size in sizes):
            continue
        offsets = np.cumsum([0] + sizes)
        for k, size in enumerate(sizes):
            if start == offsets[k] and min(end, offsets[-1]) == offsets[k] + size:
                renames[node.output[0]] = source.input[k]
    if not renames:
        return 0
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in renames:
                node.input[k] = renames[name]
    sweep(graph, nodes=True)
    return len(renames)


def _time_and_batch(node, shapes: dict) -> tuple:
    """(the static time length, the static batch) of a recurrent node's or Scan's first sequence, or 0s."""
    if node.op_type == "Scan":
        carried = len(node.input) - int(attribute(node, "num_scan_inputs"))
        axes = list(attribute(node, "scan_input_axes", [0]))
        shape = shapes.get(node.input[carried]) or []
        axis = axes[0] if axes else 0
        return (shape[axis] if len(shape) > axis and shape[axis] else 0), 0
    shape = shapes.get(node.input[0]) or []
    return (shape[0] or 0 if shape else 0), (shape[1] or 0 if len(shape) > 1 else 0)


