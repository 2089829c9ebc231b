"""The rewriter's report rows: one per recurrent loop (or unrolled layer), fused or not, and why.

:class:`Rows` writes them into the :class:`~.outcome.Findings` of a conversion, once per loop (a
later stage's fault never overwrites what an earlier stage recorded), and logs each: INFO for
what was fused or declined, WARNING for a fault of ours.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from . import cell_kinds
from .description import Pass, StackMatch
from .outcome import LOOP, UNROLLED, Findings, Outcome

logger = logging.getLogger("tf2onnx_rnn")

_WRAPPER_SCOPES = frozenset({"while", "PartitionedCall", "StatefulPartitionedCall"})


def scope_name(node_name: str) -> str:
    """The Keras layer a loop (or an unrolled layer's Unpack) belongs to, as far as its scopes tell:
    the scope path without TensorFlow's wrappers and the model's own scope."""
    parts = [p for p in node_name.split("/") if p not in _WRAPPER_SCOPES]
    return "/".join(parts[1:] if len(parts) > 1 else parts) or node_name


def kind_hint(name: str) -> str:
    """The Keras layer kind a node's scopes suggest (lstm_1 -> LSTM, conv_lstm2d_1 -> ConvLSTM2D),
    "unknown" when none does."""
    lowered = name.lower()
    conv = re.search(r"conv_?lstm(?:_?([123])d)?", lowered)
    if conv:  # no native node computes these: they have no cell kind
        return f"ConvLSTM{conv.group(1)}D" if conv.group(1) else "ConvLSTM"
    return next((kind.keras_name for kind in cell_kinds() if kind.scope_hint in lowered), "unknown")


@dataclass(frozen=True)
class LoopId:
    """Which loop a report row is about: the loop node, its Keras layer and its cell kind; an
    unrolled layer has no loop (``loop`` names its Unpack) and stays as its ops, not a Loop."""

    loop: str
    layer: str
    kind: str
    unrolled: bool = False

    @property
    def kept_as(self) -> str:
        """What the report says it became when it is not fused."""
        return UNROLLED if self.unrolled else LOOP

    @classmethod
    def of_pass(cls, pass_: Pass) -> "LoopId":
        return cls(pass_.loop, pass_.name, StackMatch.kind_name if pass_.stacked else pass_.kind.keras_name,
                   unrolled=bool(pass_.unrolled))


def _activations(pass_: Pass) -> str:
    text = ", ".join(str(a) for a in pass_.activations)
    return f"{text}; {pass_.note}" if pass_.note else text


def _left_as(outcome: Outcome) -> str:
    return "unrolled ops" if outcome.became == UNROLLED else "a Loop"


def _mask_text(pass_: Pass, form: str) -> str:
    """How a masked pass was emitted, for the report."""
    wiring = pass_.wiring
    if wiring.mask is None and wiring.lengths is None:
        return ""
    return f"{wiring.mask_source}; {form}; masked steps {wiring.masked_output.value}"


class Rows:
    """The rows of one conversion's report, as the rewriter records them."""

    def __init__(self, findings: Findings):
        self.findings = findings
        self.recorded: set = set()  # loops that have their row
        self._stack_cells: dict = {}  # loop -> (pass, Emitted) of a stack's cells emitted so far

    def kept(self, loop_id: LoopId, reason: str, where: str = "") -> None:
        """A loop that stays a Loop (an unrolled layer: its ops), and why."""
        self._record(Outcome(loop=loop_id.loop, layer=loop_id.layer, kind=loop_id.kind, direction="",
                                 became=loop_id.kept_as, reason=reason, where=where))

    def fused(self, layer, emitted) -> None:
        """One row per pass of an emitted layer (a RecurrentLayer), each naming the node built for it."""
        for pass_, (node, direction) in zip(layer.passes, emitted.nodes):
            self._record(Outcome(loop=pass_.loop, layer=pass_.name, kind=pass_.kind.keras_name,
                                     direction=pass_.direction.value, became=emitted.became or pass_.kind.onnx_op,
                                     node=node, form=emitted.form,
                                     node_direction=direction.value, activations=_activations(pass_),
                                     mask=_mask_text(pass_, emitted.mask_form),
                                     state_inputs=tuple(io.input for io in emitted.states),
                                     state_outputs=tuple(io.output for io in emitted.states),
                                     unrolled=pass_.unrolled))

    def stack_cell(self, pass_: Pass, emitted) -> None:
        """Collect a stack's emitted cells; the top one's completes the loop's row."""
        cells = self._stack_cells.setdefault(pass_.loop, [])
        cells.append((pass_, emitted))
        if pass_.stack[0] < pass_.stack[1] - 1:
            return
        del self._stack_cells[pass_.loop]
        bottom = cells[0][0]
        self._record(Outcome(
            loop=pass_.loop, layer=pass_.name, kind=StackMatch.kind_name, direction=bottom.direction.value,
            became=emitted.became or pass_.kind.onnx_op, node=emitted.node, node_direction=bottom.direction.value,
            form=emitted.form,
            activations="cells: " + " -> ".join(f"{cell.kind.keras_name} [{_activations(cell)}]" for cell, _ in cells),
            cell_nodes=tuple(e.node for _, e in cells[:-1]),
            state_inputs=tuple(io.input for _, e in cells for io in e.states),
            state_outputs=tuple(io.output for _, e in cells for io in e.states)))

    def plain(self, loop: str, layer: str, unrolled: bool, reason: str) -> None:
        """A row written with only what the loop's node name tells, when naming the loop failed too:
        the row must not be lost to a second fault."""
        if loop in self.recorded:
            return
        plain = LoopId(loop, layer, "unknown", unrolled)
        self.recorded.add(loop)
        outcome = Outcome(loop=loop, layer=layer, kind=plain.kind, direction="", became=plain.kept_as,
                              reason=reason)
        self.findings.outcomes.append(outcome)
        logger.warning("%s: stays %s: %s", layer, _left_as(outcome), reason)

    def _record(self, outcome: Outcome) -> None:
        if outcome.loop in self.recorded:
            return  # a later stage's fault does not overwrite what an earlier stage recorded
        self.recorded.add(outcome.loop)
        self.findings.outcomes.append(outcome)
        if outcome.node:
            logger.info("%s: %s %s -> ONNX %s", outcome.layer, outcome.kind, outcome.direction, outcome.became)
        elif outcome.reason.startswith("internal error"):
            logger.warning("%s: stays %s: %s", outcome.layer, _left_as(outcome), outcome.reason)
        else:
            logger.info("%s: stays %s: %s", outcome.layer, _left_as(outcome), outcome.reason)
