"""An ONNX ``Loop`` read as a per-step map over sequences: which of its values are carried states,
which are only passed through, which sequences it reads a row of at each step, and what it stacks.

A loop is such a map when it runs exactly as many steps as its sequences have rows and reads each
sequence at the step's own row: then it computes what a ``Scan`` over those sequences computes. Every
way a loop can fail that is a :class:`NoMatch` with the reason and the node: an early exit, a trip
count other than the sequences' length, a read of another step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import onnx

from ..description import NoMatch, require
from .graph_index import Scope, TypeTable, attribute, upstream
from .lengths import Lengths

_INTEGER_CASTS = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.INT16,
                            onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


@dataclass(frozen=True)
class State:
    """A value the loop carries from step to step."""

    initial: str  # the outer tensor it starts from
    step_input: str  # the body input holding it at a step
    step_output: str  # the body output giving it to the next step
    final: str  # the Loop output holding its last value


@dataclass(frozen=True)
class Invariant:
    """A value the loop carries unchanged: its body reads the outer tensor."""

    initial: str
    step_input: str
    final: str


@dataclass(frozen=True)
class SequenceRead:
    """A row of an outer sequence read at each step's own index."""

    sequence: str  # the outer tensor, steps along axis 0
    row: str  # the body tensor holding the step's row
    node: str  # the read (a Gather)


@dataclass(frozen=True)
class LoopMap:
    """A Loop that is a per-step map over its sequences."""

    loop: str  # the Loop node's name
    states: tuple  # State
    invariants: tuple  # Invariant
    reads: tuple  # SequenceRead
    step_outputs: tuple  # (body output, Loop output) of what each step stacks
    indices: tuple  # body tensors equal to the step's index (the iteration number, counters from 0)
    steps: tuple  # the number of steps, as :class:`.lengths.Lengths` names it


def read_loop(node: onnx.NodeProto, scope: Scope, types: TypeTable) -> LoopMap:
    """``node`` (a Loop in ``scope``'s graph) as a :class:`LoopMap`, or :class:`NoMatch`."""
    body = attribute(node, "body")
    inner = Scope(body, scope)
    carried = len(node.input) - 2
    require(len(body.input) == carried + 2 and len(body.output) >= carried + 1,
            "the loop's body does not carry its values as its inputs say", node.name)
    iteration = body.input[0].name
    finals = list(node.output[:carried])
    states, invariants, counters = [], [], []
    for slot in range(carried):
        initial, step_input = node.input[2 + slot], body.input[2 + slot].name
        step_output = body.output[1 + slot].name
        final = finals[slot] if slot < len(finals) else ""
        if inner.resolve(step_output) == step_input:
            invariants.append(Invariant(initial, step_input, final))
        elif _counts_steps(inner, step_input, step_output, initial) and not scope.used(final):
            counters.append(step_input)
        else:
            states.append(State(initial, step_input, step_output, final))
    indices = {iteration, *counters}
    outer_of = {inv.step_input: inv.initial for inv in invariants}
    inner.aliases = dict(outer_of)
    reads = _sequence_reads(inner, indices)
    require(bool(reads), "the loop reads no sequence a row a step", node.name)
    lengths = Lengths(scope, types)
    if _bounded(node, scope):
        _steps(node, reads, lengths, [])
    tests = [_test(inner, term, indices, lengths, node.name) for term in _conjuncts(inner, body.output[0].name)]
    steps = _steps(node, reads, lengths, tests)
    require(all(bound == steps for _, bound in tests if bound is not None),
            "the loop's condition tests the step against another length than the sequence's (an early exit)",
            node.name)
    for term in _conjuncts(scope, node.input[1]):  # before the first step: 0 < steps, or always true
        offset, bound = _test(scope, term, set(), lengths, node.name, first=True)
        require(bound is None or (offset == 0 and bound == steps),
                "the loop's first test is not that the sequence has a step", node.name)
    step_outputs = tuple((out.name, final) for out, final in zip(body.output[1 + carried:], node.output[carried:]))
    return LoopMap(node.name, tuple(states), tuple(invariants), tuple(reads), step_outputs,
                   tuple(sorted(indices)), steps)


