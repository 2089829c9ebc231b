"""A reader for TFLite's ``WHILE`` loops: Keras recurrent layers as the TFLite converter lowers them.

tf2onnx reads a ``.tflite`` file into graphs like a SavedModel's, each loop body converted before
the main graph, which holds the loop as a ``TFL_WHILE`` node (its body named by
``body_subgraph_index``). The body has a skeleton of its own, read here into the same
:class:`~.skeleton.Skeleton` a TensorFlow loop gives, so the cell matchers read it as any body:

- the step's input is ``GatherV2(sequence, t, 0)``, the sequence (and the mask) loop variables
  passed through unchanged, ``t`` advancing by one;
- the outputs are written into a ``[T, B, H]`` loop variable by slicing and concatenating (tf2onnx
  records it as the body's scan output), or, for the last output only, the variable is replaced by
  the output reshaped to ``[1, B, H]``;
- the weights are constants inside the body, not loop variables.

In the main graph the loop's inputs and outputs are tensors, not TensorLists: :func:`build_pass`
reads them into the same :class:`~.description.Pass` the other readers give.
"""
from __future__ import annotations

from ..cells.body import BodyView
from ..description import BodyMatch, Direction, Pass, Wiring, require
from .adapt import (
    constant_list,
    gate_weights,
    initial_states,
    inputs_in_type,
    loop_mask,
    output_wiring,
    reversals,
    slot_values,
    state_output,
)
from .skeleton import Skeleton, carried, sequences, time_index

LOOP_OP = "TFL_WHILE"


def body_name(loop) -> str:
    """The body subgraph a ``TFL_WHILE`` node runs."""
    return loop.get_attr_str("body_subgraph_index")


def is_body(graph) -> bool:
    """Whether ``graph`` may be a TFLite loop body: a sequence loop variable gathered by another."""
    inputs = set(graph.input_names)
    return any(n.type == "GatherV2" and n.input[0] in inputs and n.input[1] in inputs for n in graph.get_nodes())


def read_skeleton(view: BodyView) -> Skeleton:
    """The time index, the sequence(s), the output and the states of a TFLite loop body."""
    graph = view.graph
    reads = [n for n in graph.get_nodes() if n.type == "GatherV2" and view.slot_of(n.input[0]) is not None
             and view.slot_of(n.input[1]) is not None]
    require(reads, "the loop gathers no step from a sequence: not a recurrent layer loop")
    require(all(constant_list(graph, n.input[2]) == [0] for n in reads), "a sequence is gathered along an axis "
            "other than time", reads[0].name)
    _, time_slot = time_index(view, [n.input[1] for n in reads], reads[0].name)
    (input_slot, x_t), (mask_slot, mask_t) = sequences(view, [(n.input[0], n.output[0]) for n in reads])
    output_slot, y_t, every_step = _output(view, graph, time_slot)
    constant, state_inputs, state_outputs = carried(view, (time_slot, output_slot))
    require(input_slot in constant, "the input sequence is not passed through the loop unchanged", x_t)
    return Skeleton(input_slot=input_slot, output_slot=output_slot, output_every_step=every_step,
                    mask_slot=mask_slot, x_t=x_t, mask_t=mask_t, y_t=y_t, state_inputs=state_inputs,
                    state_outputs=state_outputs, constant_slots=frozenset(constant))


def _output(view: BodyView, graph, time_slot: int) -> tuple:
    """(loop slot, the value written, written every step) of the output: the scan output tf2onnx found
    (the slice-concatenate write at t), else a slot the body never reads and replaces by a value
    reshaped (the last output)."""
    scan_outputs = list(getattr(graph, "scan_outputs", None) or [])
    require(len(scan_outputs) <= 1, f"the loop writes {len(scan_outputs)} sequences, a recurrent layer writes one")
    if scan_outputs:
        slot, written = scan_outputs[0]
        reshape = view.producer(written)
        require(reshape is not None and reshape.type == "Reshape", "the written step is not a reshaped value", written)
        return slot, view.resolve(reshape.input[0]), True
    replaced = []
    for slot, (inp, out) in enumerate(zip(view.inputs, view.outputs)):
        node = view.producer(out)
        if slot != time_slot and not view.consumers(inp) and node is not None and node.type == "Reshape":
            replaced.append((slot, view.resolve(node.input[0])))
    require(len(replaced) == 1, "no loop variable holds the layer's output")
    return replaced[0] + (False,)


# -- the loop in the main graph ---------------------------------------------------------------------
def build_pass(graph, loop, match: BodyMatch, name: str) -> Pass:
    """Read a ``TFL_WHILE`` node's input, outputs, initial states and weights into a pass description."""
    x, x_unreversed = _sequence_source(graph, loop.input[match.input_slot])
    direction = Direction.FORWARD if x_unreversed is None else Direction.BACKWARD
    starts = {slot: loop.input[slot] for _, slot in match.states}
    weights = gate_weights(match, slot_values(graph, loop), loop.name)
    return Pass(loop=loop.name, name=name, kind=match.kind, direction=direction,
                activations=match.activations, attributes=match.attributes, note=match.note,
                wiring=Wiring(**inputs_in_type(graph, x, x_unreversed, weights["dtype"]),
                              **initial_states(graph, match, starts), **_outputs(graph, loop, match),
                              **_mask(graph, loop, match, direction)),
                **weights)


def _sequence_source(graph, tensor: str) -> tuple:
    """A time-major sequence as the loop steps through it, and before a reversal in time (go_backwards),
    or None when not reversed."""
    producer = graph.get_node_by_output(tensor)
    if producer is not None and producer.type in ("ReverseV2", "Reverse") \
            and constant_list(graph, producer.input[1]) == [0]:
        return tensor, producer.input[0]
    return tensor, None


def _mask(graph, loop, match: BodyMatch, direction: Direction) -> dict:
    masking = match.masking
    if masking is None:
        return {}
    return loop_mask(graph, loop, masking, *_sequence_source(graph, loop.input[masking.mask_slot]), direction)


def _outputs(graph, loop, match: BodyMatch) -> dict:
    """Which tensors of the main graph the layer's outputs replace: the [T, B, H] sequence (or its
    reversal in time a Bidirectional makes), the [1, B, H] last output, the final states."""
    state_slots = dict((slot, role) for role, slot in match.states)
    sequence, reversed_, last, states = [], [], [], []
    for slot, tensor in enumerate(loop.output):
        if not graph.find_output_consumers(tensor):
            continue
        if slot == match.output_slot:
            if not match.output_every_step:
                last.append(tensor)
            else:
                found = reversals(graph, [tensor])
                (reversed_ if found else sequence).extend(found or [tensor])
        else:
            states.append(state_output(loop, match, state_slots, slot, tensor))
    return output_wiring(graph, loop, sequence, reversed_, last, states)

