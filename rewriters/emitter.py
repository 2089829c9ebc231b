"""The one place that builds ONNX recurrent nodes and knows their input and output slots."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
from onnx import TensorProto, helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from .layer import Direction, MaskedOutput, NoMatch, NodeDirection, RecurrentLayer, StateRole


class Slot(enum.IntEnum):
    """Input positions of ONNX LSTM / GRU / RNN (LSTM's peephole P is never used)."""

    X = 0
    W = 1
    R = 2
    B = 3
    SEQUENCE_LENS = 4
    INITIAL_H = 5
    INITIAL_C = 6


class Out(enum.IntEnum):
    """Output positions of ONNX LSTM / GRU / RNN."""

    Y = 0  # [T, directions, B, H]
    Y_H = 1  # [directions, B, H]
    Y_C = 2  # [directions, B, H], LSTM only


_STATE_OUTPUT = {StateRole.HIDDEN: Out.Y_H, StateRole.CELL: Out.Y_C}
_STATE_INPUT = {StateRole.HIDDEN: Slot.INITIAL_H, StateRole.CELL: Slot.INITIAL_C}
_TAKES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
_TAKES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}
_BATCH_MAJOR = [1, 0, 2]


def _attributes(layer: RecurrentLayer, direction: NodeDirection, sequence_lens: bool) -> dict:
    """The node's attributes. ``activations`` is left out when every one is ONNX's default for the op
    and the node takes no ``sequence_lens``: OpenVINO turns a bidirectional node that lists its
    activations into two TensorIterator loops (7.7-8.8x slower, measured), but its fused kernel
    ignores ``sequence_lens`` when shapes are dynamic, which the loops honour."""
    first = layer.first
    activations = [a for one in layer.passes for a in one.activations]
    attrs = {
        "hidden_size": first.hidden_size,
        "direction": direction.value,
    }
    defaults = first.kind.default_activations * len(layer.passes)
    if sequence_lens or [str(a) for a in activations] != list(defaults):
        attrs["activations"] = [a.name for a in activations]
    alphas = [a.alpha for a in activations if a.name in _TAKES_ALPHA]
    betas = [a.beta for a in activations if a.name in _TAKES_BETA]
    if alphas:
        attrs["activation_alpha"] = [float(a) for a in alphas]
    if betas:
        attrs["activation_beta"] = [float(b) for b in betas]
    attrs.update(first.attributes)  # the family's own (paired passes have the same)
    return attrs


class StateWiring:
    """How a layer's recurrent states meet the model: the states the model itself gives and uses.

    A wiring variant of the one emitter; :class:`StreamedStates` is the other. The emitter asks
    the variant three things: the layer as the node will see it, what a carried output starts
    from, and what to add once the node is built.
    """

    def prepare(self, graph, layer: RecurrentLayer) -> RecurrentLayer:
        """``layer`` as the node is built from it."""
        return layer

    def carried_start(self, emission: "_Emission", index: int) -> Optional[str]:
        """[B, H]: what a masked pass's carried output is before its first kept step (None: zeros,
        as Keras starts every call)."""
        return None

    def final_roles(self, layer: RecurrentLayer) -> set:
        """The states the layer's node must give at its end: those the model uses."""
        return {role for one in layer.passes for role, _ in one.wiring.final_states}

    def finish(self, emission: "_Emission", node) -> tuple:
        """Add what the variant needs around the built node; returns the :class:`StateIO` it added."""
        return ()


MODEL_STATES = StateWiring()


@dataclass(frozen=True)
class StateIO:
    """One recurrent state of a streamed layer as the model's input and output."""

    role: StateRole
    input: str  # graph input the layer starts from ("" when the model gives that state itself)
    output: str  # graph output: the state the layer ends with


