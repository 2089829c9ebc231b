"""The int8 form of each unit, written into a copy of the model.

A unit is kept float, stored in int8 and dequantized where it is read (:data:`WEIGHTS`: compute stays float),
or computed by onnxruntime's integer kernels (:data:`INTEGER`: an LSTM as ``DynamicQuantizeLSTM``, a MatMul as
``DynamicQuantizeMatMul``, both quantizing their float input at run time). A stored weight is dequantized by a
``Cast`` and a ``Mul`` (:func:`dequantized`).
"""
from __future__ import annotations

import enum

import numpy as np
import onnx
from onnx import helper

from ..builder import Writer
from ..graph import attributes, nodes_of, opset_of, set_nodes, subgraphs
from .rounding import Rounded
from .units import Unit, Weight

MICROSOFT = "com.microsoft"
INTEGER_KERNELS = ("DynamicQuantizeLSTM", "DynamicQuantizeMatMul")


class Precision(enum.IntEnum):
    """How far a unit is quantized, in order."""

    FLOAT = 0
    WEIGHTS = 1  # int8 weights, float compute
    INTEGER = 2  # int8 weights, integer compute (onnxruntime's kernels)

    @property
    def words(self) -> str:
        return {Precision.FLOAT: "float", Precision.WEIGHTS: "int8 weights, float compute",
                Precision.INTEGER: "int8 (integer compute in onnxruntime)"}[self]


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


def written(model_proto: onnx.ModelProto, units: list, chosen: dict, rounded: dict) -> onnx.ModelProto:
    """A copy of ``model_proto`` with each unit at its precision in ``chosen`` (unit name -> :class:`Precision`),
    from its weights' ``rounded`` (initializer name -> :class:`Rounded`)."""
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
        else:
            for weight in unit.weights:
                dequantized(writer, weight, rounded[weight.name], _bodies(graph, weight.name))
    dequantizing, built = list(writer.nodes), writer.initializers
    nodes = dequantizing + [n for k, node in enumerate(graph.node) for n in replaced.get(k, [node])]
    set_nodes(graph, nodes)
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept + built)
    if replaced and not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    return model


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
    for weight in unit.weights:
        for reader, index in weight.readers:
            node = by_name.get(reader)
            mul = producer.get(node.input[index]) if node is not None and len(node.input) > index else None
            cast = producer.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" else None
            if cast is None or cast.op_type != "Cast" or cast.input[0] not in int8:
                return f"{weight.name} is not computed from int8 values where {reader} reads it"
    return ""
