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
from dataclasses import replace
from typing import Callable, Optional, Sequence, Union

from . import cell_kinds, cell_matchers
from .cells.body import BodyView
from .description import Approximations, BodyMatch, NoMatch, Pass, StackMatch, require
from .emit.bool_masks import exact_selects, integer_any, select_bool_products
from .emit.emitter import EmitContext, emit
from .emit.kernels import NATIVE, NativeNodes, select_kernels
from .emit.mask_forms import Masks, select_masks
from .emit.padded_lists import pad_stacked_lists
from .emit.plan import plan_nodes
from .emit.states import MODEL_STATES, StateWiring, select_states
from .outcome import WHILE_OPS, Findings
from .readers import cudnn, tf1_fused, tf1_loops, tflite_fused, tflite_loops
from .readers.adapt import build_pass
from .readers.chains import Chain, find_chains, is_recurrent
from .readers.skeleton import read_skeleton, unmask, unmask_lengths
from .readers.stacked import match_stack, stack_passes
from .readers.unrolled import chain_pass, read_chain
from .rows import LoopId, Rows, kind_hint, scope_name

# a TFLite dynamic-range kernel: tf2onnx's own conversion of its loop computes in float as well (0.04 off the
# interpreter, measured), so without the user's consent the loop is refused, not left to tf2onnx
REQUANTIZED = "the TFLite kernel quantizes its inputs at run time"
logger = logging.getLogger("tf2onnx_rnn")

def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def make_rewriter(findings: Findings, layer_of: Optional[Callable[[str], Optional[str]]] = None, *,
                  portable: bool = False, post_padded: bool = False, streaming: bool = False,
                  training: bool = False, onnxruntime: bool = False, fused_ops: Optional[dict] = None,
                  allowed: Approximations = Approximations(), masked_own_step: bool = False,
                  own_step_reason: str = "") -> Optional["RecurrentRewriter"]:
    """The rewriter for one conversion, with its variants chosen once: how masked layers are emitted
    (:func:`.mask_forms.select_masks` from ``portable``, ``post_padded`` and ``training``) and how states meet the
    model (:func:`.states.select_states` from ``streaming`` and ``portable``), and what computes a recurrence
    (:func:`.kernels.select_kernels` from ``onnxruntime``). ``fused_ops``: a TFLite file's fused
    recurrent ops, node name -> its :class:`.description.FusedLayout`. ``masked_own_step``: whether masked layers
    are written as their own step (a runtime without the ops of a native node's mask), ``own_step_reason`` why
    (their rows' reason, each row flagged ``masked_own_step``). None when it cannot
    even be built (an internal error, noted in ``findings.setup_error`` so that every recurrent loop's row
    can say so)."""
    try:
        own_step = own_step_reason if masked_own_step else ""
        return RecurrentRewriter(Rows(findings), layer_of, select_masks(portable, post_padded, training, own_step),
                                 select_states(streaming, portable and not training), fused_ops, allowed,
                                 select_kernels(onnxruntime), masked_own_step=masked_own_step)
    except Exception as error:  # noqa: BLE001 - the conversion goes on without fusing
        findings.setup_error = f"internal error while setting up the rewriter: {_describe(error)}"
        logger.warning("recurrent layers stay Loops: %s", findings.setup_error, exc_info=True)
        return None