class StreamedStates(StateWiring):
    """Streaming: every state is a graph input ``<layer>/h_in`` (``c_in``) the layer starts from and
    a graph output ``<layer>/h_out`` (``c_out``) it ends with, [batch, units] (a StackedRNNCells
    layer's cell k: ``<layer>/cell_<k>/h_in`` ...). Feeding each call's
    outputs as the next call's inputs runs a sequence chunk by chunk exactly as whole.

    A state the model computes from its own inputs (``initial_state=``) stays the model's; a
    constant one (zero, or a stateful layer's stored state, frozen) becomes the input. Only
    forward passes of the main graph stream: a backward pass needs the future.
    """

    def prepare(self, graph, layer: RecurrentLayer) -> RecurrentLayer:
        if layer.direction is not NodeDirection.FORWARD or layer.first.direction is not Direction.FORWARD:
            raise NoMatch("cannot stream: a backward pass (Bidirectional or go_backwards) needs the whole "
                          "sequence")
        if graph.parent_graph is not None:
            raise NoMatch("cannot stream: the layer runs inside another loop")
        one = layer.first
        given = dict(one.wiring.initial_states)
        states = []
        for role in one.kind.state_roles:
            tensor = given.get(role)
            if tensor is not None and role not in one.wiring.constant_states:
                states.append((role, tensor))
                continue
            name = self.name(one, role, "in")
            require_free(graph, name)
            graph.add_graph_input(name, helper.np_dtype_to_tensor_dtype(np.dtype(one.dtype)),
                                  [_batch_of(graph, layer.x), one.hidden_size])
            states.append((role, name))
        streamed = replace(one, wiring=replace(one.wiring, initial_states=tuple(states), constant_states=()))
        return replace(layer, passes=(streamed,))

    def final_roles(self, layer: RecurrentLayer) -> set:
        return super().final_roles(layer) | set(layer.first.kind.state_roles)  # every state is an output

    def carried_start(self, emission: "_Emission", index: int) -> Optional[str]:
        # in a whole sequence a masked step repeats the last kept step's output, which is the state
        # carried in (zero only where the stream starts)
        tensor = dict(emission.layer.passes[index].wiring.initial_states).get(StateRole.HIDDEN)
        return tensor if tensor == self.name(emission.layer.passes[index], StateRole.HIDDEN, "in") else None

    def finish(self, emission: "_Emission", node) -> tuple:
        one, graph = emission.layer.first, emission.graph
        given = dict(one.wiring.initial_states)
        added = []
        for role in one.kind.state_roles:
            name = self.name(one, role, "out")
            require_free(graph, name)
            graph.make_node("Identity", [emission.final_state(node, 0, role)], outputs=[name])
            graph.add_graph_output(name, helper.np_dtype_to_tensor_dtype(np.dtype(one.dtype)),
                                   [_batch_of(graph, emission.layer.x), one.hidden_size])
            streamed_in = self.name(one, role, "in")
            added.append(StateIO(role, streamed_in if given.get(role) == streamed_in else "", name))
        return tuple(added)

    @staticmethod
    def name(one, role: StateRole, end: str) -> str:
        """``<layer>/h_in`` ...; a stack's cells are ``<layer>/cell_<k>/h_in`` ..."""
        cell = f"/cell_{one.stack[0]}" if one.stacked else ""
        return f"{one.name}{cell}/{role.value}_{end}"


def require_free(graph, name: str) -> None:
    """A streamed state's name must not be taken (two layers of one name, or a model tensor)."""
    if graph.get_node_by_output(name) is not None:
        raise NoMatch(f"cannot stream: the name {name} is already taken in the graph")


def _batch_of(graph, x: str) -> int:
    """The batch size of a time-major input [T, B, F], -1 when dynamic."""
    shape = graph.get_shape(x) or []
    return shape[1] if len(shape) == 3 and shape[1] is not None and shape[1] > 0 else -1


@dataclass
class EmitContext:
    """What the emissions into one graph share."""

    assume_post_padded: bool = False  # skip compacting masked steps (exact only for post-padded masks)
    states: StateWiring = MODEL_STATES  # how the layers' states meet the model (streaming or not)
    portable: bool = False  # target "portable": masked layers without a computed sequence_lens where exact
    renamed: dict = field(default_factory=dict)  # tensors replaced by earlier emissions -> replacements
    masks: dict = field(default_factory=dict)  # mask key -> _MaskTensors, so layers share one computation

    def current(self, tensor: str) -> str:
        """A tensor's name now: an earlier node of this graph may have replaced it."""
        return self.renamed.get(tensor, tensor)


def _built_once(builder):
    """A property whose graph nodes are built on first use and reused after."""

    def get(self):
        if builder.__name__ not in self._cache:
            self._cache[builder.__name__] = builder(self)
        return self._cache[builder.__name__]

    return property(get, doc=builder.__doc__)


