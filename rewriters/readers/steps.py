"""Mapping one step of an unrolled chain onto another, node for node.

One step is the template. Each other step is mapped onto it: the same op, the same attributes,
equal constants, the step's own input and mask where the template has its own, and the states
the step before left where the template reads its states. A step that differs anywhere stops
the chain (:class:`NoMatch`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..description import NoMatch, require

ZERO_MAKERS = frozenset({"ZerosLike"})  # Keras's first masked step carries zeros_like(output)


class Mode(enum.Enum):
    DISCOVER = "discover"  # the step after the template: where they differ outside the template, a state
    CHAIN = "chain"  # a later step: the template's states are what the step before left
    RECORD = "record"  # an earlier step (the first): the template's states are what it starts from


@dataclass
class StepMap:
    """Template tensor -> the step's tensor, and template node -> the step's node."""

    tensors: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)  # the step's node -> the template node it is the image of
    states: dict = field(default_factory=dict)  # template state input -> what the step reads there

    def copy(self) -> "StepMap":
        return StepMap(dict(self.tensors), dict(self.nodes), dict(self.images), dict(self.states))


class Template:
    """One step's nodes, and how to find their counterparts in another step."""

    def __init__(self, graph, nodes: list, x_t: str, mask_t: Optional[str], taken: set):
        self.graph = graph
        self.nodes = nodes  # topological
        self.names = {n.name for n in nodes}
        self.x_t, self.mask_t = x_t, mask_t
        self.taken = taken  # nodes already some step's (no node serves two steps)
        self._injective = True  # whether two states may not start from one tensor (see map)
        self.state_inputs: list = []  # the template's state inputs, in slot order (DISCOVER finds them)

    def map(self, x_t: str, mask_t: Optional[str], mode: Mode, fixed: Optional[dict] = None,
            partial: bool = False) -> StepMap:
        """The template mapped onto the step that reads ``x_t`` (see :meth:`_map`); for the first
        step, states that start from one tensor are tried last."""
        self._injective = True
        try:
            return self._map(x_t, mask_t, mode, fixed, partial)
        except NoMatch:
            if mode is not Mode.RECORD:
                raise
        self._injective = False
        return self._map(x_t, mask_t, mode, fixed, partial)

    def _map(self, x_t: str, mask_t: Optional[str], mode: Mode, fixed: Optional[dict] = None,
             partial: bool = False) -> StepMap:
        """The template mapped onto the step that reads ``x_t``; :class:`NoMatch` where it differs.
        ``partial`` (the last step): TensorFlow pruned what nothing reads (the states a layer does
        not return), so template nodes without a counterpart are left out; whatever the step does
        instead is caught where its values leave the chain."""
        self._step = (x_t, mask_t, mode, fixed or {})
        found = StepMap()
        for node in self.nodes:
            if node.name in found.nodes or node.type in ZERO_MAKERS:
                continue
            anchor = self._anchor(node, found)
            if anchor is None:
                continue  # reached from a consumer (a projection of a state the step starts from), or missing
            index, tensor = anchor
            twins = _twins_of(self.graph, tensor)
            candidates = {c.name: c for t in sorted(twins) for c in self.graph.find_output_consumers(t)}
            for _, candidate in sorted(candidates.items()):
                if candidate.type != node.type or index >= len(candidate.input) or candidate.input[index] not in twins:
                    continue
                trial = found.copy()
                if self._node(node, candidate, trial):
                    found = trial
                    break
            else:
                require(partial, f"a step of the unrolled chain has no counterpart of the template's {node.type}",
                        node.name)
        missing = [n for n in self.nodes if n.name not in found.nodes and n.type not in ZERO_MAKERS]
        require(partial or not missing, "a step of the unrolled chain does not compute what the template does",
                missing[0].name if missing else "")
        return found

    def _anchor(self, node, found: StepMap):
        x_t, mask_t, _, fixed = self._step
        for index, tensor in enumerate(node.input):
            if tensor in found.tensors:
                return index, found.tensors[tensor]
            if tensor == self.x_t:
                return index, x_t
            if self.mask_t is not None and tensor == self.mask_t:
                return index, mask_t
            if tensor in fixed:
                return index, fixed[tensor]
        return None

    def _tensor(self, tensor: str, other: str, found: StepMap) -> bool:
        if tensor in found.tensors:
            return other in _twins_of(self.graph, found.tensors[tensor])
        if self._fresh(tensor, other, found):
            found.tensors[tensor] = other
            return True
        return False

    def _fresh(self, tensor: str, other: str, found: StepMap) -> bool:
        x_t, mask_t, mode, fixed = self._step
        if tensor == self.x_t:
            return other == x_t
        if self.mask_t is not None and tensor == self.mask_t:
            return other == mask_t
        node = self.graph.get_node_by_output(tensor)
        inside = node is not None and node.name in self.names
        if inside and not (node.type in ZERO_MAKERS and mode is not Mode.CHAIN):
            counterpart = self.graph.get_node_by_output(other)
            return (counterpart is not None and _output_index(node, tensor) == _output_index(counterpart, other)
                    and self._node(node, counterpart, found))
        if tensor in fixed:
            return other == fixed[tensor]
        if tensor == other or _equal_constants(self.graph, tensor, other):
            return not inside
        if mode is Mode.RECORD and tensor in self.state_inputs:
            if self._injective and other in found.states.values():
                return False  # first try one start per state (two states may start from one zeros tensor)
            found.states[tensor] = other
            return True
        if mode is Mode.DISCOVER and other not in found.states.values() and self._computes(other):
            found.states[tensor] = other  # one state follows one state, and the template step leaves it
            return True
        return False

    def _computes(self, tensor: str) -> bool:
        """Whether a node of the template computes ``tensor`` (a state the template step leaves; a weight
        the next step reads where the template reads another is no state)."""
        producer = self.graph.get_node_by_output(tensor)
        return producer is not None and producer.name in self.names

    def _node(self, node, other, found: StepMap) -> bool:
        if node.name in found.nodes:
            return found.nodes[node.name] == other.name
        if other.name in self.taken or other.name in self.names:
            return False
        if other.name in found.images:
            # one node of the step may stand for template nodes that are copies of each other (TensorFlow
            # merged the step's copies: the last step tiles its mask once for what it still computes)
            twin = self.graph.get_node_by_name(found.images[other.name])
            if node.output[0] not in _twins_of(self.graph, twin.output[0]):
                return False
            found.nodes[node.name] = other.name
            found.tensors.update(zip(node.output, other.output))
            return True
        if (node.type != other.type or len(node.input) != len(other.input) or len(node.output) != len(other.output)
                or not _same_attributes(node, other)):
            return False
        found.nodes[node.name] = other.name
        found.images[other.name] = node.name
        found.tensors.update(zip(node.output, other.output))
        return all(self._tensor(a, b, found) for a, b in zip(node.input, other.input))


