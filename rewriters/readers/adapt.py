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
from onnx import TensorProto, helper

from ..cells.evaluate import NotEvaluable, evaluate
from ..description import BodyMatch, Direction, MaskedOutput, Masking, NoMatch, Pass, Wiring, require


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


def in_type(graph, sequence: Optional[str], dtype) -> Optional[str]:
    """``sequence`` as the node takes it: in the layer's element type ``dtype`` (a numpy type). A
    sequence of another type (integers a Keras 3 layer casts step by step inside its loop, the cast
    step being x_t for the matchers) is cast once, before the node: by a Cast of it the graph
    already has, else by a new one."""
    target = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    if sequence is None or graph.get_dtype(sequence) in (None, TensorProto.UNDEFINED, target):
        return sequence
    for consumer in graph.find_output_consumers(sequence):
        if consumer.type == "Cast" and consumer.get_attr_value("to") == target:
            return consumer.output[0]
    return graph.make_node("Cast", [sequence], attr={"to": target}, shapes=[graph.get_shape(sequence)],
                           dtypes=[target]).output[0]


def inputs_in_type(graph, x: str, x_unreversed: Optional[str], dtype) -> dict:
    """A pass's ``x`` and ``x_unreversed`` (:class:`Wiring` fields) as its node takes them (:func:`in_type`)."""
    return dict(x=in_type(graph, x, dtype), x_unreversed=in_type(graph, x_unreversed, dtype))


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

    try:
        peepholes = [None if g.peephole is None else np.asarray(g.peephole(values)) for g in match.gates[:3]]
    except NotEvaluable as error:
        raise NoMatch(f"cannot read a peephole weight: {error.reason}", error.node_name) from error
    require(all(p is None or p.shape == (hidden,) for p in peepholes), "a peephole weight is not one per unit", where)
    return dict(
        hidden_size=hidden, input_size=input_size, dtype=dtype,
        W=np.concatenate([k.T for k in kernels]).astype(dtype),
        R=np.concatenate([r.T for r in recurrents]).astype(dtype),
        B=np.concatenate([bias(b) for b in input_biases] + [bias(b) for b in recurrent_biases]),
        P=np.concatenate([bias(p) for p in peepholes]) if any(p is not None for p in peepholes) else None)


# -- a while-loop's pass ---------------------------------------------------------------------------
def build_pass(graph, loop, match: BodyMatch, name: str, others: frozenset = frozenset()) -> Pass:
    """Read weights, input, outputs and initial states of ``loop`` into a pass description.
    ``others``: loop slots that belong to other cells of the same loop (a stack), left to them."""
    check_assumed(match, slot_values(graph, loop), loop.name)
    x, x_unreversed = _list_source(graph, loop, match.input_slot, "input sequence")
    masks = _loop_mask_wiring(graph, loop, match, Direction.FORWARD if x_unreversed is None else Direction.BACKWARD)
    if not masks.get("mask"):  # a Keras mask is reversed with the input; TF1 reverses rows within lengths
        x_unreversed = per_row_reversal(graph, x, x_unreversed, masks.get("lengths"), loop.name)
    direction = Direction.FORWARD if x_unreversed is None else Direction.BACKWARD
    outputs = _outputs(graph, loop, match, others, masks.get("lengths"))
    starts = {slot: loop.input[slot] for _, slot in match.states}
    weights = gate_weights(match, slot_values(graph, loop), loop.name)
    return Pass(loop=loop.name, name=name, kind=match.kind, direction=direction,
                activations=match.activations, attributes=match.attributes, note=match.note,
                wiring=Wiring(**inputs_in_type(graph, x, x_unreversed, weights["dtype"]),
                              **initial_states(graph, match, starts), **outputs, **masks),
                **weights)


