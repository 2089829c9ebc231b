"""How a masked layer's mask reaches its node: wiring variants of the one emitter.

:class:`MaskForm` (the kept counts as ``sequence_lens``) and :class:`PortableMask` (no computed
``sequence_lens``) are the forms; :class:`Masks`, chosen once per conversion by
:func:`select_masks`, says which form a layer takes and whether its kept steps are compacted
(moved to the front) or assumed to come first (post-padding).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..description import Direction, MaskedOutput, NodeDirection, Pass, RecurrentLayer, StateRole
from .emission import Emission
from .mask_tensors import ALWAYS, AT_RUN_TIME, Always
from .scattered_mask import ScatteredMask


class MaskForm:
    """How a masked layer's mask reaches its node: the kept counts as ``sequence_lens``, so the node
    stops at each row's last kept step (compacted first unless post-padding is assumed).

    A wiring variant of the one emitter; :class:`PortableMask` is the other. The emitter asks the
    variant the nodes a layer becomes, each node's direction, X and sequence_lens, a pass's outputs
    in compacted order, and its state at the last kept step. An unmasked layer takes this form
    with no mask (but for the portable target's reverse passes, see :meth:`Masks.form_for`).
    """

    def __init__(self, note: str = ""):
        self.note = note  # why a layer asked for another form has this one, for the report

    def layers(self, layer: RecurrentLayer) -> tuple:
        """The layers the node(s) are built from, one node each."""
        return (layer,)

    def direction(self, layer: RecurrentLayer) -> NodeDirection:
        """The node's direction attribute."""
        return layer.direction

    def inputs(self, emission: Emission) -> tuple:
        """The node's X and sequence_lens ("" for none)."""
        x = emission.x
        if emission.mask is None:
            return x, ""
        lengths = emission.mask.lengths  # first: a compaction decided at run time reads the counts from outside
        return (emission.mask.compact(x) if emission.compacted else x), lengths

    def steps(self, emission: Emission, y: str) -> str:
        """[T, B, H]: an unmasked pass's node outputs -> its outputs in the order of X."""
        return y

    def masked_sequence(self, emission: Emission, node, index: int, wiring) -> str:
        """[T, B, H]: a masked pass ``index``'s outputs at every step, in the time order of X."""
        y = emission.per_direction(emission.node_y(node), index, 1)
        mask = emission.mask
        backward = not emission.layer.runs_forward(index)
        if not emission.compacted and (wiring.masked_output is MaskedOutput.ZERO or backward):
            # post-padded: ONNX already gives zeros after each row's length, which is Keras's output
            # there in zero mode, and, for a pass stepping backward, what it carries back from the end
            return y
        start = emission.context.states.carried_start(emission, index)
        if start is None:
            # the node's own outputs are Keras's where no row's kept steps were moved (zero mode, a pass
            # stepping backward) or where no step is masked (a carried output)
            return mask.unless_needed(
                lambda tensors: emission.direction_of(emission.node_y(node), index, tensors),
                lambda tensors: tensors.restore_from_node(emission.node_y(node), index, len(emission.layer.passes),
                                                          wiring.masked_output, backward),
                post_padded=wiring.masked_output is MaskedOutput.ZERO or backward)
        return mask.restore(y, wiring.masked_output, emission.current(start), backward)

    # whether :meth:`state` is zeros for a row with no kept step, so that a state starting at zeros needs no
    # select there: not with sequence_lens, where it is whatever the runtime's kernel writes for a length of 0
    zero_where_empty = False

    def nonempty(self, emission: Emission) -> str:
        """[B, 1] bool: the rows with a kept step."""
        return emission.mask.nonempty

    def state(self, emission: Emission, node, index: int, role: StateRole) -> str:
        """[1, B, H]: pass ``index``'s state at its last kept step (zeros for a row with none).
        onnxruntime 1.23's RNN kernel leaves Y_h of a row whose sequence_lens is 0 unwritten (any
        value, 1e22 seen; 1.32 writes zeros): a masked RNN node's state is zeroed there."""
        state = emission.node_state(node, index, role)
        if emission.mask is not None and emission.layer.first.kind.onnx_op == "RNN":
            state = emission.mask.op("Where", [emission.mask.nonempty, state, emission.mask.zero])
        return state

    def describe(self, layer: RecurrentLayer, compacted: bool, choice: Always = ALWAYS) -> str:
        """The form ``layer`` (as planned, before :meth:`layers`) took, for the report's mask column
        (``choice``: when its compaction runs)."""
        form = ("sequence_lens: the given lengths" if layer.lengths is not None else
                f"{choice.describe(True)} + sequence_lens" if compacted else "sequence_lens (post-padded assumed)")
        return f"{form} ({self.note})" if self.note else form


SEQUENCE_LENS = MaskForm()


class PortableMask(MaskForm):
    """Target "portable": no computed ``sequence_lens`` (tract takes it only as a constant, onnx2torch
    not at all). Each row's kept steps are moved to the front (a scatter) and the node runs over
    every step; what comes after the kept steps never reaches an output: the outputs are gathered
    back from the kept positions, and the state from the last one (the output there is the hidden
    state). A pass that steps backward runs FORWARD over each row's kept steps in reverse (the
    scatter writes them so), and the gather reads them back in reverse. A Bidirectional layer
    becomes two forward nodes: one node cannot reverse its backward direction per row. The
    arithmetic is :class:`.scattered_mask.ScatteredMask`.

    Exact for every layer whose final cell state (LSTM's c) is not used: the node outputs only h
    at each step (:meth:`Masks.form_for` keeps ``sequence_lens`` for those).

    Every node it builds runs forward: tract runs a ``direction="reverse"`` node forward (it reads
    the direction from the number of directions only), so an unmasked pass that steps backward
    runs forward over its input reversed in time too, its outputs reversed back.
    """

    def layers(self, layer: RecurrentLayer) -> tuple:
        if layer.direction is not NodeDirection.BIDIRECTIONAL:
            return (layer,)
        forward, backward = layer.passes
        return (replace(layer, direction=NodeDirection.FORWARD, passes=(forward,)),
                replace(layer, direction=NodeDirection.REVERSE, passes=(backward,)))

    def direction(self, layer: RecurrentLayer) -> NodeDirection:
        return NodeDirection.FORWARD

    def inputs(self, emission: Emission) -> tuple:
        x, mask = emission.x, emission.mask
        reversed_ = emission.layer.direction is NodeDirection.REVERSE
        if mask is None:
            return (emission.reversed_in_time(x) if reversed_ else x), ""
        if not (reversed_ or emission.compacted):
            return x, ""  # post-padded: the kept steps come first already
        return ScatteredMask.of(mask).scattered(x, reversed_), ""

    def steps(self, emission: Emission, y: str) -> str:
        return emission.reversed_in_time(y) if emission.layer.direction is NodeDirection.REVERSE else y

    def masked_sequence(self, emission: Emission, node, index: int, wiring) -> str:
        start = emission.context.states.carried_start(emission, index)
        return ScatteredMask.of(emission.mask).restored(emission.per_direction(emission.node_y(node), index, 1),
                                                        wiring.masked_output, start and emission.current(start),
                                                        emission.layer.direction is NodeDirection.REVERSE)

    zero_where_empty = True  # the state is read from the outputs after a zero step, which a row with none reads

    def nonempty(self, emission: Emission) -> str:
        return ScatteredMask.of(emission.mask).nonempty

    def state(self, emission: Emission, node, index: int, role: StateRole) -> str:
        if emission.mask is None:  # the last step of the reversed input is the first: the node's own state
            return super().state(emission, node, index, role)
        assert role is StateRole.HIDDEN, "a cell state is not in the node's outputs"
        return ScatteredMask.of(emission.mask).last_kept(emission.per_direction(emission.node_y(node), index, 1))

    def describe(self, layer: RecurrentLayer, compacted: bool, choice: Always = ALWAYS) -> str:
        form = ["portable: no sequence_lens", "compacted" if compacted else
                "steps past each row's length masked" if layer.lengths is not None else "post-padded assumed"]
        if layer.direction is NodeDirection.BIDIRECTIONAL:
            form.append("two forward nodes, the backward one over each row's kept steps reversed")
        elif layer.direction is NodeDirection.REVERSE:
            form.append("a forward node over each row's kept steps reversed")
        return ", ".join(form + ["state read at the last kept step"])


PORTABLE = PortableMask()


class PortableKeepingLengths(PortableMask):
    """The portable form of a masked LSTM whose final cell state c is used: the node outputs c only after
    its last step, so it keeps the kept counts as ``sequence_lens`` (the report's note says so). All else
    is the portable form: its input is compacted by the scatter (a pass stepping backward over each
    row's kept steps reversed) and every node runs forward (tract runs a ``direction="reverse"`` node
    forward); c is the node's own final state, every other output the portable form's."""

    def inputs(self, emission: Emission) -> tuple:
        x, _ = super().inputs(emission)
        return x, ("" if emission.mask is None else emission.mask.lengths)

    zero_where_empty = False  # a row with no kept step: whatever the kernel writes for a length of 0

    def state(self, emission: Emission, node, index: int, role: StateRole) -> str:
        if role is StateRole.CELL:
            return emission.node_state(node, index, role)
        return super().state(emission, node, index, role)

    def describe(self, layer: RecurrentLayer, compacted: bool, choice: Always = ALWAYS) -> str:
        return f"{super().describe(layer, compacted, choice)}; sequence_lens ({self.note})"




@dataclass(frozen=True)
class Masks:
    """How the masked layers of one conversion are emitted."""

    form: MaskForm = SEQUENCE_LENS  # the form a masked layer takes unless it needs another
    post_padded: bool = False  # every row's kept steps are assumed to come first: nothing is compacted
    forward_nodes: bool = False  # every node runs forward (target "training": the training kernels' only one)
    own_step: str = ""  # why a masked layer is written as its own step, not a native node ("": it is not)

    def form_for(self, layer: RecurrentLayer, final_roles: set) -> MaskForm:
        """The form ``layer`` takes (``final_roles``: the states its node must give at its end). In
        every form, an unmasked layer that would run ``direction="reverse"`` (with ``forward_nodes``,
        any that would not run forward) takes the portable one: a forward node over its input
        reversed by a Slice (tract runs a lone reverse node forward; tf2onnx's ReverseSequence is
        unknown to onnx2torch and tract). In the portable form a masked layer whose final cell state
        is used keeps ``sequence_lens`` (:class:`PortableKeepingLengths`)."""
        runs_as_is = layer.direction is NodeDirection.FORWARD or (
            layer.direction is NodeDirection.BIDIRECTIONAL and not self.forward_nodes)
        if not layer.masked:
            # every form: tract runs a lone direction="reverse" node forward, silently wrong there
            return SEQUENCE_LENS if runs_as_is else PORTABLE
        if self.form is SEQUENCE_LENS:
            return SEQUENCE_LENS
        if layer.masked and StateRole.CELL in final_roles:
            return PortableKeepingLengths("kept for the portable target: the final cell state c is used, and "
                                          "without sequence_lens the node gives c only after the last step")
        return self.form

    @property
    def choice(self) -> Always:
        """When a masked layer's compaction and restore run: only for a batch that needs them, decided by
        an ``If`` (:class:`.mask_tensors.AtRunTime`), or on every run where the consumers take no ``If``
        (the portable form: tract, onnx2torch; the training form)."""
        return ALWAYS if isinstance(self.form, PortableMask) else AT_RUN_TIME

    @property
    def where_ints(self) -> bool:
        """Whether the mask's 0/1 ints are made by a Where (the portable form: tract's CumSum cannot add
        the ints a Cast of its bool gives it, measured); by a Cast elsewhere, a third of a Where's time."""
        return isinstance(self.form, PortableMask)

    @property
    def reads_kept_steps_only(self) -> bool:
        """Whether no output of a masked layer depends on its node's X at a step its mask does not
        keep, so that the node may read its input from before a Keras ``Masking`` layer's select
        (:meth:`.emitter.EmitContext.input_of`; the two are equal at kept steps).

        With ``sequence_lens`` (the default form, the onnxruntime target, streaming, a portable layer
        whose c is used) each row's kept steps come first (compacted, or post-padding assumed) and the
        node stops at their count. The portable form's node runs on past them, but a recurrence never
        reaches back in time: its outputs at the kept positions read kept steps only, and those after
        are discarded (the outputs gathered from kept positions, or selected away by a Where, the state
        read at the last kept position); onnxruntime's Scan for SimpleRNN likewise (a Where, a GatherND).
        Not for training: gradients run back through the steps after the kept ones, as zeros times the
        input there and the activations' slopes, exact only while those are finite (an input of
        ``Masking(mask_value=inf)``, a relu cell that overflows): the select stays."""
        return not self.forward_nodes

    def compacts(self, layer: RecurrentLayer) -> bool:
        """Whether a masked layer's input is compacted (kept steps moved to the front).

        Always, unless post-padding is assumed; even then a go_backwards pass that runs over
        Keras's reversed input is compacted, since reversing turns post-padding into pre-padding.
        A layer masked past each row's length (``lengths``) is post-padded by construction.
        """
        reversed_input = layer.direction is NodeDirection.FORWARD and layer.first.direction is Direction.BACKWARD
        return layer.mask is not None and (not self.post_padded or reversed_input)

    def runs_reverse(self, pass_: Pass) -> bool:
        """Whether a pass of its own is planned as ONNX's reverse direction over the unreversed input:
        a backward pass whose step-order outputs are unused, or a masked one with post-padding
        assumed (that saves compacting; its step-order sequence is then Y reversed in time), and
        every unmasked backward pass (in the portable form every one) that has its input unreversed.
        Every other pass runs forward over its own input. An unmasked layer planned so is built as a
        forward node over its input reversed by a Slice (:meth:`form_for`)."""
        wiring = pass_.wiring
        if pass_.direction is Direction.BACKWARD and wiring.x_unreversed is not None and (
                self.form is PORTABLE or wiring.mask is None and wiring.lengths is None):
            return True  # over the unreversed input, reversed by a Slice: tf2onnx writes Keras's reversal as
            # ReverseSequence, which some consumers lack (onnx2torch, tract)
        post_padded_sequence = self.post_padded and wiring.mask is not None
        return pass_.direction is Direction.BACKWARD and (not wiring.sequence_output or post_padded_sequence)


def select_masks(portable: bool = False, post_padded: bool = False, training: bool = False,
                 own_step: str = "") -> Masks:
    """How masked layers are emitted in a conversion: with computed ``sequence_lens``, or in the
    portable form; compacted (exact for any mask), or with post-padding assumed. ``training``: the
    portable form, every node running forward (onnxruntime's training kernels take neither
    ``sequence_lens`` nor another direction). ``own_step``: why every masked layer is instead written as its
    own step (a runtime that lacks the ops of the mask around a native node)."""
    return Masks(PORTABLE if portable or training else SEQUENCE_LENS, post_padded, forward_nodes=training,
                 own_step=own_step)