def _twins_of(graph, tensor: str) -> set:
    """``tensor`` and the same output of every node that computes the same op on the same inputs
    (Keras tiles a step's mask once per state: the copies are interchangeable)."""
    node = graph.get_node_by_output(tensor)
    if node is None or not node.input or node.is_const():
        return {tensor}
    index = node.output.index(tensor) if tensor in node.output else 0
    found = {tensor}
    for other in graph.find_output_consumers(node.input[0]):
        if (other.type == node.type and len(other.input) == len(node.input) and len(other.output) > index
                and all(a == b or _equal_constants(graph, a, b) for a, b in zip(node.input, other.input))
                and _same_attributes(node, other)):
            found.add(other.output[index])
    return found


def _output_index(node, tensor: str) -> int:
    """Which of ``node``'s outputs ``tensor`` is (TFLite's tensor names carry no ``:N``)."""
    return list(node.output).index(tensor) if tensor in node.output else 0


def _same_attributes(node, other) -> bool:
    keys = {k for k in list(node.attr) + list(other.attr) if not k.startswith("_")}
    return all(_attribute(node, key) == _attribute(other, key) for key in keys)


def _attribute(node, key: str):
    value = node.get_attr_value(key)
    return value.SerializeToString() if hasattr(value, "SerializeToString") else repr(value)


def _equal_constants(graph, a: str, b: str) -> bool:
    first, second = graph.get_node_by_output(a), graph.get_node_by_output(b)
    if first is None or second is None or not first.is_const() or not second.is_const():
        return False
    left, right = first.get_tensor_value(as_list=False), second.get_tensor_value(as_list=False)
    return left.dtype == right.dtype and left.shape == right.shape and np.array_equal(left, right)


def identity_map(nodes: list) -> StepMap:
    """The template mapped onto itself."""
    found = StepMap()
    for node in nodes:
        found.nodes[node.name] = node.name
        for tensor in node.output:
            found.tensors[tensor] = tensor
    return found
