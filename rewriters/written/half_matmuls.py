"""A written model's ``MatMul`` of a float16 time-major swap, turned into the swap of a ``MatMul``.

onnxruntime 1.23 to 1.32 ends the process (a segmentation fault, nothing to catch) while it creates a
session on a float16 ``Transpose(perm=[1, 0, 2])`` read by a ``MatMul`` with a constant 2-D right side:
at its default optimization level it fuses the two into one node and its NCHWc layout pass then fails
on it (measured on hand-built graphs: either pass disabled, the session loads; float32, another perm or
a right side fed at run time load too; 1.19 loads it). It also ends the process with ``Cast`` or
``Identity`` nodes between a swap and the ``MatMul``, whatever the types (measured: a float16 or float64
swap cast to float32, cast back to float16, or passed through an Identity: the Scan form's hoisted input
projection of a ``mixed_float16`` cell whose step casts its input wrote the first). The onnxruntime form
writes the plain shape for a float16 SimpleRNN (its input projection reads the time-major input), and a
model's own layers may have any of them. ``MatMul(Cast(Transpose(x)), W)`` equals
``Transpose(MatMul(Cast(x), W))`` (the product runs over the last axis, which the swap keeps; a cast is
elementwise), and onnxruntime loads the latter. Only a float32 swap read by the ``MatMul`` itself, which
loads, is left as it is.
"""
from __future__ import annotations

import logging

import onnx
from onnx import helper

from .graph import attribute, producers_of, set_nodes, subgraphs

logger = logging.getLogger(__name__)

SWAP = [1, 0, 2]


def swap_half_matmuls(model_proto: onnx.ModelProto) -> int:
    """Rewrite each such ``MatMul`` of the model (subgraphs included) as its product first, the swap
    after. Returns how many."""
    return _graph(model_proto.graph, {})


def _graph(graph: onnx.GraphProto, outer_constants: dict) -> int:
    """The rewrite of ``graph``'s subgraphs, then of ``graph`` itself, which changes only once its rewrite
    is built: a failure leaves this graph as written (exact) and says so."""
    rewritten = 0
    try:
        constants = dict(outer_constants)  # a name -> (element type, rank) of the constants this graph sees
        constants.update({t.name: (t.data_type, len(t.dims)) for t in graph.initializer})
        for node in graph.node:
            value = attribute(node, "value") if node.op_type == "Constant" else None
            if value is not None:
                constants[node.output[0]] = (value.data_type, len(value.dims))
        kept_for = {value.name for value in graph.output}  # and every name a subgraph reads, from outside or not
        for node in graph.node:
            for sub in subgraphs(node):
                rewritten += _graph(sub, constants)
                kept_for |= _names_read(sub)
        producer = producers_of(graph)
        nodes, replaced, here = [], set(), 0
        moved_casts: dict = {}  # a cast's output -> its cast before the swap, made once for every MatMul it feeds
        for node in graph.node:
            found = _cast_chain(node, producer, constants)
            if found is None or not _swaps_time(found[0]) or not _crashes(found, node, constants):
                nodes.append(node)
                continue
            swap, between = found  # the casts and identities, nearest the swap first
            factor = swap.input[0]
            for cast in between:
                if cast.op_type != "Cast":
                    continue
                if cast.output[0] not in moved_casts:
                    moved = moved_casts[cast.output[0]] = f"{cast.output[0]}__before_swap"
                    nodes.append(helper.make_node("Cast", [factor], [moved], name=moved, to=_cast_type(cast)))
                factor = moved_casts[cast.output[0]]
            product = f"{node.output[0]}__before_swap"
            nodes.append(helper.make_node("MatMul", [factor, node.input[1]], [product], name=node.name))
            nodes.append(helper.make_node("Transpose", [product], list(node.output), name=f"{node.output[0]}__swap",
                                          perm=SWAP))
            replaced |= {swap.name} | {step.name for step in between}
            here += 1
        if not here:
            return rewritten
        kept = _without_unread(nodes, replaced, kept_for)
        set_nodes(graph, kept)
        return rewritten + here
    except Exception as error:  # noqa: BLE001 - this graph stays as written, exact
        logger.warning("a float16 MatMul of a swap of axes 0 and 1 stays (onnxruntime 1.23-1.32 ends the process "
                       "loading it): internal error: %s: %s", type(error).__name__, error, exc_info=True)
        return rewritten


def _cast_chain(node: onnx.NodeProto, producer: dict, constants: dict):
    """(what makes the left factor of ``node`` behind any ``Cast`` and ``Identity`` nodes, those nodes nearest
    it first) where ``node`` is a ``MatMul`` with a constant 2-D right side; else None."""
    if node.op_type != "MatMul" or len(node.input) != 2:
        return None
    right = constants.get(node.input[1])
    if right is None or right[1] != 2:
        return None
    between, source = [], producer.get(node.input[0])
    while source is not None and source.op_type in ("Cast", "Identity"):
        between.insert(0, source)
        source = producer.get(source.input[0])
    return (source, between) if source is not None else None


def _crashes(chain: tuple, node: onnx.NodeProto, constants: dict) -> bool:
    """Whether onnxruntime ends the process loading a chain (:func:`_cast_chain`) of a swap: through casts or
    identities, whatever the types; read directly, in float16 (the constant right side's type)."""
    _, between = chain
    return bool(between) or constants[node.input[1]][0] == onnx.TensorProto.FLOAT16


def _cast_type(node: onnx.NodeProto) -> int:
    return attribute(node, "to")


def _without_unread(nodes: list, replaced: set, kept_for: set) -> list:
    """``nodes`` without the swaps and casts a rewrite replaced that nothing reads any more (two MatMuls
    may read one swap; a subgraph or a graph output may read it too)."""
    while True:
        read = set(kept_for) | {name for node in nodes for name in node.input}
        unread = [node for node in nodes if node.name in replaced and not any(o in read for o in node.output)]
        if not unread:
            return nodes
        nodes = [node for node in nodes if node not in unread]


def _swaps_time(node: onnx.NodeProto) -> bool:
    if node.op_type != "Transpose":
        return False
    perm = attribute(node, "perm", None)
    return perm is not None and list(perm) == SWAP


def _names_read(graph: onnx.GraphProto) -> set:
    """Every name a node of ``graph`` or of its subgraphs reads."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for sub in subgraphs(node):
            names |= _names_read(sub)
    return names
