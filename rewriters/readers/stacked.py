"""Readers for a recurrent layer over ``StackedRNNCells([...])``: one loop that steps several cells in turn.

A second reader beside the one-cell matchers: on the body it finds the cells bottom up (each a
group of the loop's states that one cell matcher reads, fed by the cell below), and on the loop
it yields one :class:`Pass` per cell, chained like a stack of layers, so the one emitter builds
one native node per cell. Cell k's input is the step-ordered sequence cell k-1's node outputs,
named here and resolved by the emitter once that node exists.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Callable

from .. import cell_kinds
from ..cells.body import BodyView
from ..description import BodyMatch, Direction, NoMatch, StackMatch, StateRole, require
from .adapt import build_pass
from .skeleton import Skeleton

MatchOne = Callable[[BodyView, Skeleton], BodyMatch]


def match_stack(view: BodyView, skeleton: Skeleton, match_one: MatchOne) -> StackMatch:
    """The cells of a stacked body, bottom first; :class:`NoMatch` when the states do not split
    into cells that each read the cell below."""
    remaining, x_t, cells = dict(skeleton.state_inputs), skeleton.x_t, []
    while remaining:
        cell = _next_cell(view, skeleton, remaining, x_t, match_one)
        require(cell is not None, f"no cell reads the loop's input or the cell below with the states left "
                                  f"({len(remaining)} of {len(skeleton.state_inputs)})", x_t)
        cells.append(cell)
        for _, slot in cell.states:
            del remaining[slot]
        x_t = skeleton.state_outputs[dict(cell.states)[StateRole.HIDDEN]]  # a cell outputs its hidden state
    require(len(cells) > 1, "one cell: not a stack")
    require(x_t == skeleton.y_t, "the top cell's output is not the loop's output", skeleton.y_t)
    return StackMatch(tuple(cells))


def _next_cell(view: BodyView, skeleton: Skeleton, remaining: dict, x_t: str, match_one: MatchOne):
    """The first group of remaining states (as many as some cell family carries) one cell matcher reads
    as a cell over ``x_t``."""
    for size in sorted({kind.state_count for kind in cell_kinds()}):
        for group in itertools.combinations(sorted(remaining), size):
            for output_slot in group:
                sub = replace(skeleton, x_t=x_t, y_t=skeleton.state_outputs[output_slot],
                              state_inputs={slot: remaining[slot] for slot in group},
                              state_outputs={slot: skeleton.state_outputs[slot] for slot in group})
                try:
                    return match_one(view, sub)
                except NoMatch:
                    continue
    return None


def stack_passes(graph, loop, stack: StackMatch, name: str, build: Callable = build_pass) -> list:
    """One pass per cell, bottom first. The bottom cell reads the loop's input (reversed for
    go_backwards); every other cell reads the step-ordered output of the cell below; only the top
    cell's outputs are the loop's, and every cell's final states are its own. A masked stack's
    cells all skip the masked steps (what a cell below outputs there, no cell above reads). A
    backward stack over an input reversed within each row's length (TF1's) reverses every cell the
    same way: each cell is a backward pass over the time-ordered output of the cell below, since
    reversing a row twice within its length is the identity. ``build(graph, loop, cell, name, others)``
    reads one cell's pass (:func:`.adapt.build_pass` for a while-loop)."""
    state_slots = {slot for cell in stack.cells for _, slot in cell.states}
    output_slot = stack.cells[-1].output_slot
    passes, below = [], None
    count = len(stack.cells)
    per_row = False  # a backward stack reversed within each row's length: every cell runs backward
    for index, cell in enumerate(stack.cells):
        top = index == count - 1
        own = {slot for _, slot in cell.states}
        others = frozenset(state_slots - own) | (frozenset() if top else {output_slot})
        pass_ = build(graph, loop, cell, name, others)
        per_row = per_row or (index == 0 and pass_.direction is Direction.BACKWARD and pass_.wiring.lengths is not None)
        wiring = pass_.wiring
        if below is not None and per_row:  # the cell below's output in time order, each row to reverse again
            wiring = replace(wiring, x=below, x_unreversed=below)
        elif below is not None:  # the cell below's output and the mask, both in step order
            wiring = replace(wiring, x=below, x_unreversed=None, mask_unreversed=None)
        below = None if top else f"{loop.name}/stacked_cell_{index}_sequence"
        if below is not None:
            wiring = replace(wiring, sequence_output=(), time_order_output=(below,)) if per_row else \
                replace(wiring, sequence_output=(below,))
        direction = pass_.direction if index == 0 or per_row else Direction.FORWARD
        passes.append(replace(pass_, wiring=wiring, stack=(index, count), direction=direction))
    return passes
