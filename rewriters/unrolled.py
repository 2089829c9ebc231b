"""A reader for ``unroll=True`` layers: a chain of cell steps in the graph itself, no loop.

Keras unrolls a layer by unstacking the time-major input (``Unpack``; a masked layer unstacks its
mask too) and calling the cell once per step, each step reading the states the step before
wrote. This reader recognises such a chain and yields the same :class:`Pass` a loop gives, so
the one emitter builds the same single native node. Nothing is taken on trust:

1. Every node is labelled with the latest step whose input it depends on. A step's own nodes
   carry its label; the recurrent projections of the state a step leaves (``h @ R``) carry it
   too and are set aside as the next step's (:func:`_projections`).
2. One step is the template (the second when there are three or more, else the first). Each
   other step is mapped onto it node for node: same op, same attributes, equal constants, the
   step's own input and mask where the template has its own, and the states the step before
   left where the template reads the states. A step that differs anywhere stops the chain.
3. The cell matchers read the template step through a :class:`StepView`, exactly as they read
   a loop body, so the chain is fused only into the cell they recognise.
4. What the chain leaves to the rest of the graph must be what the node gives: the stacked
   outputs, the last output and the final states. An intermediate value used elsewhere stops it.

A chain that does not pass stays as it is, which is exact, and its reason goes to the report.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import numpy as np
from onnx import TensorProto
from tf2onnx.graph_builder import GraphBuilder

from .adapt import gate_weights, is_constant, is_zero, mask_source, reversals
from .body import BodyView, Skeleton, unmask
from .activations import function_of
from .evaluate import NotEvaluable, evaluate
from .layer import BodyMatch, Direction, NoMatch, Pass, StackMatch, StateRole, Wiring, require

_NO_STEP = -1  # the label of what depends on no step's input (weights, initial states)
_VARYING = -1  # a StepView "slot" for the step's input and mask: not constant, not a state
# ops that carry a state into the next step's pre-activations without reading the step's input
_PROJECTIONS = frozenset({"MatMul", "Gemm", "BiasAdd", "Add", "AddV2", "Split", "SplitV", "StridedSlice",
                          "Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "Mul"})
_ZERO_MAKERS = frozenset({"ZerosLike"})  # Keras's first masked step carries zeros_like(output)
_STACKS = frozenset({"Pack"})
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


class StepView(BodyView):
    """A :class:`BodyView` over one step of a chain in the outer graph: the states the step reads
    are its slots, and weight walks stop at the step's input and mask."""

    def __init__(self, graph, state_inputs: Sequence[str], varying: Sequence[str]):  # noqa: super not called: no loop body
        self.graph = graph
        self.inputs, self.outputs = list(state_inputs), []
        self._slot_of_input = {tensor: slot for slot, tensor in enumerate(state_inputs)}
        for tensor in varying:
            self._slot_of_input.setdefault(tensor, _VARYING)


# -- finding chains ------------------------------------------------------------------------
def find_chains(graph) -> list:
    """Every float ``Unpack`` along axis 0 of a rank-3 tensor whose steps each feed a product:
    the candidates a recurrent layer's unrolling leaves. Whether a candidate is recurrent at all
    is :func:`is_recurrent`'s question."""
    chains = []
    unpacks = [n for n in graph.get_nodes() if n.type == "Unpack" and int(n.get_attr_value("axis", 0)) == 0]
    for node in unpacks:
        shape = graph.get_shape(node.input[0]) or []
        if len(shape) != 3 or graph.get_dtype(node.output[0]) == TensorProto.BOOL:
            continue
        if not all(any(c.type in _PRODUCTS for c in graph.find_output_consumers(t))
                   for t in node.output):
            continue
        outputs = tuple(node.output)
        backward = len(outputs) > 1 and len(_descendants(graph, [outputs[-1]])) > len(_descendants(graph, [outputs[0]]))
        steps = tuple(reversed(outputs)) if backward else outputs
        chain = Chain(unpack=node.name, x=node.input[0], steps=steps, backward=backward)
        chains.append(_with_mask(graph, chain, unpacks))
    return chains