class _MaskTensors:
    """Tensors derived from one time-major mask [T, B], each built on first use.

    Compaction moves each row's kept steps to the front, in order; outputs go back through
    ``source``: at step t, the compacted position of the latest kept step up to t.
    """

    def __init__(self, graph, mask: str, float_type: np.dtype):
        self.graph, self.builder = graph, GraphBuilder(graph)
        self.float_type_np = np.dtype(float_type)
        self._cache: dict = {}
        if len(graph.get_shape(mask) or []) == 3:
            mask = self.builder.make_squeeze({"data": mask, "axes": [2]})
        self.bool = self.op("Cast", [mask], to=TensorProto.BOOL)

    def op(self, op_type: str, inputs, **attrs) -> str:
        return self.graph.make_node(op_type, inputs, attr=attrs).output[0]

    def const(self, value, dtype=np.int64) -> str:
        return self.graph.make_const(utils.make_name("mask_const"), np.array(value, dtype)).output[0]

    @_built_once
    def ints(self) -> str:
        """[T, B] int64: 1 at kept steps. A Where, not a Cast: tract casts to int64 as its symbolic
        dimension type, which its CumSum cannot add."""
        return self.op("Where", [self.bool, self.const(1), self.const(0)])

    @_built_once
    def time_and_batch(self):
        shape = self.op("Shape", [self.bool])
        return (self.op("Gather", [shape, self.const(0)], axis=0),
                self.op("Gather", [shape, self.const(1)], axis=0))

    @_built_once
    def batch_index(self) -> str:
        """[B]: 0 .. B-1, to turn (step, row) into a row of a [T*B, ...] flattening."""
        return self.op("Range", [self.const(0), self.time_and_batch[1], self.const(1)])

    @_built_once
    def counts(self) -> str:
        """[B] int64: kept steps per row."""
        return self.builder.make_reduce_sum({"data": self.ints, "axes": [0], "keepdims": 0})

    @_built_once
    def lengths(self) -> str:
        """[B] int32: kept steps per row, the node's sequence_lens."""
        return self.op("Cast", [self.counts], to=TensorProto.INT32)

    @_built_once
    def source(self) -> str:
        """[T, B]: compacted position of the latest kept step at or before t (-1 before any)."""
        return self.op("Sub", [self.op("CumSum", [self.ints, self.const(0)]), self.const(1)])

    @_built_once
    def source_rows(self) -> str:
        """[T, B]: ``source`` as rows of a flattened [T*B, H] output (clamped at 0)."""
        clamped = self.op("Max", [self.source, self.const(0)])
        return self.op("Add", [self.op("Mul", [clamped, self.time_and_batch[1]]), self.batch_index])

    @_built_once
    def steps(self) -> str:
        """[T, 1]: 0 .. T-1."""
        time = self.time_and_batch[0]
        return self.builder.make_unsqueeze({"data": self.op("Range", [self.const(0), time, self.const(1)]),
                                            "axes": [1]})

    @_built_once
    def compaction_rows(self) -> str:
        """[T, B]: for compacted position k, the row of the flattened input to read."""
        time, batch = self.time_and_batch
        # kept steps first, in order: t, else T + t. Sorted as int32: tract computes on sizes in its
        # symbolic dimension type, which its TopK cannot compare (nor multiply by a symbolic T)
        key = self.op("Where", [self.bool, self.steps, self.op("Add", [self.steps, time])])
        key = self.op("Cast", [key], to=TensorProto.INT32)
        count = self.builder.make_unsqueeze({"data": time, "axes": [0]})
        order = self.graph.make_node("TopK", [key, count], attr={"axis": 0, "largest": 0, "sorted": 1},
                                     output_count=2).output[1]
        return self.op("Add", [self.op("Mul", [order, batch]), self.batch_index])

    @_built_once
    def last_rows(self) -> str:
        """[1, B]: the row of a flattened [T*B, H] output at each row's last compacted kept
        position (count - 1, clamped at 0)."""
        last = self.op("Max", [self.op("Sub", [self.counts, self.const(1)]), self.const(0)])
        rows = self.op("Add", [self.op("Mul", [last, self.time_and_batch[1]]), self.batch_index])
        return self.builder.make_unsqueeze({"data": rows, "axes": [0]})

    @_built_once
    def reversal_rows(self) -> str:
        """[T, B]: for position k of a row with n kept steps at the front, the row of a flattened
        [T*B, ...] tensor to read so that the kept steps come in reverse: n-1-k for k < n, k after.
        Reversing twice is the identity. (ReverseSequence does the same; tract has no ReverseSequence.)"""
        batch = self.time_and_batch[1]
        counts = self.builder.make_unsqueeze({"data": self.counts, "axes": [0]})
        flipped = self.op("Sub", [self.op("Sub", [counts, self.const(1)]), self.steps])
        position = self.op("Where", [self.op("Less", [self.steps, counts]), flipped, self.steps])
        return self.op("Add", [self.op("Mul", [position, batch]), self.batch_index])

    @_built_once
    def reversed_compaction_rows(self) -> str:
        """[T, B]: :attr:`compaction_rows` with each row's kept steps in reverse (one gather of the input)."""
        rows = self.op("Reshape", [self.compaction_rows, self.const([-1])])
        return self.op("Gather", [rows, self.reversal_rows], axis=0)

    @_built_once
    def kept(self) -> str:
        """[T, B, 1] bool: the kept steps."""
        return self.builder.make_unsqueeze({"data": self.bool, "axes": [2]})

    @_built_once
    def started(self) -> str:
        """[T, B, 1] bool: from the first kept step on."""
        started = self.op("Greater", [self.source, self.const(-1)])
        return self.builder.make_unsqueeze({"data": started, "axes": [2]})

    @_built_once
    def zero(self) -> str:
        """A scalar zero of the layer's float type."""
        return self.const(0, self.float_type_np)

    @_built_once
    def nonempty(self) -> str:
        """[B, 1] bool: rows with at least one kept step."""
        return self.builder.make_unsqueeze({"data": self.op("Greater", [self.counts, self.const(0)]), "axes": [1]})

    def kept_at(self, step: int) -> str:
        """[1, B, 1] bool: whether ``step`` (0 or -1) is kept."""
        return self.op("Gather", [self.kept, self.const([step])], axis=0)

    def compact(self, x: str) -> str:
        """[T, B, F] -> the same with each row's kept steps moved to the front, in order."""
        return self.op("Gather", [self.op("Flatten", [x], axis=2), self.compaction_rows], axis=0)

    def compact_reversed(self, x: str, compacted: bool = True) -> str:
        """[T, B, F] -> each row's kept steps at the front in reverse order (last kept step first);
        ``compacted=False``: the kept steps are at the front already (post-padded)."""
        rows = self.reversed_compaction_rows if compacted else self.reversal_rows
        return self.op("Gather", [self.op("Flatten", [x], axis=2), rows], axis=0)

    def unreverse(self, y: str) -> str:
        """[T, B, H] outputs of a node run over :meth:`compact_reversed` input -> in compacted order."""
        return self.op("Gather", [self.op("Flatten", [y], axis=2), self.reversal_rows], axis=0)

    def at_last_kept(self, y: str) -> str:
        """[1, B, H]: a node's output at each row's last compacted kept position, which is its state
        there; zeros for a row with no kept step (as ONNX gives with sequence_lens 0)."""
        last = self.op("Gather", [self.op("Flatten", [y], axis=2), self.last_rows], axis=0)
        return self.op("Where", [self.nonempty, last, self.zero])

    @_built_once
    def kept_source(self) -> str:
        """[T, B]: ``source`` at kept steps, -1 at the others."""
        return self.op("Where", [self.bool, self.source, self.const(-1)])

    def restore_from_node(self, y: str, index: int, directions: int, output: MaskedOutput) -> str:
        """[T, B, H]: pass ``index``'s outputs at every step, read straight from the node's Y
        [T, directions, B, H] when the node ran with sequence_lens, so its outputs past each row's
        kept count are zeros (onnxruntime writes them). A step with no output of its own (before the
        row's first kept step; with ZERO, every masked step) reads the row's position -1, that is
        T - 1: such a row has fewer than T kept steps, so that position is one of the zeros. No
        Where over the outputs, no Slice of the directions."""
        if ("flat", y) not in self._cache:
            self._cache[("flat", y)] = self.op("Flatten", [y], axis=3)  # [T * directions * B, H]
        batch = self.time_and_batch[1]
        source = self.kept_source if output is MaskedOutput.ZERO else self.source
        stride = batch if directions == 1 else self.op("Mul", [batch, self.const(directions)])
        offset = self.batch_index
        if index:
            offset = self.op("Add", [offset, self.op("Mul", [batch, self.const(index)])])
        rows = self.op("Add", [self.op("Mul", [source, stride]), offset])
        return self.op("Gather", [self._cache[("flat", y)], rows], axis=0)

    def restore(self, y: str, output: MaskedOutput, start: Optional[str] = None) -> str:
        """[T, B, H] outputs at compacted positions -> Keras's outputs at every step; a carried
        output is ``start`` ([B, H], zeros when None) before each row's first kept step."""
        spread = self.op("Gather", [self.op("Flatten", [y], axis=2), self.source_rows], axis=0)
        if output is MaskedOutput.ZERO:
            return self.op("Where", [self.kept, spread, self.zero])
        # selecting on the bool mask, with no float Cast: exact, and safe in float16 conversion
        return self.op("Where", [self.started, spread, self.zero if start is None else start])


