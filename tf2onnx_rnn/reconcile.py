"""Reconciling the conversion report with the model actually written.

The recurrent layer loops are found in the frozen TensorFlow graph, independently of the
rewriter: a ``While`` whose body reads a TensorList. After conversion every such loop must have
a report row that agrees with the ONNX graph: a loop still there as a ``Loop`` is reported as
one, with a reason; a row that says "fused" names a node that exists. Whatever the rewriter did
or failed to do, the report cannot claim what the graph does not show.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import onnx

from .report import REMOVED, UNROLLED, ConversionReport, LoopOutcome

logger = logging.getLogger("tf2onnx_rnn")

_WHILE_OPS = ("While", "StatelessWhile")
_RECURRENT_OPS = ("LSTM", "GRU", "RNN")


@dataclass(frozen=True)
class RecurrentLoop:
    """A TensorFlow while-loop that steps through a TensorList: a recurrent layer's loop."""

    name: str
    body: str

    @property
    def kind_hint(self) -> str:
        """The Keras layer kind the loop's scopes suggest (lstm_1 -> LSTM), "unknown" when none does."""
        lowered = (self.name + " " + self.body).lower()
        return next((kind.keras_name for kind in _cell_kinds() if kind.scope_hint in lowered), "unknown")


def _cell_kinds() -> tuple:
    """The cell families of the rewriter package; none when even listing them fails (the
    reconciliation must hold whatever state the rewriter package is in)."""
    try:
        from .rewriters import cell_kinds

        return cell_kinds()
    except Exception:  # noqa: BLE001 - the rows are still written, their kind "unknown"
        logger.debug("listing the cell families raised", exc_info=True)
        return ()


def recurrent_loops(graph_def) -> list:
    """The recurrent loops of a frozen graph, in graph order (loops nested in functions included)."""
    functions = {f.signature.name: f for f in graph_def.library.function}

    def reads_a_list(body: str) -> bool:
        function = functions.get(body)
        return function is not None and any(n.op == "TensorListGetItem" for n in function.node_def)

    nodes = list(graph_def.node) + [n for f in functions.values() for n in f.node_def]
    return [RecurrentLoop(n.name, n.attr["body"].func.name) for n in nodes
            if n.op in _WHILE_OPS and reads_a_list(n.attr["body"].func.name)]


def unrolled_layers(graph_def) -> list:
    """Names of the ``Unpack`` nodes of a frozen graph that look like an unrolled recurrent layer's
    (the time-major input unstacked along axis 0 into two or more steps, each feeding a product, in a
    scope naming a recurrent layer kind). Only consulted when the rewriter could not look for them."""
    consumers: dict = {}
    for node in graph_def.node:
        for name in node.input:
            consumers.setdefault(name.split("^")[-1], []).append(node.op)
    found = []
    for node in graph_def.node:
        if node.op != "Unpack" or node.attr["axis"].i != 0 or node.attr["num"].i < 2:
            continue
        outputs = [node.name if i == 0 else f"{node.name}:{i}" for i in range(node.attr["num"].i)]
        if all("MatMul" in consumers.get(t, ()) or "MatMul" in consumers.get(f"{t}:0", ()) for t in outputs) \
                and RecurrentLoop(node.name, "").kind_hint != "unknown":
            found.append(node.name)
    return found


def graph_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    """Every node of ``graph`` and its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graph_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from graph_nodes(sub)


def reconcile(report: ConversionReport, loops: list, model_proto: onnx.ModelProto,
              layer_of: Callable[[str], Optional[str]] = lambda loop: None, unrolled: Iterable[str] = ()) -> None:
    """Make ``report`` agree with ``model_proto`` for every loop in ``loops`` (in place); when the
    rewriter could not look for unrolled layers, ``unrolled`` (:func:`unrolled_layers`) get rows too."""
    nodes = list(graph_nodes(model_proto.graph))
    names = {n.name for n in nodes}
    still_loops = {_loop_name(n.name) for n in nodes if n.op_type in ("Loop", "Scan")}
    rows = {o.loop: o for o in report.outcomes}
    claimed = {o.node for o in report.outcomes if o.fused and o.node in names}
    unclaimed_native = [n for n in nodes if n.op_type in _RECURRENT_OPS and n.name not in claimed]

    def checked(loop: RecurrentLoop) -> LoopOutcome:
        row = rows.get(loop.name)
        layer = row.layer if row is not None else (layer_of(loop.name) or _scope_name(loop.name))
        kind = row.kind if row is not None else loop.kind_hint
        if loop.name in still_loops:
            if row is not None and row.became == "Loop":
                return row
            reason = ("internal error: reported as fused, but the loop is still in the written model"
                      if row is not None else
                      report.setup_error or "internal error: the rewriter did not report this loop")
            return _warned(LoopOutcome(loop=loop.name, layer=layer, kind=kind, direction="", became="Loop",
                                       reason=reason))
        if row is not None and row.fused and row.node in names and set(row.cell_nodes) <= names:
            return row
        if unclaimed_native:
            node = unclaimed_native.pop(0)
            origin = "its report row was lost to an internal error" if row is not None else "tf2onnx's own rewriter"
            return LoopOutcome(loop=loop.name, layer=layer, kind=kind, direction="", became=node.op_type,
                               node=node.name, activations=f"fused by {origin}")
        return LoopOutcome(loop=loop.name, layer=layer, kind=kind, direction="", became=REMOVED,
                           reason="its outputs are unused: tf2onnx removed the loop")

    known = {loop.name for loop in loops}
    others = [o for o in report.outcomes if o.loop not in known and (not o.fused or o.node in names)]
    unreported = [name for name in unrolled if name not in rows]
    why = report.setup_error or report.unrolled_error
    lost = [_warned(LoopOutcome(loop=name, layer=layer_of(name) or _scope_name(name),
                                kind=RecurrentLoop(name, "").kind_hint, direction="", became=UNROLLED, reason=why))
            for name in (unreported if why else [])]
    report.outcomes[:] = [checked(loop) for loop in loops] + others + lost


def _loop_name(onnx_name: str) -> str:
    """The TensorFlow while-loop an ONNX Loop came from (tf2onnx appends ``_loop``)."""
    return onnx_name[:-len(_LOOP_SUFFIX)] if onnx_name.endswith(_LOOP_SUFFIX) else onnx_name


_LOOP_SUFFIX = "_loop"


def _warned(outcome: LoopOutcome) -> LoopOutcome:
    logger.warning("%s: stays %s: %s", outcome.layer, "unrolled ops" if outcome.became == UNROLLED else "a Loop",
                   outcome.reason)
    return outcome


def _scope_name(loop_name: str) -> str:
    parts = [p for p in loop_name.split("/") if p not in ("while", "PartitionedCall", "StatefulPartitionedCall")]
    return "/".join(parts[1:] if len(parts) > 1 else parts) or loop_name
