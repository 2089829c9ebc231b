"""Planning the nodes: which passes become one ONNX node.

A forward and a backward pass over the same input (the halves of a Keras ``Bidirectional``)
become one bidirectional node; every other pass is a node of its own, running ONNX's reverse
direction or forward as the conversion's mask form says.
"""
from __future__ import annotations

from dataclasses import replace

from ..description import Direction, NodeDirection, Pass, RecurrentLayer, with_hard_sigmoid_offsets_in_bias
from ..readers.adapt import one_step, tensor_key
from .mask_forms import Masks


def plan_nodes(graph, passes: list, masks: Masks) -> list:
    """Group passes into ONNX nodes: a forward and a backward pass over the same input become
    one bidirectional node; every other pass is a node of its own.

    When a pass could pair with several others (layers side by side on one input, say a layer
    beside a Bidirectional of the same cell), the pairs whose loops share the most name scopes (the
    two halves of one Bidirectional) are taken first. Nodes keep the order of their first pass.
    """
    candidates = [(first, second) for first in range(len(passes)) for second in range(first + 1, len(passes))
                  if _can_pair(graph, passes[first], passes[second])]
    candidates.sort(key=lambda pair: (-_shared_scopes(passes[pair[0]].loop, passes[pair[1]].loop), pair))
    partner: dict = {}
    for first, second in candidates:
        if first not in partner and second not in partner:
            partner[first], partner[second] = second, first
    passes = [with_hard_sigmoid_offsets_in_bias(pass_) for pass_ in passes]
    layers = []
    for index, pass_ in enumerate(passes):
        if index not in partner:
            layers.append(_single(graph, pass_, masks))
        elif partner[index] > index:
            layers.append(_bidirectional(graph, pass_, passes[partner[index]]))
    return layers


def _shared_scopes(a: str, b: str) -> int:
    """How many leading name scopes two node names share."""
    count = 0
    for left, right in zip(a.split("/"), b.split("/")):
        if left != right:
            break
        count += 1
    return count


def _bidirectional(graph, a: Pass, b: Pass) -> RecurrentLayer:
    forward, backward = _halves(graph, a, b)
    return RecurrentLayer(x=forward.wiring.x, direction=NodeDirection.BIDIRECTIONAL, passes=(forward, backward),
                          mask=forward.wiring.mask, mask_key=tensor_key(graph, forward.wiring.mask),
                          lengths=forward.wiring.lengths, batch_major=forward.wiring.batch_major)


def _single(graph, pass_: Pass, masks: Masks) -> RecurrentLayer:
    """A pass that is a node of its own: ONNX's reverse direction over the unreversed input where
    the mask form says so (:meth:`Masks.runs_reverse`), else forward over the pass's own input."""
    wiring = pass_.wiring
    if masks.runs_reverse(pass_):
        return RecurrentLayer(x=wiring.x_unreversed, direction=NodeDirection.REVERSE, passes=(pass_,),
                              mask=wiring.mask_unreversed, mask_key=tensor_key(graph, wiring.mask_unreversed),
                              lengths=wiring.lengths, batch_major=wiring.batch_major)
    return RecurrentLayer(x=wiring.x, direction=NodeDirection.FORWARD, passes=(pass_,), mask=wiring.mask,
                          mask_key=tensor_key(graph, wiring.mask), lengths=wiring.lengths,
                          reverse_x=wiring.reverse_x, batch_major=wiring.batch_major)


def _backward_half(loop_name: str) -> bool:
    """Whether a loop runs in a Bidirectional's backward layer, which Keras names backward_<layer>."""
    return any(scope.startswith("backward_") for scope in loop_name.split("/"))


def _halves(graph, a: Pass, b: Pass):
    """(forward, backward) of two passes that may be the halves of one bidirectional node, else None.

    Over a fixed one-step sequence TensorFlow's optimizer drops a Bidirectional's reversals
    (reversing one step is the identity), so both halves read as forward passes; the backward one
    is then known by its layer's name (Keras names it backward_<layer>) and becomes a backward pass
    over that same input.
    """
    if {a.direction, b.direction} == {Direction.FORWARD, Direction.BACKWARD}:
        return (a, b) if a.direction is Direction.FORWARD else (b, a)
    one_step_forward = all(p.direction is Direction.FORWARD and one_step(graph, p.wiring.x) for p in (a, b))
    named_backward = [p for p in (a, b) if _backward_half(p.loop)]
    if not one_step_forward or len(named_backward) != 1:
        return None
    (backward,) = named_backward
    wiring = replace(backward.wiring, x_unreversed=backward.wiring.x, mask_unreversed=backward.wiring.mask)
    return (b if backward is a else a), replace(backward, direction=Direction.BACKWARD, wiring=wiring)


def _can_pair(graph, a: Pass, b: Pass) -> bool:
    """Whether two passes are the forward and backward halves of one bidirectional node: same cell,
    sizes, initial states and mask, over the same input."""
    if a.stacked or b.stacked:  # a stack's cells chain; two stacks never pair cell by cell
        return False
    halves = _halves(graph, a, b)
    if halves is None:
        return False
    forward, backward = halves
    same_shape = (a.kind, a.hidden_size, a.input_size, a.dtype, a.attributes, a.wiring.batch_major) == \
        (b.kind, b.hidden_size, b.input_size, b.dtype, b.attributes, b.wiring.batch_major)
    same_states = {r for r, _ in a.wiring.initial_states} == {r for r, _ in b.wiring.initial_states}
    same_mask = ((forward.wiring.mask is None) == (backward.wiring.mask is None)
                 and tensor_key(graph, forward.wiring.mask) == tensor_key(graph, backward.wiring.mask_unreversed)
                 and tensor_key(graph, forward.wiring.lengths) == tensor_key(graph, backward.wiring.lengths))
    return (same_shape and same_states and same_mask
            and tensor_key(graph, forward.wiring.x) == tensor_key(graph, backward.wiring.x_unreversed))
