"""A Scan-form layer's states streamed: each as a model input it starts from and a model output it ends with.

Streaming (``streaming=True``, and every model with ``stateful=True`` layers) promises that feeding each
call's state outputs as the next call's state inputs runs a sequence chunk by chunk exactly as whole. A
Scan of a loop's own step carries what the loop carries, no more: every carried value is streamed, in
the loop's order and layout, so a chunk starts where the last one ended. Their names are the native
nodes' where the loop carries its kind's states alone (``<layer>/h_in``, and ``<layer>/c_in`` for an LSTM
or a ConvLSTM), else ``<layer>/state_<k>_in`` (a masked Keras 3 layer also carries its last output); the
outputs end in ``_out``.

A start the model computes from its inputs' values (``initial_state=``) stays the model's; one computed
from constants and its inputs' shapes alone (Keras's zero state, a stateful layer's stored one, frozen)
becomes the input. Where that start is a constant, or zeros of a shape known when converting, the input
carries it as its default (an initializer of the same name, which a feed overrides); else the input is
required. A backward pass cannot stream: it needs the whole sequence.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...description import NoMatch
from ..graph import subgraphs
from ..scope import Scope, TypeTable, fresh

_FILLS = frozenset({"ConstantOfShape", "Expand"})
_SAME_VALUES = frozenset({"Identity", "Transpose", "Reshape", "Cast", "Squeeze", "Unsqueeze"})


def stream_states(written, row, scope: Scope, types: TypeTable) -> tuple:
    """Give ``written``'s Scan (of ``row``'s layer) its carried states as model inputs and outputs; returns
    (the inputs, "" for a start the model computes; the outputs). :class:`NoMatch` where it cannot."""
    if row.direction == "backward":
        raise NoMatch("cannot stream: a backward pass (Bidirectional or go_backwards) needs the whole sequence")
    graph = scope.graph
    roles = _roles(row.kind, len(written.state_starts))
    taken = {o for n in graph.node for o in n.output} | {i.name for i in graph.input} | \
        {t.name for t in graph.initializer}
    names = [(f"{row.layer}/{role}_in", f"{row.layer}/{role}_out") for role in roles]
    for name in (n for pair in names for n in pair):
        if name in taken:
            raise NoMatch(f"cannot stream: the name {name} is already taken in the graph")
    if not all(written.state_ends):
        raise NoMatch("cannot stream: a carried state's last value is not given")
    typed = [(types.elem_type(start) or types.elem_type(end),
              _merged(_merged(types.shape(start), types.shape(end)), step_shape))
             for start, end, step_shape in zip(written.state_starts, written.state_ends, written.state_shapes)]
    for (elem, shape), start in zip(typed, written.state_starts):
        if not elem:
            raise NoMatch("cannot stream: the element type of a carried state is not known", start)
        if shape is None or any(not isinstance(d, int) or d < 0 for d in shape[1:]):
            raise NoMatch("cannot stream: the shape of a carried state is not known", start)
    scan = next(node for node in graph.node if node.name == written.loop and node.op_type == "Scan")
    around = {node.output[0]: node for node in graph.node if node.name in set(written.around) and node.output}
    # everything is built first; the graph changes only once the whole plan is made
    inputs, outputs, new_inputs, defaults, nodes, new_outputs, rewired = [], [], [], [], [], [], []
    for index, (start, end, (streamed_in, streamed_out), (elem, shape)) in enumerate(zip(
            written.state_starts, written.state_ends, names, typed)):
        if _from_values_of_inputs(start, scope):
            inputs.append("")
        else:
            default = _default(start, shape, scope)
            new_inputs.append(helper.make_tensor_value_info(streamed_in, elem, _dims(shape, default)))
            if default is not None:
                defaults.append(numpy_helper.from_array(default.astype(helper.tensor_dtype_to_np_dtype(elem)),
                                                        streamed_in))
            # the state's own slot of the Scan, or the transpose into its layout that feeds it (two states may
            # start from one tensor: each gets its own input)
            laid = around.get(scan.input[index])
            if laid is not None and laid.op_type == "Transpose" and laid.input[0] == start:
                rewired.append((laid, 0, streamed_in))
            else:
                rewired.append((scan, index, streamed_in))
            inputs.append(streamed_in)
        nodes.append(helper.make_node("Identity", [end], [streamed_out], name=fresh(streamed_out)))
        new_outputs.append(helper.make_tensor_value_info(streamed_out, elem, _dims(shape, None)))
        outputs.append(streamed_out)
    for node, slot, name in rewired:
        node.input[slot] = name
        scope.reread(node)
    graph.input.extend(new_inputs)
    scope.add_initializers(defaults)
    scope.append(nodes)
    graph.output.extend(new_outputs)
    return tuple(inputs), tuple(outputs)


def _merged(first: Optional[list], second: Optional[list]) -> Optional[list]:
    """Two views of one shape, each dimension known where either knows it."""
    if first is None or second is None or len(first) != len(second):
        return first if first is not None else second
    return [a if isinstance(a, int) and a >= 0 else b for a, b in zip(first, second)]


_ROLES = {"SimpleRNN": ["h"], "GRU": ["h"], "LSTM": ["h", "c"]}  # Keras's states of each built-in kind, in order


def _roles(kind: str, count: int) -> list:
    """The native nodes' names where the loop carries the kind's states alone, else ``state_<k>``."""
    roles = ["h", "c"] if kind.startswith("ConvLSTM") else _ROLES.get(kind)
    return roles if roles and len(roles) == count else [f"state_{index}" for index in range(count)]


def _from_values_of_inputs(start: str, scope: Scope) -> bool:
    """Whether ``start`` depends on a model input's values (not only on its shape)."""
    inputs = {value.name for value in scope.graph.input}
    initializers = {tensor.name for tensor in scope.graph.initializer}
    pending, seen = [start], set()
    while pending:
        name = pending.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in inputs and name not in initializers:
            return True
        node = scope.producer(name)
        if node is None or node.op_type == "Shape":
            continue
        if subgraphs(node):
            return True  # what a subgraph reads is not followed: taken as the model's
        pending.extend(node.input)
    return False


def _default(start: str, shape: Optional[list], scope: Scope) -> Optional[np.ndarray]:
    """The start's value where known when converting: a constant, or zeros of a shape fully known."""
    value = scope.constant(start)
    if value is not None:
        return np.asarray(value)
    if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
        return None
    name = start
    for _ in range(16):  # through ops that keep every value, to a fill of a constant zero
        node = scope.producer(name)
        if node is None:
            return None
        if node.op_type in _FILLS:
            fill = _fill_value(node, scope)
            return np.zeros(shape, fill.dtype) if fill is not None and not fill.any() else None
        if node.op_type not in _SAME_VALUES:
            return None
        name = node.input[0]
    return None


def _fill_value(node: onnx.NodeProto, scope: Scope) -> Optional[np.ndarray]:
    if node.op_type == "Expand":
        return scope.constant(node.input[0])
    for held in node.attribute:
        if held.name == "value":
            return numpy_helper.to_array(held.t)
    return np.zeros(1, np.float32)  # ConstantOfShape's default


def _dims(shape: Optional[list], default: Optional[np.ndarray]) -> Optional[list]:
    if default is not None:
        return list(default.shape)
    if shape is None:
        return None
    return [d if isinstance(d, int) and d >= 0 else None for d in shape]
