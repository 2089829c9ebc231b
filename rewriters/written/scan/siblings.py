"""Sibling products made one: ``Conv`` or ``MatMul`` nodes of a step that read the same tensor with the same
attributes, each by constant weights, become one node with the weights concatenated along the output
channels (a ``Conv``'s filters, a ``MatMul``'s columns) and a ``Split`` after it, which gives each sibling's
output its own name again.

Each output channel of a convolution, and each column of a product, is computed from its own filter or
column alone: the concatenated node computes every sibling's values, in the order of its channels. Keras's
convolutional LSTM writes its four gates so (four input convolutions of the step's input, four recurrent
ones of the state), and so may any cell with one kernel per gate; one node runs the four at once, and an
input one moves out of the step as one node (:mod:`.hoisting`).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper

from ..graph import attributes, reads, subgraphs
from ..scope import TypeTable, fresh
from .constants import Constants
from .folding import evaluate

# the attributes a Conv's output depends on besides its weights: siblings must agree on all of them
_CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def fuse_siblings(body: list, constants: Constants, types: TypeTable, opset: int, keep: Callable[[str], bool]) -> tuple:
    """``body`` (a step's nodes, in order) with each group of sibling products made one node and a Split, at
    the first sibling's place: (the nodes, how many siblings were merged away). First, a constant added to
    each channel of a Conv's output alone (tf2onnx writes Keras's bias so) is the Conv's own bias."""
    value, const = _folding(body, constants.value, opset), constants.const
    body = _biased(once(body, value, keep), value, const, keep)
    groups: dict = {}
    for position, node in enumerate(body):
        key = _key(node, value)
        if key is not None:
            groups.setdefault(key, []).append(position)
    merged, replaced = 0, {}
    for key, positions in groups.items():
        if len(positions) < 2:
            continue
        siblings = [body[p] for p in positions]
        replaced[positions[0]] = _merged(siblings, value, const, types, opset)
        for position in positions[1:]:
            replaced[position] = []
        merged += len(siblings) - 1
    if not merged:
        return body, 0
    nodes = []
    for position, node in enumerate(body):
        nodes.extend(replaced.get(position, [node]))
    return nodes, merged


def once(body: list, value: Callable, keep: Callable[[str], bool]) -> list:
    """``body`` with each node that repeats an earlier one (the same op and attributes, reading the same
    tensors or constants of the same value) left out, its readers reading the earlier one's output:
    tf2onnx writes each of Keras's one-dimensional convolutions with its own ``Unsqueeze`` and ``Transpose``
    of the same input, which then are no siblings' shared input. Nodes holding graphs, read by one, or
    whose output the step gives are kept."""
    held = {name for node in body if subgraphs(node) for name in reads(node)}
    seen: dict = {}
    renamed: dict = {}
    kept = []
    for node in body:
        if any(name in renamed for name in node.input):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [renamed.get(name, name) for name in node.input]
            node = copy
        key = _repeat_key(node, value)
        if key is None or any(keep(out) or out in held for out in node.output):
            kept.append(node)
            continue
        first = seen.setdefault(key, node)
        if first is node:
            kept.append(node)
            continue
        renamed.update(zip(node.output, first.output))
    return kept


def _repeat_key(node: onnx.NodeProto, value: Callable) -> Optional[tuple]:
    """What makes two nodes compute the same (None for one that holds a graph or makes no output)."""
    if subgraphs(node) or not node.output or not all(node.output) or node.op_type.startswith("Random") or \
            node.op_type in ("Bernoulli", "Multinomial"):
        return None
    inputs = []
    for name in node.input:
        constant = value(name) if name else None
        inputs.append(name if constant is None or constant.size > 64 else
                      ("const", constant.dtype.str, constant.shape, constant.tobytes()))
    shown = tuple(sorted((key, repr(value)) for key, value in attributes(node).items()))
    return node.domain, node.op_type, tuple(inputs), shown, len(node.output)


