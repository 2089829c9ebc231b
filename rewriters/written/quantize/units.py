"""The layers of a written model whose weights can be stored in int8: each a :class:`Unit` of
:class:`Weight` s, every weight with the axis its scales run along (one per output channel) and the axis it
is contracted over.

A recurrent node (LSTM, GRU, RNN) is one unit of its two weights, ``W`` and ``R`` (``[directions, gates *
hidden, inputs]``): one scale per direction and gate row, so no gate shares a scale with another. Any other
float initializer read only as a MatMul's ``B`` (rank 2), a Gemm's ``B`` or a Conv's ``W``, in the graph or a
subgraph, is a unit of its own (steps written out read one weight from every step: one unit, one set of
scales for every step). Constants too small to be any layer's weights (:data:`SMALLEST`) stay float.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx

from ...description import RECURRENT_NODES
from ...runtimes import FORWARD
from ..graph import attribute, names_of, nodes_of, slot, subgraphs
from ..scope import fresh

SMALLEST = 16  # elements: a smaller constant is no layer's weight (a mask's arithmetic), and saves nothing


@dataclass(frozen=True)
class Weight:
    """A float initializer a unit reads as its weight."""

    name: str
    channel_axis: int  # one scale per index of this axis (a recurrent weight: per direction too, axis 0)
    contracted_axis: Optional[int]  # the axis the product sums over (None: a Conv's, over several axes)
    per_direction: bool = False  # a recurrent node's [directions, rows, inputs]: its scales [directions, rows]
    meets: str = ""  # the tensor it multiplies, in the main graph ("" where none is there to tap)
    recurrent: bool = False  # R: it multiplies the node's own output of the step before
    readers: tuple = ()  # (node name, input index) of every read of it, in the graph or a subgraph


@dataclass(frozen=True)
class Unit:
    """One layer's weights, quantized together or not at all."""

    name: str  # the name of the node that reads them (the first, for a weight read by several): the report's layer
    op: str  # the reading node's op type
    weights: tuple
    integer: bool = False  # onnxruntime has a kernel computing it in int8 (DynamicQuantizeLSTM, ...MatMul)
    hidden: int = 0  # a recurrent node's hidden size
    output: str = ""  # the reading node's first output (an integer kernel's, once it computes the unit)
    lengths: str = ""  # a recurrent node's sequence_lens ("" where it has none)
    direction: str = FORWARD  # a recurrent node's direction
    # the float tensors its readers multiply by the weights (a recurrent node's X, a MatMul's A; one per step
    # written out), where every reader is in the main graph: one calibrated int8 scale for them all ("static")
    activations: tuple = ()


