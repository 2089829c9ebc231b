"""Work a step does on its own input, taken out of the step and done once over the whole sequence.

A body node whose inputs are all rows of the scanned sequences, outer values or constants (or what
such nodes make) computes the same at step ``t`` whether it runs inside the step or once over the
sequence, sliced at ``t`` afterwards, when its op treats a leading axis as one more batch axis: an
elementwise op whose other operands broadcast from the right without reaching that axis, a MatMul by
an outer matrix, a normalisation or a split along a later axis. Such nodes move out; what the rest
of the step reads of them becomes the Scan's inputs. A node reading only outer values and constants
moves out as it is. Nothing else moves, so what stays computes exactly what the loop computed.

This module decides what moves; :mod:`.lifting` writes each moved node's sequence form, :mod:`.regrouping`
first reorders input-only work a step does apart so that it moves, and :mod:`.siblings` merges products
of one tensor by several constant weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..graph import reads, subgraphs
from ..scope import TypeTable
from .constants import Constants
from .lifting import Lifter
from .regrouping import Weights, regroup_input_only_work
from .siblings import fuse_siblings


@dataclass
class Hoisted:
    """What hoisting did: the nodes now before the Scan, the step's nodes, and the scanned rows (the
    body input of each row -> the outer sequence it is a row of)."""

    outer: list = field(default_factory=list)
    body: list = field(default_factory=list)
    rows: dict = field(default_factory=dict)
    moved: int = 0  # how many nodes now run once over the sequence
    merged: int = 0  # sibling products merged into one node with another (:mod:`.siblings`)
    lifted: dict = field(default_factory=dict)  # op type -> how many nodes of it now run over the sequence
    ranks: dict = field(default_factory=dict)  # each row's rank at one step, where known


def hoist(body: list, rows: dict, row_ranks: dict, step_inputs: set, constants: Constants, types: TypeTable,
          opset: int, keep: Callable[[str], bool]) -> Hoisted:
    """Move out of a step's ``body`` nodes what only its rows and outer values feed (see the module).

    ``rows``: each row's body input -> its outer sequence; ``step_inputs``: the body's other inputs
    (its carried states); ``keep(name)``: whether a body tensor is a body output; ``constants``: the
    rewrite's (the body's own initializers among them, now outer ones), which hoisting adds to.
    """
    hoisted = Hoisted()
    seq = dict(rows)  # per-step tensor -> its sequence outside

    def width(name: str) -> Optional[int]:  # the last dim of a body tensor (a row's: its sequence's)
        shape = types.shape(name) or (types.shape(rows[name]) if name in rows else None)
        return shape[-1] if shape else None

    lifter = Lifter(constants, types, opset, seq)
    body = regroup_input_only_work(body, step_inputs, keep, types,
                                   Weights(constants, width, lifter.float16))
    body, hoisted.merged = fuse_siblings(body, constants, types, opset, keep)
    lifter.rank.update(row_ranks)
    invariant: set = set()  # body tensors now made outside, unchanged
    varying = set(step_inputs)  # what depends on a carried state
    local = {out for node in body for out in node.output} | set(rows) | set(step_inputs)
    stays = []
    for node in body:
        names = reads(node)
        depends = [name for name in names if name in local]
        if subgraphs(node) or any(name in varying for name in depends) or node.op_type == "Shape":
            stays.append(node)
            varying.update(node.output)
            continue
        if all(name in invariant for name in depends):
            hoisted.outer.append(node)
            invariant.update(node.output)
            hoisted.moved += 1
            continue
        lifted = lifter.lift(node, seq) if all(name in seq or name in invariant for name in depends) else None
        if lifted is None:
            stays.append(node)
            varying.update(node.output)
            continue
        hoisted.outer.extend(lifted)
        hoisted.moved += 1
        hoisted.lifted[node.op_type] = hoisted.lifted.get(node.op_type, 0) + 1
    needed = {name for node in stays for name in reads(node)} | {name for name in seq if keep(name)}
    hoisted.rows = {name: sequence for name, sequence in seq.items() if name in needed}
    hoisted.body = stays
    hoisted.ranks = dict(lifter.rank)
    return hoisted
