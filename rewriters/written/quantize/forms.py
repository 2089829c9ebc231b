"""The int8 form of each unit, written into a copy of the model.

A unit is kept float, stored in int8 and dequantized where it is read (:data:`WEIGHTS`: compute stays float),
or computed by onnxruntime's integer kernels (:data:`INTEGER`: an LSTM as ``DynamicQuantizeLSTM``, a MatMul as
``DynamicQuantizeMatMul``, both quantizing their float input at run time), or written in QDQ form with its input's
scale calibrated (:data:`STATIC`: what static quantizers and NPU toolchains read). A stored weight is dequantized
by a ``Cast`` and a ``Mul`` (:func:`dequantized`), a static MatMul's, Gemm's or Conv's by a ``DequantizeLinear``.
"""
from __future__ import annotations

import enum
from typing import Optional

import numpy as np
import onnx
from onnx import helper

from ..builder import Writer
from ..graph import attributes, nodes_of, opset_of, set_nodes, subgraphs, topological
from .rounding import Rounded
from .units import Unit, Weight

MICROSOFT = "com.microsoft"
INTEGER_KERNELS = ("DynamicQuantizeLSTM", "DynamicQuantizeMatMul")


class Precision(enum.IntEnum):
    """How far a unit is quantized, in order."""

    FLOAT = 0
    WEIGHTS = 1  # int8 weights, float compute
    INTEGER = 2  # int8 weights, integer compute (onnxruntime's kernels)
    STATIC = 3  # int8 weights, its input quantized to uint8 on a calibrated scale (QDQ); a recurrent state float

    @property
    def words(self) -> str:
        return {Precision.FLOAT: "float", Precision.WEIGHTS: "int8 weights, float compute",
                Precision.INTEGER: "int8 (integer compute in onnxruntime)",
                Precision.STATIC: "int8 weights and input (QDQ, calibrated)"}[self]

    @property
    def below(self) -> "Precision":
        """The precision a unit steps down to past the budget."""
        return Precision.WEIGHTS if self > Precision.WEIGHTS else Precision.FLOAT


LEVELS = 256  # uint8 activations: 0..255, zero exactly on the grid


def dequantized(writer: Writer, weight: Weight, rounded: Rounded, bodies: list) -> None:
    """Nodes computing ``weight.name`` (a float tensor) from its int8 values and scales, stored once in the main
    graph: a ``Cast`` and a ``Mul`` where the main graph reads it, and in each of ``bodies`` (the subgraphs
    reading it: a Scan's step) a ``Cast`` and a ``Mul`` of its own, which its reads then take.

    Every runtime computes these exactly, and onnxruntime folds them into a float constant when it loads the
    model. ``DequantizeLinear`` is what tools read as an int8 weight, but measured here onnxruntime 1.32 fuses one
    feeding a MatMul into ``MatMulNBits`` computing with int8 activations (3.5e-3 off, silently), rknn-toolkit2 2.5
    crashes building one feeding an LSTM or GRU, and onnx2torch has no converter for it. Dequantized outside a
    Scan's step, a ConvLSTM's kernels fail OpenVINO 2026.4's conversion of the Scan.
    """
    stored = writer.tensor(rounded.values, f"{weight.name}_int8")
    scales = writer.tensor(rounded.scales, f"{weight.name}_scales")
    if any(weight.name in n.input for n in writer.graph.node):
        cast = writer.op("Cast", [stored], f"{weight.name}_cast", to=onnx.TensorProto.FLOAT)
        writer.op("Mul", [cast, scales], weight.name, output_names=[weight.name])
    for body in bodies:  # the step's own nodes, named apart from every name the model holds
        step = Writer(body, writer.opset, writer.taken)
        local = step.op("Mul", [step.op("Cast", [stored], f"{weight.name}_step_cast", to=onnx.TensorProto.FLOAT),
                                scales], f"{weight.name}_step")
        for _, node in nodes_of(body):
            node.input[:] = [local if name == weight.name else name for name in node.input]
        set_nodes(body, step.nodes + list(body.node))


