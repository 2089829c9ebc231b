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

import numpy as np
import onnx
from onnx import numpy_helper

from ...description import NoMatch, require
from ...emit.padded_lists import PADDED_NAME
from ..graph import attribute, upstream
from ..scope import Scope, TypeTable
from .lengths import Lengths

_RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten"})
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
    # the lengths tensor whose longest row ends the loop (TF 1.x ``dynamic_rnn`` given ``sequence_length``),
    # past which every step keeps the states and stacks zeros: running every step is exact; "" if none
    longest_of: str = ""


@dataclass(frozen=True)
class LongestRow:
    """A loop's bound ``Min(steps, Max(k, ReduceMax(lengths)))`` (or without the Max): it ends at the longest
    row of ``lengths`` where that is shorter than the sequence."""

    steps: tuple  # the sequence's length, as :class:`.lengths.Lengths` names it
    lengths: str  # the outer lengths tensor


def read_loop(node: onnx.NodeProto, scope: Scope, types: TypeTable) -> LoopMap:
    """``node`` (a Loop in ``scope``'s graph) as a :class:`LoopMap`, or :class:`NoMatch`."""
    body = attribute(node, "body")
    inner = Scope(body, scope)
    carried = len(node.input) - 2
    require(len(body.input) == carried + 2 and len(body.output) >= carried + 1,
            "the loop's body does not carry its values as its inputs say", node.name)
    iteration = body.input[0].name
    slots = [(node.input[2 + slot], body.input[2 + slot].name, body.output[1 + slot].name,
              node.output[slot] if slot < len(node.output) else "") for slot in range(carried)]
    states, invariants, counters = _carried(inner, scope, slots)
    indices = {iteration, *counters}
    reads = _sequence_reads(inner, indices)
    require(bool(reads), "the loop reads no sequence a row a step", node.name)
    lengths = Lengths(scope, types)
    if _bounded(node, scope):
        _steps(node, reads, lengths, [])
    tests = [_test(inner, term, indices, lengths, node.name) for term in _conjuncts(inner, body.output[0].name)]
    steps = _steps(node, reads, lengths, tests)
    firsts = [_test(scope, term, set(), lengths, node.name, first=True) for term in _conjuncts(scope, node.input[1])]
    for offset, bound in firsts:  # before the first step: 0 < steps, or always true
        require(bound is None or (offset == 0 and _bound_steps(bound) == steps),
                "the loop's first test is not that the sequence has a step", node.name)
    step_outputs = tuple((out.name, final) for out, final in zip(body.output[1 + carried:], node.output[carried:]))
    bounds = [bound for _, bound in tests + firsts if bound is not None]
    require(all(_bound_steps(bound) == steps for bound in bounds),
            "the loop's condition tests the step against another length than the sequence's (an early exit)",
            node.name)
    longest = {bound.lengths for bound in bounds if isinstance(bound, LongestRow)}
    require(len(longest) <= 1, "the loop's condition ends it at the longest row of two lengths", node.name)
    if longest:
        _check_stationary_past(inner, states, step_outputs, next(iter(longest)), indices, node.name)
        _check_full_length(scope, step_outputs, steps, lengths, node.name)
    return LoopMap(node.name, tuple(states), tuple(invariants), tuple(reads), step_outputs,
                   tuple(sorted(indices)), steps, next(iter(longest), ""))


def read_scan(node: onnx.NodeProto, scope: Scope, types: TypeTable) -> LoopMap:
    """``node`` (a Scan tf2onnx wrote for a TF 1.x control-flow loop) as a :class:`LoopMap`: its scanned
    inputs are the sequences read a row a step, its states what it carries (the counters among them
    the step's index), or :class:`NoMatch`."""
    body = attribute(node, "body")
    scanned = attribute(node, "num_scan_inputs", 0)
    carried = len(node.input) - scanned
    require(scanned >= 1 and carried >= 0 and len(body.input) == len(node.input) and len(body.output) >= carried,
            "the Scan's body does not take its values as its inputs say", node.name)
    for name in ("scan_input_directions", "scan_output_directions", "scan_input_axes", "scan_output_axes"):
        require(not any(attribute(node, name, []) or []),
                f"the Scan's {name.replace('_', ' ')} are not the first axis forwards", node.name)
    inner = Scope(body, scope)
    slots = [(node.input[slot], body.input[slot].name, body.output[slot].name,
              node.output[slot] if slot < len(node.output) else "") for slot in range(carried)]
    states, invariants, counters = _carried(inner, scope, slots)
    reads = tuple(SequenceRead(sequence, row.name, "") for sequence, row in
                  zip(node.input[carried:], body.input[carried:]))
    step_outputs = tuple((out.name, final) for out, final in zip(body.output[carried:], node.output[carried:]))
    steps = Lengths(scope, types).axis(reads[0].sequence, 0)
    return LoopMap(node.name, tuple(states), tuple(invariants), reads, step_outputs, tuple(sorted(counters)), steps)


