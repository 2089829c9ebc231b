"""From a match and where it sits in the outer graph to a :class:`Pass`.

Everything here is about the outer graph: what a layer starts from (initial states, zeros or
given), which mask it reads, which of its outputs the rest of the graph uses. A loop's pass is
built by :func:`build_pass`; the unrolled reader builds its pass from the same pieces
(:func:`initial_states`, :func:`mask_wiring`, :func:`require_not_graph_outputs`,
:func:`gate_weights`). The cell kind only enters through the :class:`BodyMatch`, so this module
serves every kind.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..cells.evaluate import NotEvaluable, evaluate
from ..description import BodyMatch, Direction, Masking, NoMatch, Pass, Wiring, require


# -- pieces every reader's pass is built from ---------------------------------------------------
def initial_states(graph, match: BodyMatch, starts: dict) -> dict:
    """The Wiring fields for what a pass starts from: ``starts`` gives, per state slot, the tensor
    the state starts from (None: zeros). States not known to be zero are given (ONNX starts from
    zero by default); which of them are constants is noted."""
    given = tuple((role, starts[slot]) for role, slot in match.states
                  if starts[slot] is not None and not is_zero(graph, starts[slot]))
    constant = tuple(role for role, tensor in given if is_constant(graph, tensor))
    return dict(initial_states=given, constant_states=constant)


def mask_wiring(graph, masking: Optional[Masking], mask: Optional[str], mask_unreversed: Optional[str],
                output_start: Optional[str], where: str, zeros: Optional[str] = None) -> dict:
    """The Wiring fields of a masked pass (none when ``masking`` is None): its time-major mask in
    step order and before reversal, where it comes from, and what masked steps output. The masked
    output must start from zeros (``output_start``; None: zeros), and a pass that outputs zeros at
    masked steps must take them from a zero tensor (``zeros``)."""
    if masking is None:
        return {}
    require(output_start is None or is_zero(graph, output_start), "the masked output does not start from zeros",
            where)
    if masking.zeros_slot is not None:
        require(zeros is not None and is_zero(graph, zeros), "the output at masked steps is not zeros", where)
    require(len(graph.get_shape(mask) or []) in (2, 3), "the mask's rank is unknown", where)
    return dict(mask=mask, mask_unreversed=mask_unreversed, mask_source=mask_source(graph, mask),
                masked_output=masking.output)


def require_not_graph_outputs(graph, replaced, where: str) -> None:
    """The node's outputs replace these tensors; none may be a graph output itself."""
    require(not set(replaced) & set(graph.outputs), "a layer output is itself a graph output", where)


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


# -- a while-loop's pass ---------------------------------------------------------------------------
def build_pass(graph, loop, match: BodyMatch, name: str, others: frozenset = frozenset()) -> Pass:
    """Read weights, input, outputs and initial states of ``loop`` into a pass description.
    ``others``: loop slots that belong to other cells of the same loop (a stack), left to them."""
    x, x_unreversed = _list_source(graph, loop, match.input_slot, "input sequence")
    direction = Direction.FORWARD if x_unreversed is None else Direction.BACKWARD
    outputs = _outputs(graph, loop, match, others)
    starts = {slot: loop.input[slot] for _, slot in match.states}
    return Pass(loop=loop.name, name=name, kind=match.kind, direction=direction,
                activations=match.activations, attributes=match.attributes, note=match.note,
                wiring=Wiring(x=x, x_unreversed=x_unreversed, **initial_states(graph, match, starts),
                              **outputs, **_loop_mask_wiring(graph, loop, match, direction)),
                **gate_weights(match, slot_values(graph, loop), loop.name))


def _loop_mask_wiring(graph, loop, match: BodyMatch, direction: Direction) -> dict:
    masking = match.masking
    if masking is None:
        return {}
    return loop_mask(graph, loop, masking, *_list_source(graph, loop, masking.mask_slot, "mask"), direction)


def loop_mask(graph, loop, masking, mask: str, mask_unreversed: Optional[str], direction: Direction) -> dict:
    """The mask wiring of a loop whose mask (before Keras reversed it, or None) is given: it must be
    reversed as the input is."""
    if one_step(graph, mask):  # reversing one step is the identity, which TensorFlow may drop from either
        mask_unreversed = None if direction is Direction.FORWARD else (mask_unreversed or mask)
    require((mask_unreversed is None) == (direction is Direction.FORWARD),
            "the mask and the input are not reversed alike", loop.name)
    zeros = None if masking.zeros_slot is None else loop.input[masking.zeros_slot]
    return mask_wiring(graph, masking, mask, mask_unreversed, loop.input[masking.output_slot], loop.name, zeros)


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