def check_assumed(match: BodyMatch, values, where: str) -> None:
    """What reading the body assumed of a tensor must hold (``values(slot)`` gives a loop input's
    value): a dropout's rate must be a constant zero (inference)."""
    for tensor, source, value in match.assumed:
        require(source is not None, "a dropout's rate varies from step to step (it is zero at inference only)",
                tensor)
        try:
            actual = np.asarray(source(values))
        except NotEvaluable as error:
            raise NoMatch(f"a dropout's rate is not a constant (it is zero at inference only): {error.reason}",
                          error.node_name) from error
        require(bool(np.all(actual == value)), f"a dropout's rate is {actual.reshape(-1)[0]:g}, not {value:g}",
                where)


def per_row_reversal(graph, x: str, x_unreversed: Optional[str], lengths: Optional[str], where: str) -> Optional[str]:
    """A time-major input reversed per row, as TF1's ``bidirectional_dynamic_rnn`` gives its backward
    layer: ``Transpose(ReverseSequence(x, lengths), [1, 0, 2])`` of a batch-major ``x`` (or
    ``ReverseV2(x, axis=1)`` without lengths). Returns the time-major input unreversed (``x``
    transposed as the forward layer transposes it), or ``x_unreversed`` when there is no such reversal.
    A row reversed within its length is a backward pass only of a loop that stops at that length."""
    transpose = graph.get_node_by_output(x)
    if x_unreversed is not None or transpose is None or not _transposes_time(graph, transpose):
        return x_unreversed
    reversal = graph.get_node_by_output(transpose.input[0])
    if reversal is None:
        return None
    if _reverses(graph, reversal, [1]):
        return time_major(graph, reversal.input[0])
    if reversal.type != "ReverseSequence":
        return None
    require(reversal.get_attr_value("seq_dim") == 1 and reversal.get_attr_value("batch_dim", 0) == 0,
            "the input is reversed along axes other than time within a batch-major row", where)
    require(lengths is not None and tensor_key(graph, reversal.input[1]) == tensor_key(graph, lengths),
            "the input is reversed within lengths the loop does not stop at", where)
    return time_major(graph, reversal.input[0])


def time_major(graph, batch_major: str) -> str:
    """``batch_major`` [B, T, ...] transposed to [T, B, ...]: the graph's own Transpose where it has
    one (so that two layers over the same input read one tensor), else a new one."""
    for consumer in graph.find_output_consumers(batch_major):
        if _transposes_time(graph, consumer) and consumer.input[0] == batch_major:
            return consumer.output[0]
    return graph.make_node("Transpose", [batch_major], attr={"perm": [1, 0, 2]}).output[0]


def _loop_mask_wiring(graph, loop, match: BodyMatch, direction: Direction) -> dict:
    masking = match.masking
    if masking is None:
        return {}
    if masking.lengths is not None:
        require(masking.lengths_slot is not None and masking.zeros_slot is not None,
                "the lengths or the zeros past them are not loop constants", loop.name)
        return lengths_wiring(graph, loop.input[masking.lengths_slot], loop.input[masking.zeros_slot], loop.name)
    return loop_mask(graph, loop, masking, *_list_source(graph, loop, masking.mask_slot, "mask"), direction)


def lengths_wiring(graph, lengths: str, zeros: str, where: str) -> dict:
    """The Wiring fields of a pass masked past each row's length (TF1's ``sequence_length``), whose
    output there is ``zeros`` (which must be zero)."""
    require(is_zero(graph, zeros), "the output past a row's length is not zeros", where)
    require(len(graph.get_shape(lengths) or [None]) == 1, "the lengths are not one per row", where)
    return dict(lengths=lengths, mask_source=f"sequence_length {_source_name(graph, lengths)}",
                masked_output=MaskedOutput.ZERO)


def _source_name(graph, tensor: str) -> str:
    """The graph input (or else the tensor) a tensor is taken from through Identity and Cast nodes."""
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type in ("Identity", "Cast") and node.input:
        tensor, node = node.input[0], graph.get_node_by_output(node.input[0])
    return tensor.split(":")[0]


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


