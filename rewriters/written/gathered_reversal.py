"""A written model's ``ReverseSequence`` nodes as element gathers, for consumers that lack the op.

TensorFlow's ``reverse_sequence`` (TF 1.x's ``bidirectional_dynamic_rnn`` reverses its input by the
rows' lengths so) becomes ONNX's ``ReverseSequence``, which tract and onnx2torch do not have. The same
tensor is ``GatherElements`` along the time axis at index ``L - 1 - t`` where ``t < L`` and ``t``
elsewhere (``L`` the row's length): every element is read from where the reversal reads it, bit for
bit. Runs on the written ModelProto of the portable form.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import attributes, opset_of, set_nodes


def reverse_sequences_as_gathers(model_proto: onnx.ModelProto) -> int:
    """Rewrite every ``ReverseSequence`` of the main graph whose input's rank is known as the gather
    above; returns how many. The graph changes only once every rewrite is built."""
    graph = model_proto.graph
    if not any(node.op_type == "ReverseSequence" for node in graph.node):
        return 0  # no shape inference over the whole model for nothing
    opset = opset_of(model_proto)
    ranks = _ranks(model_proto)
    constants, replaced = [], {}
    for position, node in enumerate(graph.node):
        if node.op_type != "ReverseSequence" or ranks.get(node.input[0]) is None:
            continue
        replaced[position] = _gathered(node, ranks[node.input[0]], opset, constants)
    if not replaced:
        return 0
    nodes = []
    for position, node in enumerate(graph.node):
        nodes.extend(replaced.get(position, [node]))
    set_nodes(graph, nodes)
    graph.initializer.extend(constants)
    return len(replaced)


def _gathered(node: onnx.NodeProto, rank: int, opset: int, constants: list) -> list:
    """The nodes computing ``node``'s output as a gather along its time axis."""
    given = attributes(node)
    time_axis, batch_axis = given.get("time_axis", 0), given.get("batch_axis", 1)  # 0 and 1, either way
    x, lengths = node.input[0], node.input[1]
    base = node.name or node.output[0]
    made = []

    def name(suffix: str) -> str:
        return f"{base}_gathered_{suffix}"

    def const(suffix: str, value) -> str:
        tensor = numpy_helper.from_array(np.asarray(value, np.int64), name(suffix))
        constants.append(tensor)
        return tensor.name

    def add(op: str, inputs: list, suffix: str, **attrs) -> str:
        made.append(helper.make_node(op, inputs, [name(suffix)], name=name(suffix), **attrs))
        return made[-1].output[0]

    def unsqueeze(value: str, axes: list, suffix: str) -> str:
        if opset >= 13:
            return add("Unsqueeze", [value, const(suffix + "_axes", axes)], suffix)
        return add("Unsqueeze", [value], suffix, axes=axes)

    shape = add("Shape", [x], "shape")
    steps = add("Gather", [shape, const("time_axis", time_axis)], "steps", axis=0)
    t = add("Range", [const("zero", 0), steps, const("one", 1)], "t")
    rows = add("Cast", [lengths], "lengths", to=onnx.TensorProto.INT64)
    # the [time, batch] (or [batch, time]) grid of each row's step and length
    t = unsqueeze(t, [1] if time_axis < batch_axis else [0], "t_grid")
    rows = unsqueeze(rows, [0] if time_axis < batch_axis else [1], "lengths_grid")
    inside = add("Less", [t, rows], "inside")
    flipped = add("Sub", [add("Sub", [rows, const("one_", 1)], "last"), t], "flipped")
    index = add("Where", [inside, flipped, t], "index")
    if rank > 2:
        index = unsqueeze(index, list(range(2, rank)), "index_full_rank")
    index = add("Expand", [index, shape], "index_expanded")
    made.append(helper.make_node("GatherElements", [x, index], list(node.output), name=base, axis=time_axis))
    return made


def _ranks(model_proto: onnx.ModelProto) -> dict:
    """The rank of each main-graph tensor ONNX's shape inference (or the declared types) knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model_proto).graph
    except Exception:  # noqa: BLE001 - inference is a help: without it, the declared types
        inferred = model_proto.graph
    ranks = {}
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            ranks[value.name] = len(value.type.tensor_type.shape.dim)
    return ranks