def _biased(body: list, value: Callable, const: Callable, keep: Callable[[str], bool]) -> list:
    """``body`` with each ``Add(Conv(x, W[, B]), b)``, ``b`` a constant of one value per output channel (or
    one value) and the Conv read by the Add alone, as ``Conv(x, W, B + b)`` in the Add's place."""
    readers: dict = {}
    for node in body:
        for name in reads(node):
            readers[name] = readers.get(name, 0) + 1
    producer = {out: node for node in body for out in node.output}
    replaced: dict = {}  # id of a node -> its replacement (None: removed)
    for node in body:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        for at in (0, 1):
            conv, added = producer.get(node.input[at]), value(node.input[1 - at])
            if conv is None or conv.op_type != "Conv" or id(conv) in replaced or added is None or \
                    readers.get(conv.output[0]) != 1 or keep(conv.output[0]):
                continue
            weights = value(conv.input[1])
            bias = _channels(added, weights.shape[0], len(weights.shape)) if weights is not None else None
            old = value(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros_like(bias)
            if bias is None or old is None or bias.dtype != weights.dtype:
                continue
            made = helper.make_node("Conv", [conv.input[0], conv.input[1], const(old + bias, "bias")],
                                    list(node.output), name=conv.name or fresh("Conv"))
            made.attribute.extend(conv.attribute)
            replaced[id(conv)], replaced[id(node)] = None, made
            break
    return [replaced.get(id(node), node) for node in body if replaced.get(id(node), node) is not None]


def _channels(added: np.ndarray, channels: int, rank: int) -> Optional[np.ndarray]:
    """A constant added to a convolution's output (of ``rank`` dims, ``channels`` on axis 1) as one value per
    channel, where it is one (per channel, broadcast over the rest, or a single value); else None."""
    if added.size == 1:
        return np.full(channels, added.reshape(-1)[0], added.dtype)
    shape = list(added.shape)
    while len(shape) < rank:
        shape.insert(0, 1)
    if len(shape) == rank and shape[0] == 1 and shape[1] == channels and all(d == 1 for d in shape[2:]):
        return added.reshape(channels)
    return None


def _folding(body: list, value: Callable, opset: int) -> Callable:
    """``value`` that also knows what the step computes from constants alone (tf2onnx writes a Conv's
    filters as a Transpose of Keras's kernel; it runs once, outside, after :mod:`.hoisting`)."""
    producer = {out: node for node in body for out in node.output}
    known: dict = {}

    def of(name: str, depth: int = 0) -> Optional[np.ndarray]:
        if name in known:
            return known[name]
        found = value(name)
        node = producer.get(name)
        if found is None and node is not None and depth < 8 and not subgraphs(node):
            inputs = [of(i, depth + 1) for i in node.input if i]
            if all(v is not None for v in inputs):
                outputs = evaluate(node, inputs, opset)
                found = None if outputs is None else dict(zip(node.output, outputs)).get(name)
        known[name] = found
        return found

    return of


def _key(node: onnx.NodeProto, value: Callable) -> Optional[tuple]:
    """What siblings share (the op, the tensor read, the attributes, the weights' shape but for the output
    channels, their type), or None for a node that has no siblings of this kind."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    if node.op_type == "Conv" and len(node.input) >= 2:
        weights = value(node.input[1])
        given = attributes(node)
        if weights is None or given.get("group", 1) != 1 or set(given) - set(_CONV_ATTRIBUTES):
            return None
        if len(node.input) > 2 and node.input[2] and value(node.input[2]) is None:
            return None
        shown = tuple(sorted((k, repr(v)) for k, v in given.items()))
        return ("Conv", node.input[0], shown, weights.shape[1:], weights.dtype.str)
    if node.op_type == "MatMul" and len(node.input) == 2:
        weights = value(node.input[1])
        if weights is None or weights.ndim != 2:
            return None
        return ("MatMul", node.input[0], (), weights.shape[:1], weights.dtype.str)
    return None


def _merged(siblings: list, value: Callable, const: Callable, types: TypeTable, opset: int) -> list:
    """The one node computing every sibling's output, and the Split giving each its own."""
    first = siblings[0]
    conv = first.op_type == "Conv"
    axis = 0 if conv else 1  # a Conv's filters are its weights' first axis, a MatMul's columns the second
    weights = [value(node.input[1]) for node in siblings]
    sizes = [w.shape[axis] for w in weights]
    inputs = [first.input[0], const(np.concatenate(weights, axis=axis), first.input[1])]
    biases = [value(node.input[2]) if len(node.input) > 2 and node.input[2] else None for node in siblings]
    if conv and any(bias is not None for bias in biases):  # a sibling with none adds zeros
        inputs.append(const(np.concatenate([bias if bias is not None else np.zeros(size, w.dtype)
                                            for bias, size, w in zip(biases, sizes, weights)]), "bias"))
    together = fresh(first.output[0])
    made = helper.make_node(first.op_type, inputs, [together], name=fresh(first.name or first.op_type))
    made.attribute.extend(first.attribute)
    elem = types.elem_type(first.output[0])
    if elem:
        types.types[together] = helper.make_tensor_type_proto(elem, None)
    split_axis = 1 if conv else -1  # a Conv's output channels, a product's last axis
    outputs = [node.output[0] for node in siblings]
    if opset >= 13:
        split = helper.make_node("Split", [together, const(np.array(sizes, np.int64), "split")], outputs,
                                 name=fresh("siblings_split"), axis=split_axis)
    else:
        split = helper.make_node("Split", [together], outputs, name=fresh("siblings_split"), axis=split_axis,
                                 split=sizes)
    return [made, split]
