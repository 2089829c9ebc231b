"""A written model's ``ReverseSequence`` of every row's whole length, as a ``Slice`` with step -1.

TensorFlow's ``ReverseV2`` along the time axis (Keras's ``go_backwards``, a backward layer of a
``Bidirectional``) becomes, in tf2onnx, ``ReverseSequence(x, lengths)`` with ``lengths`` each row's whole
length: ``Expand(Gather(Shape(x), time_axis), ...)``. tract has no ``ReverseSequence`` (it refuses the
model) and onnx2torch neither; a ``Slice`` over the time axis from its last step backwards reads every
element from where the reversal reads it, and every consumer has it. Lengths the graph computes
otherwise (a mask's) are left as they are (the portable form gathers them: :mod:`.gathered_reversal`).
Runs on the written ModelProto, in every form, on the main graph and every subgraph.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import attribute, producers_of, set_nodes, subgraphs

logger = logging.getLogger(__name__)

# ops whose output holds, in every element, a value of their first input's elements (all of which are one)
_SAME_VALUE = frozenset({"Cast", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Tile", "Flatten"})


def full_reversals_as_slices(model_proto: onnx.ModelProto) -> int:
    """Rewrite each such ``ReverseSequence`` of the model; returns how many."""
    return _graph(model_proto.graph, {})


def _graph(graph: onnx.GraphProto, outer: dict) -> int:
    """The rewrite of ``graph``'s subgraphs, then of ``graph`` itself, which changes only once its rewrite
    is built: a failure leaves this graph as written (exact) and says so."""
    count = 0
    try:
        constants = dict(outer)
        constants.update({t.name: t for t in graph.initializer})
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                constants[node.output[0]] = node.attribute[0].t
        for node in graph.node:
            count += sum(_graph(sub, constants) for sub in subgraphs(node))
        producer = producers_of(graph)
        made, replaced, chains = [], {}, set()
        for position, node in enumerate(graph.node):
            if node.op_type != "ReverseSequence" or node.domain not in ("", "ai.onnx"):
                continue
            time_axis = attribute(node, "time_axis", 0)
            chain = _whole_length(node.input[1], node.input[0], time_axis, producer, constants)
            if not chain:
                continue
            chains.update(chain)
            base = node.name or node.output[0]
            params = [numpy_helper.from_array(np.array(value, np.int64), f"{base}_slice_{part}") for part, value in
                      (("starts", [-1]), ("ends", [np.iinfo(np.int64).min]), ("axes", [time_axis]), ("steps", [-1]))]
            made.extend(params)
            replaced[position] = helper.make_node("Slice", [node.input[0]] + [p.name for p in params],
                                                  list(node.output), name=base)
        if not replaced:
            return count
        nodes = _live([replaced.get(position, node) for position, node in enumerate(graph.node)], graph, chains)
        set_nodes(graph, nodes)  # the graph changes only once its rewrite is built
        graph.initializer.extend(made)
        return count + len(replaced)
    except Exception as error:  # noqa: BLE001 - this graph stays as written, exact: an inner guard, per graph
        logger.debug("rewriting a graph's whole-length reversals raised", exc_info=True)
        logger.warning("a ReverseSequence of every row's whole length stays: internal error: %s: %s",
                       type(error).__name__, error)
        return count


def _whole_length(lengths: str, sequence: str, time_axis: int, producer: dict, constants: dict) -> set:
    """The names of the nodes computing ``lengths`` where every element of it is ``sequence``'s size along
    ``time_axis`` (a ``Gather`` of that axis, or a one-element ``Slice`` of it, of ``Shape(sequence)`` or
    of the shape of what ``sequence`` transposes, through ops that keep one value); else an empty set."""
    node, chain = producer.get(lengths), set()
    for _ in range(16):
        if node is None or node.op_type not in _SAME_VALUE:
            break
        chain.add(node.name)
        node = producer.get(node.input[0])
    if node is None or node.op_type not in ("Gather", "Slice"):
        return set()
    shape = producer.get(node.input[0])
    if shape is None or shape.op_type != "Shape":
        return set()
    axis = time_axis
    if shape.input[0] != sequence:  # tf2onnx reads the length off the tensor it transposes time-major
        swap = producer.get(sequence)
        perm = attribute(swap, "perm") \
            if swap is not None and swap.op_type == "Transpose" else None
        if not perm or swap.input[0] != shape.input[0] or time_axis >= len(perm):
            return set()
        axis = perm[time_axis]
    chain.update((node.name, shape.name))
    chain.discard("")  # an unnamed node stays
    return chain if _reads_axis(node, _start_of(shape), axis, producer, constants) else set()


def _start_of(shape: onnx.NodeProto) -> int:
    return attribute(shape, "start", 0)


def _reads_axis(node: onnx.NodeProto, start: int, time_axis: int, producer: dict, constants: dict) -> bool:
    """Whether a Gather or Slice of a ``Shape`` starting at axis ``start`` reads axis ``time_axis`` alone."""
    if start < 0:
        return False
    if node.op_type == "Gather":
        index = _constant(node.input[1], producer, constants)
        return index is not None and index.size == 1 and int(index.reshape(-1)[0]) + start == time_axis
    begin, end = (_constant(name, producer, constants) if len(node.input) > k else None
                  for k, name in ((1, node.input[1]), (2, node.input[2] if len(node.input) > 2 else "")))
    axes = _constant(node.input[3], producer, constants) if len(node.input) > 3 and node.input[3] else None
    steps = _constant(node.input[4], producer, constants) if len(node.input) > 4 and node.input[4] else None
    if begin is None or end is None or begin.size != 1 or end.size != 1:
        return False
    if (axes is not None and int(axes.reshape(-1)[0]) != 0) or (steps is not None and int(steps.reshape(-1)[0]) != 1):
        return False
    first = int(begin.reshape(-1)[0])
    return first >= 0 and int(end.reshape(-1)[0]) == first + 1 and first + start == time_axis


def _constant(name: str, producer: dict, constants: dict) -> Optional[np.ndarray]:
    if name in constants:
        return numpy_helper.to_array(constants[name])
    node = producer.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _live(nodes: list, graph: onnx.GraphProto, chains: set) -> list:
    """``nodes`` less those of the lengths' ``chains`` (node names) nothing reads now, until none."""
    outputs = {o.name for o in graph.output}
    while True:
        read = outputs | _names_read(nodes)
        live = [node for node in nodes if node.name not in chains or any(out in read for out in node.output)]
        if len(live) == len(nodes):
            return nodes
        nodes = live


def _names_read(nodes) -> set:
    """Every name ``nodes`` or their subgraphs read."""
    read = set()
    for node in nodes:
        read.update(node.input)
        for sub in subgraphs(node):
            read |= _names_read(sub.node)
    return read
