"""A while-loop left as tf2onnx's Loop, its stacked outputs padded to the length TensorFlow gives them.

TensorFlow stacks a list reserved with N elements (``TensorListReserve``) to N rows, zeros where the
loop wrote nothing; tf2onnx's Loop returns one row per iteration it ran. TF1's ``dynamic_rnn`` given
a ``sequence_length`` runs ``max(sequence_length)`` iterations, so where every row of a batch is
shorter than the input, the converted output was shorter than TensorFlow's. Each such stack gets the
missing rows as zeros after it.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

_WHILE_OPS = ("While", "StatelessWhile")


PADDED_NAME = "padded_list"  # the padding Concat's name starts so: a loop that becomes a Scan needs none


def pad_stacked_lists(graph) -> int:
    """Pad every stack of a reserved list a while-loop of ``graph`` returns; the number padded."""
    padded = 0
    for loop in [node for node in graph.get_nodes() if node.type in _WHILE_OPS]:
        for slot, tensor in enumerate(loop.output):
            reserve = graph.get_node_by_output(loop.input[slot]) if slot < len(loop.input) else None
            if reserve is None or reserve.type != "TensorListReserve":
                continue
            for stack in [c for c in graph.find_output_consumers(tensor) if c.type == "TensorListStack"]:
                if stack.output[0] not in graph.outputs:
                    _pad(graph, stack.output[0], reserve.input[1])
                    padded += 1
    return padded


def _pad(graph, stacked: str, size: str) -> None:
    """Rows of zeros after ``stacked`` up to ``size`` rows, for every consumer of ``stacked``."""
    consumers = graph.find_output_consumers(stacked)
    builder = GraphBuilder(graph)
    shape = graph.make_node("Shape", [stacked]).output[0]
    rows = builder.make_slice({"data": shape, "starts": [0], "ends": [1], "axes": [0]})
    rest = builder.make_slice({"data": shape, "starts": [1], "ends": [2 ** 62], "axes": [0]})
    wanted = graph.make_node("Cast", [graph.make_node("Reshape", [size, _const(graph, [1])]).output[0]],
                             attr={"to": TensorProto.INT64}).output[0]
    missing = graph.make_node("Max", [graph.make_node("Sub", [wanted, rows]).output[0], _const(graph, [0])]).output[0]
    dims = graph.make_node("Concat", [missing, rest], attr={"axis": 0}).output[0]
    dtype = graph.get_dtype(stacked) or TensorProto.FLOAT
    zero = numpy_helper.from_array(np.zeros([1], helper.tensor_dtype_to_np_dtype(dtype)))
    zeros = graph.make_node("ConstantOfShape", [dims], attr={"value": zero}).output[0]
    padded = graph.make_node("Concat", [stacked, zeros], attr={"axis": 0}, name=utils.make_name(PADDED_NAME))
    graph.replace_all_inputs(stacked, padded.output[0], ops=consumers)


def _const(graph, value) -> str:
    return graph.make_const(utils.make_name("padded_list"), np.array(value, np.int64)).output[0]
