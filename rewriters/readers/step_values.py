"""Steps of an unrolled chain that TensorFlow rearranged, checked by their values.

TensorFlow's optimizer does not leave every step a copy of the others. At a fixed batch it folds
the first step's products with its constant zero states; and in the last step, whose cell state
nothing else reads, its constant folding pushes a constant through the sums (Keras 3's
``hard_sigmoid(c) = relu6(c + 3) / 6`` becomes ``relu6(f*c + (3 + i*g)) / 6``). Such a step is
no copy of the template, but it may still compute the matched cell: each is evaluated on random
inputs, masks and states and compared with the cell's own step equation (``CellKind.step``);
only a step whose every value agrees is accepted.
"""
from __future__ import annotations

import itertools
from collections import Counter
from typing import Optional, Sequence

import numpy as np

from ..cells.activations import function_of
from ..cells.evaluate import NotEvaluable, evaluate
from ..description import BodyMatch, NoMatch, StateRole, require
from .adapt import gate_weights
from .chains import NO_STEP, STACKS, Chain, Labels, is_static
from .steps import Template

_PROBE_ROUNDS = (1.0, 3.0)  # scales of the random inputs a step is checked on
# how close a step's values must come to the cell's, by the type it computes in (a few units of its
# last place)
_PROBE_TOLERANCES = {"float16": 4e-3, "bfloat16": 3e-2}
_PROBE_TOLERANCE = 1e-5


def no_loop_values(chain: Chain):
    """The loop-input values weight sources may ask for: an unrolled step has none."""
    def value(slot: int):
        raise NotEvaluable("an unrolled step has no loop inputs", chain.unpack)

    return value


class _Probe:
    """Random inputs, masks and states for step ``k`` of a chain, and what the matched cell gives."""

    def __init__(self, graph, chain: Chain, match: BodyMatch, k: int):
        self.graph, self.match = graph, match
        self.x_t, self.mask_t = chain.steps[k], (chain.mask_steps[k] if chain.mask else None)
        shape = graph.get_shape(self.x_t) or []
        self.batch = shape[0] if len(shape) == 2 and shape[0] and shape[0] > 0 else 3
        self.weights = gate_weights(match, no_loop_values(chain), chain.unpack)
        self.dtype = np.dtype(self.weights["dtype"])
        self.tolerance = _PROBE_TOLERANCES.get(self.dtype.name, _PROBE_TOLERANCE)
        self.rng = np.random.default_rng(0)
        self.roles = dict((slot, role) for role, slot in match.states)

    def rounds(self, states: Sequence[Optional[str]]):
        """Per round: (bindings, expected value per state slot). ``states``: what the step reads per
        slot (None: zeros)."""
        hidden = self.weights["hidden_size"]
        for scale in _PROBE_ROUNDS:
            x = (self.rng.standard_normal((self.batch, self.weights["input_size"])) * scale).astype(self.dtype)
            bindings, old = {self.x_t: x}, {}
            for slot, tensor in enumerate(states):
                value = np.zeros((self.batch, hidden), self.dtype)
                if tensor is not None:
                    value = self.rng.standard_normal((self.batch, hidden)).astype(self.dtype)
                    bindings[tensor] = value
                old[slot] = value.astype(np.float64)
            kept = np.ones(self.batch, bool)
            if self.mask_t is not None:
                kept = self.rng.random(self.batch) < 0.7
                mask_shape = self.graph.get_shape(self.mask_t) or [self.batch]
                bindings[self.mask_t] = kept.reshape([self.batch] + [1] * (len(mask_shape) - 1))
            yield bindings, self._expected(x.astype(np.float64), old, kept)

    def _expected(self, x, old: dict, kept) -> dict:
        """Per slot: the cell's new state at kept rows, the old one (the masked output: zeros when
        it zeros) at masked rows."""
        match = self.match
        in_float64 = {key: self.weights[key].astype(np.float64) for key in ("W", "R", "B")}
        states = {role: old[slot] for role, slot in match.states}
        new = match.kind.step(x, states, in_float64, [function_of(a) for a in match.activations],
                              dict(match.attributes))
        expected = {}
        for slot in old:
            role = self.roles.get(slot, StateRole.HIDDEN)  # a slot without a role: the masked output
            expected[slot] = np.where(kept[:, None], new[role], old[slot])
        return expected

    def close(self, tensor: str, bindings: dict, value) -> bool:
        """Whether the graph's ``tensor`` under ``bindings`` is ``value``; :class:`NotEvaluable` when the
        graph cannot be evaluated there."""
        actual = np.asarray(evaluate(self.graph, tensor, bindings), np.float64)
        return actual.shape == value.shape and bool(
            np.all(np.abs(actual - value) <= self.tolerance * (1 + np.abs(value))))


def first_step_start(graph, chain: Chain, labels: Labels, match: BodyMatch, leaves: Sequence[str],
                     differs: NoMatch) -> dict:
    """What a first step TensorFlow rearranged (no copy of the template) starts from, per state slot
    (None: zeros), checked on its values (``leaves``: what it leaves, per state slot): zero states
    folded into it (a fixed batch), or given initial states read through ops folded with its own (at a
    fixed batch, ``h0 @ R + b`` as one Gemm). Each tensor from outside the chain the step reads is
    followed back through ops of one varying input: the nearest tensors from which the step computes
    the cell are its starts. :class:`NoMatch` (``differs``'s reason) unless there are such."""
    require(match.kind.step is not None, f"{differs.reason}, and the {match.kind.keras_name} cell gives no step "
            "equation to check it against", differs.node)
    probe = _Probe(graph, chain, match, 0)
    problems = []
    for starts in _candidate_starts(graph, labels, len(leaves)):
        problem = _start_problem(probe, leaves, starts)
        if problem is None:
            return dict(enumerate(starts))
        problems.append(problem)
    raise NoMatch(f"{differs.reason}, and {problems[0]}", differs.node)