def hoisted(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose subgraphs' weights (a Scan step's recurrent weight) are the main graph's: a
    subgraph's float initializer read as a weight is dropped from it, and its readers read the main graph's
    initializer of the same value, or a new one holding it (a step reads the outer value; one stored copy)."""
    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    main = model.graph
    by_value = {_content(t): t.name for t in main.initializer}
    taken = names_of(main)
    for _, node in nodes_of(main):  # every subgraph, nested ones included
        for body in subgraphs(node):
            _hoist(body, main, by_value, taken)
    return model


def _hoist(body: onnx.GraphProto, main: onnx.GraphProto, by_value: dict, taken: set) -> None:
    readers: dict = {}
    for where, node in nodes_of(body):
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index, where is body))
    moved = {}
    for tensor in list(body.initializer):
        reads = readers.get(tensor.name, [])
        if tensor.data_type != onnx.TensorProto.FLOAT or not reads or _weight(tensor.name, tensor, reads) is None:
            continue
        key = _content(tensor)
        if key not in by_value:
            name = fresh(tensor.name)
            while name in taken:
                name = fresh(name)
            taken.add(name)
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = name
            main.initializer.append(copy)
            by_value[key] = name
        moved[tensor.name] = by_value[key]
    if not moved:
        return
    kept = [t for t in body.initializer if t.name not in moved]
    del body.initializer[:]
    body.initializer.extend(kept)
    for _, node in nodes_of(body):
        for index, name in enumerate(node.input):
            if name in moved:
                node.input[index] = moved[name]


def _content(tensor: onnx.TensorProto) -> tuple:
    return tensor.data_type, tuple(tensor.dims), onnx.numpy_helper.to_array(tensor).tobytes()


def units_of(model_proto: onnx.ModelProto) -> list:
    """The quantizable units of ``model_proto``, in graph order."""
    graph = model_proto.graph
    initializers = {t.name: t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    found, slots = [], {}  # initializer -> [(node, slot, main graph)]
    for where, node in nodes_of(graph):
        inner = {t.name for t in where.initializer} if where is not graph else set()
        for index, name in enumerate(node.input):
            if name in initializers and name not in inner:
                slots.setdefault(name, []).append((node, index, where is graph))
    taken = set()
    for node in graph.node:
        if node.op_type in RECURRENT_NODES and node.domain in ("", "ai.onnx"):
            unit = _recurrent(node, initializers, slots)
            if unit is not None:
                found.append(unit)
                taken.update(w.name for w in unit.weights)
    for name, readers in slots.items():
        if name in taken:
            continue
        weight = _weight(name, initializers[name], readers)
        if weight is not None:
            node = readers[0][0]
            found.append(Unit(node.name or node.output[0], node.op_type, (weight,),
                              integer=node.op_type == "MatMul" and len(readers) == 1 and readers[0][2],
                              output=node.output[0], activations=_activations(readers, initializers)))
    return found


def _recurrent(node: onnx.NodeProto, initializers: dict, slots: dict) -> Optional[Unit]:
    names = [node.input[1], node.input[2]] if len(node.input) > 2 else []
    if not names or any(n not in initializers or len(slots.get(n, ())) != 1 for n in names):
        return None
    if any(len(initializers[n].dims) != 3 for n in names):
        return None
    here = node.name or node.output[0]
    weights = (Weight(names[0], 1, 2, per_direction=True, meets=node.input[0], readers=((here, 1),)),
               Weight(names[1], 1, 2, per_direction=True, meets=node.output[0] if node.output else "",
                      recurrent=True, readers=((here, 2),)))
    return Unit(here, node.op_type, weights, integer=node.op_type == "LSTM" and not attribute(node, "layout", 0),
                hidden=int(attribute(node, "hidden_size", 0) or 0), output=slot(node.output, 0),
                lengths=slot(node.input, 4), direction=attribute(node, "direction", FORWARD),
                activations=_activations([(node, 1, True)], initializers))


def _activations(readers: list, initializers: dict) -> tuple:
    """The data inputs (input 0) the readers multiply by the weight, each once; () where a reader is in a
    subgraph (no one tensor of the main graph to calibrate) or its data input is a constant."""
    names = [node.input[0] for node, _, main in readers if main and node.input and node.input[0]]
    if len(names) != len(readers) or any(name in initializers for name in names):
        return ()
    return tuple(dict.fromkeys(names))


def _weight(name: str, tensor: onnx.TensorProto, readers: list) -> Optional[Weight]:
    """The weight an initializer is to every node that reads it, or None (it is not only a weight, or its
    readers disagree on its axes, or it is small)."""
    if int(np.prod(tensor.dims)) < SMALLEST:
        return None
    axes = {_axes(node, index, len(tensor.dims)) for node, index, _ in readers}
    if len(axes) != 1 or None in axes:
        return None
    channel, contracted = axes.pop()
    main = readers[0][0].input[0] if len(readers) == 1 and readers[0][2] else ""
    return Weight(name, channel, contracted, meets=main,
                  readers=tuple((node.name or node.output[0], index) for node, index, _ in readers))


def _axes(node: onnx.NodeProto, index: int, rank: int) -> Optional[tuple]:
    """(channel axis, contracted axis) of a weight read at ``index`` of ``node``, or None where it is no weight."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "MatMul" and index == 1 and rank == 2:
        return 1, 0
    if node.op_type == "Gemm" and index == 1 and rank == 2:
        return (0, 1) if attribute(node, "transB", 0) else (1, 0)
    if node.op_type == "Conv" and index == 1 and rank >= 3:
        return 0, None
    return None
