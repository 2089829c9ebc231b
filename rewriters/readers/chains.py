"""Finding the chains ``unroll=True`` layers leave, and labelling their steps.

Keras unrolls a layer by unstacking the time-major input (``Unpack``; a masked layer unstacks
its mask too) and calling the cell once per step, each step reading the states the step before
wrote. :func:`find_chains` finds the candidates; :class:`Labels` gives every node reached from
a chain's steps the latest step whose input it depends on, and :func:`projections` sets aside
the recurrent projections of the state a step leaves (``h @ R``), which carry step k-1's label
but belong to step k.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
from onnx import TensorProto

from ..cells.evaluate import NotEvaluable, evaluate
from .adapt import is_constant, time_major
from .skeleton import cast_step

NO_STEP = -1  # the label of what depends on no step's input (weights, initial states)
# ops that carry a state into the next step's pre-activations without reading the step's input (a Mul
# only by ones: tf_keras's recurrent dropout mask at inference; any other product is the step's own)
_PROJECTIONS = frozenset({"MatMul", "Gemm", "BiasAdd", "Add", "AddV2", "Split", "SplitV", "StridedSlice",
                          "Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "Mul"})
STACKS = frozenset({"Pack"})
_PRODUCTS = frozenset({"MatMul", "BatchMatMulV2", "Gemm"})  # x_t @ W (tf2onnx may have made it a Gemm)


@dataclass(frozen=True)
class Chain:
    """An unstacked time-major input whose steps may be a recurrent layer's."""

    unpack: str  # the Unpack node: the chain's name in the report
    x: str  # [T, B, F], time order
    steps: tuple[str, ...]  # x_t per step, in the order the layer steps
    backward: bool  # go_backwards: the steps run last to first
    mask: Optional[str] = None  # [T, B] or [T, B, 1] bool, time order
    mask_steps: tuple[str, ...] = ()

    @property
    def length(self) -> int:
        return len(self.steps)


def find_chains(graph) -> list:
    """Every ``Unpack`` along the time axis of a rank-3 tensor whose steps each feed a product
    (directly, or joined with the state first, as TF1's cells do; a step of another type than the
    layer's, cast to a float type first): the candidates a recurrent layer's unrolling leaves. Keras
    unstacks a time-major input (axis 0); a TF1 ``static_rnn`` is given the steps of a batch-major one
    (axis 1), which the chain reads transposed. Whether a candidate is recurrent at all is
    :func:`is_recurrent`'s question."""
    chains = []
    unpacks = [n for n in graph.get_nodes() if n.type == "Unpack" and int(n.get_attr_value("axis", 0)) in (0, 1)]
    for node in unpacks:
        shape = graph.get_shape(node.input[0]) or []
        if len(shape) != 3 or not all(_feeds_a_product(graph, t) for t in node.output):
            continue
        outputs = tuple(node.output)
        backward = len(outputs) > 1 and len(descendants(graph, [outputs[-1]])) > len(descendants(graph, [outputs[0]]))
        steps = tuple(reversed(outputs)) if backward else outputs
        x = node.input[0] if int(node.get_attr_value("axis", 0)) == 0 else time_major(graph, node.input[0])
        chain = Chain(unpack=node.name, x=x, steps=steps, backward=backward)
        chains.append(_with_mask(graph, chain, [n for n in unpacks if int(n.get_attr_value("axis", 0)) == 0]))
    return chains


def _feeds_a_product(graph, tensor: str) -> bool:
    consumers = graph.find_output_consumers(cast_step(graph, tensor))
    return any(c.type in _PRODUCTS for c in consumers) or any(
        c.type in ("ConcatV2", "Concat") and any(p.type in _PRODUCTS for p in graph.find_output_consumers(c.output[0]))
        for c in consumers)


def _with_mask(graph, chain: Chain, unpacks: list) -> Chain:
    """The chain with the bool Unpack that masks its steps, if one does: its first step's mask
    reaches, within a few ops, a node of the chain's first step (what depends on the first step's
    input and not on the second's). Another layer may unstack a mask of the same length."""
    if chain.length < 1:
        return chain
    first = descendants(graph, [chain.steps[0]])
    if chain.length > 1:
        first -= descendants(graph, [chain.steps[1]])
    for node in unpacks:
        if graph.get_dtype(node.output[0]) != TensorProto.BOOL or len(node.output) != chain.length \
                or node.name == chain.unpack:
            continue
        masks = tuple(reversed(node.output)) if chain.backward else tuple(node.output)
        if descendants(graph, [masks[0]], depth=4) & first:
            return replace(chain, mask=node.input[0], mask_steps=masks)
    return chain


