"""Reconciling the conversion report with the model actually written.

The recurrent layer loops are found in the frozen TensorFlow graph, independently of the
rewriter: a ``While`` whose body reads a TensorList. After conversion every such loop must have
a report row that agrees with the ONNX graph: a loop still there as a ``Loop`` is reported as
one, with a reason; a row that says "fused" names a node that exists. Whatever the rewriter did
or failed to do, the report cannot claim what the graph does not show.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

import onnx

from .probes import graph_nodes
from .report import LOOP, REMOVED, SCAN, UNROLLED, ConversionReport, LoopOutcome
from .rewriters.outcome import WHILE_OPS, Findings, while_loop_name
from .rewriters.rows import kind_hint, scope_name

logger = logging.getLogger("tf2onnx_rnn")

_RECURRENT_OPS = ("LSTM", "GRU", "RNN")  # ONNX's recurrent ops (tf2onnx's own rewriters make them too)


@dataclass(frozen=True)
class RecurrentLoop:
    """A TensorFlow while-loop that steps through a TensorList: a recurrent layer's loop."""

    name: str
    body: str

    @property
    def kind_hint(self) -> str:
        """The Keras layer kind the loop's scopes suggest (lstm_1 -> LSTM), "unknown" when none does."""
        return _hint(self.name + " " + self.body)


def _hint(name: str) -> str:
    """:func:`kind_hint`, or "unknown" when the rewriter package cannot say (the reconciliation must
    hold whatever state the rewriter package is in)."""
    try:
        return kind_hint(name)
    except Exception:  # noqa: BLE001 - the rows are still written, their kind "unknown"
        logger.debug("naming the cell kind of %s raised", name, exc_info=True)
        return "unknown"


def _layer_name(name: str, layer_of: Callable[[str], Optional[str]]) -> str:
    """The report name of a loop's (or unrolled layer's) Keras layer: the source's, else its scopes'."""
    found = layer_of(name)
    if found:
        return found
    try:
        return scope_name(name)
    except Exception:  # noqa: BLE001 - as above: the node's own name then
        logger.debug("naming the layer of %s raised", name, exc_info=True)
        return name


def recurrent_loops(graph_def) -> list:
    """The recurrent loops of a frozen graph, in graph order (loops nested in functions included): its
    functional while-loops reading a TensorList, and its TF 1.x loops (:func:`v1_loops`) reading a
    TensorArray or a TensorList."""
    functions = {f.signature.name: f for f in graph_def.library.function}

    def reads_a_list(body: str) -> bool:
        function = functions.get(body)
        return function is not None and any(n.op == "TensorListGetItem" for n in function.node_def)

    nodes = list(graph_def.node) + [n for f in functions.values() for n in f.node_def]
    return [RecurrentLoop(n.name, n.attr["body"].func.name) for n in nodes
            if n.op in WHILE_OPS and reads_a_list(n.attr["body"].func.name)] + \
        [RecurrentLoop(frame, frame) for frame, ops in v1_loops(graph_def).items()
         if ops & {"TensorArrayReadV3", "TensorListGetItem"}]


def v1_loops(graph_def) -> dict:
    """The TF 1.x loops of a graph (``Enter``/``Exit`` frames), each named as its scope (``rnn/while``),
    with the op types inside it."""
    frames = {node.attr["frame_name"].s.decode().rsplit("/while_context", 1)[0]
              for node in graph_def.node if node.op == "Enter"}
    return {frame: {node.op for node in graph_def.node if node.name.startswith(frame + "/")}
            for frame in sorted(frames)}


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
                and _hint(node.name) != "unknown":
            found.append(node.name)
    return found


def reconcile(findings: Findings, loops: list, model_proto: onnx.ModelProto,
              layer_of: Callable[[str], Optional[str]] = lambda loop: None,
              unrolled: Iterable[str] = ()) -> ConversionReport:
    """The report of the rewriter's ``findings``, made to agree with ``model_proto`` for every loop in
    ``loops``; when the rewriter could not look for unrolled layers, ``unrolled``
    (:func:`unrolled_layers`) get rows too."""
    recorded = [LoopOutcome.of(row) for row in findings.outcomes]
    nodes = list(graph_nodes(model_proto.graph))
    names = {n.name for n in nodes}
    still_loops = {while_loop_name(n) for n in nodes if n.op_type in ("Loop", "Scan")}
    scan_of = {while_loop_name(n): n.name for n in nodes if n.op_type == "Scan"}  # loop -> its Scan node
    scans = set(scan_of.values())
    rows = {o.loop: o for o in recorded}
    claimed = {o.node for o in recorded if o.fused and o.node in names}
    unclaimed_native = [n for n in nodes if n.op_type in _RECURRENT_OPS and n.name not in claimed]

    def checked(loop: RecurrentLoop) -> LoopOutcome:
        row = rows.get(loop.name)
        layer = row.layer if row is not None else _layer_name(loop.name, layer_of)
        kind = row.kind if row is not None else loop.kind_hint
        if kind == "unknown":  # the layer's name may tell (a TF 1.x loop's is its cell's scope)
            kind = _hint(layer)
        if loop.name in still_loops:
            if row is not None and row.became == LOOP and loop.name in scan_of:
                # a TF 1.x loop tf2onnx itself wrote as a Scan (its dynamic_rnn frames): a Scan, not a Loop
                return replace(row, became=SCAN, own_step=True, node=scan_of[loop.name],
                               form="tf2onnx's own Scan of the TF 1.x loop (its step as tf2onnx wrote it)")
            if row is not None and (row.became == LOOP or (row.own_step and row.node in scans)):
                return row
            reason = ("internal error: reported as fused, but the loop is still in the written model"
                      if row is not None else
                      findings.setup_error or "internal error: the rewriter did not report this loop")
            return _warned(LoopOutcome(loop=loop.name, layer=layer, kind=kind, direction="", became=LOOP,
                                       reason=reason))
        if row is not None and (row.fused or (row.own_step and row.node in scans)) and row.node in names \
                and set(row.cell_nodes) <= names:  # a native node, or a node written as a Scan of its own step
            return row
        if unclaimed_native:
            node = unclaimed_native.pop(0)
            origin = "its report row was lost to an internal error" if row is not None else "tf2onnx's own rewriter"
            return LoopOutcome(loop=loop.name, layer=layer, kind=kind, direction="", became=node.op_type,
                               node=node.name, activations=f"fused by {origin}")
        return LoopOutcome(loop=loop.name, layer=layer, kind=kind, direction="", became=REMOVED,
                           reason="its outputs are unused: tf2onnx removed the loop")

    known = {loop.name for loop in loops}
    others = [o for o in recorded if o.loop not in known and (not o.fused or o.node in names)]
    unreported = [name for name in unrolled if name not in rows]
    why = findings.setup_error or findings.unrolled_error
    lost = [_warned(LoopOutcome(loop=name, layer=_layer_name(name, layer_of), kind=_hint(name), direction="",
                                became=UNROLLED, reason=why))
            for name in (unreported if why else [])]
    return ConversionReport([checked(loop) for loop in loops] + others + lost)


def _warned(outcome: LoopOutcome) -> LoopOutcome:
    logger.warning("%s: stays %s: %s", outcome.layer, outcome.left_as, outcome.reason)
    return outcome
