"""The one place that builds ONNX recurrent nodes and knows their input and output slots.

How a mask reaches a node (:mod:`.mask_forms`) and how states meet the model (:mod:`.states`)
are variants chosen once per conversion; the mask arithmetic is :mod:`.mask_tensors`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from onnx import helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from ..description import TAKES_ALPHA, TAKES_BETA, MaskedOutput, NodeDirection, NoMatch, RecurrentLayer, StateRole
from .bool_masks import MaskingSource, masking_source, moved
from .kernels import NATIVE, NativeNodes, NodeInputs
from .mask_forms import MaskForm, Masks, PortableMask
from .mask_tensors import LengthTensors, MaskTensors
from .states import MODEL_STATES, StateWiring


class Slot(enum.IntEnum):
    """Input positions of ONNX LSTM / GRU / RNN."""

    X = 0
    W = 1
    R = 2
    B = 3
    SEQUENCE_LENS = 4
    INITIAL_H = 5
    INITIAL_C = 6
    P = 7  # LSTM only: peepholes


class Out(enum.IntEnum):
    """Output positions of ONNX LSTM / GRU / RNN."""

    Y = 0  # [T, directions, B, H]
    Y_H = 1  # [directions, B, H]
    Y_C = 2  # [directions, B, H], LSTM only


_STATE_OUTPUT = {StateRole.HIDDEN: Out.Y_H, StateRole.CELL: Out.Y_C}
_STATE_INPUT = {StateRole.HIDDEN: Slot.INITIAL_H, StateRole.CELL: Slot.INITIAL_C}
_BATCH_MAJOR = [1, 0, 2]


def _attributes(layer: RecurrentLayer, direction: NodeDirection, sequence_lens: bool) -> dict:
    """The node's attributes. ``activations`` is left out when every one is ONNX's default for the op
    and the node takes no ``sequence_lens``: OpenVINO turns a bidirectional node that lists its
    activations into two TensorIterator loops (7.7-8.8x slower, measured), but its fused kernel
    ignores ``sequence_lens`` when shapes are dynamic, which the loops honour."""
    first = layer.first
    activations = [a for pass_ in layer.passes for a in pass_.activations]
    attrs = {
        "hidden_size": first.hidden_size,
        "direction": direction.value,
    }
    defaults = first.kind.default_activations * len(layer.passes)
    if sequence_lens or [str(a) for a in activations] != list(defaults):
        attrs["activations"] = [a.name for a in activations]
    alphas = [a.alpha for a in activations if a.name in TAKES_ALPHA]
    betas = [a.beta for a in activations if a.name in TAKES_BETA]
    if alphas:
        attrs["activation_alpha"] = [float(a) for a in alphas]
    if betas:
        attrs["activation_beta"] = [float(b) for b in betas]
    attrs.update(first.attributes)  # the family's own (paired passes have the same)
    return attrs


@dataclass
class EmitContext:
    """What the emissions into one graph share: the variants chosen for the conversion, the tensors
    earlier emissions replaced, and the mask computations layers share."""

    masks: Masks = Masks()  # how masked layers are emitted
    states: StateWiring = MODEL_STATES  # how the layers' states meet the model (streaming or not)
    kernels: NativeNodes = NATIVE  # what computes a layer's recurrence (the native node, or a Scan for onnxruntime)
    renamed: dict = field(default_factory=dict)  # tensors replaced by earlier emissions -> replacements
    mask_tensors: dict = field(default_factory=dict)  # mask key -> MaskTensors, so layers share one computation
    planned: tuple = ()  # every layer planned in the graph (the readers of a Masking layer's output)
    unmasked: dict = field(default_factory=dict)  # a layer's input -> the same read before a Masking layer's select
    read_after: dict = field(default_factory=dict)  # a Masking layer's output -> whether more than its skippers read it

    def current(self, tensor: str) -> str:
        """A tensor's name now: an earlier node of this graph may have replaced it."""
        return self.renamed.get(tensor, tensor)

    def input_of(self, graph, layer: RecurrentLayer) -> str:
        """The tensor a layer's node reads X from: the layer's input as the graph has it now or, when
        that input is a Keras ``Masking`` layer's output masked by the very mask the layer uses
        (:func:`.bool_masks.masking_source`) and nothing but such layers reads that output, the same
        moves of the Masking layer's own input: the two are equal at every kept step, and no output
        depends on another step (:attr:`.mask_forms.Masks.reads_kept_steps_only`). The select then
        has no reader left, and goes with the loops."""
        x = self.current(layer.x)
        found = self.masking(graph, layer)
        if found is None or self.select_read_after(graph, found.select):
            return x
        if x not in self.unmasked:
            self.unmasked[x] = moved(graph, found.source, found.moves)
        return self.unmasked[x]

    def masking(self, graph, layer: RecurrentLayer) -> Optional[MaskingSource]:
        """The Masking layer whose select a masked layer's node may skip (None: none may be)."""
        if layer.mask is None or layer.batch_major or not self.masks.reads_kept_steps_only:
            return None
        return masking_source(graph, self.current(layer.x), self.current(layer.mask))

    def select_read_after(self, graph, select: str) -> bool:
        """Whether a Masking layer's output is still read once the planned layers that may skip its
        select (:meth:`masking`) are nodes: by anything the graph's outputs need but their loops (a
        Dense, another layer, a graph output...)."""
        if select not in self.read_after:
            skipping = {pass_.loop for layer in self.planned
                        if (found := self.masking(graph, layer)) is not None and found.select == select
                        for pass_ in layer.passes}
            needed = graph.extract_sub_graph_nodes(graph.outputs, input_checker=lambda node: node.name not in skipping)
            self.read_after[select] = graph.get_node_by_output(select) in needed
        return self.read_after[select]


