"""A reader for ``unroll=True`` layers: a chain of cell steps in the graph itself, no loop.

The chain is found and its steps labelled by :mod:`.chains`; every step is mapped onto a template
step by :mod:`.steps`. Here the chain is read: the cell matchers read the template step through a
:class:`StepView`, exactly as they read a loop body, so the chain is fused only into the cell they
recognise; a first or last step TensorFlow rearranged is checked against that cell's own step
equation (:mod:`.step_values`); and
what the chain leaves to the rest of the graph must be what the node gives (the stacked outputs,
the last output and the final states). The pass is built from the same pieces as a loop's
(:mod:`.adapt`), so the one emitter builds the same single native node.

A chain that does not pass stays as it is, which is exact, and its reason goes to the report.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from ..cells.body import BodyView
from ..description import BodyMatch, Direction, NoMatch, Pass, StackMatch, StateRole, Wiring, require
from .adapt import gate_weights, in_type, initial_states, is_zero, mask_wiring, require_not_graph_outputs, reversals
from .chains import NO_STEP, STACKS, Chain, Labels, projections, topological
from .skeleton import Skeleton, cast_step, unmask
from .step_values import first_step_start, no_loop_values, rearranged_last_step
from .steps import ZERO_MAKERS, Mode, StepMap, Template, identity_map

_VARYING = -1  # a StepView "slot" for the step's input and mask: not constant, not a state


class StepView(BodyView):
    """A :class:`BodyView` over one step of a chain in the outer graph: the states the step reads
    are its slots, and weight walks stop at the step's input and mask."""

    def __init__(self, graph, state_inputs: Sequence[str], varying: Sequence[str]):
        # BodyView's own __init__ is not called: there is no loop body, the step's states are its slots
        self.graph = graph
        self.inputs, self.outputs = list(state_inputs), []
        self._slot_of_input = {tensor: slot for slot, tensor in enumerate(state_inputs)}
        for tensor in varying:
            self._slot_of_input.setdefault(tensor, _VARYING)
        self._blocks, self.assumed = {}, {}


@dataclass(frozen=True)
class ChainReading:
    """What the steps of a chain are, once each is known to be the template's copy."""

    match: BodyMatch
    outputs: tuple[str, ...]  # y_t per step, in step order
    initial: dict  # state slot -> what the first step reads there (None: zeros)
    final: dict  # state slot -> what the last step leaves there
    nodes: frozenset  # every node of the chain


MatchCell = Callable[[BodyView, Skeleton], BodyMatch]


# -- reading a chain -----------------------------------------------------------------------
def read_chain(graph, chain: Chain, match_cell: MatchCell) -> ChainReading:
    """Read a chain whose steps all compute one cell; :class:`NoMatch` with the reason otherwise."""
    require(chain.length >= 2, f"an unrolled layer of {chain.length} step: nothing recurrent to fuse", chain.unpack)
    labels = Labels(graph, chain)
    first = 1 if chain.length >= 3 else 0  # a step whose successor is a step too: its nodes are bounded
    template = _template(graph, chain, labels, first)
    maps, leaves = _map_later_steps(chain, template, first)
    match = _match_template(graph, chain, template, first, leaves, match_cell)
    initial = _initial(graph, chain, labels, template, match, maps, leaves) if first == 1 \
        else dict(enumerate(template.state_inputs))
    for _, slot in match.states:  # a state starts from zeros or what the model gives, not from the steps
        start = initial[slot]
        require(start is None or is_zero(graph, start) or labels.tensor(start) == NO_STEP,
                "an initial state depends on the layer's input", start)
    y_template = _output_of(match, leaves)
    outputs = tuple(maps[k].tensors.get(y_template) for k in range(chain.length))
    require(all(outputs[:-1]), "an unrolled step before the last has no output", chain.unpack)
    last = maps[chain.length - 1]
    final = {slot: last.tensors[leaf] for slot, leaf in enumerate(leaves) if leaf in last.tensors}
    members = set().union(*(set(m.images) for m in maps.values())) | template.names
    starts = [graph.get_node_by_output(t) for t in initial.values() if t]
    members |= {node.name for node in starts if node is not None and node.type in ZERO_MAKERS}
    before_last = maps[chain.length - 2]
    rearranged = rearranged_last_step(graph, chain, labels, match, template, maps,
                                      [before_last.tensors[leaf] for leaf in leaves])
    if rearranged is not None:  # the last step's values, checked by the step equation
        found, region = rearranged
        output_slot = match.masking.output_slot if match.masking else dict(match.states)[StateRole.HIDDEN]
        outputs = outputs[:-1] + (found.get(output_slot),)
        final = {slot: tensor for slot, tensor in found.items() if slot in {s for _, s in match.states}}
        members |= region
    return ChainReading(match=match, outputs=outputs, initial=initial, final=final, nodes=frozenset(members))


def _step_mask(chain: Chain, k: int) -> Optional[str]:
    return chain.mask_steps[k] if chain.mask else None


