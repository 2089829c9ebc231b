"""From a body match and its loop node in the outer graph to a :class:`RecurrentLayer`.

Everything here is about the outer graph: the loop's inputs give the weights and the
initial states, its consumers tell which outputs Keras uses. The cell kind only enters
through the :class:`BodyMatch`, so this module serves every kind.
"""
from __future__ import annotations

import re
import numpy as np

from .evaluate import NotEvaluable, evaluate
from .layer import BodyMatch, Direction, NoMatch, RecurrentLayer, StateRole, Wiring, require

_WRAPPER_SCOPES = {"PartitionedCall", "StatefulPartitionedCall", "while"}


def layer_name(loop_name: str, known_layers: frozenset = frozenset()) -> str:
    """The Keras layer a loop belongs to, as far as its scope tells.

    With the model's layer names at hand, the innermost scope that names a layer wins
    (tracing may have added a ``_1`` suffix to the scope). Otherwise the scope path without
    the model's own scope.
    """
    parts = [p for p in loop_name.split("/") if p not in _WRAPPER_SCOPES]
    for part in reversed(parts):
        for candidate in (part, re.sub(r"_\d+$", "", part)):
            if candidate in known_layers:
                return candidate
    if len(parts) > 1:
        parts = parts[1:]
    return "/".join(parts) or loop_name


def build_layer(graph, loop, match: BodyMatch, name: str) -> RecurrentLayer:
    """Read weights, input, outputs and initial states of ``loop`` into a layer description."""
    x, direction = _sequence_input(graph, loop, match)
    weights = _gate_weights(graph, loop, match)
    return RecurrentLayer(
        name=name, kind=match.kind, direction=direction,
        activations=match.activations, linear_before_reset=match.linear_before_reset,
        wiring=Wiring(x=x, **_outputs(graph, loop, match), initial_states=_initial_states(graph, loop, match)),
        **weights)


def _slot_values(graph, loop):
    cache = {}

    def value(slot: int) -> np.ndarray:
        if slot not in cache:
            try:
                cache[slot] = evaluate(graph, loop.input[slot])
            except NotEvaluable as error:
                raise NoMatch(f"a weight is not constant: {error.reason}", error.node_name) from error
        return cache[slot]

    return value


def _gate_weights(graph, loop, match: BodyMatch) -> dict:
    values = _slot_values(graph, loop)
    try:
        kernels = [np.asarray(g.input_weight(values)) for g in match.gates]
        recurrents = [None if g.recurrent_weight is None else np.asarray(g.recurrent_weight(values))
                      for g in match.gates]
        input_biases = [None if g.input_bias is None else np.asarray(g.input_bias(values)) for g in match.gates]
        recurrent_biases = [None if g.recurrent_bias is None else np.asarray(g.recurrent_bias(values))
                            for g in match.gates]
    except NotEvaluable as error:
        raise NoMatch(f"cannot read a weight: {error.reason}", error.node_name) from error
    require(all(k.ndim == 2 for k in kernels), "a kernel is not a matrix", loop.name)
    input_size, hidden = kernels[0].shape
    require(all(k.shape == (input_size, hidden) for k in kernels), "gate kernels differ in shape", loop.name)
    dtype = kernels[0].dtype
    zeros_r = np.zeros((hidden, hidden), dtype)
    zeros_b = np.zeros((hidden,), dtype)
    recurrents = [zeros_r if r is None else r for r in recurrents]
    require(all(r.shape == (hidden, hidden) for r in recurrents), "a recurrent kernel is not H x H", loop.name)

    def bias(part):
        part = zeros_b if part is None else np.broadcast_to(part, (hidden,))
        return part.astype(dtype)

    return dict(
        hidden_size=hidden, input_size=input_size, dtype=dtype,
        W=np.concatenate([k.T for k in kernels]).astype(dtype),
        R=np.concatenate([r.T for r in recurrents]).astype(dtype),
        B=np.concatenate([bias(b) for b in input_biases] + [bias(b) for b in recurrent_biases]))


def _sequence_input(graph, loop, match: BodyMatch):
    """The time-major input [T, B, F], and whether Keras reversed it (go_backwards)."""
    source = graph.get_node_by_output(loop.input[match.input_slot])
    require(source is not None and source.type == "TensorListFromTensor",
            "the input sequence is not a TensorList made from a tensor", loop.name)
    x = source.input[0]
    producer = graph.get_node_by_output(x)
    if producer is not None and producer.type in ("ReverseV2", "Reverse"):
        try:
            axes = np.atleast_1d(evaluate(graph, producer.input[1])).tolist()
        except NotEvaluable:
            axes = []
        if axes == [0]:
            return x, Direction.BACKWARD
    return x, Direction.FORWARD


def _outputs(graph, loop, match: BodyMatch) -> dict:
    """Which tensors of the outer graph the layer's outputs replace."""
    state_slots = dict((slot, role) for role, slot in match.states)
    sequence, last, states = [], [], []
    for slot, tensor in enumerate(loop.output):
        consumers = graph.find_output_consumers(tensor)
        if not consumers:
            continue
        if slot == match.output_slot:
            require(all(c.type == "TensorListStack" for c in consumers),
                    "the output TensorList is used other than by TensorListStack", loop.name)
            stacked = [c.output[0] for c in consumers]
            if match.output_every_step:
                sequence.extend(stacked)
            else:
                _require_single_element_list(graph, loop, slot)
                last.extend(stacked)
        elif slot in state_slots:
            states.append((state_slots[slot], tensor))
        else:
            raise NoMatch(f"loop output {slot} (not a state or the output) is used after the loop", loop.name)
    replaced = sequence + last + [tensor for _, tensor in states]
    require(not set(replaced) & set(graph.outputs), "a loop output is itself a graph output", loop.name)
    return dict(sequence_output=tuple(sequence), last_output=tuple(last), final_states=tuple(states))


def _require_single_element_list(graph, loop, slot: int) -> None:
    reserve = graph.get_node_by_output(loop.input[slot])
    require(reserve is not None and reserve.type == "TensorListReserve",
            "the last-output TensorList is not reserved in the graph", loop.name)
    try:
        size = int(np.asarray(evaluate(graph, reserve.input[1])).reshape(-1)[0])
    except NotEvaluable:
        size = -1
    require(size == 1, "the loop writes its output at index 0 of a list longer than one", loop.name)


def _initial_states(graph, loop, match: BodyMatch) -> tuple:
    """Initial states that are not known to be zero (ONNX starts from zero by default)."""
    return tuple((role, loop.input[slot]) for role, slot in match.states
                 if not _is_zero(graph, loop.input[slot]))


def _is_zero(graph, tensor: str) -> bool:
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type == "Identity":
        node = graph.get_node_by_output(node.input[0])
    if node is None:
        return False
    if node.type == "ZerosLike":
        return True
    if node.type == "Fill":
        filler = graph.get_node_by_output(node.input[1])
        return filler is not None and filler.is_const() and not np.any(filler.get_tensor_value(as_list=False))
    if node.is_const():
        return not np.any(node.get_tensor_value(as_list=False))
    return False