def _with_mask(graph, chain: Chain, unpacks: list) -> Chain:
    """The chain with the bool Unpack that masks its steps, if one does: its first step's mask
    reaches, within a few ops, a node of the chain's first step (what depends on the first step's
    input and not on the second's). Another layer may unstack a mask of the same length."""
    if chain.length < 1:
        return chain
    first = _descendants(graph, [chain.steps[0]])
    if chain.length > 1:
        first -= _descendants(graph, [chain.steps[1]])
    for node in unpacks:
        if graph.get_dtype(node.output[0]) != TensorProto.BOOL or len(node.output) != chain.length:
            continue
        masks = tuple(reversed(node.output)) if chain.backward else tuple(node.output)
        if _descendants(graph, [masks[0]], depth=4) & first:
            return replace(chain, mask=node.input[0], mask_steps=masks)
    return chain


def _descendants(graph, tensors: Sequence[str], depth: Optional[int] = None) -> set:
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


# -- labels --------------------------------------------------------------------------------
class _Labels:
    """For each node reached from the chain's steps: the latest step it depends on."""

    def __init__(self, graph, chain: Chain):
        self.graph = graph
        self.roots = {t: k for k, t in enumerate(chain.steps)}
        self.roots.update({t: k for k, t in enumerate(chain.mask_steps)})
        reached = _descendants(graph, list(chain.steps))
        self.foreign: set = set()
        if chain.mask_steps:  # what reads the mask belongs to the chain when the chain uses it (another
            # layer may read the same mask: a Bidirectional's halves share it)
            masked = _descendants(graph, list(chain.mask_steps)) - reached
            for node in reversed(_topological(graph, masked)):
                if any(c.name in reached for t in node.output for c in graph.find_output_consumers(t)):
                    reached.add(node.name)
        self.foreign = _descendants(graph, list(chain.mask_steps)) - reached  # another layer's use of the mask
        self.of: dict = {}
        for node in _topological(graph, reached):
            self.of[node.name] = max((self.tensor(t) for t in node.input), default=_NO_STEP)

    def tensor(self, tensor: str) -> int:
        if tensor in self.roots:
            return self.roots[tensor]
        node = self.graph.get_node_by_output(tensor)
        return _NO_STEP if node is None else self.of.get(node.name, _NO_STEP)

    def step(self, k: int) -> list:
        return [self.graph.get_node_by_name(name) for name, label in self.of.items() if label == k]


def _topological(graph, names: set) -> list:
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
    labels = _Labels(graph, chain)
    return any(labels.tensor(t) == 0 for node in labels.step(1) if node.type not in _STACKS | {"ConcatV2"}
               for t in node.input if t not in labels.roots)


def _projections(graph, labels: _Labels, k: int) -> set:
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
        varying = [t for t in node.input if not _static(graph, labels, t)]
        if len(varying) != 1 or labels.tensor(varying[0]) != k - 1 or varying[0] in labels.roots:
            continue
        found.add(node.name)
        pending.append(varying[0])
    return found


def _static(graph, labels: _Labels, tensor: str) -> bool:
    """Whether ``tensor`` depends on no step and is computed from constants (a weight, a folded bias)."""
    if labels.tensor(tensor) != _NO_STEP:
        return False
    if is_constant(graph, tensor):
        return True
    try:
        evaluate(graph, tensor)
    except (NotEvaluable, ValueError, TypeError):
        return False
    return True


# -- mapping one step onto another ---------------------------------------------------------
class _Mode(enum.Enum):
    DISCOVER = "discover"  # the step after the template: where they differ outside the template, a state
    CHAIN = "chain"  # a later step: the template's states are what the step before left
    RECORD = "record"  # an earlier step (the first): the template's states are what it starts from


@dataclass
class _StepMap:
    """Template tensor -> the step's tensor, and template node -> the step's node."""

    tensors: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)  # the step's node -> the template node it is the image of
    states: dict = field(default_factory=dict)  # template state input -> what the step reads there

    def copy(self) -> "_StepMap":
        return _StepMap(dict(self.tensors), dict(self.nodes), dict(self.images), dict(self.states))