def _carried(inner: Scope, scope: Scope, slots: list) -> tuple:
    """(states, invariants, counters) of the values a loop carries: ``slots`` are (outer initial, body
    input, body output, outer final); a value the body passes on unchanged is an invariant (the body's
    reads of it become reads of the outer tensor), one counting the steps from 0 whose last value nothing
    reads is the step's index."""
    states, invariants, counters = [], [], []
    for initial, step_input, step_output, final in slots:
        if inner.resolve(step_output) == step_input:
            invariants.append(Invariant(initial, step_input, final))
        elif _counts_steps(inner, step_input, step_output, initial) and not scope.used(final):
            counters.append(step_input)
        else:
            states.append(State(initial, step_input, step_output, final))
    inner.aliases = {inv.step_input: inv.initial for inv in invariants}
    return states, invariants, counters


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
    ends = [_bound_steps(bound) for offset, bound in tests if offset == 1 and _bound_steps(bound) in rows]
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
        bound = lengths.value(large, scope) or _longest_row(scope, large, lengths)
        if offset in (0, 1) and bound is not None:
            return int(offset), bound
    raise NoMatch("the loop's condition may end it before its trip count (an early exit)",
                  node.name if node is not None else where)


def _bound_steps(bound):
    """The number of steps a loop bound names: the length itself, or a :class:`LongestRow`'s sequence."""
    return bound.steps if isinstance(bound, LongestRow) else bound


def _longest_row(scope: Scope, name: str, lengths: Lengths) -> Optional[LongestRow]:
    """``name`` as ``Min(n, Max(k, ReduceMax(L)))`` or ``Min(n, ReduceMax(L))`` (through casts), with ``n`` a
    length and ``L`` a tensor of lengths reduced whole; else None."""
    scope, name = _owner(scope, scope.resolve(name))
    node = scope.producer(name) if scope is not None else None
    while node is not None and node.op_type in ("Cast", "Identity"):
        scope, name = _owner(scope, scope.resolve(node.input[0]))
        node = scope.producer(name) if scope is not None else None
    if node is None or node.op_type != "Min" or len(node.input) != 2:
        return None
    for first, second in (node.input, reversed(node.input)):
        steps, reduced = lengths.value(first, scope), _reduced_lengths(scope, second, lengths.types)
        if steps is not None and reduced:
            return LongestRow(steps, reduced)
    return None


def _reduced_lengths(scope: Scope, name: str, types: TypeTable) -> str:
    """L where ``name`` is ``ReduceMax(L)`` over every axis, or ``Max(k, ReduceMax(L))`` with k a constant
    (through casts); "" otherwise."""
    node = scope.producer(scope.resolve(name))
    while node is not None and node.op_type == "Cast":
        node = scope.producer(scope.resolve(node.input[0]))
    if node is not None and node.op_type == "Max" and len(node.input) == 2:
        constants = [scope.constant(n) is not None for n in node.input]
        if constants.count(True) != 1:
            return ""
        return _reduced_lengths(scope, node.input[constants.index(False)], types)
    if node is None or node.op_type != "ReduceMax":
        return ""
    axes = attribute(node, "axes")
    if len(node.input) > 1 and node.input[1]:
        axes = scope.constant(node.input[1])
        if axes is None:
            return ""
    rank = types.rank(node.input[0])
    if axes is not None and (rank is None or {int(a) % rank for a in np.reshape(axes, -1)} != set(range(rank))):
        return ""  # a reduction over some axes only is no longest row
    return _canonical(scope, node.input[0])


def _canonical(scope: Scope, name: str) -> str:
    """``name`` seen through identities and invariants out to the scope that makes it."""
    while scope is not None:
        name = scope.resolve(name)
        if scope.local(name):
            return name
        scope = scope.outer
    return name


def _owner(scope: Scope, name: str) -> tuple:
    """(the scope whose graph makes ``name``, ``name``), (None, name) when no scope does."""
    while scope is not None and not scope.local(name):
        scope = scope.outer
    return scope, name


def _check_stationary_past(inner: Scope, states: list, step_outputs: tuple, lengths: str, indices: set,
                           where: str) -> None:
    """That a loop ending at the longest row of ``lengths`` computes nothing new past each row's length:
    every state is ``Where(index >= L, state, new)`` and every stacked output ``Where(index >= L, 0, new)``
    (TF 1.x's ``dynamic_rnn`` steps so). Then every step past the longest row keeps every state and
    stacks zeros, and running all the sequence's steps gives what the loop gives, padded with zeros."""
    for state in states:
        kept = _kept_past_length(inner, state.step_output, lengths, indices)
        require(kept is not None and inner.resolve(kept) == inner.resolve(state.step_input),
                "the loop ends at the longest row, but a state it carries changes past a row's length", where)
    for output, _ in step_outputs:
        made = inner.producer(inner.resolve(output))
        while made is not None and made.op_type in _RESHAPES:  # zeros reshaped are zeros
            output = made.input[0]
            made = inner.producer(inner.resolve(output))
        kept = _kept_past_length(inner, output, lengths, indices)
        require(kept is not None and zero_filled(inner, kept),
                "the loop ends at the longest row, but what it stacks past a row's length is not zeros", where)