def compacts(layer: RecurrentLayer, assume_post_padded: bool) -> bool:
    """Whether a masked layer's input is compacted (kept steps moved to the front).

    Always, unless post-padding is assumed; even then a go_backwards pass that runs over
    Keras's reversed input is compacted, since reversing turns post-padding into pre-padding.
    """
    reversed_input = layer.direction is NodeDirection.FORWARD and layer.first.direction is Direction.BACKWARD
    return layer.mask is not None and (not assume_post_padded or reversed_input)


class MaskForm:
    """How a masked layer's mask reaches its node: the kept counts as ``sequence_lens``, so the node
    stops at each row's last kept step (compacted first unless post-padding is assumed).

    A wiring variant of the one emitter; :class:`PortableMask` is the other. The emitter asks the
    variant the nodes a layer becomes, each node's direction, X and sequence_lens, a pass's outputs
    in compacted order, and its state at the last kept step. An unmasked layer takes this form
    with no mask (but for the portable target's reverse passes, see :func:`mask_form`).
    """

    zeros_past_count = True  # the node's outputs past each row's kept count are zeros (sequence_lens)

    def __init__(self, note: str = ""):
        self.note = note  # why a layer asked for another form has this one, for the report

    def layers(self, layer: RecurrentLayer) -> tuple:
        """The layers the node(s) are built from, one node each."""
        return (layer,)

    def direction(self, layer: RecurrentLayer) -> NodeDirection:
        """The node's direction attribute."""
        return layer.direction

    def inputs(self, emission: "_Emission") -> tuple:
        """The node's X and sequence_lens ("" for none)."""
        x = emission.current(emission.layer.x)
        if emission.mask is None:
            return x, ""
        return (emission.mask.compact(x) if emission.compacted else x), emission.mask.lengths

    def steps(self, emission: "_Emission", y: str) -> str:
        """[T, B, H]: a pass's node outputs -> its outputs in the order of X, at compacted positions
        when masked (zero past each row's kept count when not compacted)."""
        return y

    def state(self, emission: "_Emission", node, index: int, role: StateRole) -> str:
        """[1, B, H]: pass ``index``'s state at its last kept step (zeros for a row with none)."""
        state = node.output[_STATE_OUTPUT[role]]
        if len(emission.layer.passes) > 1:
            state = emission.builder.make_slice({"data": state, "starts": [index], "ends": [index + 1], "axes": [0]})
        return state

    def describe(self, layer: RecurrentLayer, compacted: bool) -> str:
        """The form ``layer`` (as planned, before :meth:`layers`) took, for the report's mask column."""
        form = "compacted + sequence_lens" if compacted else "sequence_lens (post-padded assumed)"
        return f"{form} ({self.note})" if self.note else form