class _Template:
    """One step's nodes, and how to find their counterparts in another step."""

    def __init__(self, graph, nodes: list, x_t: str, mask_t: Optional[str], taken: set):
        self.graph = graph
        self.nodes = nodes  # topological
        self.names = {n.name for n in nodes}
        self.x_t, self.mask_t = x_t, mask_t
        self.taken = taken  # nodes already some step's (no node serves two steps)
        self._injective = True  # whether two states may not start from one tensor (see map)
        self.state_inputs: list = []  # the template's state inputs, in slot order (DISCOVER finds them)

    def map(self, x_t: str, mask_t: Optional[str], mode: _Mode, fixed: Optional[dict] = None,
            partial: bool = False) -> _StepMap:
        """The template mapped onto the step that reads ``x_t`` (see :meth:`_map`); for the first
        step, states that start from one tensor are tried last."""
        self._injective = True
        try:
            return self._map(x_t, mask_t, mode, fixed, partial)
        except NoMatch:
            if mode is not _Mode.RECORD:
                raise
        self._injective = False
        return self._map(x_t, mask_t, mode, fixed, partial)

    def _map(self, x_t: str, mask_t: Optional[str], mode: _Mode, fixed: Optional[dict] = None,
             partial: bool = False) -> _StepMap:
        """The template mapped onto the step that reads ``x_t``; :class:`NoMatch` where it differs.
        ``partial`` (the last step): TensorFlow pruned what nothing reads (the states a layer does
        not return), so template nodes without a counterpart are left out; whatever the step does
        instead is caught where its values leave the chain."""
        self._step = (x_t, mask_t, mode, fixed or {})
        found = _StepMap()
        for node in self.nodes:
            if node.name in found.nodes or node.type in _ZERO_MAKERS:
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
        missing = [n for n in self.nodes if n.name not in found.nodes and n.type not in _ZERO_MAKERS]
        require(partial or not missing, "a step of the unrolled chain does not compute what the template does",
                missing[0].name if missing else "")
        return found

    def _anchor(self, node, found: _StepMap):
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

    def _tensor(self, tensor: str, other: str, found: _StepMap) -> bool:
        if tensor in found.tensors:
            return other in _twins_of(self.graph, found.tensors[tensor])
        if self._fresh(tensor, other, found):
            found.tensors[tensor] = other
            return True
        return False

    def _fresh(self, tensor: str, other: str, found: _StepMap) -> bool:
        x_t, mask_t, mode, fixed = self._step
        if tensor == self.x_t:
            return other == x_t
        if self.mask_t is not None and tensor == self.mask_t:
            return other == mask_t
        node = self.graph.get_node_by_output(tensor)
        inside = node is not None and node.name in self.names
        if inside and not (node.type in _ZERO_MAKERS and mode is not _Mode.CHAIN):
            counterpart = self.graph.get_node_by_output(other)
            return (counterpart is not None and _output_index(tensor) == _output_index(other)
                    and self._node(node, counterpart, found))
        if tensor in fixed:
            return other == fixed[tensor]
        if tensor == other or _equal_constants(self.graph, tensor, other):
            return not inside
        if mode is _Mode.RECORD and tensor in self.state_inputs:
            if self._injective and other in found.states.values():
                return False  # first try one start per state (two states may start from one zeros tensor)
            found.states[tensor] = other
            return True
        if mode is _Mode.DISCOVER and other not in found.states.values():  # one state follows one state
            found.states[tensor] = other
            return True
        return False

    def _node(self, node, other, found: _StepMap) -> bool:
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


def _output_index(tensor: str) -> str:
    return tensor.rsplit(":", 1)[-1] if ":" in tensor else "0"


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


# -- reading a chain -----------------------------------------------------------------------
@dataclass(frozen=True)
class ChainReading:
    """What the steps of a chain are, once each is known to be the template's copy."""

    match: BodyMatch
    outputs: tuple[str, ...]  # y_t per step, in step order
    initial: dict  # state slot -> what the first step reads there (None: zeros)
    final: dict  # state slot -> what the last step leaves there
    nodes: frozenset  # every node of the chain


MatchCell = Callable[[BodyView, Skeleton], BodyMatch]


