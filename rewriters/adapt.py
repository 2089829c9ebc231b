"""From a body match and its loop node in the outer graph to a :class:`RecurrentLayer`.

Everything here is about the outer graph: the loop's inputs give the weights and the
initial states, its consumers tell which outputs Keras uses. The cell kind only enters
through the :class:`BodyMatch`, so this module serves every kind.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional
import numpy as np

from .evaluate import NotEvaluable, evaluate
from .layer import (BodyMatch, Direction, MaskedOutput, NodeDirection, NoMatch, Pass, RecurrentLayer, Wiring,
                    require)

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


def build_pass(graph, loop, match: BodyMatch, name: str, others: frozenset = frozenset()) -> Pass:
    """Read weights, input, outputs and initial states of ``loop`` into a pass description.
    ``others``: loop slots that belong to other cells of the same loop (a stack), left to them."""
    x, x_unreversed = _list_source(graph, loop, match.input_slot, "input sequence")
    direction = Direction.FORWARD if x_unreversed is None else Direction.BACKWARD
    outputs = _outputs(graph, loop, match, direction, others)
    return Pass(loop=loop.name, name=name, kind=match.kind, direction=direction,
                activations=match.activations, attributes=match.attributes,
                wiring=Wiring(x=x, x_unreversed=x_unreversed, **_initial_states(graph, loop, match),
                              **outputs, **_mask_wiring(graph, loop, match, direction)),
                **gate_weights(match, _slot_values(graph, loop), loop.name))


def _mask_wiring(graph, loop, match: BodyMatch, direction: Direction) -> dict:
    masking = match.masking
    if masking is None:
        return {}
    mask, mask_unreversed = _list_source(graph, loop, masking.mask_slot, "mask")
    if _one_step(graph, mask):  # reversing one step is the identity, which TensorFlow may drop from either
        mask_unreversed = None if direction is Direction.FORWARD else (mask_unreversed or mask)
    require((mask_unreversed is None) == (direction is Direction.FORWARD),
            "the mask and the input are not reversed alike", loop.name)
    require(is_zero(graph, loop.input[masking.output_slot]),
            "the masked output does not start from zeros", loop.name)
    if masking.zeros_slot is not None:
        require(is_zero(graph, loop.input[masking.zeros_slot]),
                "the output at masked steps is not zeros", loop.name)
    rank = len(graph.get_shape(mask) or [])
    require(rank in (2, 3), "the mask's rank is unknown", loop.name)
    return dict(mask=mask, mask_unreversed=mask_unreversed, mask_source=mask_source(graph, mask),
                masked_output=masking.output)


_MASK_PASSTHROUGH = frozenset({"Identity", "Transpose", "ReverseV2", "ExpandDims", "Squeeze", "Reshape",
                               "Cast", "LogicalAnd", "StridedSlice", "Tile"})


def mask_source(graph, mask: str) -> str:
    """Where a mask comes from, for the report: a Masking layer, Embedding(mask_zero=True), or an input."""
    seen, pending = set(), [mask]
    while pending:
        tensor = pending.pop()
        node = graph.get_node_by_output(tensor)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.is_graph_input():
            return f"mask input {node.output[0].split(':')[0]}"
        if node.type == "Any":
            return "Masking layer"
        if node.type == "NotEqual":
            return "Embedding(mask_zero=True)"
        if node.type in _MASK_PASSTHROUGH:
            pending.extend(node.input[:1] if node.type != "LogicalAnd" else node.input)
    return "computed mask"


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


def gate_weights(match: BodyMatch, values, where: str) -> dict:
    """W, R, B in ONNX gate order (and the sizes and type they imply) from a match's weight sources;
    ``values(slot)`` gives a loop input's value (``where`` names the layer in a reason)."""
    try:
        kernels = [np.asarray(g.input_weight(values)) for g in match.gates]
        recurrents = [None if g.recurrent_weight is None else np.asarray(g.recurrent_weight(values))
                      for g in match.gates]
        input_biases = [None if g.input_bias is None else np.asarray(g.input_bias(values)) for g in match.gates]
        recurrent_biases = [None if g.recurrent_bias is None else np.asarray(g.recurrent_bias(values))
                            for g in match.gates]
    except NotEvaluable as error:
        raise NoMatch(f"cannot read a weight: {error.reason}", error.node_name) from error
    require(all(k.ndim == 2 for k in kernels), "a kernel is not a matrix", where)
    input_size, hidden = kernels[0].shape
    require(all(k.shape == (input_size, hidden) for k in kernels), "gate kernels differ in shape", where)
    dtype = kernels[0].dtype
    zeros_r = np.zeros((hidden, hidden), dtype)
    zeros_b = np.zeros((hidden,), dtype)
    recurrents = [zeros_r if r is None else r for r in recurrents]
    require(all(r.shape == (hidden, hidden) for r in recurrents), "a recurrent kernel is not H x H", where)

    def bias(part):
        part = zeros_b if part is None else np.broadcast_to(part, (hidden,))
        return part.astype(dtype)

    return dict(
        hidden_size=hidden, input_size=input_size, dtype=dtype,
        W=np.concatenate([k.T for k in kernels]).astype(dtype),
        R=np.concatenate([r.T for r in recurrents]).astype(dtype),
        B=np.concatenate([bias(b) for b in input_biases] + [bias(b) for b in recurrent_biases]))


