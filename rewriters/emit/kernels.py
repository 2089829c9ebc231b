"""What computes a layer's recurrence: ONNX's native node, or, for onnxruntime, SimpleRNN's as a Scan.

A variant of the one emitter, chosen once per conversion by :func:`select_kernels`. The emitter
hands the variant the node it would build (op, input slots filled, attributes); the variant
returns something with that node's outputs. :data:`NATIVE` builds the node itself.
:class:`ScanRNN` (target "onnxruntime") builds ONNX's ``RNN`` out of its definition instead: the
input projection as one MatMul over every step, then a ``Scan`` whose body is the recurrent
product, an Add and the activation. onnxruntime's RNN kernel applies its activation one value at
a time, which puts it behind stock tf2onnx's Loop from batch 16 on; the Scan's ops are vectorised
(docs/performance.md). Its outputs are the node's, ``sequence_lens`` included (outputs past a
row's length are zeros, the final state is the one at its last step within it), so every mask
form and state wiring works unchanged. Other consumers (OpenVINO, tract, onnx2torch, the
training kernels) want the native node: they get it without the target.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from onnx import helper, numpy_helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from ..description import Activation, RecurrentLayer
from .mask_tensors import LengthTensors

ONNXRUNTIME = "onnxruntime"  # the target that selects :class:`ScanRNN`


@dataclass(frozen=True)
class Built:
    """What stands for the recurrent node: its name (the report's) and its outputs by ONNX slot."""

    name: str
    output: tuple
    op_type: str
    pass_names: tuple = ()  # one node per pass where the passes are not one node (the Scan form's directions)

    def name_of(self, index: int) -> str:
        """The node that computes pass ``index``."""
        return self.pass_names[index] if self.pass_names else self.name


class NativeNodes:
    """Every layer becomes its native ONNX node."""

    describe = ""  # what the report adds about the form, for a layer this variant builds otherwise

    def build(self, graph, layer: RecurrentLayer, inputs: list, named: NodeInputs, attributes: dict, name: str,
              shapes: list, dtypes: list):
        """The node for ``layer`` from its ``inputs`` by slot (``named``: some of them by name)."""
        node = graph.make_node(layer.first.kind.onnx_op, inputs, attr=attributes, output_count=len(shapes),
                               name=name, shapes=shapes, dtypes=dtypes)
        return Built(node.name, tuple(node.output), node.type)

    def builds_native(self, layer: RecurrentLayer) -> bool:
        return True


NATIVE = NativeNodes()

# ONNX RNN activations with an ONNX op of the same computation: name -> (op, the attributes it takes)
_SAME_OP = {"Tanh": (), "Relu": (), "Sigmoid": (), "Softsign": (), "Softplus": (),
            "LeakyRelu": ("alpha",), "Elu": ("alpha",), "ThresholdedRelu": ("alpha",),
            "HardSigmoid": ("alpha", "beta")}
_COMPOSED = {"Affine", "ScaledTanh"}  # alpha * x + beta; alpha * tanh(beta * x)


@dataclass(frozen=True)
class NodeInputs:
    """The node's inputs a variant that builds it otherwise reads (the emitter knows their slots)."""

    x: str  # [T, B, I]
    sequence_lens: str = ""  # [B] int32, "" for none
    initial_h: str = ""  # [directions, B, H], "" for zeros


def _writable(activation: Activation) -> bool:
    """Whether the Scan body can compute ``activation`` as the node does: its parameters given
    (a node left to its defaults reads them as the runtime chooses)."""
    if activation.name in _SAME_OP:
        return all(getattr(activation, p) is not None for p in _SAME_OP[activation.name])
    return activation.name in _COMPOSED and activation.alpha is not None and activation.beta is not None


class ScanRNN(NativeNodes):
    """Target "onnxruntime": a SimpleRNN's node as input MatMul + Scan; other kinds stay native."""

    describe = "onnxruntime form: input MatMul + Scan (target onnxruntime)"

    def builds_native(self, layer: RecurrentLayer) -> bool:
        return layer.first.kind.onnx_op != "RNN" or not all(
            _writable(a) for pass_ in layer.passes for a in pass_.activations)

    def build(self, graph, layer: RecurrentLayer, inputs: list, named: NodeInputs, attributes: dict, name: str,
              shapes: list, dtypes: list):
        if self.builds_native(layer):
            return super().build(graph, layer, inputs, named, attributes, name, shapes, dtypes)
        recurrence = _Recurrence(graph, layer, named.x, named.sequence_lens, name, dtypes[0])
        reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[attributes["direction"]]
        ys, hs, scans = [], [], []
        for index, backward in enumerate(reverse):
            initial = named.initial_h and recurrence.builder.make_squeeze({"data": recurrence.builder.make_slice(
                {"data": named.initial_h, "starts": [index], "ends": [index + 1], "axes": [0]}), "axes": [0]})
            scan, y, h = recurrence.direction(layer.passes[index], backward, initial)
            scans.append(scan.name)
            ys.append(recurrence.unsqueeze(y, 1))
            hs.append(recurrence.unsqueeze(h, 0))
        y = ys[0] if len(ys) == 1 else graph.make_node("Concat", ys, attr={"axis": 1}).output[0]
        h = hs[0] if len(hs) == 1 else graph.make_node("Concat", hs, attr={"axis": 0}).output[0]
        return Built(scans[0], (y, h), "Scan", tuple(scans))


class _Recurrence:
    """The Scan form's pieces for one layer: what its directions share (X, the lengths' mask)."""

    def __init__(self, graph, layer: RecurrentLayer, x: str, lengths: str, name: str, dtype: int):
        self.graph, self.x, self.name, self.dtype = graph, x, name, dtype
        self.np_dtype = np.dtype(layer.first.dtype)
        self.hidden = layer.first.hidden_size
        self.builder = GraphBuilder(graph)
        # the mask arithmetic of a layer masked past each row's length, built where used
        self.length_tensors = LengthTensors(graph, lengths, x, self.np_dtype) if lengths else None
        self.lengths = self.length_tensors.counts if lengths else ""  # [B] int64
        self._mask: Optional[str] = None
        self._zeros: Optional[str] = None
        self._last_steps: Optional[str] = None

    def const(self, suffix: str, value: np.ndarray) -> str:
        return self.graph.make_const(utils.make_name(f"{self.name}_{suffix}"), value).output[0]

    def unsqueeze(self, tensor: str, axis: int) -> str:
        return self.builder.make_unsqueeze({"data": tensor, "axes": [axis]})

    @property
    def mask(self) -> str:
        """[T, B, 1] bool: step t of row b is within the row's length."""
        if self._mask is None:
            self._mask = self.unsqueeze(self.length_tensors.bool, 2)
        return self._mask

    @property
    def zeros(self) -> str:
        """[B, H] zeros: the state a pass starts from when the model gives none."""
        if self._zeros is None:
            self._zeros = self._zeros_like_state()
        return self._zeros

    def _zeros_like_state(self) -> str:
        batch = self.builder.make_slice({"data": self.graph.make_node("Shape", [self.x]).output[0],
                                         "starts": [1], "ends": [2], "axes": [0]})
        shape = self.graph.make_node("Concat", [batch, self.const("hidden", np.array([self.hidden], np.int64))],
                                     attr={"axis": 0}).output[0]
        return self.graph.make_node("ConstantOfShape", [shape], attr={
            "value": numpy_helper.from_array(np.zeros(1, self.np_dtype))}).output[0]

    def reversed_whole(self, sequence: str) -> str:
        return self.builder.make_slice({"data": sequence, "starts": [-1], "ends": [np.iinfo(np.int64).min],
                                        "axes": [0], "steps": [-1]})

    def reversed_in_rows(self, sequence: str) -> str:
        return self.graph.make_node("ReverseSequence", [sequence, self.lengths],
                                    attr={"batch_axis": 1, "time_axis": 0}).output[0]

    def direction(self, pass_, backward: bool, initial: str):
        """One direction: (the Scan node, Y [T, B, H] in the time order of X, the final state [B, H]).

        With lengths the Scan still runs over every step, unmasked (per step, a mask costs more than the
        step at batch 1); what ONNX defines is then taken from its outputs: each row's outputs up to its
        length (zeros after), and the state at its last step within it (zeros for an empty row). The
        reverse direction runs forward over each row's steps reversed within its length (over the whole
        sequence reversed by a Slice where no lengths are given): no Scan runs backwards, which tract
        releases before September 2026 ignore."""
        hidden = self.hidden
        projected = self.graph.make_node("MatMul", [self.x, self.const("W_T", pass_.W.T.astype(self.np_dtype))])
        bias = (pass_.B[:hidden] + pass_.B[hidden:]).astype(self.np_dtype)
        xw = self.graph.make_node("Add", [projected.output[0], self.const("bias", bias)]).output[0]
        masked = bool(self.lengths)
        reversal = self.reversed_in_rows if masked else self.reversed_whole
        if backward:
            xw = reversal(xw)
        scan = self.graph.make_node(
            "Scan", [initial or self.zeros, xw], output_count=2, name=utils.make_name(self.name + "_scan"),
            attr={"body": _body(pass_, self.np_dtype), "num_scan_inputs": 1},
            shapes=[[-1, hidden], [-1, -1, hidden]], dtypes=[self.dtype] * 2)
        h, y = scan.output
        if masked:
            zero = self.const("zero_h", np.zeros((), self.np_dtype))
            y = self.graph.make_node("Where", [self.mask, y, zero]).output[0]
            h = self.graph.make_node("GatherND", [y, self.last_steps]).output[0]
        return scan, reversal(y) if backward else y, h

    @property
    def last_steps(self) -> str:
        """[B, 2]: (each row's last step within its length, or 0 for an empty row; the row)."""
        if self._last_steps is None:
            last = self.graph.make_node("Sub", [self.lengths, self.const("one", np.array(1, np.int64))]).output[0]
            last = self.graph.make_node("Max", [last, self.const("zero", np.array(0, np.int64))]).output[0]
            rows = self.graph.make_node("Range", [self.const("zero", np.array(0, np.int64)), self.builder.make_squeeze(
                {"data": self.graph.make_node("Shape", [self.lengths]).output[0], "axes": [0]}),
                self.const("one", np.array(1, np.int64))]).output[0]
            self._last_steps = self.graph.make_node("Concat", [self.unsqueeze(last, 1), self.unsqueeze(rows, 1)],
                                                    attr={"axis": 1}).output[0]
        return self._last_steps


def _body(pass_, dtype: np.dtype):
    """The Scan body: (h, x W^T + b at step t) -> (the next h, the step's output: the same)."""
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    # the recurrent product first: OpenVINO 2026.4 fuses Tanh(Add(x, MatMul(h, R))) in a Scan's step into its RNN
    # cell with the operands mixed up, silently (1.7 off, measured; this order is exact)
    nodes = [helper.make_node("MatMul", ["h", "R_T"], ["hR"]), helper.make_node("Add", ["hR", "xw"], ["a"])]
    # the activation gives the next h itself, the step's output is its copy (one copy per step, not two)
    nodes += _activation_nodes(pass_.activations[0], "a", "next_h", dtype)
    nodes.append(helper.make_node("Identity", ["next_h"], ["y"]))
    inputs = [helper.make_tensor_value_info("h", elem, ["batch", pass_.hidden_size]),
              helper.make_tensor_value_info("xw", elem, ["batch", pass_.hidden_size])]
    outputs = [helper.make_tensor_value_info(name, elem, ["batch", pass_.hidden_size]) for name in ("next_h", "y")]
    return helper.make_graph(nodes, "rnn_step", inputs, outputs,
                             initializer=[numpy_helper.from_array(pass_.R.T.astype(dtype), "R_T")])


def _activation_nodes(activation: Activation, x: str, out: str, dtype: np.dtype) -> list:
    """The body's nodes computing ``out = activation(x)``, as ONNX's recurrent ops define it."""
    name, alpha, beta = activation.name, activation.alpha, activation.beta
    if name in _SAME_OP:
        params = {p: float(getattr(activation, p)) for p in _SAME_OP[name]}
        return [helper.make_node(name, [x], [out], **params)]
    alpha_c, beta_c = (helper.make_node("Constant", [], [f"{out}_{p}"], value=numpy_helper.from_array(
        np.array(v, dtype))) for p, v in (("alpha", alpha), ("beta", beta)))
    if name == "Affine":  # alpha * x + beta
        return [alpha_c, beta_c, helper.make_node("Mul", [x, f"{out}_alpha"], [f"{out}_scaled"]),
                helper.make_node("Add", [f"{out}_scaled", f"{out}_beta"], [out])]
    # ScaledTanh: alpha * tanh(beta * x)
    return [alpha_c, beta_c, helper.make_node("Mul", [x, f"{out}_beta"], [f"{out}_in"]),
            helper.make_node("Tanh", [f"{out}_in"], [f"{out}_tanh"]),
            helper.make_node("Mul", [f"{out}_tanh", f"{out}_alpha"], [out])]


def select_kernels(onnxruntime: bool = False) -> NativeNodes:
    """What computes the recurrences of a conversion: native nodes, or with ``onnxruntime`` SimpleRNN's
    as a Scan."""
    return ScanRNN() if onnxruntime else NATIVE