def _template(graph, chain: Chain, labels: Labels, first: int) -> Template:
    """Step ``first``'s nodes, with the projections of the states it reads and without those of
    the states it leaves (they are the next step's)."""
    found = {k: projections(graph, labels, k) for k in (first, first + 1)}
    own = [n for n in labels.step(first) if n.name not in found[first + 1]]
    own += [graph.get_node_by_name(name) for name in found[first]]
    nodes = topological(graph, {n.name for n in own})
    return Template(graph, nodes, chain.steps[first], _step_mask(chain, first), taken=set(labels.foreign))


def _map_later_steps(chain: Chain, template: Template, first: int) -> tuple:
    """Every step after the template mapped onto it: the next one tells the template's states (where
    they differ outside the template) and what the template leaves for each (``leaves``); each later
    one reads what the step before left. Returns (step -> StepMap, leaves)."""
    graph, length = template.graph, chain.length
    maps = {first: identity_map(template.nodes)}
    mask, partial = _step_mask(chain, first + 1), first + 2 == length
    following = template.map(chain.steps[first + 1], mask, Mode.DISCOVER, partial=partial)
    selected = _selected_states(template) if chain.mask else {}
    if len(selected) > len(following.states):
        # the next step is the last, and TensorFlow rearranged it past where it reads a state: a masked
        # template says its states itself (each update is Select(mask, new, state))
        following = template.map(chain.steps[first + 1], mask, Mode.CHAIN, dict(selected), partial=partial)
        following.states.update(selected)
    template.state_inputs = sorted(following.states)
    require(bool(template.state_inputs), "no state passes from one unrolled step to the next (a first step of "
            "two whose zero states TensorFlow folded away)", chain.unpack)
    leaves = [following.states[t] for t in template.state_inputs]  # what the template step leaves, per slot
    for tensor in leaves:
        producer = graph.get_node_by_output(tensor)
        require(producer is not None and producer.name in template.names,
                "the unrolled steps differ in something that is not a state", tensor)
    maps[first + 1] = following
    template.taken |= set(following.images)
    for k in range(first + 2, length):
        fixed = {t: maps[k - 1].tensors[leaf] for t, leaf in zip(template.state_inputs, leaves)}
        maps[k] = template.map(chain.steps[k], _step_mask(chain, k), Mode.CHAIN, fixed, partial=k == length - 1)
        template.taken |= set(maps[k].images)
    return maps, leaves


_MASK_BROADCASTS = frozenset({"Tile", "ExpandDims", "Reshape", "Cast", "Identity", "BroadcastTo"})


def _selected_states(template: Template) -> dict:
    """A masked template's states, read from its masked updates ``Select(mask, new, old)`` whose
    ``old`` comes from outside the step (or is the zeros a masked output starts from): old -> the
    update."""
    graph, found = template.graph, {}
    for node in template.nodes:
        if node.type not in ("SelectV2", "Select") or not _from_mask(graph, node.input[0], template.mask_t):
            continue
        old = node.input[2]
        producer = graph.get_node_by_output(old)
        if producer is None or producer.name not in template.names or producer.type in ZERO_MAKERS:
            found.setdefault(old, node.output[0])
    return found


def _from_mask(graph, tensor: str, mask_t: Optional[str]) -> bool:
    """Whether ``tensor`` is the step's mask, broadcast or cast."""
    while tensor != mask_t:
        node = graph.get_node_by_output(tensor)
        if node is None or node.type not in _MASK_BROADCASTS:
            return False
        tensor = node.input[0]
    return True


def _initial(graph, chain: Chain, labels: Labels, template: Template, match: BodyMatch, maps: dict,
             leaves: list) -> dict:
    """What the first step (before the template) starts from, per state slot (None: zeros), with the
    first step mapped into ``maps``. A first step TensorFlow folded at a fixed batch (with constant zero
    states, or with the given states' products) is no copy of the template: it is accepted when it
    computes the cell, from what it starts from (:func:`.step_values.first_step_start`)."""
    try:
        maps[0] = template.map(chain.steps[0], _step_mask(chain, 0), Mode.RECORD)
    except NoMatch as differs:
        starts = first_step_start(graph, chain, labels, match, template.state_inputs, differs)
        maps[0] = StepMap(tensors={leaf: t for t, leaf in zip(template.state_inputs, leaves)})
        return starts
    template.taken |= set(maps[0].images)
    for t, leaf in zip(template.state_inputs, leaves):
        require(maps[0].tensors.get(leaf) == t, "the first unrolled step does not lead into the second", t)
    return {slot: maps[0].states.get(t, t) for slot, t in enumerate(template.state_inputs)}