def _list_source(graph, loop, slot: int, what: str):
    """The time-major tensor a TensorList input is made from (as the loop steps through it),
    and that tensor before Keras reversed it (go_backwards), or None when not reversed."""
    source = graph.get_node_by_output(loop.input[slot])
    require(source is not None and source.type == "TensorListFromTensor",
            f"the {what} is not a TensorList made from a tensor", loop.name)
    x = source.input[0]
    producer = graph.get_node_by_output(x)
    if producer is not None and producer.type in ("ReverseV2", "Reverse"):
        if _constant_list(graph, producer.input[1]) == [0]:
            return x, producer.input[0]
    return x, None


def _one_step(graph, tensor: str) -> bool:
    """Whether a time-major tensor has a fixed time length of one."""
    shape = graph.get_shape(tensor)
    return bool(shape) and shape[0] == 1


def _reverses_nothing(graph, node) -> bool:
    """A reversal along axes of static length one: the identity (whether or not TensorFlow dropped it)."""
    if node.type not in ("ReverseV2", "Reverse"):
        return False
    shape, axes = graph.get_shape(node.input[0]), _constant_list(graph, node.input[1])
    return bool(shape) and axes is not None and all(shape[axis] == 1 for axis in axes)


def _backward_half(loop_name: str) -> bool:
    """Whether a loop runs in a Bidirectional's backward layer, which Keras names backward_<layer>."""
    return any(scope.startswith("backward_") for scope in loop_name.split("/"))


def _outputs(graph, loop, match: BodyMatch, direction: Direction, others: frozenset = frozenset()) -> dict:
    """Which tensors of the outer graph the layer's outputs replace (none of the ``others`` slots)."""
    state_slots = dict((slot, role) for role, slot in match.states)
    sequence, reversed_, last, states = [], [], [], []
    for slot, tensor in enumerate(loop.output):
        consumers = graph.find_output_consumers(tensor)
        if not consumers or slot in others:
            continue
        if slot == match.output_slot:
            require(all(c.type == "TensorListStack" for c in consumers),
                    "the output TensorList is used other than by TensorListStack", loop.name)
            stacked = [c.output[0] for c in consumers]
            if match.output_every_step:
                found = reversals(graph, stacked)
                if found is None:
                    sequence.extend(stacked)
                else:
                    reversed_.extend(found)
            else:
                _require_single_element_list(graph, loop, slot)
                last.extend(stacked)
        elif slot in state_slots:
            states.append((state_slots[slot], tensor))
        elif match.masking is not None and slot == match.masking.output_slot:
            raise NoMatch("the masked output's loop variable is used after the loop", loop.name)
        else:
            raise NoMatch(f"loop output {slot} (not a state or the output) is used after the loop", loop.name)
    replaced = sequence + reversed_ + last + [tensor for _, tensor in states]
    require(not set(replaced) & set(graph.outputs), "a loop output is itself a graph output", loop.name)
    return dict(sequence_output=tuple(sequence), reversed_output=tuple(reversed_), last_output=tuple(last),
                final_states=tuple(states))