def _bodies(graph: onnx.GraphProto, name: str) -> list:
    """The subgraphs of ``graph``'s nodes (each whole, nested ones within it) in which a node reads ``name``."""
    return [body for node in graph.node for body in subgraphs(node)
            if any(name in inner.input for _, inner in nodes_of(body))]


def written(model_proto: onnx.ModelProto, units: list, chosen: dict, rounded: dict,
            ranges: Optional[dict] = None) -> onnx.ModelProto:
    """A copy of ``model_proto`` with each unit at its precision in ``chosen`` (unit name -> :class:`Precision`),
    from its weights' ``rounded`` (initializer name -> :class:`Rounded`) and, static, its inputs' calibrated
    ``ranges`` (unit name -> (lowest, highest))."""
    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    graph = model.graph
    writer = Writer(graph, opset_of(model))
    dropped, replaced = set(), {}
    for unit in units:
        precision = chosen.get(unit.name, Precision.FLOAT)
        if precision == Precision.FLOAT:
            continue
        dropped.update(w.name for w in unit.weights)
        if precision == Precision.INTEGER:
            index = next(k for k, n in enumerate(graph.node) if (n.name or n.output[0]) == unit.name)
            replaced[index] = _integer(writer, graph.node[index], unit, rounded)
        elif precision == Precision.STATIC:
            _static(writer, unit, rounded, ranges[unit.name])
        else:
            for weight in unit.weights:
                dequantized(writer, weight, rounded[weight.name], _bodies(graph, weight.name))
    dequantizing, built = list(writer.nodes), writer.initializers
    nodes = dequantizing + [n for k, node in enumerate(graph.node) for n in replaced.get(k, [node])]
    if Precision.STATIC in chosen.values():  # a QuantizeLinear follows what computes its input
        nodes = topological(nodes, set())
    set_nodes(graph, nodes)
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept + built)
    if replaced and not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    return model


def _static(writer: Writer, unit: Unit, rounded: dict, span: tuple) -> None:
    """The unit in QDQ form: each input it multiplies (one calibrated scale for all, so every step and direction
    shares it) through a ``QuantizeLinear`` to uint8 and a ``DequantizeLinear``; a MatMul's, Gemm's or Conv's
    weight a per-channel ``DequantizeLinear`` of int8 values, what static quantizers fuse into integer kernels. A
    recurrent node's weights keep the ``Cast`` and ``Mul`` (rknn-toolkit2 crashes building a ``DequantizeLinear``
    feeding an LSTM or GRU); its gates and state compute in float."""
    graph = writer.graph
    low, high = min(span[0], 0.0), max(span[1], 0.0)
    step = (high - low) / (LEVELS - 1) or 1.0
    scale = writer.tensor(np.asarray(step, np.float32), f"{unit.name}_input_scale")
    zero = writer.tensor(np.asarray(np.clip(round(-low / step), 0, LEVELS - 1), np.uint8), f"{unit.name}_input_zero")
    readers = {reader for weight in unit.weights for reader, _ in weight.readers}
    for name in unit.activations:
        quantized = writer.op("QuantizeLinear", [name, scale, zero], f"{name}_quantized")
        back = writer.op("DequantizeLinear", [quantized, scale, zero], f"{name}_dequantized")
        for node in graph.node:
            if (node.name or node.output[0]) in readers and node.input[0] == name:
                node.input[0] = back
    for weight in unit.weights:
        q = rounded[weight.name]
        if unit.hidden or writer.opset < 13:  # per-channel DequantizeLinear is opset 13's
            dequantized(writer, weight, q, [])
            continue
        writer.op("DequantizeLinear", [writer.tensor(q.values, f"{weight.name}_int8"),
                                       writer.tensor(q.scales.reshape(-1), f"{weight.name}_scales"),
                                       writer.tensor(np.zeros(q.scales.size, np.int8), f"{weight.name}_zero")],
                  weight.name, output_names=[weight.name], axis=weight.channel_axis)