def read_chain(graph, chain: Chain, match_cell: MatchCell) -> ChainReading:
    """Read a chain whose steps all compute one cell; :class:`NoMatch` with the reason otherwise."""
    length = chain.length
    require(length >= 2, f"an unrolled layer of {length} step: nothing recurrent to fuse", chain.unpack)
    labels = _Labels(graph, chain)
    first = 1 if length >= 3 else 0  # a step whose successor is a step too: its nodes are bounded
    projections = {k: _projections(graph, labels, k) for k in (first, first + 1)}
    own = [n for n in labels.step(first) if n.name not in projections[first + 1]]
    own += [graph.get_node_by_name(name) for name in projections[first]]
    nodes = _topological(graph, {n.name for n in own})
    template = _Template(graph, nodes, chain.steps[first], chain.mask_steps[first] if chain.mask else None,
                         taken=set(labels.foreign))

    def step_mask(k: int) -> Optional[str]:
        return chain.mask_steps[k] if chain.mask else None

    maps = {first: _identity_map(nodes)}
    nxt = template.map(chain.steps[first + 1], step_mask(first + 1), _Mode.DISCOVER, partial=first + 2 == length)
    template.state_inputs = sorted(nxt.states)
    require(bool(template.state_inputs), "no state passes from one unrolled step to the next (a first step of "
            "two whose zero states TensorFlow folded away)", chain.unpack)
    leaves = [nxt.states[t] for t in template.state_inputs]  # what the template step leaves, per slot
    for tensor in leaves:
        producer = graph.get_node_by_output(tensor)
        require(producer is not None and producer.name in template.names,
                "the unrolled steps differ in something that is not a state", tensor)
    maps[first + 1] = nxt
    template.taken |= set(nxt.images)
    for k in range(first + 2, length):
        before = maps[k - 1]
        fixed = {t: before.tensors[leaf] for t, leaf in zip(template.state_inputs, leaves)}
        maps[k] = template.map(chain.steps[k], step_mask(k), _Mode.CHAIN, fixed, partial=k == length - 1)
        template.taken |= set(maps[k].images)
    match = _match_template(graph, chain, template, first, leaves, match_cell)
    initial = {}
    if first == 1:
        try:
            maps[0] = template.map(chain.steps[0], step_mask(0), _Mode.RECORD)
        except NoMatch as differs:
            # TensorFlow folded the first step's products with constant zero states (a fixed batch):
            # it is the template's cell from zero states if it computes the same values
            first_step_from_zero(graph, chain, match, template.state_inputs, differs)
            maps[0] = _identity_map([])
            maps[0].tensors.update({leaf: t for t, leaf in zip(template.state_inputs, leaves)})
            initial = {slot: None for slot in range(len(leaves))}  # zeros
        else:
            template.taken |= set(maps[0].images)
            for t, leaf in zip(template.state_inputs, leaves):
                require(maps[0].tensors.get(leaf) == t, "the first unrolled step does not lead into the second", t)
            initial = {slot: maps[0].states.get(t, t) for slot, t in enumerate(template.state_inputs)}
    else:
        initial = dict(enumerate(template.state_inputs))
    for _, slot in match.states:  # a state starts from zeros or what the model gives, not from the steps
        start = initial[slot]
        require(start is None or is_zero(graph, start) or labels.tensor(start) == _NO_STEP,
                "an initial state depends on the layer's input", start)

    y_template = _output_of(match, leaves)
    outputs = tuple(maps[k].tensors.get(y_template) for k in range(length))
    require(all(outputs[:-1]), "an unrolled step before the last has no output", chain.unpack)
    last = maps[length - 1]
    final = {slot: last.tensors[leaf] for slot, leaf in enumerate(leaves) if leaf in last.tensors}
    members = set().union(*(set(m.images) for m in maps.values())) | template.names
    members |= {graph.get_node_by_output(t).name for t in initial.values()
                if t and graph.get_node_by_output(t) is not None and graph.get_node_by_output(t).type in _ZERO_MAKERS}
    return ChainReading(match=match, outputs=outputs, initial=initial, final=final, nodes=frozenset(members))


_PROBE_ROUNDS = (1.0, 3.0)  # scales of the random inputs the first step is checked on
# how close the first step's values must come to the cell's, by the type it computes in (a few
# units of its last place)
_PROBE_TOLERANCES = {"float16": 4e-3, "bfloat16": 3e-2}
_PROBE_TOLERANCE = 1e-5