def _kept_past_length(inner: Scope, name: str, lengths: str, indices: set) -> Optional[str]:
    """What ``Where(index >= L, a, b)`` (or ``Where(index < L, b, a)``) at ``name`` gives past each row's
    length, with L the outer ``lengths``: ``a``; None for any other node."""
    node = inner.producer(inner.resolve(name))
    if node is None or node.op_type != "Where":
        return None
    condition = inner.producer(inner.resolve(node.input[0]))
    while condition is not None and (condition.op_type in ("Reshape", "Unsqueeze", "Expand") or (
            condition.op_type == "Cast" and attribute(condition, "to") == onnx.TensorProto.BOOL)):
        condition = inner.producer(inner.resolve(condition.input[0]))
    if condition is None or condition.op_type not in ("GreaterOrEqual", "Less") or \
            _index_of(inner, condition.input[0], indices) != 0 or _canonical(inner, condition.input[1]) != lengths:
        return None
    return node.input[1] if condition.op_type == "GreaterOrEqual" else node.input[2]


def _check_full_length(scope: Scope, step_outputs: tuple, steps, lengths: Lengths, where: str) -> None:
    """That every stacked output of a loop ending at the longest row has the sequence's length in the
    source, as a Scan's stack of every step has: it is read only as padded with zeros to that length
    (:mod:`..emit.padded_lists`), or the source declares that length for it (a fixed-shape TFLite
    model's output, which tf2onnx's Loop returned shorter)."""
    for _, final in step_outputs:
        if not scope.used(final) or _declared_rows(scope, lengths, final, 0, steps):
            continue
        pads = paddings(scope, final, steps, lengths)
        require(len(pads) == 1 and final not in scope.graph_outputs,
                "the loop ends at the longest row, and a stack it returns is not padded to the sequence's length",
                where)
        arithmetic = {id(n) for n in upstream(pads[0].input[1:], scope.producer, scope.reads_of)[1].values()}
        require(all(id(r) in arithmetic or r is pads[0] for r in scope.readers.get(final, [])),
                "the loop ends at the longest row, and its stack is read unpadded", where)


def _declared_rows(scope: Scope, lengths: Lengths, name: str, axis: int, steps) -> bool:
    """Whether the tensor ``name`` (read through Identity and Transpose nodes, each its one reader) is
    declared with ``steps`` along ``axis``."""
    shape = lengths.types.shape(name)
    if shape is not None and axis < len(shape) and shape[axis] and ("const", shape[axis]) == steps:
        return True
    readers = scope.readers.get(name, [])
    if len(readers) != 1 or name in scope.graph_outputs or readers[0].op_type not in ("Identity", "Transpose"):
        return False
    reader = readers[0]
    perm = attribute(reader, "perm") if reader.op_type == "Transpose" else None
    if reader.op_type == "Transpose" and (perm is None or axis not in perm):
        return False
    return _declared_rows(scope, lengths, reader.output[0], list(perm).index(axis) if perm else axis, steps)


def paddings(scope: Scope, stacked: str, steps, lengths: Lengths) -> list:
    """The Concats that pad ``stacked`` with zeros to ``steps`` rows (:mod:`..emit.padded_lists`)."""
    return [r for r in scope.readers.get(stacked, []) if r.op_type == "Concat" and r.name.startswith(PADDED_NAME)
            and r.input[0] == stacked and padded_length(scope, r, lengths) == steps]


def padded_length(scope: Scope, concat: onnx.NodeProto, lengths: Lengths):
    """The length a padding Concat pads to: Concat(stacked, ConstantOfShape(Concat(Max(Sub(length, rows), 0),
    rest))), as :mod:`..emit.padded_lists` writes it; None for any other Concat."""
    chain = scope.producer(concat.input[1]) if len(concat.input) == 2 and attribute(concat, "axis") == 0 else None
    for op, position in (("ConstantOfShape", 0), ("Concat", 0), ("Max", 0), ("Sub", 0)):
        if chain is None or chain.op_type != op:
            return None
        if op == "ConstantOfShape" and not zero_filled(scope, chain.output[0]):
            return None
        chain = scope.producer(chain.input[position]) if op != "Sub" else chain
    return lengths.value(chain.input[0])


def zero_filled(scope: Scope, name: str) -> bool:
    """Whether a tensor is all zeros by construction: a constant, a ConstantOfShape of zero, an Expand of
    a zero constant (through casts and identities, in ``scope`` or a scope around it)."""
    value = scope.constant(name)
    if value is not None:
        return not np.any(value)
    scope, name = _owner(scope, scope.resolve(name))
    node = scope.producer(name) if scope is not None else None
    if node is None:
        return False
    if node.op_type == "ConstantOfShape":
        fill = attribute(node, "value")
        return fill is None or not np.any(numpy_helper.to_array(fill))
    if node.op_type == "Expand":
        source = scope.constant(node.input[0])
        return source is not None and not np.any(source)
    return node.op_type == "Cast" and zero_filled(scope, node.input[0])  # identities: resolved above
