"""A written model's row gathers that feed a swap of their first two axes, turned into one gather.

A masked layer's outputs come back through a gather of rows (``Gather(Flatten(Y), rows)``, rows
[T, B]: :meth:`.mask_tensors.MaskTensors.restore_from_node`), and Keras's graph then moves them to
batch-major order (``Transpose`` with ``perm=[1, 0, 2]``). Gathering with the index transposed
instead (a [T, B] integer tensor) gives the same tensor, bit for bit, and saves a pass over the
outputs. Runs on the written ModelProto, after tf2onnx's optimizers (which move transposes).
"""
from __future__ import annotations

import logging

import onnx
from onnx import helper

logger = logging.getLogger(__name__)


def fold_transposed_gathers(model_proto: onnx.ModelProto) -> int:
    """Rewrite every ``Transpose(perm=[1, 0, 2])`` of the main graph whose input is read by it alone
    and is an axis-0 ``Gather`` from a ``Flatten`` (2-D data, so a 2-D index) into that gather with
    its index transposed. Returns how many. The graph changes only once the whole rewrite is built."""
    try:
        return fold_graph(model_proto.graph)
    except Exception as error:  # noqa: BLE001 - the model stays as written, exact
        logger.warning("the outputs' transposes stay: internal error: %s: %s", type(error).__name__, error,
                       exc_info=True)
        return 0


def fold_graph(graph: onnx.GraphProto) -> int:
    """:func:`fold_transposed_gathers` on one graph (an ``If`` branch's too: its outputs count as read)."""
    written = list(graph.node)  # held, so that each node keeps its wrapper (and ``id``) throughout
    producer = {output: node for node in written for output in node.output}
    readers: dict = {}
    for node in written:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    graph_outputs = {value.name for value in graph.output}
    attributes = {id(node): {a.name: helper.get_attribute_value(a) for a in node.attribute} for node in written}
    folded = {}  # id(transpose) -> the gather it becomes
    for node in written:
        if node.op_type != "Transpose" or attributes[id(node)].get("perm") != [1, 0, 2]:
            continue
        gather = producer.get(node.input[0])
        if gather is None or gather.op_type != "Gather" or attributes[id(gather)].get("axis", 0) != 0 \
                or readers.get(gather.output[0]) != 1 or gather.output[0] in graph_outputs:
            continue
        data = producer.get(gather.input[0])
        if data is None or data.op_type != "Flatten":
            continue
        folded[id(node)] = gather
    if not folded:
        return 0
    gathers = {id(gather) for gather in folded.values()}
    nodes = []
    for node in written:
        if id(node) in gathers:
            continue  # written where its transpose was: its index's transpose is built there too
        gather = folded.get(id(node))
        if gather is None:
            nodes.append(node)
            continue
        index = gather.output[0] + "_rows_batch_major"
        nodes.append(helper.make_node("Transpose", [gather.input[1]], [index], perm=[1, 0],
                                      name=gather.name + "_rows_batch_major"))
        nodes.append(helper.make_node("Gather", [gather.input[0], index], list(node.output), axis=0,
                                      name=gather.name))
    del graph.node[:]
    graph.node.extend(nodes)
    return len(folded)

