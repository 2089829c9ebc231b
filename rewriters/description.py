"""Typed descriptions shared by the matchers, the adapters and the emitter.

A matcher reads a loop body and returns a :class:`BodyMatch`. An adapter turns it, together
with the loop node in the outer graph, into a :class:`RecurrentLayer`: everything the emitter
needs, with weights already in ONNX gate order. Nothing here knows ONNX input slots.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np


class NoMatch(Exception):
    """A matcher or adapter declined a loop: ``reason`` says why, ``node`` where."""

    def __init__(self, reason: str, node: str = ""):
        super().__init__(f"{reason} [{node}]" if node else reason)
        self.reason = reason
        self.node = node


def require(condition: bool, reason: str, node: str = "") -> None:
    """Raise :class:`NoMatch` with ``reason`` unless ``condition`` holds."""
    if not condition:
        raise NoMatch(reason, node)


@dataclass(frozen=True)
class Approximations:
    """What the user lets a conversion compute otherwise than the source model, each field named as
    the conversion option that allows it (a refusal names it, and its command-line flag)."""

    drop_cell_clip: bool = False  # a TFLite fused LSTM that clips its cell state, converted without the clip
    dequantize: bool = False  # a TFLite kernel quantizing its inputs at run time, converted in float


@dataclass(frozen=True)
class FusedLayout:
    """What a TFLite file says of one fused recurrent op beside what tf2onnx's reader keeps: the input
    positions present (the reader drops absent ones), and for each state variable the ops that read
    that same tensor after or before the op runs (the file's converter may merge equal zero tensors,
    so a later op reads the state this one leaves)."""

    positions: tuple[int, ...]
    readers_after: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (state position, op names)
    readers_before: tuple[tuple[int, tuple[str, ...]], ...] = ()


class StateRole(enum.Enum):
    """What a loop-carried value of a recurrent body is."""

    HIDDEN = "h"
    CELL = "c"  # LSTM only


# A cell's step as the ONNX equations compute it, on values: ``step(x, states, weights, activations,
# attributes)`` with ``x`` [B, F], ``states`` role -> [B, H], ``weights`` W [G*H, F], R [G*H, H] and
# B [2*G*H] in ONNX gate order, ``activations`` the numpy functions in ONNX order and ``attributes``
# the family's own ONNX attributes as a dict; returns role -> the new state [B, H].
StepEquation = Callable[..., dict]


@dataclass(frozen=True)
class RecurrentNode:
    """An ONNX recurrent op as the spec defines it: which of its activation functions each of its gate blocks
    goes through (ONNX gate order; LSTM's third function is applied to the cell state, not to a gate block), and
    its default functions, one direction's."""

    op: str
    gate_functions: tuple[int, ...]
    default_activations: tuple[str, ...]

    @property
    def gates(self) -> int:
        return len(self.gate_functions)


RECURRENT_NODES = {node.op: node for node in (RecurrentNode("LSTM", (0, 0, 0, 1), ("Sigmoid", "Tanh", "Tanh")),
                                              RecurrentNode("GRU", (0, 0, 1), ("Sigmoid", "Tanh")),
                                              RecurrentNode("RNN", (0,), ("Tanh",)))}


@dataclass(frozen=True)
class CellKind:
    """A cell family's facts. Each cell module (``lstm``, ``gru``, ``simple_rnn``) defines its own
    ``KIND`` beside its matcher; nothing else in the package lists the families or names one."""

    keras_name: str  # the Keras layer, as the report names it (SimpleRNN)
    onnx_op: str  # the ONNX node it becomes (RNN)
    scope_hint: str  # what Keras's scopes for this family contain (lstm_cell, gru_1, simple_rnn...)
    state_roles: tuple[StateRole, ...]  # the states in ONNX order (initial_h, initial_c)
    # element types onnxruntime's CPU kernel of ``onnx_op`` runs (measured on onnxruntime 1.17, 1.26 and 1.31:
    # LSTM, GRU and RNN run float16 and float32, none runs float64)
    element_types: tuple[str, ...] = ("float32", "float16")
    # the cell's step on values (the unrolled reader checks a step TensorFlow folded against it)
    step: Optional[StepEquation] = field(default=None, compare=False, repr=False)
    # attributes of a loop body graph through which tf2onnx's own rewriters would claim this family's
    # loops (cleared when this package's matchers take a loop)
    tf2onnx_contexts: tuple[str, ...] = ()
    # the family this kind is another form of (TF1's LSTMBlockCell op of the LSTM family), "" for a
    # family of its own: a reader that knows only the ONNX op a layer becomes takes the family itself
    form_of: str = ""

    @property
    def state_count(self) -> int:
        return len(self.state_roles)

    @property
    def default_activations(self) -> tuple[str, ...]:
        """The ONNX op's default activations, per direction (a node that uses exactly these may omit them)."""
        return RECURRENT_NODES[self.onnx_op].default_activations


class Direction(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"  # Keras go_backwards: steps run last to first, outputs stay in that order


@dataclass(frozen=True)
class Activation:
    """One ONNX recurrent activation, with its alpha/beta where it has them. A node's ``activation_alpha``
    and ``activation_beta`` lists are consumed in order by the functions that take them
    (:data:`TAKES_ALPHA`, :data:`TAKES_BETA`), as onnxruntime reads them."""

    name: str
    alpha: Optional[float] = None
    beta: Optional[float] = None

    def __str__(self) -> str:
        params = [f"{k}={v:g}" for k, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None]
        return f"{self.name}({', '.join(params)})" if params else self.name


TAKES_ALPHA = frozenset({"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"})
TAKES_BETA = frozenset({"Affine", "ScaledTanh", "HardSigmoid"})


# ONNX attributes of one family's node beyond those every recurrent node has (GRU's
# linear_before_reset): (name, value) pairs, set by the matcher that knows them.
OpAttributes = tuple[tuple[str, Any], ...]

# A weight in a loop body: a function that, given the values of the loop's inputs
# (slot -> array), returns the array. Matchers build these; adapters call them.
WeightSource = Callable[[Callable[[int], np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class GateForm:
    """One gate's pre-activation: x @ input_weight + h @ recurrent_weight + biases.

    ``input_bias`` is added outside any reset product, ``recurrent_bias`` inside it (GRU
    with reset_after); for every other gate ONNX adds both, so which one holds a bias
    does not matter there.
    """

    input_weight: WeightSource
    recurrent_weight: Optional[WeightSource]
    input_bias: Optional[WeightSource] = None
    recurrent_bias: Optional[WeightSource] = None
    peephole: Optional[WeightSource] = None  # LSTM: the weight of the cell state added to the gate (ONNX's P)


class MaskedOutput(enum.Enum):
    """What a masked layer outputs at a masked step."""

    CARRY = "carry"  # the previous step's output (zeros before the first kept step)
    ZERO = "zero"  # zeros (Keras does this inside Bidirectional)


@dataclass(frozen=True)
class Masking:
    """How a masked loop body treats masked steps: states hold, the output carries or zeros.

    A Keras loop reads a mask per step from a TensorList (``mask_slot``); a TF1 loop given a
    ``sequence_length`` masks the steps from each row's length on (``lengths``, the body's tensor
    of lengths), which ONNX's ``sequence_lens`` does itself."""

    mask_slot: Optional[int]  # the TensorList of per-step masks (None: masked by lengths)
    output: MaskedOutput
    output_slot: Optional[int]  # the loop variable that holds the previous output (None: not carried)
    zeros_slot: Optional[int] = None  # ZERO: the loop constant the output takes at masked steps
    lengths: Optional[str] = None  # each row's length, as the body reads it
    lengths_slot: Optional[int] = None  # the loop constant holding it, where the body reads it as one
    zeros: Optional[str] = None  # ZERO: the tensor the output takes at masked steps, as the body reads it


@dataclass(frozen=True)
class Skeleton:
    """The loop slots of a recurrent body (slot = position in the loop's variables)."""

    input_slot: int
    output_slot: int
    output_every_step: bool
    mask_slot: Optional[int]
    x_t: str
    mask_t: Optional[str]
    y_t: str  # the value written to the output list each step
    state_inputs: dict  # slot -> body input tensor, for slots the cell updates
    state_outputs: dict  # slot -> the tensor the body returns for that slot
    constant_slots: frozenset  # slots passed through unchanged
    time_input: str = ""  # the body's time index (the step being computed), where it has one

    def single_state(self, cell: str) -> tuple[int, str]:
        """(slot, previous value) of a cell whose one state is also its output (GRU, simple RNN)."""
        require(len(self.state_inputs) == 1, f"a {cell} carries 1 state, this loop carries {len(self.state_inputs)}")
        ((slot, previous),) = self.state_inputs.items()
        require(self.state_outputs[slot] == self.y_t, "the loop's state is not its per-step output")
        return slot, previous


@dataclass(frozen=True)
class BodyMatch:
    """What a matcher learned from a loop body; keyed by the body's function name."""

    kind: CellKind
    gates: tuple[GateForm, ...]  # in ONNX gate order
    activations: tuple[Activation, ...]  # in ONNX order (f, g, h for LSTM; f, g for GRU; f for RNN)
    states: tuple[tuple[StateRole, int], ...]  # ONNX state order -> loop slot
    input_slot: int  # the TensorList that feeds x_t
    output_slot: int  # the TensorList written with h_t
    output_every_step: bool  # written at the time index (all steps) or at a fixed index (last only)
    attributes: OpAttributes = ()  # the family's own ONNX attributes for this layer
    masking: Optional[Masking] = None
    note: str = ""  # what the native node computes otherwise than the source, said in the report
    # (tensor, its WeightSource or None when it varies, the value reading the body assumed it has): a
    # dropout's rate of zero, checked where the loop's inputs are known
    assumed: tuple = ()


@dataclass(frozen=True)
class StackMatch:
    """A body that steps several cells in turn (Keras ``StackedRNNCells``): cell k reads cell
    k-1's output, the top cell's output is the loop's. Each cell's match holds its own states."""

    cells: tuple[BodyMatch, ...]  # bottom first

    kind_name = "StackedRNNCells"  # the Keras form, as the report names it


@dataclass(frozen=True)
class Wiring:
    """Where one direction of a layer sits in the outer graph: its input and what it replaces."""

    x: str  # time-major input [T, B, F], in the order the Keras loop steps through it
    x_unreversed: Optional[str] = None  # for a backward pass: the input before Keras reversed it
    sequence_output: tuple[str, ...] = ()  # become Y squeezed to [T, B, H], in step order
    reversed_output: tuple[str, ...] = ()  # [B, T, H]: the step-order sequence reversed in time (Keras's
    # Bidirectional reverses its backward layer's output, putting a backward pass back in time order)
    time_order_output: tuple[str, ...] = ()  # the sequence in time order, laid out as X (a fused
    # bidirectional op's backward half)
    batch_major_output: tuple[str, ...] = ()  # [B, T, H]: the step-order sequence, batch-major (a TF1
    # static_rnn's outputs stacked along axis 1)
    last_output: tuple[str, ...] = ()  # become Y_h, [1, B, H]
    last_step_output: tuple[str, ...] = ()  # [B, H]: the output at the last step (an unrolled chain's), as Y_h
    final_states: tuple[tuple[StateRole, str], ...] = ()  # become a state, [B, H]
    initial_states: tuple[tuple[StateRole, str], ...] = ()  # [B, H] tensors; absent roles start at zero
    constant_states: tuple[StateRole, ...] = ()  # initial states that are constants (a stateful layer's, frozen)
    zero_states: tuple[StateRole, ...] = ()  # initial states given as zeros the emitter built (none of the model's)
    mask: Optional[str] = None  # time-major [T, B] or [T, B, 1] bool, in step order
    mask_unreversed: Optional[str] = None  # for a backward pass: the mask before Keras reversed it
    mask_source: str = ""  # where the mask comes from, for the report
    masked_output: Optional[MaskedOutput] = None
    # [B] integers: each row's length (TF1's sequence_length), the steps from it on masked (a mask of
    # post-padded rows, given as lengths); then ``mask`` is None
    lengths: Optional[str] = None
    # an unrolled layer unstacks its input (and mask) in time order whichever way it steps: a backward
    # pass's ``x`` and ``mask`` are then in time order, and the node reverses them when it runs forward
    reverse_x: bool = False
    # ``x``, ``x_unreversed`` and ``sequence_output`` are [B, T, ...], not time-major (TFLite's fused op)
    batch_major: bool = False


@dataclass(frozen=True, eq=False)
class Pass:
    """One direction of a layer: what one Keras while-loop computes, and where it sits."""

    loop: str  # the loop node's name
    name: str  # the Keras layer
    kind: CellKind
    direction: Direction
    hidden_size: int
    input_size: int
    dtype: np.dtype
    attributes: OpAttributes  # the family's own ONNX attributes (GRU: linear_before_reset)
    W: np.ndarray  # [G*H, F], ONNX gate order
    R: np.ndarray  # [G*H, H]
    B: np.ndarray  # [2*G*H] = [Wb, Rb]
    activations: tuple[Activation, ...]
    wiring: Wiring
    P: Optional[np.ndarray] = None  # LSTM's peepholes [3*H] = [Pi, Po, Pf], where the cell has them
    stack: tuple[int, int] = (0, 1)  # (this cell's position, cells) in a StackedRNNCells loop
    unrolled: int = 0  # an unrolled chain's number of steps (0: a while-loop)
    note: str = ""  # what the native node computes otherwise than the source, said in the report

    @property
    def stacked(self) -> bool:
        return self.stack[1] > 1


def with_hard_sigmoid_offsets_in_bias(pass_: Pass) -> Pass:
    """``pass_`` with every HardSigmoid a gate block goes through at ONNX's default beta of 0.5, the difference
    moved into that block's input bias: ``HardSigmoid(a, b)(v) = HardSigmoid(a, 0.5)(v + (b - 0.5) / a)``.
    Keras 3's GRU reads as beta 0 with its hard_sigmoid's ``+ 3`` in the bias; OpenVINO 2026.4 computes a
    HardSigmoid whose beta is 0 with beta 0.5, silently (measured)."""
    functions = RECURRENT_NODES[pass_.kind.onnx_op].gate_functions
    shifted = [k for k, a in enumerate(pass_.activations) if a.name == "HardSigmoid" and a.alpha and a.alpha > 0
               and a.beta is not None and a.beta != 0.5 and k in functions]
    if not shifted:
        return pass_
    hidden, bias = pass_.hidden_size, pass_.B.copy()
    for block, function in enumerate(functions):
        if function in shifted:
            a = pass_.activations[function]
            bias[block * hidden:(block + 1) * hidden] += bias.dtype.type((a.beta - 0.5) / a.alpha)
    activations = tuple(Activation(a.name, a.alpha, 0.5) if k in shifted else a
                        for k, a in enumerate(pass_.activations))
    return dataclasses.replace(pass_, B=bias, activations=activations)


class NodeDirection(enum.Enum):
    """The ONNX ``direction`` attribute."""

    FORWARD = "forward"
    REVERSE = "reverse"
    BIDIRECTIONAL = "bidirectional"


@dataclass(frozen=True, eq=False)
class RecurrentLayer:
    """One ONNX recurrent node to emit: one pass, or a forward and a backward pass."""

    x: str  # the node's X, time-major
    direction: NodeDirection
    passes: tuple[Pass, ...]  # in ONNX direction order
    mask: Optional[str] = None  # time-major mask in the order of X
    mask_key: Optional[tuple] = None  # equal for masks equal by construction (computed once)
    lengths: Optional[str] = None  # [B] each row's length, the steps from it on masked (instead of a mask)
    reverse_x: bool = False  # X and the mask are the given tensors reversed in time (built by the emitter)
    batch_major: bool = False  # X and the sequence outputs the passes replace are [B, T, ...]

    @property
    def masked(self) -> bool:
        """Whether steps of the layer are masked: by a mask, or past each row's length."""
        return self.mask is not None or self.lengths is not None

    def runs_forward(self, index: int) -> bool:
        """Whether pass ``index`` steps through X first to last."""
        return self.direction is NodeDirection.FORWARD or (
            self.direction is NodeDirection.BIDIRECTIONAL and index == 0)

    @property
    def first(self) -> Pass:
        return self.passes[0]

    @property
    def name(self) -> str:
        return self.first.name