def slot_values(graph, loop):
    """The values of a loop node's inputs, by slot, evaluated on first use (a weight must be constant)."""
    cache = {}

    def value(slot: int) -> np.ndarray:
        if slot not in cache:
            try:
                cache[slot] = evaluate(graph, loop.input[slot])
            except NotEvaluable as error:
                raise NoMatch(f"a weight is not constant: {error.reason}", error.node_name) from error
        return cache[slot]

    return value


def _list_source(graph, loop, slot: int, what: str):
    """The time-major tensor a TensorList input is made from (as the loop steps through it),
    and that tensor before Keras reversed it (go_backwards), or None when not reversed."""
    source = graph.get_node_by_output(loop.input[slot])
    require(source is not None and source.type == "TensorListFromTensor",
            f"the {what} is not a TensorList made from a tensor", loop.name)
    x = source.input[0]
    producer = graph.get_node_by_output(x)
    if producer is not None and producer.type in ("ReverseV2", "Reverse"):
        if constant_list(graph, producer.input[1]) == [0]:
            return x, producer.input[0]
    return x, None


def _outputs(graph, loop, match: BodyMatch, others: frozenset = frozenset()) -> dict:
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
        else:
            states.append(state_output(loop, match, state_slots, slot, tensor))
    return output_wiring(graph, loop, sequence, reversed_, last, states)


def state_output(loop, match, state_slots: dict, slot: int, tensor: str) -> tuple:
    """(role, tensor) of a loop output used after the loop that is not the layer's output: it must
    be a state."""
    if slot in state_slots:
        return state_slots[slot], tensor
    if match.masking is not None and slot == match.masking.output_slot:
        raise NoMatch("the masked output's loop variable is used after the loop", loop.name)
    raise NoMatch(f"loop output {slot} (not a state or the output) is used after the loop", loop.name)


def output_wiring(graph, loop, sequence: list, reversed_: list, last: list, states: list) -> dict:
    """The outputs the layer replaces, none of which may be a graph output."""
    require_not_graph_outputs(graph, sequence + reversed_ + last + [tensor for _, tensor in states], loop.name)
    return dict(sequence_output=tuple(sequence), reversed_output=tuple(reversed_), last_output=tuple(last),
                final_states=tuple(states))


def _require_single_element_list(graph, loop, slot: int) -> None:
    reserve = graph.get_node_by_output(loop.input[slot])
    require(reserve is not None and reserve.type == "TensorListReserve",
            "the last-output TensorList is not reserved in the graph", loop.name)
    try:
        size = int(np.asarray(evaluate(graph, reserve.input[1])).reshape(-1)[0])
    except NotEvaluable:
        size = -1
    require(size == 1, "the loop writes its output at index 0 of a list longer than one", loop.name)


# -- facts about tensors of the outer graph ----------------------------------------------------------
def reversals(graph, stacked: list):
    """Where Keras reverses a sequence in time (Bidirectional does to its backward layer):
    ``ReverseV2(Transpose(stack, [1, 0, 2]), axis=1)``, or the TFLite converter's
    ``Transpose(ReverseV2(stack, axis=0), [1, 0, 2])``. Returns those [B, T, H] tensors when every
    use of the sequence goes through one, else None."""
    found = []
    for tensor in stacked:
        for first in graph.find_output_consumers(tensor):
            second_type, second_axes = (("ReverseV2", "Reverse"), [1]) if first.type == "Transpose" \
                else (("Transpose",), [1, 0, 2])
            if not (_transposes_time(graph, first) or _reverses(graph, first, [0])):
                return None
            for second in graph.find_output_consumers(first.output[0]):
                if second.type not in second_type or constant_list(graph, second.input[1]) != second_axes:
                    return None
                found.append(second.output[0])
    return found or None


def _transposes_time(graph, node) -> bool:
    return node.type == "Transpose" and constant_list(graph, node.input[1]) == [1, 0, 2]


def _reverses(graph, node, axes: list) -> bool:
    return node.type in ("ReverseV2", "Reverse") and constant_list(graph, node.input[1]) == axes


def constant_list(graph, tensor: str):
    """A constant tensor's values as a flat list, None when it is not constant."""
    try:
        return np.atleast_1d(evaluate(graph, tensor)).tolist()
    except NotEvaluable:
        return None


def one_step(graph, tensor: str) -> bool:
    """Whether a time-major tensor has a fixed time length of one."""
    shape = graph.get_shape(tensor)
    return bool(shape) and shape[0] == 1


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
