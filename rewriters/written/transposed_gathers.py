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
import onnx.numpy_helper
from onnx import helper

from .graph import attributes, set_nodes

logger = logging.getLogger(__name__)


def fold_transposed_gathers(model_proto: onnx.ModelProto) -> int:
    """Rewrite every ``Transpose(perm=[1, 0, 2])`` of the main graph whose input is read by it alone
    and is an axis-0 ``Gather`` from a ``Flatten`` (2-D data, so a 2-D index) into that gather with
    its index transposed. Returns how many. The graph changes only once the whole rewrite is built."""
    return fold_graph(model_proto.graph)


def fold_graph(graph: onnx.GraphProto) -> int:
    """:func:`fold_transposed_gathers` on one graph (an ``If`` branch's too: its outputs count as read).
    A ``Where`` between the gather and the transpose, selecting on a mask unsqueezed at axis 2 against
    a scalar (a restore in zero mode), moves with it: its mask is transposed
    instead (bools, one per step and row) and the outputs still take one pass fewer."""
    written = list(graph.node)  # held, so that each node keeps its wrapper (and ``id``) throughout
    producer = {output: node for node in written for output in node.output}
    readers: dict = {}
    for node in written:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    graph_outputs = {value.name for value in graph.output}
    given = {id(node): attributes(node) for node in written}
    scalars = {tensor.name for tensor in graph.initializer if not tensor.dims} | {
        node.output[0] for node in written if node.op_type == "Constant" and "value" in given[id(node)]
        and not given[id(node)]["value"].dims}
    constant_ints = {tensor.name: list(onnx.numpy_helper.to_array(tensor)) for tensor in graph.initializer
                     if tensor.data_type == onnx.TensorProto.INT64 and len(tensor.dims) == 1 and tensor.dims[0] <= 4}

    def read_once(name: str) -> bool:
        return readers.get(name) == 1 and name not in graph_outputs

    def unsqueezed_at_2(name: str) -> bool:
        node = producer.get(name)
        if node is None or node.op_type != "Unsqueeze":
            return False
        axes = given[id(node)].get("axes") or (constant_ints.get(node.input[1]) if len(node.input) > 1 else None)
        return axes is not None and [int(axis) for axis in axes] == [2]

    folded = {}  # id(transpose) -> (the gather it becomes, the Where between them or None)
    for node in written:
        if node.op_type != "Transpose" or given[id(node)].get("perm") != [1, 0, 2]:
            continue
        source, where = producer.get(node.input[0]), None
        if source is not None and source.op_type == "Where" and read_once(source.output[0]) \
                and source.input[2] in scalars and unsqueezed_at_2(source.input[0]):
            source, where = producer.get(source.input[1]), source
        gather = source
        if gather is None or gather.op_type != "Gather" or given[id(gather)].get("axis", 0) != 0 \
                or not read_once(gather.output[0]):
            continue
        data = producer.get(gather.input[0])
        if data is None or data.op_type != "Flatten":
            continue
        folded[id(node)] = (gather, where)
    if not folded:
        return 0
    moved = {id(part) for pair in folded.values() for part in pair if part is not None}
    nodes, masks = [], {}  # masks: each Where's mask transposed once, however many read it
    for node in written:
        if id(node) in moved:
            continue  # written where its transpose was: its index's transpose is built there too
        if id(node) not in folded:
            nodes.append(node)
            continue
        gather, where = folded[id(node)]
        index = gather.output[0] + "_rows_batch_major"
        nodes.append(helper.make_node("Transpose", [gather.input[1]], [index], perm=[1, 0],
                                      name=gather.name + "_rows_batch_major"))
        gathered = list(node.output) if where is None else [gather.output[0] + "_batch_major"]
        nodes.append(helper.make_node("Gather", [gather.input[0], index], gathered, axis=0, name=gather.name))
        if where is not None:
            mask = where.input[0]
            if mask not in masks:
                masks[mask] = mask + "_batch_major"
                nodes.append(helper.make_node("Transpose", [mask], [masks[mask]], perm=[1, 0, 2],
                                              name=where.name + "_mask_batch_major"))
            nodes.append(helper.make_node("Where", [masks[mask], gathered[0], where.input[2]], list(node.output),
                                          name=where.name))
    set_nodes(graph, nodes)
    return len(folded)