class RecurrentRewriter:
    """One conversion's rewriter: its body matches and the rows it records."""

    def __init__(self, rows: Rows, layer_of: Optional[Callable[[str], Optional[str]]] = None,
                 masks: Masks = Masks(), states: StateWiring = MODEL_STATES, fused_ops: Optional[dict] = None,
                 allowed: Approximations = Approximations(), kernels: NativeNodes = NATIVE,
                 masked_own_step: bool = False):
        self.findings = rows.findings
        self.kernels = kernels
        self.masked_own_step = masked_own_step  # a masked layer is its own step (``masks`` says why), no native node
        self.rows = rows
        self.fused_ops, self.allowed = dict(fused_ops or {}), allowed
        self.masks, self.states = masks, states
        self.layer_of = layer_of or (lambda loop: None)
        # body name -> its match, why none matched, or (a str) the internal error that stopped matching
        self.bodies: dict[str, Union[BodyMatch, StackMatch, NoMatch, str]] = {}

    def __call__(self, graph, ops):
        try:
            if any(op.type == "TensorListGetItem" for op in ops) or tflite_loops.is_body(graph):
                self._read_body(graph)
            loops = [op for op in ops if op.type in WHILE_OPS + (tflite_loops.LOOP_OP,)]
            loops += self._guarded("finding TF 1.x loops", [],
                                   lambda: [op for op in ops if tf1_loops.is_loop(op)]) or []
            fused = [op for op in ops if op.type in _FUSED_OPS]
            chains = []
            if any(op.type == "Unpack" for op in ops):  # unroll=True layers: chains of steps, no loop
                chains = self._find_chains(graph)
            if loops or chains or fused:
                # fused ops first: one may hand its final state to a loop read after it
                self._replace_loops(graph, fused + loops, chains)
            if loops:  # the loops left as they are return the rows TensorFlow gives them
                self._guarded("padding the loops' stacked outputs", [], lambda: pad_stacked_lists(graph))
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
        if isinstance(entry, (BodyMatch, StackMatch)):  # the loop is ours: keep tf2onnx's own rewriters off it
            for context in {context for kind in cell_kinds() for context in kind.tf2onnx_contexts}:
                setattr(graph, context, None)

    def _match_body(self, graph, scan=None) -> Union[BodyMatch, StackMatch, NoMatch]:
        """The match of a loop body (``scan``: the TF 1.x Scan whose body ``graph`` is)."""
        try:
            view = tf1_loops.view_of(scan) if scan is not None else BodyView(graph)
            if scan is not None:
                skeleton, masking = tf1_loops.read_body(view, scan)
            else:
                tensor_lists = any(n.type == "TensorListGetItem" for n in graph.get_nodes())
                skeleton = read_skeleton(view) if tensor_lists else tflite_loops.read_skeleton(view)
                if skeleton.mask_slot is not None:
                    skeleton, masking = unmask(view, skeleton)
                else:
                    skeleton, masking = unmask_lengths(view, skeleton)
            match = self._match_cells(view, skeleton)
            note = self._quantization_note(view)
            assumed = tuple((tensor, view.static_source(tensor, skeleton.constant_slots), value)
                            for tensor, value in view.assumed.items())
            if isinstance(match, StackMatch):  # every cell of a stack skips the masked steps
                return StackMatch(tuple(replace(cell, masking=masking, note=note, assumed=assumed)
                                        for cell in match.cells))
            return replace(match, masking=masking, note=note, assumed=assumed)
        except NoMatch as no_match:
            return no_match

    def _quantization_note(self, view: BodyView) -> str:
        """A body whose kernels quantize their inputs at run time (a TFLite dynamic-range model) is fused
        only when the user allows computing in float; the note says so in the layer's row."""
        if not view.requantized:
            return ""
        require(self.allowed.dequantize, REQUANTIZED + " (dynamic-range "
                "quantization), which a native node cannot; convert with dequantize=True (--dequantize) to compute in "
                "float with the stored weights", view.requantized)
        return ("computed in float with the stored weights, without the TFLite kernel's run-time quantization of its "
                "inputs: outputs differ from the TFLite interpreter by that quantization's error")

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
        hint = kind_hint(view.graph.graph_name + " " + skeleton.y_t)
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
        layers = self._guarded("pairing directions", [], lambda: plan_nodes(graph, passes, self.masks))
        if layers is None:  # pairing is an optimisation: without it every pass is its own node
            layers = [layer for pass_ in passes for layer in self._guarded(
                "planning the node", [pass_], lambda pass_=pass_: plan_nodes(graph, [pass_], self.masks)) or []]
        context = EmitContext(masks=self.masks, states=self.states, kernels=self.kernels, planned=tuple(layers))
        for layer in layers:
            self._guarded("emitting", layer.passes, lambda layer=layer: self._emit(graph, layer, context))

    def _guarded(self, stage: str, subjects: Sequence, work: Callable):
        """``work()``, or None after recording a fault of ours for ``subjects`` (loop nodes, chains or
        passes).

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
        """Record ``reason`` for a loop node, a chain or a pass; when naming the loop fails too, with
        only what its node name tells."""
        try:
            self.rows.kept(self._id_of(subject), reason)
        except Exception:  # noqa: BLE001 - record it plainly below
            loop = subject.loop if isinstance(subject, Pass) else subject.unpack if isinstance(subject, Chain) \
                else subject.name
            logger.debug("recording %s raised", loop, exc_info=True)
            unrolled = isinstance(subject, Chain) or (isinstance(subject, Pass) and bool(subject.unrolled))
            self.rows.plain(loop, self.layer_of(loop) or loop, unrolled, reason)

    def _id_of(self, subject) -> LoopId:
        if isinstance(subject, Pass):
            return LoopId.of_pass(subject)
        if isinstance(subject, Chain):
            return self._chain_id(subject)
        return self._loop_id(subject)

    def _loop_id(self, loop) -> LoopId:
        if loop.type in tf1_fused.OPS:
            return LoopId(loop.name, self.layer_of(loop.name) or scope_name(loop.name), loop.type)
        if loop.type in cudnn.OPS:  # named after the scope holding the op, as a loop is
            return LoopId(loop.name, self.layer_of(loop.name) or scope_name(loop.name.rsplit("/", 1)[0]),
                          cudnn.kind_of(loop).keras_name)
        if loop.type in tflite_fused.OPS:
            name = tflite_fused.op_name(loop)
            return LoopId(name, self.layer_of(name) or scope_name(name),
                          tflite_fused.kind_of(tflite_fused.OPS[loop.type].onnx_op).keras_name)
        body = _body_of(loop)
        entry = self.bodies.get(body)
        name = tf1_loops.loop_name(loop) if tf1_loops.is_loop(loop) else loop.name
        kind = (entry.kind.keras_name if isinstance(entry, BodyMatch) else
                entry.kind_name if isinstance(entry, StackMatch) else kind_hint(name + " " + body))
        return LoopId(name, self.layer_of(name) or scope_name(name), kind)

    def _chain_id(self, chain: Chain) -> LoopId:
        return LoopId(chain.unpack, self.layer_of(chain.unpack) or scope_name(chain.unpack), kind_hint(chain.unpack),
                      unrolled=True)

    def _find_chains(self, graph) -> list:
        """The graph's candidate unrolled layers; none after a fault of ours, which the findings keep
        (reconciliation then lists the graph's unrolled layers with it)."""
        try:
            return find_chains(graph)
        except Exception as error:  # noqa: BLE001 - the layers stay as their ops, exact
            self.findings.unrolled_error = f"internal error while finding unrolled layers: {_describe(error)}"
            logger.warning("recurrent rewriter: %s", self.findings.unrolled_error, exc_info=True)
            return []

    def _read_chain(self, graph, chain: Chain) -> list:
        """An unrolled layer's pass; none when it stays as its ops (reported when it is recurrent)."""
        try:
            reading = read_chain(graph, chain, self._match_cells)
            return [chain_pass(graph, chain, reading, self._chain_id(chain).layer)]
        except NoMatch as no_match:
            if is_recurrent(graph, chain) or kind_hint(chain.unpack) != "unknown":
                self.rows.kept(self._chain_id(chain), no_match.reason, no_match.node)
            return []

    def _read_passes(self, graph, loop) -> list:
        """The loop's passes: one, or one per cell of a stack; none when it stays a Loop. A TFLite fused
        op is read as a loop would be."""
        if loop.type in _FUSED_OPS:
            return self._read_fused(graph, loop)
        if tf1_loops.is_loop(loop):  # read here: tf2onnx made it in this graph, its body is still TensorFlow's
            self.bodies[_body_of(loop)] = self._match_body(tf1_loops.body_of(loop), scan=loop)
        entry = self.bodies.get(_body_of(loop))
        if entry is None:
            return []  # a body with no TensorList reads: not a recurrent layer, nothing to report
        loop_id = self._loop_id(loop)
        if isinstance(entry, str):
            self.rows.kept(loop_id, entry)
            return []
        if isinstance(entry, NoMatch):
            self.rows.kept(loop_id, entry.reason, entry.node)
            if entry.reason.startswith(REQUANTIZED):  # tf2onnx's Loop computes it in float too: no exact fallback
                self.findings.no_fallback.add(loop_id.loop)
            return []
        try:
            if isinstance(entry, StackMatch):
                build = tf1_loops.build_pass if tf1_loops.is_loop(loop) else build_pass
                return stack_passes(graph, loop, entry, loop_id.layer, build)
            if loop.type == tflite_loops.LOOP_OP:
                return [tflite_loops.build_pass(graph, loop, entry, loop_id.layer)]
            if tf1_loops.is_loop(loop):
                return [tf1_loops.build_pass(graph, loop, entry, loop_id.layer)]
            return [build_pass(graph, loop, entry, loop_id.layer)]
        except NoMatch as no_match:
            self.rows.kept(loop_id, no_match.reason, no_match.node)
        return []

    def _read_fused(self, graph, node) -> list:
        """A fused recurrent op's passes. The op has no exact tf2onnx handler: one left unread, or any of its
        passes left unemitted, is the conversion's error (``findings.no_fallback``)."""
        self.findings.no_fallback.add(node.name)  # first: naming the op may fail too
        loop_id = self._loop_id(node)
        self.findings.no_fallback.add(loop_id.loop)
        try:
            if node.type in tf1_fused.OPS:
                passes = tf1_fused.fused_passes(graph, node, loop_id.layer)
            elif node.type in cudnn.OPS:
                passes, reading = cudnn.fused_passes(graph, node, loop_id.layer)
                if reading is not None:  # the verification's reference computes the op as it was read
                    self.findings.keras_masks[node.name] = reading
            else:
                passes = tflite_fused.fused_passes(graph, node, self.fused_ops.get(loop_id.loop), loop_id.layer,
                                                   self.allowed)
        except NoMatch as no_match:
            self.rows.kept(loop_id, no_match.reason, no_match.node)
            return []
        self.findings.no_fallback.update(pass_.loop for pass_ in passes)
        return passes

    def _emit(self, graph, layer, context: EmitContext) -> None:
        first = layer.first
        if first.stacked and first.stack[0] > 0 and first.loop in self.rows.recorded:
            return  # a cell below stayed in the Loop: the cells above read it there
        try:
            emitted = emit(graph, layer, context)
        except NoMatch as no_match:
            recorded = len(self.findings.outcomes)
            for pass_ in layer.passes:
                self.rows.kept(LoopId.of_pass(pass_), no_match.reason, no_match.node)
            if layer.masked and self.masked_own_step:  # the emitter's refusal of a masked layer: its own step
                self.findings.outcomes[recorded:] = [replace(o, masked_own_step=True)
                                                     for o in self.findings.outcomes[recorded:]]
            return
        if first.stacked:
            self.rows.stack_cell(first, emitted)
        else:
            self.rows.fused(layer, emitted)


# ops a reader reads whole: TFLite's fused sequence ops, TF 1.x's BlockLSTM, cuDNN's
_FUSED_OPS = frozenset(tflite_fused.OPS) | frozenset(tf1_fused.OPS) | frozenset(cudnn.OPS)


def _body_of(loop) -> str:
    """The name of the body function (or graph) a loop node runs."""
    if loop.type == tflite_loops.LOOP_OP:
        return tflite_loops.body_name(loop)
    if tf1_loops.is_loop(loop):
        return tf1_loops.body_of(loop).graph_name
    return loop.get_attr_str("body")