def reversals(graph, stacked: list):
    """Where Keras reverses a sequence in time (Bidirectional does to its backward layer):
    ``ReverseV2(Transpose(stack, [1, 0, 2]), axis=1)``. Returns those [B, T, H] tensors when
    every use of the sequence goes through one, else None."""
    found = []
    for tensor in stacked:
        for transpose in graph.find_output_consumers(tensor):
            if transpose.type != "Transpose" or _constant_list(graph, transpose.input[1]) != [1, 0, 2]:
                return None
            for reverse in graph.find_output_consumers(transpose.output[0]):
                if reverse.type not in ("ReverseV2", "Reverse") or _constant_list(graph, reverse.input[1]) != [1]:
                    return None
                found.append(reverse.output[0])
    return found or None


def _constant_list(graph, tensor: str):
    try:
        return np.atleast_1d(evaluate(graph, tensor)).tolist()
    except NotEvaluable:
        return None


def _require_single_element_list(graph, loop, slot: int) -> None:
    reserve = graph.get_node_by_output(loop.input[slot])
    require(reserve is not None and reserve.type == "TensorListReserve",
            "the last-output TensorList is not reserved in the graph", loop.name)
    try:
        size = int(np.asarray(evaluate(graph, reserve.input[1])).reshape(-1)[0])
    except NotEvaluable:
        size = -1
    require(size == 1, "the loop writes its output at index 0 of a list longer than one", loop.name)


def _initial_states(graph, loop, match: BodyMatch) -> dict:
    """Initial states that are not known to be zero (ONNX starts from zero by default), and which
    of them are constants."""
    given = tuple((role, loop.input[slot]) for role, slot in match.states if not is_zero(graph, loop.input[slot]))
    constant = tuple(role for role, tensor in given if is_constant(graph, tensor))
    return dict(initial_states=given, constant_states=constant)


def is_constant(graph, tensor: str) -> bool:
    node = _source(graph, tensor)
    return node is not None and node.is_const()


def _source(graph, tensor: str):
    """The node that makes ``tensor``, through Identity nodes (None for a graph input)."""
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type == "Identity":
        node = graph.get_node_by_output(node.input[0])
    return node


def is_zero(graph, tensor: str) -> bool:
    node = _source(graph, tensor)
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


def plan_nodes(graph, passes: list, assume_post_padded: bool = False) -> list:
    """Group passes into ONNX nodes: a forward and a backward pass over the same input become
    one bidirectional node; every other pass is a node of its own.

    When a pass could pair with several others (layers side by side on one input, say an LSTM
    beside a Bidirectional LSTM), the pairs whose loops share the most name scopes (the two
    halves of one Bidirectional) are taken first. Nodes keep the order of their first pass.
    """
    candidates = [(first, second) for first in range(len(passes)) for second in range(first + 1, len(passes))
                  if _pairs(graph, passes[first], passes[second], assume_post_padded)]
    candidates.sort(key=lambda pair: (-_shared_scopes(passes[pair[0]].loop, passes[pair[1]].loop), pair))
    partner: dict = {}
    for first, second in candidates:
        if first not in partner and second not in partner:
            partner[first], partner[second] = second, first
    layers = []
    for index, one in enumerate(passes):
        if index not in partner:
            layers.append(_single(graph, one, assume_post_padded))
        elif partner[index] > index:
            layers.append(_bidirectional(graph, one, passes[partner[index]]))
    return layers


def _shared_scopes(a: str, b: str) -> int:
    """How many leading name scopes two node names share."""
    count = 0
    for left, right in zip(a.split("/"), b.split("/")):
        if left != right:
            break
        count += 1
    return count


def _bidirectional(graph, a: Pass, b: Pass) -> RecurrentLayer:
    forward, backward = _halves(graph, a, b)
    return RecurrentLayer(x=forward.wiring.x, direction=NodeDirection.BIDIRECTIONAL, passes=(forward, backward),
                          mask=forward.wiring.mask, mask_key=_tensor_key(graph, forward.wiring.mask))


def _single(graph, one: Pass, assume_post_padded: bool) -> RecurrentLayer:
    """A backward pass runs ONNX's reverse direction over the unreversed input when that needs
    no reversal op (its step-order outputs are unused) or, for a masked pass with post-padding
    assumed, saves compacting (its step-order sequence is then Y reversed in time); otherwise a
    pass runs forward over its own input."""
    wiring = one.wiring
    post_padded_sequence = assume_post_padded and wiring.mask is not None and wiring.sequence_output
    if (one.direction is Direction.BACKWARD and (not wiring.sequence_output or post_padded_sequence)
            and _reversible(one, assume_post_padded)):
        return RecurrentLayer(x=wiring.x_unreversed, direction=NodeDirection.REVERSE, passes=(one,),
                              mask=wiring.mask_unreversed, mask_key=_tensor_key(graph, wiring.mask_unreversed))
    return RecurrentLayer(x=wiring.x, direction=NodeDirection.FORWARD, passes=(one,), mask=wiring.mask,
                          mask_key=_tensor_key(graph, wiring.mask))