def first_step_from_zero(graph, chain: Chain, match: BodyMatch, leaves: Sequence[str], differs: NoMatch) -> None:
    """Check that the first step's values (``leaves``, per state slot) are the matched cell applied
    to zero states: computed from the graph on random inputs and masks, and from the weights by
    the ONNX equations. :class:`NoMatch` (``differs``'s reason) unless every value agrees."""
    x_t = chain.steps[0]
    mask_t = chain.mask_steps[0] if chain.mask else None
    shape = graph.get_shape(x_t) or []
    batch = shape[0] if len(shape) == 2 and shape[0] and shape[0] > 0 else 3
    weights = gate_weights(match, _no_loop_values(chain), chain.unpack)
    dtype = np.dtype(weights["dtype"])
    rng = np.random.default_rng(0)
    tolerance = _PROBE_TOLERANCES.get(dtype.name, _PROBE_TOLERANCE)
    roles = dict((slot, role) for role, slot in match.states)
    for scale in _PROBE_ROUNDS:
        x = (rng.standard_normal((batch, weights["input_size"])) * scale).astype(dtype)
        bindings = {x_t: x}
        kept = np.ones(batch, bool)
        if mask_t is not None:
            kept = rng.random(batch) < 0.7
            mask_shape = graph.get_shape(mask_t) or [batch]
            bindings[mask_t] = kept.reshape([batch] + [1] * (len(mask_shape) - 1))
        expected = cell_from_zero(match, weights, x.astype(np.float64))
        for slot, leaf in enumerate(leaves):
            role = roles.get(slot)
            value = expected[role] if role is not None else expected[StateRole.HIDDEN]  # the masked output
            value = np.where(kept[:, None], value, 0.0)
            try:
                actual = np.asarray(evaluate(graph, leaf, bindings), np.float64)
            except (NotEvaluable, ValueError) as error:
                raise NoMatch(f"{differs.reason}, and its values cannot be checked: {error}", differs.node) from error
            close = actual.shape == value.shape and np.all(np.abs(actual - value) <= tolerance * (1 + np.abs(value)))
            require(bool(close), f"{differs.reason}, and it does not compute the cell from zero states", leaf)


def cell_from_zero(match: BodyMatch, weights: dict, x: np.ndarray) -> dict:
    """The ONNX cell's new states (role -> [B, H]) from zero states, for input ``x`` [B, F]."""
    hidden, gates = weights["hidden_size"], len(match.gates)
    W, B = weights["W"].astype(np.float64), weights["B"].astype(np.float64)
    input_bias, recurrent_bias = B[:gates * hidden], B[gates * hidden:]
    f = [function_of(a) for a in match.activations]
    projected = np.split(x @ W.T + input_bias, gates, axis=-1)
    recurrent = np.split(np.broadcast_to(recurrent_bias, projected[0].shape[:-1] + (gates * hidden,)), gates, axis=-1)
    op = match.kind.onnx_op
    if op == "LSTM":  # gates i, o, f, c; activations f, g, h
        i, o, _, c = (p + r for p, r in zip(projected, recurrent))
        cell = f[0](i) * f[1](c)
        return {StateRole.HIDDEN: f[0](o) * f[2](cell), StateRole.CELL: cell}
    if op == "GRU":  # gates z, r, h; activations f, g
        z = f[0](projected[0] + recurrent[0])
        r = f[0](projected[1] + recurrent[1])
        reset_after = dict(match.attributes).get("linear_before_reset", 0)
        candidate = f[1](projected[2] + (r * recurrent[2] if reset_after else recurrent[2]))
        return {StateRole.HIDDEN: (1 - z) * candidate}
    return {StateRole.HIDDEN: f[0](projected[0] + recurrent[0])}  # RNN


def _no_loop_values(chain: Chain):
    def value(slot: int):
        raise NotEvaluable("an unrolled step has no loop inputs", chain.unpack)

    return value


def _identity_map(nodes: list) -> _StepMap:
    found = _StepMap()
    for node in nodes:
        found.nodes[node.name] = node.name
        for tensor in node.output:
            found.tensors[tensor] = tensor
    return found


