"""The reader of TF 1.x while-loops, as tf2onnx hands them over: a ``Scan`` or ``Loop`` whose body still
holds the cell.

A TF 1.x graph holds its loops as ``Enter``/``Merge``/``Switch``/``NextIteration``/``Exit`` frames.
tf2onnx's own rewriters turn them into ONNX loops before this package's rewriter runs, in the graph
holding them, so a loop is read there at once: its body's cell read as a loop body's
(:mod:`.skeleton`, the cell families), its weights and lengths read from the graph around it.

- A ``dynamic_rnn`` frame over ``TensorArrayV3`` becomes a ``Scan`` of the whole time-major input (its
  TensorArray read becomes the scan input, its write the scan output). Its variables are its states,
  then its scan inputs; its body returns the states, then its scan outputs. A state that steps by one
  is a counter (the iteration and the time); a recurrent layer's Scan scans one input and one output.
- A functional loop that was lowered to a frame when its graph was frozen (a Keras layer's, frozen with
  ``convert_variables_to_constants_v2``'s default ``lower_control_flow=True``) steps TensorLists, which
  tf2onnx carries as the variables of a ``Loop``; its body reads like a functional loop's once the
  Loop's trip count and condition are set aside.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..cells.body import BodyView
from ..description import BodyMatch, Direction, NoMatch, Pass, Skeleton, Wiring, require
from .adapt import build_pass as build_loop_pass
from .adapt import (
    check_assumed,
    gate_weights,
    initial_states,
    inputs_in_type,
    lengths_wiring,
    output_wiring,
    per_row_reversal,
    reversals,
    state_output,
)
from .skeleton import cast_step, unmask, unmask_lengths
from .skeleton import read_skeleton as read_list_skeleton

LOOP_OPS = ("Scan", "Loop")


def is_loop(node) -> bool:
    """Whether ``node`` is a Scan or Loop tf2onnx made of a TF 1.x loop (its body still TensorFlow's ops)."""
    if node.type not in LOOP_OPS:
        return False
    body = _body(node)
    return body is not None and any(n.type in _TF_OPS for n in body.get_nodes())


class LoopView(BodyView):
    """A :class:`BodyView` over an ONNX ``Loop``'s body with the trip count and condition set aside: its
    slots are the Loop's variables, as a functional loop's are."""

    def __init__(self, graph):
        super().__init__(graph, inputs=list(graph.input_names)[2:], outputs=list(graph.outputs)[1:])


class LoopVariables:
    """An ONNX ``Loop`` seen as a functional loop by the readers: its inputs and outputs are its
    variables (the trip count and condition set aside), its name the TF 1.x loop's."""

    def __init__(self, node):
        self.node, self.name = node, loop_name(node)
        self.input, self.output = list(node.input)[2:], list(node.output)

    def get_attr_str(self, name: str) -> str:
        return ""


def view_of(node) -> BodyView:
    """The view a loop's body is read through."""
    return LoopView(_body(node)) if node.type == "Loop" else BodyView(_body(node))


_TF_OPS = frozenset({"MatMul", "BiasAdd", "ConcatV2", "Select", "SelectV2", "AddV2", "LSTMBlockCell", "GRUBlockCell",
                     "TensorListGetItem"})


def _body(node):
    bodies = node.get_body_graphs() or {}
    return bodies.get("body")


def body_of(node):
    """The Scan's body graph."""
    return _body(node)


def loop_name(node) -> str:
    """The TF 1.x loop a Scan came from, as its body's nodes are named (``rnn/while``), else the Scan's name."""
    body = _body(node)
    prefixes = Counter(n.name.split("/while/")[0] + "/while" for n in (body.get_nodes() if body else [])
                       if "/while/" in n.name)
    return prefixes.most_common(1)[0][0] if prefixes else node.name


def read_skeleton(view: BodyView, node) -> Skeleton:
    """The skeleton of a Scan body: its states, its one scanned input and output, its counters."""
    scanned = int(node.get_attr_value("num_scan_inputs", 0))
    states = len(node.input) - scanned
    require(scanned == 1, f"the loop scans {scanned} inputs, a recurrent layer scans one", node.name)
    require(len(view.outputs) == states + 1, "the loop scans out more than one sequence", node.name)
    counters, constant, state_inputs, state_outputs = [], set(), {}, {}
    for slot in range(states):
        inp, out = view.inputs[slot], view.resolve(view.outputs[slot])
        if out == inp:
            constant.add(slot)
        elif _steps_by_one(view, slot):
            counters.append(view.inputs[slot])
        else:
            state_inputs[slot], state_outputs[slot] = inp, out
    time = [t for t in counters if any(c.type == "GreaterEqual" for c in view.consumers(t))]
    return Skeleton(input_slot=states, output_slot=states, output_every_step=True, mask_slot=None,
                    x_t=cast_step(view.graph, view.inputs[states]), mask_t=None,
                    y_t=view.resolve(view.outputs[states]),
                    state_inputs=state_inputs, state_outputs=state_outputs, constant_slots=frozenset(constant),
                    time_input=(time or counters or [""])[0])


def _steps_by_one(view: BodyView, slot: int) -> bool:
    step = view.producer(view.outputs[slot])
    return (step is not None and step.type in ("AddV2", "Add") and view.inputs[slot] in view.operands(step)
            and any(view.scalar(t) == 1 for t in view.operands(step)))


def read_body(view: BodyView, node) -> tuple:
    """(the skeleton without its masking, the masking or None) of a Scan or Loop body."""
    if node.type == "Loop":
        skeleton = read_list_skeleton(view)
        return unmask(view, skeleton) if skeleton.mask_slot is not None else unmask_lengths(view, skeleton)
    return unmask_lengths(view, read_skeleton(view, node))


def build_pass(graph, node, match: BodyMatch, name: str, others: frozenset = frozenset()) -> Pass:
    """One direction of the layer a TF 1.x Scan or Loop computes, from its match and the graph around it;
    ``others``: the loop's outputs that belong to other cells of a stack, left to them."""
    if node.type == "Loop":
        return replace(build_loop_pass(graph, LoopVariables(node), match, name, others), loop=loop_name(node))
    loop = loop_name(node)
    check_assumed(match, _no_values, loop)
    x = node.input[match.input_slot]
    masks = {}
    if match.masking is not None:
        require(match.masking.lengths is not None, "the loop is masked otherwise than by lengths", loop)
        masks = lengths_wiring(graph, match.masking.lengths, match.masking.zeros, loop)
    x_unreversed = per_row_reversal(graph, x, None, masks.get("lengths"), loop)
    sequence, reversed_, states = [], [], []
    state_slots = dict((slot, role) for role, slot in match.states)
    for slot, tensor in enumerate(node.output):
        if slot in others or not graph.find_output_consumers(tensor):
            continue
        if slot == match.output_slot:
            found = reversals(graph, [tensor], masks.get("lengths"))
            (reversed_ if found else sequence).extend(found or [tensor])
        else:
            states.append(state_output(node, match, state_slots, slot, tensor))
    require(x_unreversed is None or not sequence, "a backward pass's outputs are used in step order", loop)
    starts = {slot: node.input[slot] for _, slot in match.states}
    weights = gate_weights(match, _no_values, loop)
    return Pass(loop=loop, name=name, kind=match.kind,
                direction=Direction.FORWARD if x_unreversed is None else Direction.BACKWARD,
                activations=match.activations, attributes=match.attributes, note=match.note,
                wiring=Wiring(**inputs_in_type(graph, x, x_unreversed, weights["dtype"]),
                              **initial_states(graph, match, starts),
                              **output_wiring(graph, node, sequence, reversed_, [], states), **masks),
                **weights)


def _no_values(slot: int):
    """A Scan body reads its weights from the graph around it, never from a loop variable."""
    raise NoMatch(f"a weight is the loop's variable {slot}, not a constant")