SEQUENCE_LENS = MaskForm()


class PortableMask(MaskForm):
    """Target "portable": no computed ``sequence_lens`` (tract takes it only as a constant, onnx2torch
    not at all). Each row's kept steps are compacted to the front as usual and the node runs over
    every step; what comes after the kept steps never reaches an output: the outputs are gathered
    back from the kept positions, and the state from the last one (the output there is the hidden
    state). A pass that steps backward runs FORWARD over each row's kept steps reversed (a gather,
    composed with the compaction's), and its outputs are reversed back per row. A Bidirectional
    layer becomes two forward nodes: one node cannot reverse its backward direction per row.

    Exact for every layer whose final cell state (LSTM's c) is not used: the node outputs only h
    at each step (:func:`mask_form` keeps ``sequence_lens`` for those).

    Every node it builds runs forward: tract runs a ``direction="reverse"`` node forward (it reads
    the direction from the number of directions only), so an unmasked pass that steps backward
    runs forward over its input reversed in time too, its outputs reversed back.
    """

    zeros_past_count = False  # the node runs over every step

    def layers(self, layer: RecurrentLayer) -> tuple:
        if layer.direction is not NodeDirection.BIDIRECTIONAL:
            return (layer,)
        forward, backward = layer.passes
        return (replace(layer, direction=NodeDirection.FORWARD, passes=(forward,)),
                replace(layer, direction=NodeDirection.REVERSE, passes=(backward,)))

    def direction(self, layer: RecurrentLayer) -> NodeDirection:
        return NodeDirection.FORWARD

    def inputs(self, emission: "_Emission") -> tuple:
        x, mask = emission.current(emission.layer.x), emission.mask
        if emission.layer.direction is NodeDirection.REVERSE:
            return (emission.reversed_in_time(x) if mask is None else mask.compact_reversed(x, emission.compacted)), ""
        return (mask.compact(x) if emission.compacted else x), ""

    def steps(self, emission: "_Emission", y: str) -> str:
        mask = emission.mask
        if emission.layer.direction is NodeDirection.REVERSE:
            y = emission.reversed_in_time(y) if mask is None else mask.unreverse(y)
        if mask is not None and not emission.compacted:
            # post-padded: zeros past each row's kept steps, as sequence_lens gives
            y = mask.op("Where", [mask.kept, y, mask.zero])
        return y

    def state(self, emission: "_Emission", node, index: int, role: StateRole) -> str:
        if emission.mask is None:  # the last step of the reversed input is the first: the node's own state
            return super().state(emission, node, index, role)
        assert role is StateRole.HIDDEN, "a cell state is not in the node's outputs"
        return emission.mask.at_last_kept(emission.per_direction(node.output[Out.Y], index, 1))

    def describe(self, layer: RecurrentLayer, compacted: bool) -> str:
        form = ["portable: no sequence_lens", "compacted" if compacted else "post-padded assumed"]
        if layer.direction is NodeDirection.BIDIRECTIONAL:
            form.append("two forward nodes, the backward one over each row's kept steps reversed")
        elif layer.direction is NodeDirection.REVERSE:
            form.append("a forward node over each row's kept steps reversed")
        return ", ".join(form + ["state read at the last kept step"])


