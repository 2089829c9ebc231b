"""The skeleton of a Keras recurrent while-loop body: its time index, lists and states.

Every recurrent body Keras builds (Keras 3 and tf_keras alike) has the same skeleton:
a time index ``t`` that steps by one, ``x_t = TensorListGetItem(inputs, t)``, the cell,
and ``TensorListSetItem(outputs, t or 0, h_t)``. :func:`read_skeleton` finds it, and
:func:`unmask` reads how a masked body treats masked steps, so the cell matchers read masked
and unmasked bodies alike.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from onnx import TensorProto

from ..cells.body import BodyView
from ..description import MaskedOutput, Masking, Skeleton, require


def read_skeleton(view: BodyView) -> Skeleton:
    """Find the time index, the input/output lists and the states of a recurrent body."""
    graph = view.graph
    reads = [n for n in graph.get_nodes() if n.type == "TensorListGetItem"]
    writes = [n for n in graph.get_nodes() if n.type == "TensorListSetItem"]
    require(reads, "the loop reads no TensorList: not a recurrent layer loop")
    require(len(writes) == 1, f"the loop writes {len(writes)} TensorLists, a recurrent layer writes one")
    write = writes[0]
    time_input, time_slot = time_index(view, [n.input[1] for n in reads], reads[0].name)
    (input_slot, x_t), (mask_slot, mask_t) = sequences(view, [(n.input[0], n.output[0]) for n in reads])

    output_slot = view.slot_of(write.input[0])
    require(output_slot is not None, "the written TensorList is not a loop variable", write.name)
    require(view.resolve(view.outputs[output_slot]) == write.output[0],
            "the written TensorList is not what the loop carries on", write.name)
    write_index = view.resolve(write.input[1])
    if write_index == time_input:
        every_step = True
    else:
        require(view.scalar(write_index) == 0, "the output is written at an index other than t or 0",
                write.name)
        every_step = False
    constant, state_inputs, state_outputs = carried(view, (time_slot, output_slot))
    return Skeleton(input_slot=input_slot, output_slot=output_slot,
                    output_every_step=every_step, mask_slot=mask_slot, x_t=x_t, mask_t=mask_t,
                    y_t=view.resolve(write.input[2]), state_inputs=state_inputs,
                    state_outputs=state_outputs, constant_slots=frozenset(constant), time_input=time_input)


def time_index(view: BodyView, indices, where: str) -> tuple:
    """(the tensor, the loop slot) of the one index every sequence is read at, which must advance by
    one each step."""
    index_tensors = {view.resolve(t) for t in indices}
    require(len(index_tensors) == 1, "the loop reads its sequences at different indices", where)
    time_input = index_tensors.pop()
    time_slot = view.slot_of(time_input)
    require(time_slot is not None, "the read index is not a loop variable", where)
    step = view.producer(view.outputs[time_slot])
    require(step is not None and step.type in ("AddV2", "Add")
            and time_input in view.operands(step)
            and any(view.scalar(t) == 1 for t in view.operands(step)),
            "the read index does not advance by one each step", where)
    return time_input, time_slot


def sequences(view: BodyView, reads) -> tuple:
    """((input slot, x_t), (mask slot, mask_t)) from the (sequence, read value) pairs of a body: one
    input sequence, and at most one bool sequence, the mask ((None, None) when there is none). A bool
    sequence is the mask, unless the loop reads no other and casts its steps to a float type (a layer
    fed bools). ``x_t`` is the step as the cell reads it (:func:`cast_step`)."""
    values, masks = [], []
    for sequence, value in reads:
        slot = view.slot_of(sequence)
        require(slot is not None, "a sequence read comes from inside the loop", value)
        dtype = view.graph.get_dtype(value)
        (masks if dtype == TensorProto.BOOL else values).append((slot, value))
    if not values:
        values = [(slot, value) for slot, value in masks if cast_step(view.graph, value) != value]
        masks = [read for read in masks if read not in values]
    require(len(values) == 1, f"the loop reads {len(values)} input sequences, a recurrent layer reads one")
    require(len(masks) <= 1, "the loop reads more than one mask")
    (input_slot, x_t), = values
    return (input_slot, cast_step(view.graph, x_t)), (masks[0] if masks else (None, None))


FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})


def cast_step(graph, value: str) -> str:
    """The step of a sequence as the cell reads it: ``value``, or the one float type every use of it
    casts it to (Keras 3 casts each step of a sequence of another type, integers say, to the layer's
    type, inside its loop or in each unrolled step). The cast step is x_t for the matchers; the pass
    then reads the sequence cast once, before the node (:func:`.adapt.in_type`)."""
    uses = graph.find_output_consumers(value)
    targets = {use.get_attr_value("to") for use in uses if use.type == "Cast"}
    if not uses or len(targets) != 1 or any(use.type != "Cast" for use in uses) or not targets <= FLOAT_TYPES:
        return value
    return uses[0].output[0]


def carried(view: BodyView, skip) -> tuple:
    """(constant slots, state inputs, state outputs) of a body: the slots passed through unchanged, and
    the others (but ``skip`` and iteration counters) with what the body reads and returns there."""
    constant, state_inputs, state_outputs = set(), {}, {}
    for slot, (inp, out) in enumerate(zip(view.inputs, view.outputs)):
        if view.resolve(out) == inp:
            constant.add(slot)
        elif slot not in skip and not _is_counter(view, slot):
            state_inputs[slot] = inp
            state_outputs[slot] = view.resolve(out)
    return constant, state_inputs, state_outputs


def _is_counter(view: BodyView, slot: int) -> bool:
    """A loop variable that only counts iterations: its next value is itself plus one."""
    step = view.producer(view.outputs[slot])
    return (step is not None and step.type in ("AddV2", "Add")
            and view.inputs[slot] in view.operands(step)
            and any(view.scalar(t) == 1 for t in view.operands(step))
            and all(c.type in ("AddV2", "Add", "Less", "Identity", "LogicalAnd")
                    for c in view.consumers(view.inputs[slot])))


_MASK_BROADCASTS = frozenset({"Tile", "ExpandDims", "Reshape", "Cast", "Identity", "BroadcastTo"})


def unmask(view: BodyView, skeleton: Skeleton) -> tuple[Skeleton, Masking]:
    """Read how a masked body treats masked steps and return the skeleton without the masking.

    Keras writes every masked update as ``SelectV2(mask_t, new, old)``: a state keeps its old
    value, and the output takes the previous output (a loop variable of its own) or zeros.
    The skeleton returned has the unmasked updates as state outputs and ``new`` as the
    per-step output, so the cell matchers read a masked body like an unmasked one.
    """
    updates = {}
    for slot, out in skeleton.state_outputs.items():
        node = view.producer(out)
        require(node is not None and node.type in ("SelectV2", "Select"),
                "a state of the masked loop is not updated through the mask", out)
        condition, new, old = view.operands(node)
        require(_mask_root(view, condition) == skeleton.mask_t,
                "a state is selected by something other than the step's mask", node.name)
        updates[slot] = (new, old)

    holders = [slot for slot, out in skeleton.state_outputs.items() if out == skeleton.y_t]
    require(len(holders) == 1, "no loop variable holds the masked output", skeleton.y_t)
    output_slot = holders[0]
    new_output, old_output = updates.pop(output_slot)
    zeros_slot = view.slot_of(old_output)
    if old_output == skeleton.state_inputs[output_slot]:
        mode, zeros_slot = MaskedOutput.CARRY, None
    else:
        require(zeros_slot in skeleton.constant_slots,
                "a masked step's output is neither the previous output nor a constant", skeleton.y_t)
        mode = MaskedOutput.ZERO
    for slot, (new, old) in updates.items():
        require(old == skeleton.state_inputs[slot], "a masked step changes a state", new)

    unmasked = replace(skeleton, y_t=new_output,
                       state_inputs={s: t for s, t in skeleton.state_inputs.items() if s != output_slot},
                       state_outputs={s: updates[s][0] for s in updates})
    return unmasked, Masking(mask_slot=skeleton.mask_slot, output=mode, output_slot=output_slot,
                             zeros_slot=zeros_slot)


def _mask_root(view: BodyView, tensor: str) -> str:
    """Follow broadcasts and casts of a mask back to the tensor read from the mask list."""
    node = view.producer(tensor)
    while node is not None and node.type in _MASK_BROADCASTS:
        tensor = view.resolve(node.input[0])
        node = view.producer(tensor)
    return view.resolve(tensor)


_SELECTS = ("Select", "SelectV2")


def unmask_lengths(view: BodyView, skeleton: Skeleton) -> tuple[Skeleton, Optional[Masking]]:
    """Read a TF1 loop given a ``sequence_length``, and return the skeleton without its masking.

    From each row's length on, such a loop keeps its states and outputs zeros: every state is
    ``Select(t >= length, old, new)`` and the output ``Select(t >= length, zeros, new)``, one condition
    for all (TF1's ``dynamic_rnn``). ONNX's ``sequence_lens`` computes the same. A loop whose states
    are not selected is not masked so: (skeleton, None).
    """
    selected = {slot: _select(view, out) for slot, out in skeleton.state_outputs.items()}
    lengths = {_lengths_of(view, select[0], skeleton.time_input) if select else None for select in selected.values()}
    if lengths == {None}:  # no state selected against a length: not masked so (the matchers read the rest)
        return skeleton, None
    require(None not in lengths and len(lengths) == 1,
            "the loop's states are not all selected against one length per row", skeleton.y_t)
    (lengths,) = lengths
    (condition,) = {select[0] for select in selected.values()}
    for slot, (_, old, _) in selected.items():
        require(old == skeleton.state_inputs[slot], "a step past a row's length changes a state", old)
    output = _select(view, skeleton.y_t)
    require(output is not None and output[0] == condition,
            "the output past a row's length is not selected like the states", skeleton.y_t)
    _, zeros, new_output = output
    zeros_slot = view.slot_of(zeros)
    require(zeros_slot is None or zeros_slot in skeleton.constant_slots,
            "the output past a row's length is not a loop constant", zeros)
    unmasked = replace(skeleton, y_t=new_output,
                       state_outputs={slot: new for slot, (_, _, new) in selected.items()})
    return unmasked, Masking(mask_slot=None, output=MaskedOutput.ZERO, output_slot=None, zeros_slot=zeros_slot,
                             lengths=lengths, lengths_slot=view.slot_of(lengths), zeros=zeros)


def _select(view: BodyView, tensor: str) -> Optional[tuple]:
    """(condition, then, else) of a select making ``tensor``, else None."""
    node = view.producer(tensor)
    if node is None or node.type not in _SELECTS:
        return None
    return tuple(view.operands(node))


def _lengths_of(view: BodyView, condition: str, time_input: str) -> Optional[str]:
    """The lengths a ``t >= length`` condition compares the loop's time index with, else None."""
    node = view.producer(condition)
    if node is None or node.type != "GreaterEqual" or not time_input:
        return None
    time, lengths = view.operands(node)
    return lengths if time == view.resolve(time_input) else None