def _integer(writer: Writer, node: onnx.NodeProto, unit: Unit, rounded: dict) -> list:
    """The node computed by onnxruntime's integer kernel (its outputs keep their names); its constants are the
    writer's."""
    if unit.op == "LSTM":
        inputs = list(node.input) + [""] * (8 - len(node.input))
        extra = []
        for index, weight in ((1, unit.weights[0]), (2, unit.weights[1])):
            q = rounded[weight.name]
            # the kernel takes W [directions, inputs, 4 hidden] and R [directions, hidden, 4 hidden]
            inputs[index] = writer.tensor(np.ascontiguousarray(np.transpose(q.values, (0, 2, 1))),
                                          f"{weight.name}_int8")
            steps = q.scales[:, :, 0]
            extra += [writer.tensor(steps, f"{weight.name}_scales"),
                      writer.tensor(np.zeros(steps.shape, np.int8), f"{weight.name}_zero")]
        kept = {k: v for k, v in attributes(node).items() if k != "layout"}
        return [helper.make_node("DynamicQuantizeLSTM", inputs[:8] + extra, list(node.output),
                                 name=writer.name(f"{unit.name}_int8"), domain=MICROSOFT, **kept)]
    weight = unit.weights[0]  # a MatMul of a constant B [K, N]: one scale per column
    q = rounded[weight.name]
    steps = q.scales.reshape(-1)
    return [helper.make_node("DynamicQuantizeMatMul",
                             [node.input[0], writer.tensor(q.values, f"{weight.name}_int8"),
                              writer.tensor(steps, f"{weight.name}_scales"),
                              writer.tensor(np.zeros(steps.shape, np.int8), f"{weight.name}_zero")],
                             list(node.output), name=writer.name(f"{unit.name}_int8"), domain=MICROSOFT)]


def int8_held(model_proto: onnx.ModelProto, unit: Unit, precision: Precision) -> str:
    """Why ``unit`` is not at ``precision`` in the written model ("" where it is), read from its ops: every read of
    each weight takes a ``Mul`` of a ``Cast`` of an int8 initializer, or the node is an integer kernel reading int8
    ones."""
    graph = model_proto.graph
    int8 = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    every = list(nodes_of(graph))
    producer = {o: n for _, n in every for o in n.output}
    if precision == Precision.INTEGER:
        kernel = producer.get(unit.output)
        if kernel is None or kernel.domain != MICROSOFT or kernel.op_type not in INTEGER_KERNELS:
            return "no integer kernel computes it"
        return "" if all(kernel.input[k] in int8 for k in ((1, 2) if unit.hidden else (1,))) else \
            "its integer kernel reads float weights"
    by_name = {n.name or n.output[0]: n for _, n in every}
    if precision == Precision.STATIC:
        for reader in {r for w in unit.weights for r, _ in w.readers}:
            node = by_name.get(reader)
            back = producer.get(node.input[0]) if node is not None else None
            ahead = producer.get(back.input[0]) if back is not None and back.op_type == "DequantizeLinear" else None
            if ahead is None or ahead.op_type != "QuantizeLinear":
                return f"{reader} does not read its input through a QuantizeLinear and a DequantizeLinear"
    for weight in unit.weights:
        for reader, index in weight.readers:
            node = by_name.get(reader)
            mul = producer.get(node.input[index]) if node is not None and len(node.input) > index else None
            if mul is not None and mul.op_type == "DequantizeLinear" and precision == Precision.STATIC and \
                    mul.input[0] in int8:
                continue
            cast = producer.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" else None
            if cast is None or cast.op_type != "Cast" or cast.input[0] not in int8:
                return f"{weight.name} is not computed from int8 values where {reader} reads it"
    return ""