def _match_template(graph, chain: Chain, template: _Template, first: int, leaves: list,
                    match_cell: MatchCell) -> BodyMatch:
    """The cell the template step computes, read by the cell matchers as a loop body would be:
    its states are the slots, what it leaves their updates; each leaf in turn is tried as the output."""
    x_t = chain.steps[first]
    mask_t = chain.mask_steps[first] if chain.mask else None
    view = StepView(graph, template.state_inputs, [t for t in (x_t, mask_t) if t])
    inputs = dict(enumerate(template.state_inputs))
    outputs = dict(enumerate(leaves))
    reasons = []
    for y_t in dict.fromkeys(leaves):
        skeleton = Skeleton(time_slot=_VARYING, input_slot=_VARYING, output_slot=_VARYING, output_every_step=True,
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
    """The pass a chain computes, wired to the tensors it replaces."""
    match = reading.match
    direction = Direction.BACKWARD if chain.backward else Direction.FORWARD
    x, x_unreversed = _in_step_order(graph, chain.x, chain.backward), (chain.x if chain.backward else None)
    mask_wiring = {}
    if match.masking is not None:
        start = reading.initial[match.masking.output_slot]
        require(start is None or is_zero(graph, start), "the masked output does not start from zeros", chain.unpack)
        require(len(graph.get_shape(chain.mask) or []) in (2, 3), "the mask's rank is unknown", chain.unpack)
        mask_wiring = dict(mask=_in_step_order(graph, chain.mask, chain.backward),
                           mask_unreversed=chain.mask if chain.backward else None,
                           mask_source=mask_source(graph, chain.mask), masked_output=match.masking.output)
    given = [(role, reading.initial[slot]) for role, slot in match.states
             if reading.initial[slot] is not None and not is_zero(graph, reading.initial[slot])]
    constant = tuple(role for role, tensor in given if is_constant(graph, tensor))

    return Pass(loop=chain.unpack, name=name, kind=match.kind, direction=direction,
                activations=match.activations, attributes=match.attributes, unrolled=chain.length,
                wiring=Wiring(x=x, x_unreversed=x_unreversed, initial_states=tuple(given), constant_states=constant,
                              **_outputs(graph, chain, reading), **mask_wiring),
                **gate_weights(match, _no_loop_values(chain), chain.unpack))


def _in_step_order(graph, tensor: str, backward: bool) -> str:
    """A time-major tensor in the order the layer steps through it (reversed in time for go_backwards)."""
    if not backward:
        return tensor
    return GraphBuilder(graph).make_slice({"data": tensor, "starts": [-1], "ends": [-(2 ** 62)], "steps": [-1],
                                           "axes": [0]})


def _outputs(graph, chain: Chain, reading: ChainReading) -> dict:
    """Which tensors the node replaces: stacks of every step's output (or of the last one), the
    last output, the final states. Any other value of the chain used outside it stops the chain."""
    match, outputs, members = reading.match, reading.outputs, reading.nodes
    roles = {slot: role for role, slot in match.states}
    last = outputs[-1]
    final_by_tensor = {tensor: roles[slot] for slot, tensor in reading.final.items() if slot in roles}
    sequence, reversed_, last_stacked, last_step, states = [], [], [], [], []
    for name in sorted(members):
        node = graph.get_node_by_name(name)
        for tensor in node.output:
            outside = [c for c in graph.find_output_consumers(tensor) if c.name not in members]
            if not outside:
                continue
            if tensor == last or tensor in final_by_tensor:
                if tensor in final_by_tensor:
                    states.append((final_by_tensor[tensor], tensor))
                else:
                    last_step.append(tensor)
                continue
            require(tensor in outputs, "a value inside an unrolled step is used outside the layer", tensor)
            for consumer in outside:
                require(consumer.type in _STACKS and list(consumer.input) == list(outputs)
                        and int(consumer.get_attr_value("axis", 0)) == 0,
                        "an unrolled step's output is used other than stacked with the others", consumer.name)
    # stacks of all outputs (return_sequences) or of the last one only
    for consumer in {c.name: c for t in outputs for c in graph.find_output_consumers(t)
                     if c.type in _STACKS and c.name not in members}.values():
        if int(consumer.get_attr_value("axis", 0)) != 0:
            continue
        if list(consumer.input) == list(outputs):
            found = reversals(graph, [consumer.output[0]])
            (reversed_ if found else sequence).extend(found or [consumer.output[0]])
        elif list(consumer.input) == [last]:
            last_stacked.append(consumer.output[0])
    replaced = sequence + reversed_ + last_stacked + last_step + [t for _, t in states]
    require(not set(replaced) & set(graph.outputs), "an unrolled layer's output is itself a graph output",
            chain.unpack)
    return dict(sequence_output=tuple(sequence), reversed_output=tuple(reversed_), last_output=tuple(last_stacked),
                last_step_output=tuple(last_step), final_states=tuple(states))
