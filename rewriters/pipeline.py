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
from typing import Iterable, Optional, Union

from ..report import ConversionReport, LoopOutcome
from . import CELL_MATCHERS
from .adapt import build_layer, layer_name
from .body import BodyView, read_skeleton
from .emitter import emit
from .layer import BodyMatch, CellKind, Direction, NoMatch

logger = logging.getLogger("tf2onnx_rnn")

_KIND_HINTS = (("lstm", "LSTM"), ("gru", "GRU"), ("simple_rnn", "SimpleRNN"))
_LOOP_TYPES = ("While", "StatelessWhile")


_LABELS = {CellKind.LSTM: "LSTM", CellKind.GRU: "GRU", CellKind.SIMPLE_RNN: "SimpleRNN"}


def _kind_label(match: BodyMatch) -> str:
    return _LABELS[match.kind]


def _kind_hint(name: str) -> str:
    lowered = name.lower()
    return next((label for key, label in _KIND_HINTS if key in lowered), "unknown")


class RecurrentRewriter:
    """One conversion's rewriter: its body matches and the report it fills."""

    def __init__(self, report: Optional[ConversionReport] = None, layer_names: Iterable[str] = ()):
        self.report = report if report is not None else ConversionReport()
        self.layer_names = frozenset(layer_names)
        self.bodies: dict[str, Union[BodyMatch, NoMatch]] = {}

    def __call__(self, graph, ops):
        if any(op.type == "TensorListGetItem" for op in ops):
            self._read_body(graph)
        for loop in [op for op in ops if op.type in _LOOP_TYPES]:
            self._replace_loop(graph, loop)
        return graph.get_nodes()

    # -- phase 1 -------------------------------------------------------------------------
    def _read_body(self, graph) -> None:
        name = graph.graph_name
        try:
            view = BodyView(graph)
            skeleton = read_skeleton(view)
            if skeleton.mask_slot is not None:
                raise NoMatch("masked layers are not fused yet", skeleton.mask_t)
            self.bodies[name] = self._match_cell(view, skeleton)
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
        carried = len(skeleton.state_inputs)
        hint = _kind_hint(view.graph.graph_name + " " + skeleton.y_t)
        reasons.sort(key=lambda item: (item[0].state_count != carried, _LABELS[item[0]] != hint))
        kind, first = reasons[0]
        raise NoMatch(f"not a {_LABELS[kind]} cell: {first.reason}", first.node)

    # -- phase 2 -------------------------------------------------------------------------
    def _replace_loop(self, graph, loop) -> None:
        body = loop.get_attr_str("body")
        entry = self.bodies.get(body)
        name = layer_name(loop.name, self.layer_names)
        if entry is None:
            return  # a body with no TensorList reads: not a recurrent layer, nothing to report
        if isinstance(entry, NoMatch):
            self._record(LoopOutcome(loop=loop.name, layer=name, kind=_kind_hint(loop.name + body),
                                     direction="", became="Loop", reason=entry.reason, where=entry.node))
            return
        try:
            layer = build_layer(graph, loop, entry, name)
            node = emit(graph, layer)
        except NoMatch as no_match:
            self._record(LoopOutcome(loop=loop.name, layer=name, kind=_kind_label(entry), direction="",
                                     became="Loop", reason=no_match.reason, where=no_match.node))
            return
        except Exception as error:  # never abort the conversion
            logger.debug("emitting %s raised", loop.name, exc_info=True)
            self._record(LoopOutcome(loop=loop.name, layer=name, kind=_kind_label(entry), direction="",
                                     became="Loop",
                                     reason=f"internal error while emitting: {type(error).__name__}: {error}"))
            return
        direction = "backward" if layer.direction is Direction.BACKWARD else "forward"
        self._record(LoopOutcome(loop=loop.name, layer=name, kind=_kind_label(entry), direction=direction,
                                 became=layer.kind.onnx_op, node=node,
                                 activations=", ".join(str(a) for a in layer.activations)))

    def _record(self, outcome: LoopOutcome) -> None:
        self.report.add(outcome)
        if outcome.fused:
            logger.info("%s: %s %s -> ONNX %s", outcome.layer, outcome.kind, outcome.direction, outcome.became)
        else:
            logger.info("%s: stays a Loop: %s", outcome.layer, outcome.reason)
