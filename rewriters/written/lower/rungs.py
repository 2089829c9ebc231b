"""The rungs of the ladder, as rules: what each applies to (op types, the obstacle kinds it answers, those it
needs), a check that says why not, and the rewrite. :func:`one_rung` moves a node down the first rung that
applies; the rungs are tried in the order listed, cheapest first (a node's own kind, then its own step, then
its steps written out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import onnx

from ...runtimes import BIDIRECTIONAL, FORWARD, RECURRENT_OPS, Kind, Runtime
from ..builder import Writer
from ..graph import attribute
from .forward import (
    as_forward_nodes,
    drop_zero_states,
    last_step_as_y_h,
    read_merged,
    read_through_squeeze,
    zero_initial_states,
    zero_states_given,
)
from .op_rungs import OP_RUNGS
from .per_step import convolution_per_step
from .scan_node import node_as_scan
from .scan_steps import scan_as_steps
from .steps import CannotLower, node_as_steps

_NATIVE = frozenset({Kind.DIRECTION, Kind.Y_H, Kind.INITIAL_STATES, Kind.GIVEN_STATES})  # a native node answers
_READS = frozenset({Kind.Y_H, Kind.INITIAL_STATES})  # how its outputs are read, its states given


@dataclass(frozen=True)
class Place:
    """A node on the ladder: its graph, the kinds of its obstacles, the runtime's row, the model's static shapes
    and constants, the writer of its rewrite, and its static time length and batch (0: not static)."""

    graph: onnx.GraphProto
    node: onnx.NodeProto
    kinds: frozenset
    row: Runtime
    shapes: dict
    constants: dict
    w: Writer
    steps: int
    batch: int


@dataclass(frozen=True)
class Rung:
    """One way down: for ``ops`` (None: any op), where every kind of the node's obstacles is one it ``answers``
    (None: any) and it has those the rung ``needs``, and ``check`` finds nothing against it ("": nothing).
    ``write`` rewrites the node and returns a str naming the form where the node is no longer a node of its own
    kind and name, else True (or raises :class:`.steps.CannotLower`)."""

    name: str
    write: Callable[[Place], object]
    ops: Optional[frozenset] = None
    answers: Optional[frozenset] = None
    needs: frozenset = frozenset()
    check: Callable[[Place], str] = lambda place: ""

    def why_not(self, place: Place) -> str:
        """Why this rung does not take ``place``'s node ("" where it does)."""
        if self.ops is not None and place.node.op_type not in self.ops:
            return f"it takes {', '.join(sorted(self.ops))} nodes"
        if self.answers is not None and not place.kinds <= self.answers:
            return f"it answers {', '.join(sorted(map(str, self.answers)))} alone"
        if not self.needs <= place.kinds:
            return f"it answers {', '.join(sorted(map(str, self.needs)))}"
        return self.check(place)


def _scan_steps(p: Place) -> str:
    if not p.steps:
        raise CannotLower("its Scan needs a fixed number of steps: give the inputs fixed shapes")
    scan_as_steps(p.graph, p.node, p.steps, p.w, beside_batch=p.row.batch_one)
    return f"its {p.steps} steps written out"


def _read_squeezed(p: Place) -> bool:
    if attribute(p.node, "direction", FORWARD) == BIDIRECTIONAL:
        read_merged(p.graph, p.node, p.constants, p.shapes.get(p.node.input[0]) or [0, 0], p.w)
    else:
        read_through_squeeze(p.graph, p.node, p.constants, p.w)
    return True


def _own_step(p: Place) -> str:
    node_as_scan(p.graph, p.node, p.constants.get, p.w, p.batch, reversed_by_slices=p.row.scan_backward != "exact")
    return "a Scan of its own step"


def _steps(p: Place) -> str:
    if not p.steps:
        raise CannotLower(f"its {p.node.op_type} needs a fixed time length: give the inputs fixed shapes")
    node_as_steps(p.graph, p.node, p.steps, p.batch, p.constants.get, p.w)
    return f"its {p.steps} steps written out"


def _op_rung(op: str, kind: Kind, rewrite) -> Rung:
    return Rung(f"{op} without {kind}", lambda p: rewrite(p.node, p.shapes, p.constants, p.w), frozenset({op}),
                frozenset({kind}), frozenset({kind}))


def _recurrent(name: str, write, answers=None, needs=frozenset(), check=lambda place: "") -> Rung:
    return Rung(name, write, frozenset(RECURRENT_OPS), answers, frozenset(needs), check)


RUNGS = (
    Rung("a Conv per image", lambda p: convolution_per_step(p.graph, p.node, p.shapes, p.constants, p.w),
         frozenset({"Conv"}), frozenset({Kind.BATCHED}), frozenset({Kind.BATCHED})),
    *(_op_rung(op, kind, rewrite) for (op, kind), rewrite in OP_RUNGS.items()),
    Rung("a Scan's steps written out", _scan_steps, frozenset({"Scan"})),
    _recurrent("zero initial states dropped", lambda p: drop_zero_states(p.graph, p.node, p.w) or True, _NATIVE,
               {Kind.GIVEN_STATES}, lambda p: "" if zero_states_given(p.node, p.constants) else "its states are not 0"),
    _recurrent("zero initial states given",
               lambda p: zero_initial_states(p.graph, p.node, p.batch, p.constants[p.node.input[1]].dtype, p.w)
               or True, frozenset({Kind.INITIAL_STATES}), {Kind.INITIAL_STATES},
               lambda p: "" if p.batch else "its batch is not fixed"),
    _recurrent("forward nodes, each backward pass over its input reversed",
               lambda p: as_forward_nodes(p.graph, p.node, p.constants.get, p.w) or
               "forward nodes, each backward pass over its input reversed", _NATIVE, {Kind.DIRECTION},
               lambda p: "" if FORWARD in p.row.recurrent.get(p.node.op_type, ()) else "no forward node either"),
    _recurrent("Y read through a Squeeze", _read_squeezed, _READS,
               check=lambda p: "" if p.row.y_read_squeezed else "the runtime reads Y as it is"),
    _recurrent("the last step as Y_h", lambda p: last_step_as_y_h(p.graph, p.node, p.w) or True, _READS),
    _recurrent("a Scan of its own step", _own_step, needs={Kind.ACTIVATIONS},
               check=lambda p: "" if p.row.scan != "none" else "the runtime has no Scan"),
    _recurrent("its steps written out", _steps),
)


def one_rung(place: Place):
    """``place``'s node moved down the first rung that takes it: what the rung's write returns ("" where none
    does: the node stays, its obstacles left)."""
    rung = next((r for r in RUNGS if not r.why_not(place)), None)
    return rung.write(place) if rung is not None else ""