@dataclass(frozen=True)
class Emitted:
    """What :func:`emit` built, for the report."""

    nodes: tuple  # per pass of the layer, in its order: (the node built for it, that node's NodeDirection)
    mask_form: str = ""  # how a masked layer's mask reached its node(s), as the form describes itself
    states: tuple = ()  # StateIO per streamed state (streaming only)
    became: str = ""  # the op that computes the recurrence when it is not the layer's native node
    form: str = ""  # how, in words, then

    @property
    def node(self) -> str:
        """The first pass's node."""
        return self.nodes[0][0]


class Emission:
    """Builds one node and collects (old tensor, new tensor) replacements."""

    def __init__(self, graph, layer: RecurrentLayer, context: EmitContext, form: MaskForm):
        self.graph, self.context, self.form = graph, context, form
        kind, dtype = layer.first.kind, np.dtype(layer.first.dtype)
        if dtype.name not in kind.element_types:
            raise NoMatch(f"onnxruntime's {kind.onnx_op} does not run {dtype.name} (it runs "
                          f"{', '.join(kind.element_types)})")
        self.input = context.input_of(graph, layer)  # what the node reads X from (see EmitContext.input_of)
        self.layer = layer = context.states.prepare(graph, layer, self.input)
        self.builder = GraphBuilder(graph)
        self._reversals: dict = {}  # reversed_in_time's outputs -> their inputs
        self.name = utils.make_name(layer.name.replace("/", "_") + "_" + layer.first.kind.onnx_op)
        self.replacements: list = []
        self.mask = None
        if layer.lengths is not None:
            key = ("lengths", context.current(layer.lengths), context.current(layer.x))
            if key not in context.mask_tensors:
                context.mask_tensors[key] = LengthTensors(graph, context.current(layer.lengths),
                                                          context.current(layer.x), layer.first.dtype,
                                                          context.masks.where_ints)
            self.mask = context.mask_tensors[key]
        elif layer.mask is not None:
            key = layer.mask_key or (context.current(layer.mask),)
            if layer.reverse_x:
                key = ("reversed in time",) + key
            if key not in context.mask_tensors:
                mask = context.current(layer.mask)
                mask = self.reversed_in_time(mask) if layer.reverse_x else mask
                context.mask_tensors[key] = MaskTensors(graph, mask, layer.first.dtype, context.masks.where_ints,
                                                        context.masks.choice)
            self.mask = context.mask_tensors[key]
        self.compacted = self.mask is not None and context.masks.compacts(layer)
        self._x = None

    def current(self, tensor: str) -> str:
        return self.context.current(tensor)

    @property
    def x(self) -> str:
        """The layer's input in the order its node steps through it (reversed here when the layer
        says so: an unrolled layer gives its input in time order only)."""
        if self._x is None:
            x = self.input
            if self.layer.batch_major:
                x = self.graph.make_node("Transpose", [x], attr={"perm": _BATCH_MAJOR}).output[0]
            self._x = self.reversed_in_time(x) if self.layer.reverse_x else x
        return self._x

    def stacked_const(self, suffix: str, field_name: str) -> str:
        value = np.stack([getattr(pass_, field_name) for pass_ in self.layer.passes]).astype(self.layer.first.dtype)
        return self.graph.make_const(utils.make_name(self.name + "_" + suffix), value).output[0]

    def initial_state(self, role: StateRole) -> str:
        """[directions, B, H] from the passes' [B, H] initial states; "" when all start at zero."""
        given = [dict(pass_.wiring.initial_states).get(role) for pass_ in self.layer.passes]
        if not any(given):
            return ""
        parts = [self.builder.make_unsqueeze({"data": self.current(tensor), "axes": [0]}) for tensor in given]
        if len(parts) == 1:
            return parts[0]
        return self.graph.make_node("Concat", parts, attr={"axis": 0}).output[0]

    def per_direction(self, tensor: str, index: int, axis: int, builder: Optional[GraphBuilder] = None) -> str:
        """The slice of a per-direction output for pass ``index``, with the direction axis removed
        (built by ``builder``: an ``If`` branch's, or this graph's)."""
        builder = builder or self.builder
        if len(self.layer.passes) > 1:
            tensor = builder.make_slice({"data": tensor, "starts": [index], "ends": [index + 1], "axes": [axis]})
        return builder.make_squeeze({"data": tensor, "axes": [axis]})

    def direction_of(self, y: str, index: int, tensors: MaskTensors) -> str:
        """[T, B, H]: pass ``index``'s outputs from the node's Y [T, directions, B, H], as an ``If``
        branch's output: one Gather of the direction (a Slice and a Squeeze would copy twice there, the
        Squeeze's view copied out of the branch); a lone direction's Squeeze, whose reader (Keras's
        transpose to batch-major) the written model moves into the branch
        (:mod:`.if_branches`)."""
        if len(self.layer.passes) == 1:
            return tensors.builder.make_squeeze({"data": y, "axes": [1]})
        return tensors.op("Gather", [y, tensors.const(index)], axis=1)

    @staticmethod
    def node_y(node) -> str:
        """The node's Y: [T, directions, B, H]."""
        return node.output[Out.Y]

    def node_state(self, node, index: int, role: StateRole) -> str:
        """[1, B, H]: the state the node ends pass ``index`` with."""
        state = node.output[_STATE_OUTPUT[role]]
        if len(self.layer.passes) > 1:
            state = self.builder.make_slice({"data": state, "starts": [index], "ends": [index + 1], "axes": [0]})
        return state

    def node(self):
        first, layer = self.layer.first, self.layer
        inputs = [""] * len(Slot)
        inputs[Slot.X], inputs[Slot.SEQUENCE_LENS] = self.form.inputs(self)
        inputs[Slot.W] = self.stacked_const("W", "W")
        inputs[Slot.R] = self.stacked_const("R", "R")
        inputs[Slot.B] = self.stacked_const("B", "B")
        for role in first.kind.state_roles:
            inputs[_STATE_INPUT[role]] = self.initial_state(role)
        peepholes = [pass_.P for pass_ in layer.passes]
        if any(p is not None for p in peepholes):
            inputs[Slot.P] = self.graph.make_const(utils.make_name(self.name + "_P"), np.stack(
                [np.zeros(3 * first.hidden_size) if p is None else p for p in peepholes]).astype(first.dtype)).output[0]
        else:
            # absent inputs stay "" up to the kind's last state slot: onnxruntime's gradient builders give
            # the backward node the forward node's inputs by position, so a shorter list misplaces them
            del inputs[max(_STATE_INPUT[role] for role in first.kind.state_roles) + 1:]
        count = first.kind.state_count + 1
        directions, hidden = len(layer.passes), first.hidden_size
        shapes = [[-1, directions, -1, hidden]] + [[directions, -1, hidden]] * first.kind.state_count
        dtype = helper.np_dtype_to_tensor_dtype(np.dtype(first.dtype))
        lengths = len(inputs) > Slot.SEQUENCE_LENS and bool(inputs[Slot.SEQUENCE_LENS])
        attributes = _attributes(layer, self.form.direction(layer), lengths)
        named = NodeInputs(inputs[Slot.X], inputs[Slot.SEQUENCE_LENS] if lengths else "",
                           inputs[Slot.INITIAL_H] if len(inputs) > Slot.INITIAL_H else "")
        return self.context.kernels.build(self.graph, layer, inputs, named, attributes, self.name, shapes,
                                          [dtype] * count)

    def wire(self, node) -> None:
        for index, pass_ in enumerate(self.layer.passes):
            wiring = pass_.wiring
            if wiring.sequence_output or wiring.reversed_output or wiring.time_order_output or \
                    wiring.batch_major_output:
                in_node_order = self.sequence(node, index, wiring)
                # a pass stepping backward through X yields its step-order sequence reversed
                step_order = self.layer.runs_forward(index)
                if self.layer.lengths is not None and ((wiring.sequence_output or wiring.batch_major_output)
                                                       and not step_order or wiring.reversed_output and step_order):
                    # its rows are reversed within their lengths, which reversing time as a whole is not
                    raise NoMatch("a sequence of a layer masked past each row's length is used reversed in time")
                if wiring.sequence_output or wiring.batch_major_output:
                    steps = in_node_order if step_order else self.reversed_in_time(in_node_order)
                    transposed = self.graph.make_node("Transpose", [steps], attr={"perm": _BATCH_MAJOR}).output[0]
                    self.replace(wiring.sequence_output, transposed if self.layer.batch_major else steps)
                    self.replace(wiring.batch_major_output, transposed)
                if wiring.reversed_output:
                    reversed_steps = self.reversed_in_time(in_node_order) if step_order else in_node_order
                    batch_major = self.graph.make_node("Transpose", [reversed_steps], attr={"perm": _BATCH_MAJOR})
                    self.replace(wiring.reversed_output, batch_major.output[0])
                if wiring.time_order_output:
                    time_order = self.graph.make_node("Transpose", [in_node_order], attr={"perm": _BATCH_MAJOR}) \
                        .output[0] if self.layer.batch_major else in_node_order
                    self.replace(wiring.time_order_output, time_order)
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
            last = self.mask.op("Where", [self.form.nonempty(self), last, self.builder.make_unsqueeze(
                {"data": self.current(start), "axes": [0]})])
        return last

    def final_state(self, node, index: int, role: StateRole) -> str:
        """[B, H]: the state pass ``index`` ends with."""
        state = self.builder.make_squeeze({"data": self.form.state(self, node, index, role), "axes": [0]})
        wiring = self.layer.passes[index].wiring
        initial = dict(wiring.initial_states)
        if self.mask is not None and role in initial and not (
                role in wiring.zero_states and self.form.zero_where_empty):
            # a row with no kept step keeps its initial state (ONNX gives zeros)
            state = self.mask.op("Where", [self.form.nonempty(self), state, self.current(initial[role])])
        return state

    def sequence(self, node, index: int, wiring) -> str:
        """Pass ``index``'s [T, B, H] outputs at every step, in the time order of X."""
        if self.mask is None:
            return self.form.steps(self, self.per_direction(self.node_y(node), index, 1))
        return self.form.masked_sequence(self, node, index, wiring)

    def reversed_in_time(self, sequence: str) -> str:
        """[T, ...] with the time axis reversed as a whole (a reversal of this emission's own reversal
        is its input: reversing twice costs two copies and computes nothing)."""
        if sequence in self._reversals:
            return self._reversals[sequence]
        reversed_ = self.builder.make_slice({"data": sequence, "starts": [-1], "ends": [-(2 ** 62)], "steps": [-1],
                                             "axes": [0]})
        self._reversals[reversed_] = sequence
        return reversed_

    def replace(self, olds, new: str) -> None:
        self.replacements.extend((old, new) for old in olds)