def descendants(graph, tensors: Sequence[str], depth: Optional[int] = None) -> set:
    """Names of the nodes reachable from ``tensors`` (within ``depth`` ops when given)."""
    seen, frontier, level = set(), list(tensors), 0
    while frontier and (depth is None or level < depth):
        following = []
        for tensor in frontier:
            for node in graph.find_output_consumers(tensor):
                if node.name not in seen:
                    seen.add(node.name)
                    following.extend(node.output)
        frontier, level = following, level + 1
    return seen


class Labels:
    """For each node reached from the chain's steps: the latest step it depends on."""

    def __init__(self, graph, chain: Chain):
        self.graph = graph
        self.roots = {t: k for k, t in enumerate(chain.steps)}
        self.roots.update({t: k for k, t in enumerate(chain.mask_steps)})
        reached = descendants(graph, list(chain.steps))
        if chain.mask_steps:  # what reads the mask belongs to the chain when the chain uses it (another
            # layer may read the same mask: a Bidirectional's halves share it)
            masked = descendants(graph, list(chain.mask_steps)) - reached
            for node in reversed(topological(graph, masked)):
                if any(c.name in reached for t in node.output for c in graph.find_output_consumers(t)):
                    reached.add(node.name)
        self.foreign = descendants(graph, list(chain.mask_steps)) - reached  # another layer's use of the mask
        self.of: dict = {}
        for node in topological(graph, reached):
            self.of[node.name] = max((self.tensor(t) for t in node.input), default=NO_STEP)

    def tensor(self, tensor: str) -> int:
        if tensor in self.roots:
            return self.roots[tensor]
        node = self.graph.get_node_by_output(tensor)
        return NO_STEP if node is None else self.of.get(node.name, NO_STEP)

    def step(self, k: int) -> list:
        return [self.graph.get_node_by_name(name) for name, label in self.of.items() if label == k]


def topological(graph, names: set) -> list:
    """The nodes named in ``names``, each after those of its inputs that are among them."""
    nodes = {name: graph.get_node_by_name(name) for name in names}
    waiting = {}
    for name, node in nodes.items():
        producers = {graph.get_node_by_output(t) for t in node.input}
        waiting[name] = {p.name for p in producers if p is not None and p.name in nodes and p.name != name}
    users: dict = {}
    for name, before in sorted(waiting.items()):
        for other in sorted(before):
            users.setdefault(other, []).append(name)
    ready = sorted((name for name, before in waiting.items() if not before), reverse=True)
    order = []
    while ready:  # the same order in every process: names decide among the nodes that are ready
        name = ready.pop()
        order.append(nodes[name])
        for user in users.get(name, ()):
            waiting[user].discard(name)
            if not waiting[user]:
                ready.append(user)
    return order


def is_recurrent(graph, chain: Chain) -> bool:
    """Whether a later step reads what an earlier one computed, other than by stacking outputs."""
    if chain.length < 2:
        return False
    labels = Labels(graph, chain)
    return any(labels.tensor(t) == 0 for node in labels.step(1) if node.type not in STACKS | {"ConcatV2"}
               for t in node.input if t not in labels.roots)


def projections(graph, labels: Labels, k: int) -> set:
    """Nodes that project the states step k-1 left for step k (``h @ R`` and its column blocks),
    which depend on step k-1 only: each has one non-constant input, from step k-1."""
    found, pending = set(), []
    for node in labels.step(k):
        pending.extend(t for t in node.input if t not in labels.roots and labels.tensor(t) == k - 1)
    while pending:
        tensor = pending.pop()
        node = graph.get_node_by_output(tensor)
        if node is None or node.name in found or node.type not in _PROJECTIONS:
            continue
        varying = [t for t in node.input if not is_static(graph, labels, t)]
        if len(varying) != 1 or labels.tensor(varying[0]) != k - 1 or varying[0] in labels.roots:
            continue
        if node.type == "Mul" and not all(_ones(graph, t) for t in node.input if t != varying[0]):
            continue
        found.add(node.name)
        pending.append(varying[0])
    return found


def is_static(graph, labels: Labels, tensor: str) -> bool:
    """Whether ``tensor`` depends on no step and is computed from constants (a weight, a folded bias)."""
    if labels.tensor(tensor) != NO_STEP:
        return False
    if is_constant(graph, tensor):
        return True
    try:
        evaluate(graph, tensor)
    except (NotEvaluable, ValueError, TypeError):
        return False
    return True



def _ones(graph, tensor: str) -> bool:
    try:
        return bool(np.all(np.asarray(evaluate(graph, tensor)) == 1))
    except (NotEvaluable, ValueError, TypeError):
        return False
