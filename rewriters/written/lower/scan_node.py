"""An ONNX ``LSTM``, ``GRU`` or ``RNN`` node as a ``Scan`` of its own step, at any time length.

The rung above the steps written out, for a runtime that computes a ``Scan`` but not the node as written:
one whose recurrent kernel takes only some activation functions (OpenVINO refuses a HardSigmoid gate; tract
and IREE compute other functions than those written, silently). The input's work stays one ``MatMul`` over
every step, outside the Scan (the input weights and the biases that sit outside the recurrence, added once);
the Scan carries the states and, per step, adds the recurrent product and applies the gates, as
:mod:`.steps` writes one step, with the node's own activations; a reverse pass scans its input and stacks its
output backwards. The step holds its weights and other constants as ``Constant`` nodes of its own, reading
nothing of the graph around it. Missing initial states start from zeros of the input's batch, read from its
shape, so the time length and the batch may stay dynamic. What this cannot write
(``sequence_lens``, weights that are not constants, ``layout=1``, ``input_forget``) raises :class:`CannotLower`.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...description import RECURRENT_NODES
from ...runtimes import INITIAL_C, INITIAL_H, SEQUENCE_LENS, Y_C, Y_H, Y
from ..builder import INT64_MIN, Writer
from ..graph import attribute
from .steps import CannotLower, cell, outside_bias, passes_of


class _Step(Writer):
    """A Writer of a Scan's step, its constants ``Constant`` nodes of the step itself (IREE 3.13's compiler
    crashes on a step's Split whose sizes the graph around it holds, measured)."""

    def __init__(self, outer: Writer):
        super().__init__(outer.graph, outer.opset, outer.taken)
        self.dtype = outer.dtype

    def _hold(self, array: np.ndarray, name: str) -> None:
        self.nodes.append(helper.make_node("Constant", [], [name], name=self.name(f"{name}_Constant"),
                                           value=numpy_helper.from_array(array, name)))


def node_as_scan(graph: onnx.GraphProto, node: onnx.NodeProto, constants, w: Writer, batch: int = 0,
                 reversed_by_slices: bool = False) -> None:
    """Write ``node`` (in ``graph``) as one Scan per direction; ``constants(name)`` reads a constant's value;
    ``batch``: the static batch size (0: read from the input's shape where zero states are needed);
    ``reversed_by_slices``: a backward pass scans its input reversed by a ``Slice`` of step -1, forwards, its
    output reversed back (for a runtime whose Scan runs backwards wrongly: IREE), rather than backwards."""
    op, hidden = node.op_type, int(attribute(node, "hidden_size"))
    if attribute(node, "layout", 0) or attribute(node, "input_forget", 0):
        raise CannotLower(f"{op} with layout=1 or input_forget has no Scan form here")
    if len(node.input) > SEQUENCE_LENS and node.input[SEQUENCE_LENS]:
        raise CannotLower(f"{op} with sequence_lens has no Scan form here")
    passes = passes_of(node, constants, hidden, attribute(node, "direction", "forward"))
    base = (node.name or node.output[0]).replace("/", "_")
    w.dtype = passes[0].w.dtype
    x, clip, lstm = node.input[0], attribute(node, "clip"), op == "LSTM"
    zeros = None
    ys, finals_h, finals_c = [], [], []
    for d, p in enumerate(passes):
        projected = w.op("MatMul", [x, w.const(np.ascontiguousarray(p.w.T), f"{base}_d{d}_W")], f"{base}_d{d}_xw")
        projected = w.op("Add", [projected, w.const(outside_bias(op, p, hidden), f"{base}_d{d}_bias")],
                         f"{base}_d{d}_xwb")
        states = []
        for slot, wanted in ((INITIAL_H, True), (INITIAL_C, lstm)):
            if not wanted:
                continue
            given = node.input[slot] if len(node.input) > slot else ""
            if given:
                picked = w.slice(given, d, d + 1, 0, f"{base}_d{d}_s{slot}") if len(passes) > 1 else given
                states.append(w.squeeze(picked, [0], f"{base}_d{d}_s{slot}"))
            else:
                zeros = zeros or (w.const(np.zeros((batch, hidden), w.dtype), f"{base}_zeros") if batch else
                                  _zero_states(w, x, hidden, base))
                states.append(zeros)
        body = _body(w, op, p, hidden, clip, len(states), batch or None, f"{base}_d{d}")
        sliced = p.reverse and reversed_by_slices
        if sliced:
            projected = w.slice(projected, -1, INT64_MIN, 0, f"{base}_d{d}_reversed", step=-1)
        backward = [1] if p.reverse and not sliced else [0]
        finals = w.op("Scan", states + [projected], f"{base}_d{d}_scan", outputs=len(states) + 1, body=body,
                      num_scan_inputs=1, scan_input_directions=backward, scan_output_directions=backward)
        y = w.slice(finals[-1], -1, INT64_MIN, 0, f"{base}_d{d}_back", step=-1) if sliced else finals[-1]
        ys.append(w.unsqueeze(y, [1], f"{base}_d{d}_y"))
        finals_h.append(w.unsqueeze(finals[0], [0], f"{base}_d{d}_h"))
        finals_c.append(w.unsqueeze(finals[1], [0], f"{base}_d{d}_c") if lstm else None)
    outputs = list(node.output) + [""] * (3 - len(node.output))
    for index, pieces, axis in ((Y, ys, 1), (Y_H, finals_h, 0), (Y_C, finals_c, 0)):
        if outputs[index] and (index != Y_C or lstm):
            w.op("Concat", pieces, f"{base}_out{index}", output_names=[outputs[index]], axis=axis)
    w.replace([node])


def _zero_states(w: Writer, x: str, hidden: int, base: str) -> str:
    """[B, H] zeros, B read from ``x``'s shape [T, B, F]."""
    batch = w.op("Slice", [w.op("Shape", [x], f"{base}_shape"), w.ints([1], f"{base}_one"), w.ints([2], f"{base}_two")],
                 f"{base}_batch")
    size = w.op("Concat", [batch, w.ints([hidden], f"{base}_hidden")], f"{base}_state_shape", axis=0)
    zero = helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(w.dtype), [1], [0])
    return w.op("ConstantOfShape", [size], f"{base}_zeros", value=zero)


def _body(w: Writer, op: str, p, hidden: int, clip, states: int, batch, base: str) -> onnx.GraphProto:
    """The Scan's step: the states [B, H] and the step's projected input [B, G*H] in, the new states and the
    step's h out (``batch``: B where static, else None)."""
    step = _Step(w)
    element = helper.np_dtype_to_tensor_dtype(w.dtype)
    names = [step.name(f"{base}_{role}_in") for role in ("h", "c")[:states]] + [step.name(f"{base}_xw_in")]
    h, c = names[0], names[1] if states > 1 else None
    new_h, new_c = cell(step, op, p, names[-1], h, c, hidden, RECURRENT_NODES[op].gates, clip, f"{base}_step")
    results = [new_h] + ([new_c] if states > 1 else [])
    out_names = [step.name(f"{base}_{role}_out") for role in ("h", "c")[:states]] + [step.name(f"{base}_y_out")]
    for value, name in zip(results + [new_h], out_names):
        step.op("Identity", [value], name, output_names=[name])
    dims = [[batch, hidden]] * states + [[batch, RECURRENT_NODES[op].gates * hidden]]
    inputs = [helper.make_tensor_value_info(n, element, d) for n, d in zip(names, dims)]
    outputs = [helper.make_tensor_value_info(n, element, [batch, hidden]) for n in out_names]
    return helper.make_graph(step.nodes, f"{base}_step", inputs, outputs)