def _halves(graph, a: Pass, b: Pass):
    """(forward, backward) of two passes that may be the halves of one bidirectional node, else None.

    Over a fixed one-step sequence TensorFlow's optimizer drops a Bidirectional's reversals
    (reversing one step is the identity), so both halves read as forward passes; the backward one
    is then known by its layer's name (Keras names it backward_<layer>) and becomes a backward pass
    over that same input.
    """
    if {a.direction, b.direction} == {Direction.FORWARD, Direction.BACKWARD}:
        return (a, b) if a.direction is Direction.FORWARD else (b, a)
    one_step_forward = all(p.direction is Direction.FORWARD and _one_step(graph, p.wiring.x) for p in (a, b))
    named_backward = [p for p in (a, b) if _backward_half(p.loop)]
    if not one_step_forward or len(named_backward) != 1:
        return None
    (backward,) = named_backward
    wiring = replace(backward.wiring, x_unreversed=backward.wiring.x, mask_unreversed=backward.wiring.mask)
    return (b if backward is a else a), replace(backward, direction=Direction.BACKWARD, wiring=wiring)


def _pairs(graph, a: Pass, b: Pass, assume_post_padded: bool) -> bool:
    if a.stacked or b.stacked:  # a stack's cells chain; two stacks never pair cell by cell
        return False
    halves = _halves(graph, a, b)
    if halves is None:
        return False
    forward, backward = halves
    same_shape = (a.kind, a.hidden_size, a.input_size, a.dtype, a.attributes) == \
        (b.kind, b.hidden_size, b.input_size, b.dtype, b.attributes)
    same_states = {r for r, _ in a.wiring.initial_states} == {r for r, _ in b.wiring.initial_states}
    same_mask = ((forward.wiring.mask is None) == (backward.wiring.mask is None)
                 and _tensor_key(graph, forward.wiring.mask) == _tensor_key(graph, backward.wiring.mask_unreversed))
    return (same_shape and same_states and same_mask and _reversible(backward, assume_post_padded)
            and _tensor_key(graph, forward.wiring.x) == _tensor_key(graph, backward.wiring.x_unreversed))


def _reversible(one: Pass, assume_post_padded: bool) -> bool:
    """Whether ONNX's reverse direction over the unreversed input gives what Keras uses of this
    backward pass. Outputs at masked steps that carry the previous one carry it back in time,
    which compacted outputs cannot give; with post-padding assumed nothing is compacted and the
    step-order sequence is Y reversed in time."""
    wiring = one.wiring
    if wiring.masked_output is not MaskedOutput.CARRY:
        return True
    if wiring.reversed_output:
        return False
    return not wiring.sequence_output or assume_post_padded


_PURE_OPS = frozenset({"Transpose", "ExpandDims", "Squeeze", "Reshape", "Cast", "Identity", "ReverseV2",
                       "NotEqual", "Equal", "Any", "All", "LogicalAnd", "LogicalNot", "StridedSlice"})


def _tensor_key(graph, tensor: Optional[str], depth: int = 8):
    """Equal for tensors equal by construction: the same tensor, or the same pure ops
    (transposes, reshapes, casts...) applied to the same inputs and constants."""
    if tensor is None:
        return None
    node = graph.get_node_by_output(tensor)
    if node is None or depth == 0:
        return (tensor,)
    if node.is_const():
        value = np.asarray(node.get_tensor_value(as_list=False))
        return ("Const", str(value.dtype), value.shape, value.tobytes())
    if node.type not in _PURE_OPS:
        return (tensor,)
    if _reverses_nothing(graph, node):
        return _tensor_key(graph, node.input[0], depth - 1)
    attrs = tuple(sorted((key, repr(node.get_attr_value(key))) for key in node.attr if not key.startswith("_")))
    index = tensor.rsplit(":", 1)[-1]
    return (node.type, index, attrs, tuple(_tensor_key(graph, t, depth - 1) for t in node.input))