PORTABLE = PortableMask()


def mask_form(layer: RecurrentLayer, context: EmitContext) -> MaskForm:
    """The form a layer's mask takes in its node(s) (the portable form also takes an unmasked layer
    that would run ``direction="reverse"``)."""
    if not context.portable or (layer.mask is None and layer.direction is not NodeDirection.REVERSE):
        return SEQUENCE_LENS
    if layer.mask is not None and StateRole.CELL in context.states.final_roles(layer):
        return MaskForm("kept for the portable target: the final cell state c is used, and without "
                        "sequence_lens the node gives c only after the last step")
    return PORTABLE


@dataclass(frozen=True)
class Emitted:
    """What :func:`emit` built, for the report."""

    node: str  # the ONNX node's name (the first node's when there are two)
    mask_form: str = ""  # how a masked layer's mask reached the node; empty when unmasked
    states: tuple = ()  # StateIO per streamed state (streaming only)
    nodes: tuple = ()  # every node built, in the layer's pass order: one per pass when a layer became
    # one node per direction (the portable form of a masked Bidirectional layer), else the one node


class _Emission:
    """Builds one node and collects (old tensor, new tensor) replacements."""

    def __init__(self, graph, layer: RecurrentLayer, context: EmitContext, form: MaskForm = SEQUENCE_LENS):
        self.graph, self.context, self.form = graph, context, form
        kind, dtype = layer.first.kind, np.dtype(layer.first.dtype)
        if dtype.name not in kind.element_types:
            raise NoMatch(f"onnxruntime's {kind.onnx_op} does not run {dtype.name} (it runs "
                          f"{', '.join(kind.element_types)}): the layer stays an exact Loop")
        self.layer = layer = context.states.prepare(graph, layer)
        self.builder = GraphBuilder(graph)
        self.name = utils.make_name(layer.name.replace("/", "_") + "_" + layer.first.kind.onnx_op)
        self.replacements: list = []
        self.mask = None
        if layer.mask is not None:
            key = layer.mask_key or (context.current(layer.mask),)
            if key not in context.masks:
                context.masks[key] = _MaskTensors(graph, context.current(layer.mask), layer.first.dtype)
            self.mask = context.masks[key]
        self.compacted = self.mask is not None and compacts(layer, context.assume_post_padded)

    def current(self, tensor: str) -> str:
        return self.context.current(tensor)

    def stacked_const(self, suffix: str, field_name: str) -> str:
        value = np.stack([getattr(one, field_name) for one in self.layer.passes]).astype(self.layer.first.dtype)
        return self.graph.make_const(utils.make_name(self.name + "_" + suffix), value).output[0]

    def initial_state(self, role: StateRole) -> str:
        """[directions, B, H] from the passes' [B, H] initial states; "" when all start at zero."""
        given = [dict(one.wiring.initial_states).get(role) for one in self.layer.passes]
        if not any(given):
            return ""
        parts = [self.builder.make_unsqueeze({"data": self.current(tensor), "axes": [0]}) for tensor in given]
        if len(parts) == 1:
            return parts[0]
        return self.graph.make_node("Concat", parts, attr={"axis": 0}).output[0]

    def per_direction(self, tensor: str, index: int, axis: int) -> str:
        """The slice of a per-direction output for pass ``index``, with the direction axis removed."""
        if len(self.layer.passes) > 1:
            tensor = self.builder.make_slice({"data": tensor, "starts": [index], "ends": [index + 1],
                                              "axes": [axis]})
        return self.builder.make_squeeze({"data": tensor, "axes": [axis]})

    def node(self):
        first, layer = self.layer.first, self.layer
        inputs = [""] * len(Slot)
        inputs[Slot.X], inputs[Slot.SEQUENCE_LENS] = self.form.inputs(self)
        inputs[Slot.W] = self.stacked_const("W", "W")
        inputs[Slot.R] = self.stacked_const("R", "R")
        inputs[Slot.B] = self.stacked_const("B", "B")
        for role in first.kind.state_roles:
            inputs[_STATE_INPUT[role]] = self.initial_state(role)
        while inputs[-1] == "":
            inputs.pop()
        count = first.kind.state_count + 1
        directions, hidden = len(layer.passes), first.hidden_size
        shapes = [[-1, directions, -1, hidden]] + [[directions, -1, hidden]] * first.kind.state_count
        dtype = helper.np_dtype_to_tensor_dtype(np.dtype(first.dtype))
        lengths = len(inputs) > Slot.SEQUENCE_LENS and bool(inputs[Slot.SEQUENCE_LENS])
        attributes = _attributes(layer, self.form.direction(layer), lengths)
        return self.graph.make_node(first.kind.onnx_op, inputs, attr=attributes,
                                    output_count=count,
                                    name=self.name, shapes=shapes, dtypes=[dtype] * count)

    def wire(self, node) -> None:
        for index, one in enumerate(self.layer.passes):
            wiring = one.wiring
            if wiring.sequence_output or wiring.reversed_output:
                in_node_order = self.sequence(node, index, wiring)
                # a pass stepping backward through X yields its step-order sequence reversed
                step_order = self.layer.runs_forward(index)
                if wiring.sequence_output:
                    self.replace(wiring.sequence_output,
                                 in_node_order if step_order else self.reversed_in_time(in_node_order))
                if wiring.reversed_output:
                    reversed_steps = self.reversed_in_time(in_node_order) if step_order else in_node_order
                    batch_major = self.graph.make_node("Transpose", [reversed_steps], attr={"perm": _BATCH_MAJOR})
                    self.replace(wiring.reversed_output, batch_major.output[0])
            if wiring.last_output or wiring.last_step_output:
                last = self.last_output(node, index, wiring)
                self.replace(wiring.last_output, last)
                if wiring.last_step_output:
                    self.replace(wiring.last_step_output, self.builder.make_squeeze({"data": last, "axes": [0]}))
            for role, old in wiring.final_states:
                self.replace([old], self.final_state(node, index, role))

    def last_output(self, node, index: int, wiring) -> str:
        """[1, B, H]: pass ``index``'s output at its last step."""
        last = self.form.state(self, node, index, StateRole.HIDDEN)
        if wiring.masked_output is MaskedOutput.ZERO:
            # the loop's last write: zeros when its last step is masked
            return self.mask.op("Where", [self.mask.kept_at(-1 if self.layer.runs_forward(index) else 0), last,
                                          self.mask.zero])
        start = self.context.states.carried_start(self, index) if self.mask is not None else None
        if start is not None:
            # a row with no kept step repeats the output carried in (ONNX gives zeros)
            last = self.mask.op("Where", [self.mask.nonempty, last, self.builder.make_unsqueeze(
                {"data": self.current(start), "axes": [0]})])
        return last

    def final_state(self, node, index: int, role: StateRole) -> str:
        """[B, H]: the state pass ``index`` ends with."""
        state = self.builder.make_squeeze({"data": self.form.state(self, node, index, role), "axes": [0]})
        initial = dict(self.layer.passes[index].wiring.initial_states)
        if self.mask is not None and role in initial:
            # a row with no kept step keeps its initial state (ONNX gives zeros)
            state = self.mask.op("Where", [self.mask.nonempty, state, self.current(initial[role])])
        return state

    def sequence(self, node, index: int, wiring) -> str:
        """Pass ``index``'s [T, B, H] outputs at every step, in the time order of X."""
        def sequence():
            return self.form.steps(self, self.per_direction(node.output[Out.Y], index, 1))

        if self.mask is None:
            return sequence()
        if not self.compacted and (wiring.masked_output is MaskedOutput.ZERO or not self.layer.runs_forward(index)):
            # post-padded: ONNX already gives zeros after each row's length, which is Keras's output
            # there in zero mode, and, once reversed, before the first kept step of a backward pass
            return sequence()
        start = self.context.states.carried_start(self, index)
        if start is None and self.form.zeros_past_count:
            return self.mask.restore_from_node(node.output[Out.Y], index, len(self.layer.passes),
                                               wiring.masked_output)
        return self.mask.restore(sequence(), wiring.masked_output, start and self.current(start))

    def reversed_in_time(self, sequence: str) -> str:
        """[T, B, H] with the time axis reversed as a whole."""
        return self.builder.make_slice({"data": sequence, "starts": [-1], "ends": [-(2 ** 62)], "steps": [-1],
                                        "axes": [0]})

    def replace(self, olds, new: str) -> None:
        self.replacements.extend((old, new) for old in olds)


def emit(graph, layer: RecurrentLayer, context: EmitContext) -> "Emitted":
    """Add the node for ``layer`` to ``graph`` (two with the portable form of a masked
    Bidirectional layer) and rewire the tensors it replaces.

    ``context`` is shared by the emissions into one graph: it maps tensors that earlier
    emissions replaced (an encoder's states feeding a decoder, say) and holds the mask
    computations layers share. Every node is built before anything is rewired, so a failure
    leaves the graph as it was (apart from unused nodes, which tf2onnx removes).
    Returns what was built.
    """
    form = mask_form(layer, context)
    emissions = [_Emission(graph, part, context, form) for part in form.layers(layer)]
    nodes, states = [], ()
    for emission in emissions:
        nodes.append(emission.node())
        emission.wire(nodes[-1])
        states += context.states.finish(emission, nodes[-1])
    for emission in emissions:
        for old, new in emission.replacements:
            graph.replace_all_inputs(old, new)
            context.renamed[old] = new
    masked = emissions[0].mask is not None
    return Emitted(node=nodes[0].name, mask_form=form.describe(layer, emissions[0].compacted) if masked else "",
                   states=states, nodes=tuple(node.name for node in nodes))