_START_DEPTH = 3  # ops of one varying input a given state may pass through before the first step reads it


def _candidate_starts(graph, labels: Labels, slots: int):
    """Starts per state slot (None: zeros) a rearranged first step may have, nearest first: every way of
    placing the outside tensors it reads (each followed back) on distinct slots, then zeros everywhere."""
    reads = sorted({t for node in labels.step(0) for t in node.input
                    if labels.tensor(t) == NO_STEP and not is_static(graph, labels, t)})
    if reads and len(reads) <= slots:
        for chosen in itertools.product(*(_traced_back(graph, labels, t) for t in reads)):
            for placed in itertools.permutations(range(slots), len(reads)):
                starts = [None] * slots
                for tensor, slot in zip(chosen, placed):
                    starts[slot] = tensor
                yield tuple(starts)
    yield (None,) * slots


def _traced_back(graph, labels: Labels, tensor: str) -> list:
    """``tensor`` and what it is computed from through ops of one varying input (a state's projection
    folded with its bias), nearest first."""
    found = [tensor]
    for _ in range(_START_DEPTH):
        node = graph.get_node_by_output(tensor)
        if node is None or node.is_graph_input() or node.is_const():
            break
        varying = [t for t in node.input if not is_static(graph, labels, t)]
        if len(varying) != 1:
            break
        tensor = varying[0]
        found.append(tensor)
    return found


def _start_problem(probe: "_Probe", leaves: Sequence[str], starts: Sequence[Optional[str]]) -> Optional[str]:
    """Why the step's values (``leaves``, per slot) are not the cell's from ``starts``; None when they are."""
    what = "zero states" if not any(starts) else "the states it reads"
    for bindings, expected in probe.rounds(starts):
        for slot, leaf in enumerate(leaves):
            try:
                close = probe.close(leaf, bindings, expected[slot])
            except (NotEvaluable, ValueError) as error:
                return f"its values cannot be checked: {error}"
            if not close:
                return f"it does not compute the cell from {what}"
    return None


def rearranged_last_step(graph, chain: Chain, labels: Labels, match: BodyMatch, template: Template,
                         maps: dict, left: Sequence[str]) -> Optional[tuple]:
    """The last step when TensorFlow rearranged what the template computes after its mapped part:
    (the values it leaves to the rest of the graph, by state slot; its nodes). None when the last
    step holds nothing but its mapped part. ``left``: what the step before left, per state slot.
    :class:`NoMatch` unless each value it leaves is one of the cell's, by the step equation."""
    k = chain.length - 1
    region = _region(graph, labels, template, set(maps[k].images), k)
    if region == set(maps[k].images) or match.kind.step is None:
        return None
    leaving = [t for name in sorted(region) for t in graph.get_node_by_name(name).output
               if any(c.name not in region for c in graph.find_output_consumers(t))]
    probe = _Probe(graph, chain, match, k)
    found: dict = {}
    for tensor in leaving:
        slots = set(probe.roles) | ({match.masking.output_slot} if match.masking else set())
        try:
            for bindings, expected in probe.rounds(left):
                slots = {slot for slot in slots if probe.close(tensor, bindings, expected[slot])}
        except (NotEvaluable, ValueError) as error:
            raise NoMatch(f"the last unrolled step is no copy of the others, and its values cannot be checked: "
                          f"{error}", tensor) from error
        require(bool(slots), "the last unrolled step is no copy of the others, and it does not compute the cell",
                tensor)
        for slot in slots:
            found.setdefault(slot, tensor)
    return found, region


def _region(graph, labels: Labels, template: Template, mapped: set, k: int) -> set:
    """Step ``k``'s nodes: its mapped part, and the nodes of step ``k`` computed from it that the
    template's unmapped ops can account for (the same op types, as many)."""
    budget = Counter(n.type for n in template.nodes) - Counter(graph.get_node_by_name(n).type for n in mapped)
    region, grew = set(mapped), True
    made = {t for name in region for t in graph.get_node_by_name(name).output}

    def own(tensor: str) -> bool:
        """Whether step ``k`` of this chain may read ``tensor``: made in the region, constant, made before
        the step (what earlier steps left, the initial states), or the step's own input or mask. Not what
        another layer made from the same steps (a Bidirectional's other half reads the same input)."""
        return (tensor in made or is_static(graph, labels, tensor) or labels.tensor(tensor) < k
                or labels.roots.get(tensor) == k)

    while grew:
        grew = False
        for name in sorted(region):
            for tensor in graph.get_node_by_name(name).output:
                for consumer in graph.find_output_consumers(tensor):
                    if (consumer.name in region or labels.of.get(consumer.name) != k or consumer.type in STACKS
                            or budget[consumer.type] <= 0 or not all(own(t) for t in consumer.input if t)):
                        continue
                    region.add(consumer.name)
                    made.update(consumer.output)
                    budget[consumer.type] -= 1
                    grew = True
    return region