def emit(graph, layer: RecurrentLayer, context: EmitContext) -> Emitted:
    """Add the node for ``layer`` to ``graph`` (two with the portable form of a masked
    Bidirectional layer) and rewire the tensors it replaces.

    ``context`` is shared by the emissions into one graph: it maps tensors that earlier
    emissions replaced (an encoder's states feeding a decoder, say) and holds the mask
    computations layers share. Every node is built before anything is rewired, so a failure
    leaves the graph as it was (apart from unused nodes, which tf2onnx removes).
    Returns what was built.
    """
    if layer.masked and context.masks.own_step:
        raise NoMatch(context.masks.own_step)
    if isinstance(context.masks.form, PortableMask) and any(p.P is not None for p in layer.passes):
        raise NoMatch("peepholes: OpenVINO computes an ONNX LSTM's P input otherwise than onnxruntime and "
                      "TensorFlow, so the portable form writes the cell as a Scan of its own step")
    form = context.masks.form_for(layer, context.states.final_roles(layer))
    native = context.kernels.builds_native(layer)
    emissions = [Emission(graph, part, context, form) for part in form.layers(layer)]
    built, states = [], ()
    for emission in emissions:
        built.append(emission.node())
        emission.wire(built[-1])
        states += context.states.finish(emission, built[-1])
    nodes = tuple((node.name_of(index), form.direction(emission.layer))
                  for emission, node in zip(emissions, built) for index, _ in enumerate(emission.layer.passes))
    masked = emissions[0].mask is not None
    emitted = Emitted(nodes=nodes, mask_form=form.describe(layer, emissions[0].compacted, context.masks.choice)
                      if masked else "",
                      states=states, became="" if native else built[0].op_type,
                      form="" if native else context.kernels.describe)
    for emission in emissions:  # last: nothing after the rewiring can fail
        for old, new in emission.replacements:
            graph.replace_all_inputs(old, new)
            context.renamed[old] = new
    return emitted