def _match_template(graph, chain: Chain, template: Template, first: int, leaves: list,
                    match_cell: MatchCell) -> BodyMatch:
    """The cell the template step computes, read by the cell matchers as a loop body would be:
    its states are the slots, what it leaves their updates; each leaf in turn is tried as the output."""
    x_t, mask_t = cast_step(graph, chain.steps[first]), _step_mask(chain, first)
    view = StepView(graph, template.state_inputs, [t for t in (x_t, mask_t) if t])
    inputs = dict(enumerate(template.state_inputs))
    outputs = dict(enumerate(leaves))
    reasons = []
    for y_t in dict.fromkeys(leaves):
        skeleton = Skeleton(input_slot=_VARYING, output_slot=_VARYING, output_every_step=True,
                            mask_slot=_VARYING if mask_t else None, x_t=x_t, mask_t=mask_t, y_t=y_t,
                            state_inputs=inputs, state_outputs=outputs, constant_slots=frozenset())
        try:
            masking = None
            if mask_t:
                skeleton, masking = unmask(view, skeleton)
            match = match_cell(view, skeleton)
        except NoMatch as no_match:
            reasons.append(no_match)
            continue
        require(not isinstance(match, StackMatch), "an unrolled StackedRNNCells layer is not fused: its cells stay "
                "as unrolled ops (unroll=False makes it one native node per cell)", chain.unpack)
        return replace(match, masking=masking)
    raise reasons[0]


def _output_of(match: BodyMatch, leaves: list) -> str:
    """The tensor a step outputs: the masked output's own carried value, else the hidden state."""
    if match.masking is not None:
        return leaves[match.masking.output_slot]
    return leaves[dict(match.states)[StateRole.HIDDEN]]


# -- the pass ------------------------------------------------------------------------------
def chain_pass(graph, chain: Chain, reading: ChainReading, name: str) -> Pass:
    """The pass a chain computes, wired to the tensors it replaces. A chain unstacks its input and
    mask in time order whichever way it steps: a backward pass's are reversed by the emitter."""
    match, backward = reading.match, chain.backward
    masking = match.masking
    start = None if masking is None else reading.initial[masking.output_slot]
    weights = gate_weights(match, no_loop_values(chain), chain.unpack)
    x = in_type(graph, chain.x, weights["dtype"])
    wiring = Wiring(x=x, x_unreversed=x if backward else None, reverse_x=backward,
                    **initial_states(graph, match, reading.initial), **_outputs(graph, chain, reading),
                    **mask_wiring(graph, masking, chain.mask, chain.mask if backward else None, start, chain.unpack))
    return Pass(loop=chain.unpack, name=name, kind=match.kind,
                direction=Direction.BACKWARD if backward else Direction.FORWARD,
                activations=match.activations, attributes=match.attributes, unrolled=chain.length, wiring=wiring,
                **weights)


def _outputs(graph, chain: Chain, reading: ChainReading) -> dict:
    """Which tensors the node replaces: stacks of every step's output (or of the last one), the
    last output, the final states. Any other value of the chain used outside it stops the chain."""
    roles = {slot: role for role, slot in reading.match.states}
    final_by_tensor = {tensor: roles[slot] for slot, tensor in reading.final.items() if slot in roles}
    last_step, states = [], []
    for name in sorted(reading.nodes):
        for tensor in graph.get_node_by_name(name).output:
            outside = [c for c in graph.find_output_consumers(tensor) if c.name not in reading.nodes]
            if not outside:
                continue
            if tensor in final_by_tensor:
                states.append((final_by_tensor[tensor], tensor))
            elif tensor == reading.outputs[-1]:
                last_step.append(tensor)
            else:
                require(tensor in reading.outputs, "a value inside an unrolled step is used outside the layer", tensor)
                for consumer in outside:
                    require(consumer.type in STACKS and list(consumer.input) == list(reading.outputs)
                            and int(consumer.get_attr_value("axis", 0)) in (0, 1),
                            "an unrolled step's output is used other than stacked with the others", consumer.name)
    stacked = _stacked_outputs(graph, reading)
    require_not_graph_outputs(graph, [t for found in stacked.values() for t in found] + last_step
                              + [t for _, t in states], chain.unpack)
    return dict(**stacked, last_step_output=tuple(last_step), final_states=tuple(states))


def _stacked_outputs(graph, reading: ChainReading) -> dict:
    """Stacks of all the steps' outputs (return_sequences; a Bidirectional's backward half reversed
    in time; stacked batch-major) or of the last one only."""
    outputs, last = list(reading.outputs), reading.outputs[-1]
    sequence, reversed_, last_stacked, batch_major = [], [], [], []
    for consumer in {c.name: c for t in outputs for c in graph.find_output_consumers(t)
                     if c.type in STACKS and c.name not in reading.nodes}.values():
        if int(consumer.get_attr_value("axis", 0)) == 1 and list(consumer.input) == outputs:
            batch_major.append(consumer.output[0])  # [B, T, H]: a TF1 static_rnn's caller stacks its list so
            continue
        if int(consumer.get_attr_value("axis", 0)) != 0:
            continue
        if list(consumer.input) == outputs:
            found = reversals(graph, [consumer.output[0]])
            (reversed_ if found else sequence).extend(found or [consumer.output[0]])
        elif list(consumer.input) == [last]:
            last_stacked.append(consumer.output[0])
    return dict(sequence_output=tuple(sequence), reversed_output=tuple(reversed_), last_output=tuple(last_stacked),
                batch_major_output=tuple(batch_major))