def _outputs(graph, loop, match: BodyMatch, others: frozenset = frozenset(), lengths: Optional[str] = None) -> dict:
    """Which tensors of the outer graph the layer's outputs replace (none of the ``others`` slots);
    ``lengths``: the lengths the loop stops at, within which a sequence may be reversed per row."""
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
                found = reversals(graph, stacked, lengths)
                if found is None:
                    require(lengths is None or not _reversed_per_row(graph, stacked),
                            "the output is reversed within lengths the loop does not stop at", loop.name)
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
def reversals(graph, stacked: list, lengths: Optional[str] = None):
    """Where Keras reverses a sequence in time (Bidirectional does to its backward layer):
    ``ReverseV2(Transpose(stack, [1, 0, 2]), axis=1)``, or the TFLite converter's
    ``Transpose(ReverseV2(stack, axis=0), [1, 0, 2])``; with ``lengths``, TF1's
    ``ReverseSequence(Transpose(stack, [1, 0, 2]), lengths)`` (each row within its length). Returns
    those [B, T, H] tensors when every use of the sequence goes through one, else None."""
    found = []
    for tensor in stacked:
        for first in graph.find_output_consumers(tensor):
            if not (_transposes_time(graph, first) or _reverses(graph, first, [0])):
                return None
            for second in graph.find_output_consumers(first.output[0]):
                if first.type == "Transpose" and _reverses_rows(graph, second, lengths):
                    found.append(second.output[0])
                    continue
                second_type, second_axes = (("ReverseV2", "Reverse"), [1]) if first.type == "Transpose" \
                    else (("Transpose",), [1, 0, 2])
                if second.type not in second_type or constant_list(graph, second.input[1]) != second_axes:
                    return None
                found.append(second.output[0])
    return found or None


def _reverses_rows(graph, node, lengths: Optional[str]) -> bool:
    """Whether ``node`` reverses each row of a batch-major sequence within ``lengths``."""
    return (lengths is not None and node.type == "ReverseSequence" and node.get_attr_value("seq_dim") == 1
            and node.get_attr_value("batch_dim", 0) == 0
            and tensor_key(graph, node.input[1]) == tensor_key(graph, lengths))


def _reversed_per_row(graph, stacked: list) -> bool:
    """Whether a use of the sequence reverses its rows (within lengths other than the loop's)."""
    return any(second.type == "ReverseSequence" for tensor in stacked for first in graph.find_output_consumers(tensor)
               for second in graph.find_output_consumers(first.output[0]))


def _transposes_time(graph, node) -> bool:
    """A Transpose swapping the first two of three axes (TensorFlow's, or one this package made)."""
    if node.type != "Transpose":
        return False
    perm = constant_list(graph, node.input[1]) if len(node.input) > 1 else node.get_attr_value("perm")
    return list(perm or []) == [1, 0, 2]


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


def reverses_nothing(graph, node) -> bool:
    """A reversal along axes of static length one: the identity (whether or not TensorFlow dropped it)."""
    if node.type not in ("ReverseV2", "Reverse"):
        return False
    shape, axes = graph.get_shape(node.input[0]), constant_list(graph, node.input[1])
    return bool(shape) and axes is not None and all(shape[axis] == 1 for axis in axes)


_PURE_OPS = frozenset({"Transpose", "ExpandDims", "Squeeze", "Reshape", "Cast", "Identity", "ReverseV2",
                       "NotEqual", "Equal", "Any", "All", "LogicalAnd", "LogicalNot", "StridedSlice"})


def tensor_key(graph, tensor: Optional[str], depth: int = 8):
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
    if reverses_nothing(graph, node):
        return tensor_key(graph, node.input[0], depth - 1)
    attrs = tuple(sorted((key, repr(node.get_attr_value(key))) for key in node.attr if not key.startswith("_")))
    index = list(node.output).index(tensor) if tensor in node.output else 0
    return (node.type, index, attrs, tuple(tensor_key(graph, t, depth - 1) for t in node.input))
