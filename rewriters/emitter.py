"""The one place that builds ONNX recurrent nodes and knows their input and output slots."""
from __future__ import annotations

import enum

import numpy as np
from onnx import helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from .layer import Direction, RecurrentLayer, StateRole


class Slot(enum.IntEnum):
    """Input positions of ONNX LSTM / GRU / RNN (LSTM's peephole P is never used)."""

    X = 0
    W = 1
    R = 2
    B = 3
    SEQUENCE_LENS = 4
    INITIAL_H = 5
    INITIAL_C = 6


class Out(enum.IntEnum):
    """Output positions of ONNX LSTM / GRU / RNN."""

    Y = 0
    Y_H = 1
    Y_C = 2


_STATE_OUTPUT = {StateRole.HIDDEN: Out.Y_H, StateRole.CELL: Out.Y_C}
_STATE_INPUT = {StateRole.HIDDEN: Slot.INITIAL_H, StateRole.CELL: Slot.INITIAL_C}
_TAKES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
_TAKES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}


def _attributes(layer: RecurrentLayer) -> dict:
    activations = list(layer.activations)
    attrs = {
        "hidden_size": layer.hidden_size,
        "direction": "forward",
        "activations": [a.name for a in activations],
    }
    alphas = [a.alpha for a in activations if a.name in _TAKES_ALPHA]
    betas = [a.beta for a in activations if a.name in _TAKES_BETA]
    if alphas:
        attrs["activation_alpha"] = [float(a) for a in alphas]
    if betas:
        attrs["activation_beta"] = [float(b) for b in betas]
    if layer.kind.onnx_op == "GRU":
        attrs["linear_before_reset"] = int(layer.linear_before_reset)
    return attrs


def emit(graph, layer: RecurrentLayer) -> str:
    """Add the node for ``layer`` to ``graph`` and rewire the tensors it replaces.

    Every node is built before anything is rewired, so a failure leaves the graph as it was
    (apart from unused nodes, which tf2onnx removes). Returns the new node's name.
    ``Direction.BACKWARD`` needs nothing here: Keras already reversed the input it feeds
    the loop, and its outputs stay in that order, as a forward pass over that input gives.
    """
    builder = GraphBuilder(graph)
    name = utils.make_name(layer.name.replace("/", "_") + "_" + layer.kind.onnx_op)
    dtype = layer.dtype
    inputs = [""] * len(Slot)
    inputs[Slot.X] = layer.wiring.x
    inputs[Slot.W] = graph.make_const(name + "_W", layer.W[np.newaxis].astype(dtype)).output[0]
    inputs[Slot.R] = graph.make_const(name + "_R", layer.R[np.newaxis].astype(dtype)).output[0]
    inputs[Slot.B] = graph.make_const(name + "_B", layer.B[np.newaxis].astype(dtype)).output[0]
    for role, tensor in layer.wiring.initial_states:
        inputs[_STATE_INPUT[role]] = builder.make_unsqueeze({"data": tensor, "axes": [0]})
    while inputs[-1] == "":
        inputs.pop()

    output_count = layer.kind.state_count + 1
    onnx_dtype = helper.np_dtype_to_tensor_dtype(dtype)
    hidden = layer.hidden_size
    shapes = [[-1, 1, -1, hidden], [1, -1, hidden], [1, -1, hidden]][:output_count]
    node = graph.make_node(layer.kind.onnx_op, inputs, attr=_attributes(layer), output_count=output_count,
                           name=name, shapes=shapes, dtypes=[onnx_dtype] * output_count)

    replacements = []
    if layer.wiring.sequence_output:
        sequence = builder.make_squeeze({"data": node.output[Out.Y], "axes": [1]})
        replacements += [(old, sequence) for old in layer.wiring.sequence_output]
    replacements += [(old, node.output[Out.Y_H]) for old in layer.wiring.last_output]
    for role, old in layer.wiring.final_states:
        state = builder.make_squeeze({"data": node.output[_STATE_OUTPUT[role]], "axes": [0]})
        replacements.append((old, state))

    for old, new in replacements:
        graph.replace_all_inputs(old, new)
    return node.name


def direction_label(layer: RecurrentLayer) -> str:
    return "backward (go_backwards)" if layer.direction is Direction.BACKWARD else "forward"
