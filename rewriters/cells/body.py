"""Reading a recurrent cell's ops: the view the cell matchers describe a cell through.

A :class:`BodyView` looks at a loop body (its skeleton is :mod:`.skeleton`'s) or, through the
unrolled reader's ``StepView``, at one step of an unrolled chain, and lets a matcher describe
what the cell computes:

- :meth:`BodyView.activation_chain` walks back from a gate value through element-wise ops
  to its pre-activation;
- :meth:`BodyView.affine` decomposes a pre-activation into ``x @ W + h @ R + biases``
  (:mod:`.affine`'s reading, mixed in), following Split/StridedSlice column blocks, so
  per-gate slices and fused kernels read the same way.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from onnx import TensorProto, helper

from ..description import Activation, NoMatch, WeightSource, require
from .activations import identify, tolerance_for
from .affine import SUM_OPS, AffineReading
from .evaluate import ELEMENTWISE_OPS, evaluate


class _FrozenNode:
    """A snapshot of one node, so weights can be read after the body graph is converted."""

    def __init__(self, node):
        self.name = node.name
        self.type = node.type
        self.input = list(node.input)
        self.output = list(node.output)
        self._attrs = {key: node.get_attr_value(key) for key in node.attr}
        self._value = node.get_tensor_value(as_list=False) if node.is_const() else None

    def is_const(self) -> bool:
        return self._value is not None

    def get_tensor_value(self, as_list=False):
        return self._value

    def get_attr_value(self, name, default=None):
        return self._attrs.get(name, default)


class _FrozenGraph:
    def __init__(self, nodes: dict):
        self._by_output = {out: node for node in nodes.values() for out in node.output}

    def get_node_by_output(self, tensor):
        return self._by_output.get(tensor)


class BodyView(AffineReading):
    """Read-only helpers over a loop body graph (a tf2onnx graph still holding TF ops)."""

    requantized = ""  # where an input quantized on the fly (a TFLite hybrid kernel) was read as the float value

    def __init__(self, graph, inputs: Optional[list] = None, outputs: Optional[list] = None):
        """``inputs``, ``outputs``: the body's loop variables, where they are not all the graph's inputs
        and outputs. (A subclass that does not call this, the unrolled reader's StepView, sets
        ``_blocks`` and ``assumed`` itself.)"""
        self.graph = graph
        self.inputs = list(graph.input_names) if inputs is None else inputs
        self.outputs = list(graph.outputs) if outputs is None else outputs
        require(len(self.inputs) == len(self.outputs), "body inputs and outputs differ in number")
        self._slot_of_input = {name: slot for slot, name in enumerate(self.inputs)}
        self._blocks: dict = {}  # pre-activations this view names: column blocks of another tensor
        self.assumed: dict = {}  # tensor -> the value reading the body assumed it has (a dropout rate of 0)

    # -- basic navigation -------------------------------------------------------------
    def resolve(self, tensor: str) -> str:
        """Follow ops that forward a tensor unchanged back to it: Identity, and products with
        ones (tf_keras multiplies by an all-ones recurrent dropout mask at inference). A value
        quantized and dequantized again (how tf2onnx writes a TFLite hybrid kernel's on-the-fly
        input quantization) is read as the value itself, and the view notes where (:attr:`requantized`)."""
        node = self.graph.get_node_by_output(tensor)
        while node is not None:
            if node.type in ("Identity", "StopGradient") and len(node.input) == 1:
                tensor = node.input[0]
            elif node.type == "Mul" and len(node.input) == 2 and any(self._is_ones(t) for t in node.input):
                tensor = next((t for t in node.input if not self._is_ones(t)), node.input[0])
            elif self._requantization(node) is not None:
                tensor, self.requantized = self._requantization(node), node.name
            elif self._dropout(node) is not None:
                tensor = self._dropout(node)
            else:
                return tensor
            node = self.graph.get_node_by_output(tensor)
        return tensor

    def _requantization(self, node) -> Optional[str]:
        """The value ``DequantizeLinear(DynamicQuantizeLinear(value))`` quantizes and dequantizes."""
        if node.type != "DequantizeLinear":
            return None
        quantized = [self.graph.get_node_by_output(t) for t in node.input]
        if quantized and quantized[0] is not None and quantized[0].type == "DynamicQuantizeLinear" \
                and all(q is quantized[0] for q in quantized):
            return quantized[0].input[0]
        return None

    def _dropout(self, node) -> Optional[str]:
        """The value a dropout passes through at a rate of zero (TF1's ``DropoutWrapper`` at inference):
        ``Select(uniform >= rate, value / (1 - rate), 0)``, a uniform sample in [0, 1). The rate is
        assumed to be zero (:attr:`assumed`): where it is not a constant, the reader checks it."""
        if node.type not in ("Select", "SelectV2") or len(node.input) != 3:
            return None
        condition, dropped = (self.graph.get_node_by_output(node.input[i]) for i in (0, 2))
        if condition is None or condition.type != "GreaterEqual" or dropped is None or not dropped.is_const() \
                or np.any(dropped.get_tensor_value(as_list=False)):
            return None
        sample, rate = self.graph.get_node_by_output(condition.input[0]), condition.input[1]
        if sample is None or sample.type != "RandomUniform":
            return None
        value, kept = node.input[1], self.graph.get_node_by_output(node.input[1])
        if kept is not None and kept.type == "RealDiv":  # value / (1 - rate): 1 at a rate of zero
            scale = self.graph.get_node_by_output(kept.input[1])
            scaled_by_rate = scale is not None and scale.type == "Sub" and scale.input[1] == rate \
                and self.scalar(scale.input[0]) == 1.0
            if not (scaled_by_rate or self.scalar(kept.input[1]) == 1.0):
                return None
            value = kept.input[0]
        rate_value = self.scalar(rate)
        if rate_value is None:
            self.assumed[rate] = 0.0
        elif rate_value != 0.0:
            return None
        return value

    def _is_ones(self, tensor: str) -> bool:
        node = self.graph.get_node_by_output(tensor)
        while node is not None and node.type == "Identity":
            node = self.graph.get_node_by_output(node.input[0])
        if node is None:
            return False
        if node.type == "OnesLike":
            return True
        if node.type == "Fill":
            node = self.graph.get_node_by_output(node.input[1])
        return node is not None and node.is_const() and bool(np.all(node.get_tensor_value(as_list=False) == 1))

    def producer(self, tensor: str):
        return self.graph.get_node_by_output(self.resolve(tensor))

    def operands(self, node) -> list[str]:
        return [self.resolve(t) for t in node.input]

    def slot_of(self, tensor: str) -> Optional[int]:
        """The loop slot whose body input ``tensor`` is, or None."""
        return self._slot_of_input.get(self.resolve(tensor))

    def consumers(self, tensor: str):
        return self.graph.find_output_consumers(tensor)

    def constant(self, tensor: str) -> Optional[np.ndarray]:
        """The value of a constant: a Const, or TFLite's DEQUANTIZE of one (a float16 weight widened,
        an integer one scaled), else None."""
        node = self.producer(tensor)
        if node is not None and node.is_const():
            return np.asarray(node.get_tensor_value(as_list=False))
        if node is not None and node.type == "TFL_DEQUANTIZE":
            stored = self.graph.get_node_by_output(node.input[0])
            if stored is not None and stored.is_const():
                return np.asarray(evaluate(self.graph, node.output[0]))
        return None

    def is_constant(self, tensor: str) -> bool:
        return self.constant(tensor) is not None

    def scalar(self, tensor: str) -> Optional[float]:
        """The value of a constant scalar (or one-element) tensor, else None."""
        value = self.constant(tensor)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    # -- weights ----------------------------------------------------------------------
    def static_source(self, tensor: str, constant_slots: frozenset) -> Optional[WeightSource]:
        """A weight source for ``tensor`` if it only depends on constants and constant slots."""
        nodes: dict = {}
        slots: dict = {}
        pending = [tensor]
        while pending:
            name = pending.pop()
            slot = self._slot_of_input.get(name)
            if slot is not None:
                if slot not in constant_slots:
                    return None
                slots[name] = slot
                continue
            node = self.graph.get_node_by_output(name)
            if node is None or node.is_graph_input():
                return None
            if node.name in nodes:
                continue
            nodes[node.name] = _FrozenNode(node)
            pending.extend(node.input)
        frozen = _FrozenGraph(nodes)

        def source(slot_value: Callable[[int], np.ndarray]) -> np.ndarray:
            bindings = {name: slot_value(slot) for name, slot in slots.items()}
            return evaluate(frozen, tensor, bindings)

        return source

    # -- activations --------------------------------------------------------------------
    def activation_chain(self, tensor: str) -> tuple[str, list]:
        """Walk back from ``tensor`` through element-wise ops that have one varying operand.

        Returns the pre-activation tensor where the walk stopped and the chain's nodes
        (value end first). An empty chain means the identity.
        """
        chain = []
        tensor = self.resolve(tensor)
        while True:
            node = self.graph.get_node_by_output(tensor)
            if node is None or node.type not in ELEMENTWISE_OPS:
                return tensor, chain
            varying = [t for t in self.operands(node) if not self.is_constant(t)]
            if len(varying) != 1:
                return tensor, chain
            chain.append(node)
            tensor = varying[0]

    def gate(self, value: str) -> tuple[str, Activation]:
        """Split a gate value into its pre-activation tensor and the activation applied to it.

        A column block of an activated tensor (TF1's GRU splits ``sigmoid(z)`` into its gates) is the
        activation of that block of the pre-activation: the pre-activation returned is then a block
        this view names (``affine`` and ``terms`` read it as a column block of ``z``)."""
        pre, chain = self.activation_chain(value)
        if not chain:
            block = self._column_block(pre)
            if block is not None and self.activation_chain(block[0])[1]:
                source_pre, activation = self.gate(block[0])
                name = f"{self.resolve(value)}/pre-activation"
                self._blocks[name] = (source_pre, block[1])
                return name, activation
            return pre, identify(lambda points: points, value)
        graph, resolved = self.graph, self.resolve(value)
        element_type = helper.tensor_dtype_to_np_dtype(graph.get_dtype(resolved) or TensorProto.FLOAT).name
        try:
            return pre, identify(lambda points: evaluate(graph, resolved, {pre: points}), value,
                                 tolerance_for(element_type))
        except NoMatch as no_match:
            # a constant added first belongs to the pre-activation (TF1's forget_bias: sigmoid(f + 1))
            shorter = chain
            while shorter and shorter[-1].type in SUM_OPS and shorter[-1].output[0] != resolved:
                inner, shorter = shorter[-1].output[0], shorter[:-1]
                try:
                    return inner, identify(lambda points: evaluate(graph, resolved, {inner: points}), value,
                                           tolerance_for(element_type))
                except NoMatch:
                    continue
            ops = "(" + ", ".join(node.type for node in reversed(chain)) + ")"
            raise NoMatch(f"activation {ops}: {no_match.reason}", no_match.node) from no_match

    # -- affine forms -----------------------------------------------------------------
    def unbroadcast(self, tensor: str) -> str:
        """Follow reshapes that only add or drop axes of size one and keep the last axis (the
        columns): with a batch of one, tf2onnx's static shapes let ``[1, N]`` and ``[N]`` stand
        for each other, and a sum broadcasts them back alike."""
        tensor = self.resolve(tensor)
        node = self.graph.get_node_by_output(tensor)
        while node is not None and node.type in _UNIT_RESHAPES:
            source = self.resolve(node.input[0])
            if not _same_but_unit_axes(self.graph.get_shape(source), self.graph.get_shape(tensor)):
                break
            tensor, node = source, self.graph.get_node_by_output(source)
        return tensor


_UNIT_RESHAPES = frozenset({"Squeeze", "Reshape", "ExpandDims", "Unsqueeze"})


def _same_but_unit_axes(source_shape, shape) -> bool:
    """Known shapes that differ only in axes of size one, with the same last axis."""
    if not source_shape or not shape or any(d is None or d < 0 for d in list(source_shape) + list(shape)):
        return False
    return (source_shape[-1] == shape[-1]
            and [d for d in source_shape if d != 1] == [d for d in shape if d != 1])
