"""The one place that builds ONNX recurrent nodes and knows their input and output slots."""
from __future__ import annotations

import enum

import numpy as np
from onnx import helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from .layer import RecurrentLayer, StateRole


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

    Y = 0  # [T, directions, B, H]
    Y_H = 1  # [directions, B, H]
    Y_C = 2  # [directions, B, H], LSTM only


_STATE_OUTPUT = {StateRole.HIDDEN: Out.Y_H, StateRole.CELL: Out.Y_C}
_STATE_INPUT = {StateRole.HIDDEN: Slot.INITIAL_H, StateRole.CELL: Slot.INITIAL_C}
_TAKES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
_TAKES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}
_BATCH_MAJOR = [1, 0, 2]


def _attributes(layer: RecurrentLayer) -> dict:
    first = layer.first
    activations = [a for one in layer.passes for a in one.activations]
    attrs = {
        "hidden_size": first.hidden_size,
        "direction": layer.direction.value,
        "activations": [a.name for a in activations],
    }
    alphas = [a.alpha for a in activations if a.name in _TAKES_ALPHA]
    betas = [a.beta for a in activations if a.name in _TAKES_BETA]
    if alphas:
        attrs["activation_alpha"] = [float(a) for a in alphas]
    if betas:
        attrs["activation_beta"] = [float(b) for b in betas]
    if first.kind.onnx_op == "GRU":
        attrs["linear_before_reset"] = int(first.linear_before_reset)
    return attrs


class _Emission:
    """Builds one node and collects (old tensor, new tensor) replacements."""

    def __init__(self, graph, layer: RecurrentLayer, renamed: dict):
        self.graph, self.layer, self.renamed = graph, layer, renamed
        self.builder = GraphBuilder(graph)
        self.name = utils.make_name(layer.name.replace("/", "_") + "_" + layer.first.kind.onnx_op)
        self.replacements: list = []

    def stacked_const(self, suffix: str, field: str) -> str:
        value = np.stack([getattr(one, field) for one in self.layer.passes]).astype(self.layer.first.dtype)
        return self.graph.make_const(utils.make_name(self.name + "_" + suffix), value).output[0]

    def initial_state(self, role: StateRole) -> str:
        """[directions, B, H] from the passes' [B, H] initial states; "" when all start at zero."""
        given = [dict(one.wiring.initial_states).get(role) for one in self.layer.passes]
        if not any(given):
            return ""
        parts = [self.builder.make_unsqueeze({"data": self.current(tensor), "axes": [0]}) for tensor in given]
        if len(parts) == 1:
            return parts[0]
        return self.graph.make_node("Concat", parts, attr={"axis": 0}).output[0]

    def per_direction(self, tensor: str, index: int, axis: int) -> str:
        """The slice of a per-direction output for pass ``index``, with the direction axis removed."""
        if len(self.layer.passes) > 1:
            tensor = self.builder.make_slice({"data": tensor, "starts": [index], "ends": [index + 1],
                                              "axes": [axis]})
        return self.builder.make_squeeze({"data": tensor, "axes": [axis]})

    def node(self):
        first, layer = self.layer.first, self.layer
        inputs = [""] * len(Slot)
        inputs[Slot.X] = self.current(layer.x)
        inputs[Slot.W] = self.stacked_const("W", "W")
        inputs[Slot.R] = self.stacked_const("R", "R")
        inputs[Slot.B] = self.stacked_const("B", "B")
        for role in first.kind.state_roles:
            inputs[_STATE_INPUT[role]] = self.initial_state(role)
        while inputs[-1] == "":
            inputs.pop()
        count = first.kind.state_count + 1
        directions, hidden = len(layer.passes), first.hidden_size
        shapes = [[-1, directions, -1, hidden]] + [[directions, -1, hidden]] * first.kind.state_count
        dtype = helper.np_dtype_to_tensor_dtype(first.dtype)
        return self.graph.make_node(first.kind.onnx_op, inputs, attr=_attributes(layer), output_count=count,
                                    name=self.name, shapes=shapes, dtypes=[dtype] * count)

    def wire(self, node) -> None:
        for index, one in enumerate(self.layer.passes):
            wiring = one.wiring
            if wiring.sequence_output or wiring.restored_output:
                sequence = self.per_direction(node.output[Out.Y], index, 1)
                self.replace(wiring.sequence_output, sequence)
                if wiring.restored_output:
                    batch_major = self.graph.make_node("Transpose", [sequence], attr={"perm": _BATCH_MAJOR})
                    self.replace(wiring.restored_output, batch_major.output[0])
            if wiring.last_output:
                last = node.output[Out.Y_H]
                if len(self.layer.passes) > 1:
                    last = self.builder.make_slice({"data": last, "starts": [index], "ends": [index + 1],
                                                    "axes": [0]})
                self.replace(wiring.last_output, last)
            for role, old in wiring.final_states:
                self.replace([old], self.per_direction(node.output[_STATE_OUTPUT[role]], index, 0))

    def current(self, tensor: str) -> str:
        """A tensor's name now: an earlier node of this graph may have replaced it."""
        return self.renamed.get(tensor, tensor)

    def replace(self, olds, new: str) -> None:
        self.replacements.extend((old, new) for old in olds)


def emit(graph, layer: RecurrentLayer, renamed: dict) -> str:
    """Add the node for ``layer`` to ``graph`` and rewire the tensors it replaces.

    ``renamed`` maps tensors that earlier emissions in this graph replaced to their
    replacements (an encoder's states feeding a decoder, say); it is read and extended.
    Every node is built before anything is rewired, so a failure leaves the graph as it was
    (apart from unused nodes, which tf2onnx removes). Returns the new node's name.
    """
    emission = _Emission(graph, layer, renamed)
    node = emission.node()
    emission.wire(node)
    for old, new in emission.replacements:
        graph.replace_all_inputs(old, new)
        renamed[old] = new
    return node.name