def _counts_steps(inner: Scope, step_input: str, step_output: str, initial: str) -> bool:
    """A value starting at 0 and growing by one each step: it equals the step's index."""
    step = inner.producer(inner.resolve(step_output))
    if step is None or step.op_type != "Add" or step_input not in step.input:
        return False
    other = [name for name in step.input if name != step_input]
    return len(other) == 1 and inner.scalar(other[0]) == 1 and inner.outer.scalar(initial) == 0


def _index_of(inner: Scope, name: str, indices: set) -> Optional[int]:
    """``k`` when ``name`` is the step's index plus a constant ``k`` (through integer casts), else None."""
    name = inner.resolve(name)
    node = inner.producer(name)
    if name in indices:
        return 0
    if node is None:
        return None
    if node.op_type == "Cast" and attribute(node, "to") in _INTEGER_CASTS | {onnx.TensorProto.FLOAT,
                                                                              onnx.TensorProto.DOUBLE}:
        return _index_of(inner, node.input[0], indices)
    if node.op_type == "Add":
        for a, b in (node.input, reversed(node.input)):
            base, k = _index_of(inner, a, indices), inner.scalar(b)
            if base is not None and isinstance(k, (int, float)) and float(k).is_integer():
                return base + int(k)
    return None


def _sequence_reads(inner: Scope, indices: set) -> list:
    """Every Gather along axis 0 of an outer tensor at the step's own index; a read of another row of a
    sequence is a NoMatch."""
    reads = []
    for node in inner.graph.node:
        if node.op_type != "Gather" or attribute(node, "axis", 0) != 0:
            continue
        data = inner.resolve(node.input[0])
        if inner.local(data):
            continue  # a gather of something the step computes: part of the cell
        offset = _index_of(inner, node.input[1], indices)
        if offset is None:
            if any(name in indices for name in _ancestors(inner, node.input[1])):
                raise NoMatch("the loop reads a sequence at an index computed from the step (not the step's row)",
                              node.name)
            continue  # a lookup at a constant index: not a sequence read
        require(offset == 0, f"the loop reads another step's row of a sequence (step {offset:+d})", node.name)
        reads.append(SequenceRead(data, node.output[0], node.name))
    return reads


def _ancestors(inner: Scope, name: str) -> set:
    return upstream([name], inner.producer)[0]


def _steps(node: onnx.NodeProto, reads: list, lengths: Lengths, tests: list):
    """The symbolic number of steps: the trip count, or the length whose test ``index + 1 < length`` ends
    the loop; either must be the length of a sequence read."""
    rows = {lengths.axis(read.sequence, 0) for read in reads}
    if _bounded(node, lengths.scope):
        trip = lengths.value(node.input[0])
        require(trip is not None, "the loop's trip count is not a length the graph states", node.name)
        require(trip in rows, "the loop's trip count is not the length of the sequence it reads", node.name)
        return trip
    ends = [bound for offset, bound in tests if offset == 1 and bound in rows]
    require(bool(ends), "the loop has no trip count, and its condition does not end it at the sequence's end",
            node.name)
    return ends[0]


def _bounded(node: onnx.NodeProto, scope: Scope) -> bool:
    """Whether the Loop has a trip count: a tensor, not a constant so large that only its condition ends
    it (a TFLite WHILE loop converted by tf2onnx carries the largest int64)."""
    if not node.input[0]:
        return False
    trip = scope.scalar(node.input[0])
    return not (isinstance(trip, int) and trip >= 2 ** 62)


def _conjuncts(scope: Scope, name: str) -> list:
    name = scope.resolve(name)
    node = scope.producer(name)
    if node is not None and node.op_type == "And":
        return [t for operand in node.input for t in _conjuncts(scope, operand)]
    return [name]


def _test(scope: Scope, term: str, indices: set, lengths: Lengths, where: str, first: bool = False) -> tuple:
    """(k, length) of a test ``index + k < length`` with k 0 or 1 (``first``: ``k < length`` before the
    first step), (None, None) for a test that always holds; anything else ends the loop otherwise:
    NoMatch."""
    if scope.scalar(term) is True:
        return None, None
    node = scope.producer(term)
    if node is not None and node.op_type in ("Less", "Greater"):
        small, large = node.input if node.op_type == "Less" else reversed(node.input)
        offset = scope.scalar(small) if first else _index_of(scope, small, indices)
        bound = lengths.value(large, scope)
        if offset in (0, 1) and bound is not None:
            return int(offset), bound
    raise NoMatch("the loop's condition may end it before its trip count (an early exit)",
                  node.name if node is not None else where)
