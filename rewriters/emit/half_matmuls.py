"""A written model's float16 ``MatMul`` of a time-major swap, turned into the swap of a ``MatMul``.

onnxruntime 1.23 to 1.32 ends the process (a segmentation fault, nothing to catch) while it creates a
session on a float16 ``Transpose(perm=[1, 0, 2])`` read by a ``MatMul`` with a constant 2-D right side:
at its default optimization level it fuses the two into one node and its NCHWc layout pass then fails
on it (measured on hand-built graphs: either pass disabled, the session loads; float32, another perm or
a right side fed at run time load too; 1.19 loads it). The onnxruntime form writes that shape for a
float16 SimpleRNN (its input projection reads the time-major input), and a model's own layers may
have it. ``MatMul(Transpose(x), W)`` equals ``Transpose(MatMul(x, W))`` (the product runs over the
last axis, which the swap keeps), and onnxruntime loads the latter.
"""
from __future__ import annotations

import logging

import onnx
from onnx import helper

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
            if node.op_type == "Constant":
                for attribute in node.attribute:
                    if attribute.name == "value":
                        constants[node.output[0]] = (attribute.t.data_type, len(attribute.t.dims))
        readers: dict = {}
        kept_for = {value.name for value in graph.output}  # and every name a subgraph reads, from outside or not
        for node in graph.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    rewritten += _graph(attribute.g, constants)
                    kept_for |= _names_read(attribute.g)
        producer = {output: node for node in graph.node for output in node.output}
        nodes, here = [], 0
        for node in graph.node:
            swap = producer.get(node.input[0]) if node.op_type == "MatMul" and len(node.input) == 2 else None
            if swap is None or not _swaps_time(swap) or constants.get(node.input[1]) != (onnx.TensorProto.FLOAT16, 2):
                nodes.append(node)
                continue
            product = f"{node.output[0]}__before_swap"
            nodes.append(helper.make_node("MatMul", [swap.input[0], node.input[1]], [product], name=node.name))
            nodes.append(helper.make_node("Transpose", [product], list(node.output), name=f"{node.name}__swap",
                                          perm=SWAP))
            readers[swap.output[0]] -= 1  # a swap no node reads any more goes (two MatMuls may read one)
            here += 1
        if not here:
            return rewritten
        kept = []
        for node in nodes:
            if not (_swaps_time(node) and readers.get(node.output[0]) == 0 and node.output[0] not in kept_for):
                kept.append(node)
        del graph.node[:]
        graph.node.extend(kept)
        return rewritten + here
    except Exception as error:  # noqa: BLE001 - this graph stays as written, exact
        logger.warning("a float16 MatMul of a swap of axes 0 and 1 stays (onnxruntime 1.23-1.32 ends the process "
                       "loading it): internal error: %s: %s", type(error).__name__, error, exc_info=True)
        return rewritten


def _swaps_time(node: onnx.NodeProto) -> bool:
    if node.op_type != "Transpose":
        return False
    perm = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"), None)
    return perm is not None and list(perm) == SWAP


def _names_read(graph: onnx.GraphProto) -> set:
    """Every name a node of ``graph`` or of its subgraphs reads."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                names |= _names_read(attribute.g)
    return names
