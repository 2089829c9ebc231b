"""The tf2onnx ``custom_rewriter`` that runs the matchers and the emitter.

tf2onnx converts each loop body before the graph holding the loop. So the rewriter works in
two phases through the same callable:
1. on a body (still TF ops) it runs the cell matchers and files a :class:`BodyMatch` (or the
   reasons none matched) under the body's function name;
2. on a graph holding ``While`` nodes it looks each body up, builds the layer description
   and emits one ONNX node in place of the loop.
Nothing raised here escapes: a loop that fails anywhere stays tf2onnx's exact Loop, and the
report says why.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Iterable, Optional, Union

from ..report import ConversionReport, LoopOutcome
from . import CELL_MATCHERS
from .adapt import build_pass, layer_name, plan_nodes
from .body import BodyView, read_skeleton, unmask
from .emitter import EmitContext, compacts, emit
from .layer import BodyMatch, CellKind, NoMatch, Pass

logger = logging.getLogger("tf2onnx_rnn")

_LOOP_TYPES = ("While", "StatelessWhile")


def _kind_hint(name: str) -> str:
    """The Keras layer kind a scope name suggests, for loops no matcher took."""
    lowered = name.lower()
    return next((kind.keras_name for kind in CellKind if kind.scope_hint in lowered), "unknown")


class RecurrentRewriter:
    """One conversion's rewriter: its body matches and the report it fills."""

    def __init__(self, report: Optional[ConversionReport] = None, layer_names: Iterable[str] = (),
                 assume_post_padded: bool = False):
        self.report = report if report is not None else ConversionReport()
        self.assume_post_padded = assume_post_padded
        self.layer_names = frozenset(layer_names)
        self.bodies: dict[str, Union[BodyMatch, NoMatch]] = {}

    def __call__(self, graph, ops):
        if any(op.type == "TensorListGetItem" for op in ops):
            self._read_body(graph)
        loops = [op for op in ops if op.type in _LOOP_TYPES]
        if loops:
            self._replace_loops(graph, loops)
        return graph.get_nodes()

    # -- phase 1 -------------------------------------------------------------------------
    def _read_body(self, graph) -> None:
        name = graph.graph_name
        try:
            view = BodyView(graph)
            skeleton = read_skeleton(view)
            masking = None
            if skeleton.mask_slot is not None:
                skeleton, masking = unmask(view, skeleton)
            self.bodies[name] = replace(self._match_cell(view, skeleton), masking=masking)
        except NoMatch as no_match:
            self.bodies[name] = no_match
        except Exception as error:  # a bug must not abort the conversion: keep the Loop
            logger.debug("matching %s raised", name, exc_info=True)
            self.bodies[name] = NoMatch(f"internal error while matching: {type(error).__name__}: {error}")
        if isinstance(self.bodies[name], BodyMatch):
            # the loop is ours: keep tf2onnx's own LSTM/GRU rewriters off it
            graph.lstm_rewriter_context = None
            graph.gru_rewriter_context = None

    @staticmethod
    def _match_cell(view: BodyView, skeleton) -> BodyMatch:
        carried = len(skeleton.state_inputs)
        if carried > max(kind.state_count for kind in CellKind):
            raise NoMatch(f"the loop carries {carried} states: several cells in one loop (StackedRNNCells) "
                          "are not fused", skeleton.y_t)
        reasons = []
        for matcher in CELL_MATCHERS:
            try:
                return matcher.match(view, skeleton)
            except NoMatch as no_match:
                reasons.append((matcher.KIND, no_match))
            except Exception as error:  # one matcher's bug must not stop the others
                logger.debug("the %s matcher raised", matcher.KIND.value, exc_info=True)
                reasons.append((matcher.KIND, NoMatch(
                    f"internal error while matching: {type(error).__name__}: {error}")))
        # report first the matcher whose state count fits and whose kind the scope names
        hint = _kind_hint(view.graph.graph_name + " " + skeleton.y_t)
        reasons.sort(key=lambda item: (item[0].state_count != carried, item[0].keras_name != hint))
        kind, first = reasons[0]
        raise NoMatch(f"not a {kind.keras_name} cell: {first.reason}", first.node)

    # -- phase 2 -------------------------------------------------------------------------
    def _replace_loops(self, graph, loops) -> None:
        passes = [p for p in (self._read_pass(graph, loop) for loop in loops) if p is not None]
        try:
            layers = plan_nodes(graph, passes, self.assume_post_padded)
        except Exception:  # pairing is an optimisation: without it every pass is its own node
            logger.debug("pairing directions raised", exc_info=True)
            layers = [plan_nodes(graph, [p], self.assume_post_padded)[0] for p in passes]
        context = EmitContext(assume_post_padded=self.assume_post_padded)
        for layer in layers:
            self._emit(graph, layer, context)

    def _read_pass(self, graph, loop) -> Optional[Pass]:
        body = loop.get_attr_str("body")
        entry = self.bodies.get(body)
        name = layer_name(loop.name, self.layer_names)
        if entry is None:
            return None  # a body with no TensorList reads: not a recurrent layer, nothing to report
        if isinstance(entry, NoMatch):
            kind = _kind_hint(loop.name + " " + body)
            self._record_loop(loop.name, name, kind, entry.reason, entry.node)
            return None
        try:
            return build_pass(graph, loop, entry, name)
        except NoMatch as no_match:
            self._record_loop(loop.name, name, entry.kind.keras_name, no_match.reason, no_match.node)
        except Exception as error:  # never abort the conversion
            logger.debug("reading %s raised", loop.name, exc_info=True)
            self._record_loop(loop.name, name, entry.kind.keras_name,
                              f"internal error while reading the loop: {type(error).__name__}: {error}")
        return None

    def _emit(self, graph, layer, context: EmitContext) -> None:
        try:
            node = emit(graph, layer, context)
        except NoMatch as no_match:
            for one in layer.passes:
                self._record_loop(one.loop, one.name, one.kind.keras_name, no_match.reason, no_match.node)
            return
        except Exception as error:  # never abort the conversion
            logger.debug("emitting %s raised", layer.name, exc_info=True)
            for one in layer.passes:
                self._record_loop(one.loop, one.name, one.kind.keras_name,
                                  f"internal error while emitting: {type(error).__name__}: {error}")
            return
        for one in layer.passes:
            self._record(LoopOutcome(loop=one.loop, layer=one.name, kind=one.kind.keras_name,
                                     direction=one.direction.value, became=one.kind.onnx_op, node=node,
                                     node_direction=layer.direction.value,
                                     activations=", ".join(str(a) for a in one.activations),
                                     mask=self._mask_form(layer, one)))

    def _mask_form(self, layer, one: Pass) -> str:
        """How a masked pass was emitted, for the report."""
        wiring = one.wiring
        if wiring.mask is None:
            return ""
        if compacts(layer, self.assume_post_padded):
            form = "compacted + sequence_lens"
        else:
            form = "sequence_lens (post-padded assumed)"
        return f"{wiring.mask_source}; {form}; masked steps {wiring.masked_output.value}"

    def _record_loop(self, loop: str, layer: str, kind: str, reason: str, where: str = "") -> None:
        self._record(LoopOutcome(loop=loop, layer=layer, kind=kind, direction="", became="Loop",
                                 reason=reason, where=where))

    def _record(self, outcome: LoopOutcome) -> None:
        self.report.add(outcome)
        if outcome.fused:
            logger.info("%s: %s %s -> ONNX %s", outcome.layer, outcome.kind, outcome.direction, outcome.became)
        else:
            logger.info("%s: stays a Loop: %s", outcome.layer, outcome.reason)
