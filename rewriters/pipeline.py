"""The tf2onnx ``custom_rewriter`` that runs the matchers and the emitter.

tf2onnx converts each loop body before the graph holding the loop. So the rewriter works in
two phases through the same callable:
1. on a body (still TF ops) it runs the cell matchers and files a :class:`BodyMatch` (or the
   reasons none matched) under the body's function name;
2. on a graph holding ``While`` nodes it looks each body up, builds the layer description
   and emits one ONNX node in place of the loop.
Nothing raised here escapes, at any stage: a loop that fails anywhere stays tf2onnx's exact
Loop, the report says why ("internal error while ..." for a fault of ours), and a fault is
logged as a WARNING naming the layer. tf2onnx would swallow an escaping exception and the
report would never hear of the loops it concerns.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, Union

from ..report import UNROLLED, ConversionReport, LoopOutcome
from . import cell_kinds, cell_matchers
from .adapt import build_pass, layer_name, plan_nodes
from .body import BodyView, read_skeleton, unmask
from .bool_masks import exact_selects, integer_any, select_bool_products
from .emitter import MODEL_STATES, EmitContext, StreamedStates, emit
from .layer import BodyMatch, NodeDirection, NoMatch, Pass, StackMatch, require
from .stacked import match_stack, stack_passes
from .unrolled import Chain, chain_pass, find_chains, is_recurrent, read_chain

logger = logging.getLogger("tf2onnx_rnn")

_LOOP_TYPES = ("While", "StatelessWhile")


def _kind_hint(name: str) -> str:
    """The Keras layer kind a scope name suggests, for loops no matcher took."""
    lowered = name.lower()
    return next((kind.keras_name for kind in cell_kinds() if kind.scope_hint in lowered), "unknown")


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


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
        return UNROLLED if self.unrolled else "Loop"


def make_rewriter(report: ConversionReport, layer_of: Optional[Callable[[str], Optional[str]]] = None,
                  assume_post_padded: bool = False, streaming: bool = False,
                  portable: bool = False) -> Optional["RecurrentRewriter"]:
    """The rewriter for one conversion, or None when it cannot even be built (an internal error,
    noted in ``report.setup_error`` so that every recurrent loop's row can say so).
    ``portable``: masked layers without a computed ``sequence_lens`` where that is exact."""
    try:
        return RecurrentRewriter(report, layer_of, assume_post_padded, streaming, portable)
    except Exception as error:  # noqa: BLE001 - the conversion goes on without fusing
        report.setup_error = f"internal error while setting up the rewriter: {_describe(error)}"
        logger.warning("recurrent layers stay Loops: %s", report.setup_error, exc_info=True)
        return None


class RecurrentRewriter:
    """One conversion's rewriter: its body matches and the report it fills."""

    def __init__(self, report: ConversionReport, layer_of: Optional[Callable[[str], Optional[str]]] = None,
                 assume_post_padded: bool = False, streaming: bool = False, portable: bool = False):
        self.report = report
        self.portable = portable
        self.assume_post_padded = assume_post_padded
        self.states = StreamedStates() if streaming else MODEL_STATES  # how states meet the model
        self.layer_of = layer_of or (lambda loop: None)
        # body name -> its match, why none matched, or (a str) the internal error that stopped matching
        self.bodies: dict[str, Union[BodyMatch, NoMatch, str]] = {}
        self.recorded: set = set()
        self.stack_cells: dict = {}  # loop -> (pass, Emitted) of a stack's cells emitted so far

    def __call__(self, graph, ops):
        try:
            if any(op.type == "TensorListGetItem" for op in ops):
                self._read_body(graph)
            loops = [op for op in ops if op.type in _LOOP_TYPES]
            chains = []
            if any(op.type == "Unpack" for op in ops):  # unroll=True layers: chains of steps, no loop
                chains = self._find_chains(graph)
            if loops or chains:
                self._replace_loops(graph, loops, chains)
            # after the loops are read (the mask's source is named from Keras's own ops): the mask
            # arithmetic without float Casts
            self._guarded("selecting on bool masks", [], lambda: select_bool_products(graph))
            self._guarded("reducing bool masks", [], lambda: integer_any(graph))
            self._guarded("selecting exactly", [], lambda: exact_selects(graph))
        except Exception as error:  # noqa: BLE001 - last line of defence; reconciliation fills the gaps
            logger.warning("internal error in the recurrent rewriter on %s: %s", graph.graph_name,
                           _describe(error), exc_info=True)
        return graph.get_nodes()

    # -- phase 1 -------------------------------------------------------------------------
    def _read_body(self, graph) -> None:
        name = graph.graph_name
        try:
            entry = self._match_body(graph)
        except Exception as error:  # noqa: BLE001 - a bug must not abort the conversion: keep the Loop
            logger.debug("matching %s raised", name, exc_info=True)
            entry = f"internal error while matching: {_describe(error)}"  # a plain reason: nothing more can fail
        self.bodies[name] = entry
        if isinstance(entry, (BodyMatch, StackMatch)):
            # the loop is ours: keep tf2onnx's own LSTM/GRU rewriters off it
            graph.lstm_rewriter_context = None
            graph.gru_rewriter_context = None

    def _match_body(self, graph) -> Union[BodyMatch, StackMatch, NoMatch]:
        try:
            view = BodyView(graph)
            skeleton = read_skeleton(view)
            masking = None
            if skeleton.mask_slot is not None:
                skeleton, masking = unmask(view, skeleton)
            match = self._match_cells(view, skeleton)
            if isinstance(match, StackMatch):  # every cell of a stack skips the masked steps
                return StackMatch(tuple(replace(cell, masking=masking) for cell in match.cells))
            return replace(match, masking=masking)
        except NoMatch as no_match:
            return no_match

    @classmethod
    def _match_cells(cls, view: BodyView, skeleton) -> Union[BodyMatch, StackMatch]:
        """One cell, or else several stepped in turn (StackedRNNCells); the one-cell reason when
        neither reads the body and one cell could carry its states."""
        carried = len(skeleton.state_inputs)
        if carried > max(kind.state_count for kind in cell_kinds()):
            return match_stack(view, skeleton, cls._match_cell)
        try:
            return cls._match_cell(view, skeleton)
        except NoMatch as one_cell:
            if carried < 2:
                raise
            try:
                return match_stack(view, skeleton, cls._match_cell)
            except NoMatch:
                raise one_cell from None

    @staticmethod
    def _match_cell(view: BodyView, skeleton) -> BodyMatch:
        carried = len(skeleton.state_inputs)
        reasons = []  # (kind, reason, node, whether a fault of ours)
        for matcher in cell_matchers():
            try:
                return matcher.match(view, skeleton)
            except NoMatch as no_match:
                reasons.append((matcher.KIND, f"not a {matcher.KIND.keras_name} cell: {no_match.reason}",
                                no_match.node, False))
            except Exception as error:  # noqa: BLE001 - one matcher's bug must not stop the others
                logger.debug("the %s matcher raised", matcher.KIND.keras_name, exc_info=True)
                reasons.append((matcher.KIND, f"internal error while matching: {_describe(error)} "
                                f"(in the {matcher.KIND.keras_name} matcher)", "", True))
        # report first a matcher whose state count fits; among those, one that failed by a fault of
        # ours (it may be why the loop stays: the report must say so), then the kind the scope names
        hint = _kind_hint(view.graph.graph_name + " " + skeleton.y_t)
        reasons.sort(key=lambda item: (item[0].state_count != carried, not item[3], item[0].keras_name != hint))
        _, reason, node, _ = reasons[0]
        raise NoMatch(reason, node)

    # -- phase 2 -------------------------------------------------------------------------
    def _replace_loops(self, graph, loops, chains: Sequence[Chain] = ()) -> None:
        passes = []
        for loop in loops:
            passes.extend(self._guarded("reading the loop", [loop], lambda: self._read_passes(graph, loop)) or [])
        for chain in chains:
            passes.extend(self._guarded("reading the unrolled layer", [chain],
                                        lambda: self._read_chain(graph, chain)) or [])
        layers = self._guarded("pairing directions", [], lambda: plan_nodes(graph, passes, self.assume_post_padded))
        if layers is None:  # pairing is an optimisation: without it every pass is its own node
            layers = [layer for one in passes for layer in self._guarded(
                "planning the node", [one], lambda one=one: plan_nodes(graph, [one], self.assume_post_padded)) or []]
        context = EmitContext(assume_post_padded=self.assume_post_padded, states=self.states, portable=self.portable)
        for layer in layers:
            self._guarded("emitting", layer.passes, lambda layer=layer: self._emit(graph, layer, context))

    def _guarded(self, stage: str, subjects: Sequence, work: Callable):
        """``work()``, or None after recording a fault of ours for ``subjects`` (loop nodes or passes).

        Everything that can fail for a loop runs in here, its report row included: a fault
        stays with the loops it concerns, and the other loops of the graph go on.
        """
        try:
            return work()
        except Exception as error:  # noqa: BLE001 - never abort the conversion
            reason = f"internal error while {stage}: {_describe(error)}"
            logger.debug("%s", reason, exc_info=True)
            if not subjects:
                logger.warning("recurrent rewriter: %s", reason)
            for subject in subjects:
                self._record_fault(subject, reason)
            return None

    def _record_fault(self, subject, reason: str) -> None:
        """Record ``reason`` for a loop node or a pass; when naming the loop fails too, with only
        what its node name tells (the row must not be lost to a second fault)."""
        loop = subject.loop if isinstance(subject, Pass) else subject.unpack if isinstance(subject, Chain) else subject.name
        unrolled = isinstance(subject, Chain) or (isinstance(subject, Pass) and bool(subject.unrolled))
        try:
            self._record_loop(self._chain_id(subject) if isinstance(subject, Chain) else
                              self._pass_id(subject) if isinstance(subject, Pass) else self._loop_id(subject), reason)
        except Exception:  # noqa: BLE001 - record it plainly below
            logger.debug("recording %s raised", loop, exc_info=True)
            if loop not in self.recorded:
                self.recorded.add(loop)
                plain = LoopId(loop, self.layer_of(loop) or loop, "unknown", unrolled)
                outcome = LoopOutcome(loop=loop, layer=plain.layer, kind=plain.kind, direction="",
                                      became=plain.kept_as, reason=reason)
                self.report.add(outcome)
                logger.warning("%s: stays %s: %s", plain.layer, _left_as(outcome), reason)

    def _loop_id(self, loop) -> LoopId:
        body = loop.get_attr_str("body")
        entry = self.bodies.get(body)
        kind = (entry.kind.keras_name if isinstance(entry, BodyMatch) else
                entry.kind_name if isinstance(entry, StackMatch) else _kind_hint(loop.name + " " + body))
        return LoopId(loop.name, self.layer_of(loop.name) or layer_name(loop.name), kind)

    def _find_chains(self, graph) -> list:
        """The graph's candidate unrolled layers; none after a fault of ours, which the report keeps
        (reconciliation then lists the graph's unrolled layers with it)."""
        try:
            return find_chains(graph)
        except Exception as error:  # noqa: BLE001 - the layers stay as their ops, exact
            self.report.unrolled_error = f"internal error while finding unrolled layers: {_describe(error)}"
            logger.warning("recurrent rewriter: %s", self.report.unrolled_error, exc_info=True)
            return []

    def _chain_id(self, chain: Chain) -> LoopId:
        return LoopId(chain.unpack, self.layer_of(chain.unpack) or layer_name(chain.unpack), _kind_hint(chain.unpack),
                      unrolled=True)

    def _read_chain(self, graph, chain: Chain) -> list:
        """An unrolled layer's pass; none when it stays as its ops (reported when it is recurrent)."""
        try:
            reading = read_chain(graph, chain, self._match_cells)
            return [chain_pass(graph, chain, reading, self._chain_id(chain).layer)]
        except NoMatch as no_match:
            if is_recurrent(graph, chain) or _kind_hint(chain.unpack) != "unknown":
                self._record_loop(self._chain_id(chain), no_match.reason, no_match.node)
            return []

    @staticmethod
    def _pass_id(one: Pass) -> LoopId:
        return LoopId(one.loop, one.name, StackMatch.kind_name if one.stacked else one.kind.keras_name,
                      unrolled=bool(one.unrolled))

    def _read_passes(self, graph, loop) -> list:
        """The loop's passes: one, or one per cell of a stack; none when it stays a Loop."""
        entry = self.bodies.get(loop.get_attr_str("body"))
        if entry is None:
            return []  # a body with no TensorList reads: not a recurrent layer, nothing to report
        loop_id = self._loop_id(loop)
        if isinstance(entry, str):
            self._record_loop(loop_id, entry)
            return []
        if isinstance(entry, NoMatch):
            self._record_loop(loop_id, entry.reason, entry.node)
            return []
        try:
            if isinstance(entry, StackMatch):
                return stack_passes(graph, loop, entry, loop_id.layer)
            return [build_pass(graph, loop, entry, loop_id.layer)]
        except NoMatch as no_match:
            self._record_loop(loop_id, no_match.reason, no_match.node)
        return []

    def _emit(self, graph, layer, context: EmitContext) -> None:
        first = layer.first
        if first.stacked and first.stack[0] > 0 and first.loop in self.recorded:
            return  # a cell below stayed in the Loop: the cells above read it there
        try:
            emitted = emit(graph, layer, context)
        except NoMatch as no_match:
            for one in layer.passes:
                self._record_loop(self._pass_id(one), no_match.reason, no_match.node)
            return
        if first.stacked:
            self._record_stack_cell(first, emitted)
            return
        split = len(emitted.nodes) == len(layer.passes) > 1  # one node per direction (the portable form)
        for index, one in enumerate(layer.passes):
            self._record(LoopOutcome(loop=one.loop, layer=one.name, kind=one.kind.keras_name,
                                     direction=one.direction.value, became=one.kind.onnx_op,
                                     node=emitted.nodes[index] if split else emitted.node,
                                     node_direction=NodeDirection.FORWARD.value if split else layer.direction.value,
                                     activations=", ".join(str(a) for a in one.activations),
                                     mask=_mask_text(one, emitted.mask_form),
                                     state_inputs=tuple(io.input for io in emitted.states),
                                     state_outputs=tuple(io.output for io in emitted.states),
                                     unrolled=one.unrolled))

    def _record_stack_cell(self, one: Pass, emitted) -> None:
        """Collect a stack's emitted cells; the top one's completes the loop's row."""
        cells = self.stack_cells.setdefault(one.loop, [])
        cells.append((one, emitted))
        if one.stack[0] < one.stack[1] - 1:
            return
        del self.stack_cells[one.loop]
        self._record(LoopOutcome(
            loop=one.loop, layer=one.name, kind=StackMatch.kind_name, direction=cells[0][0].direction.value,
            became=one.kind.onnx_op, node=emitted.node, node_direction=cells[0][0].direction.value,
            activations="cells: " + " -> ".join(f"{cell.kind.keras_name} [{', '.join(str(a) for a in cell.activations)}]"
                                               for cell, _ in cells),
            cell_nodes=tuple(e.node for _, e in cells[:-1]),
            state_inputs=tuple(io.input for _, e in cells for io in e.states),
            state_outputs=tuple(io.output for _, e in cells for io in e.states)))

    def _record_loop(self, loop_id: LoopId, reason: str, where: str = "") -> None:
        """A loop that stays a Loop (an unrolled layer: its ops), and why."""
        self._record(LoopOutcome(loop=loop_id.loop, layer=loop_id.layer, kind=loop_id.kind, direction="",
                                 became=loop_id.kept_as, reason=reason, where=where))

    def _record(self, outcome: LoopOutcome) -> None:
        if outcome.loop in self.recorded:
            return  # a later stage's fault does not overwrite what an earlier stage recorded
        self.recorded.add(outcome.loop)
        self.report.add(outcome)
        if outcome.fused:
            logger.info("%s: %s %s -> ONNX %s", outcome.layer, outcome.kind, outcome.direction, outcome.became)
        elif outcome.reason.startswith("internal error"):
            logger.warning("%s: stays %s: %s", outcome.layer, _left_as(outcome), outcome.reason)
        else:
            logger.info("%s: stays %s: %s", outcome.layer, _left_as(outcome), outcome.reason)


def _left_as(outcome: LoopOutcome) -> str:
    return "unrolled ops" if outcome.became == UNROLLED else "a Loop"


def _mask_text(one: Pass, form: str) -> str:
    """How a masked pass was emitted, for the report."""
    wiring = one.wiring
    if wiring.mask is None:
        return ""
    return f"{wiring.mask_source}; {form}; masked steps {wiring.masked_output.value}"
