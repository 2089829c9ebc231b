"""Typed descriptions shared by the matchers, the adapters and the emitter.

A matcher reads a loop body and returns a :class:`BodyMatch`. An adapter turns it, together
with the loop node in the outer graph, into a :class:`RecurrentLayer`: everything the emitter
needs, with weights already in ONNX gate order. Nothing here knows ONNX input slots.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional

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


class CellKind(enum.Enum):
    LSTM = "LSTM"
    GRU = "GRU"
    SIMPLE_RNN = "RNN"

    @property
    def onnx_op(self) -> str:
        return self.value

    @property
    def keras_name(self) -> str:
        """The Keras layer this cell kind comes from, as the report names it."""
        return {"LSTM": "LSTM", "GRU": "GRU", "RNN": "SimpleRNN"}[self.value]

    @property
    def scope_hint(self) -> str:
        """What Keras's scopes for this kind contain (lstm_cell, gru_1, simple_rnn...)."""
        return {"LSTM": "lstm", "GRU": "gru", "RNN": "simple_rnn"}[self.value]

    @property
    def gate_count(self) -> int:
        return {"LSTM": 4, "GRU": 3, "RNN": 1}[self.value]

    @property
    def state_count(self) -> int:
        return len(self.state_roles)

    @property
    def state_roles(self) -> tuple:
        """The states in ONNX order (initial_h, initial_c)."""
        return (StateRole.HIDDEN, StateRole.CELL) if self is CellKind.LSTM else (StateRole.HIDDEN,)


class Direction(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"  # Keras go_backwards: steps run last to first, outputs stay in that order


class StateRole(enum.Enum):
    """What a loop-carried value of a recurrent body is."""

    HIDDEN = "h"
    CELL = "c"  # LSTM only


@dataclass(frozen=True)
class Activation:
    """One ONNX recurrent activation, with its alpha/beta where it has them."""

    name: str
    alpha: Optional[float] = None
    beta: Optional[float] = None

    def __str__(self) -> str:
        params = [f"{k}={v:g}" for k, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None]
        return f"{self.name}({', '.join(params)})" if params else self.name


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


class MaskedOutput(enum.Enum):
    """What a masked layer outputs at a masked step."""

    CARRY = "carry"  # the previous step's output (zeros before the first kept step)
    ZERO = "zero"  # zeros (Keras does this inside Bidirectional)


@dataclass(frozen=True)
class Masking:
    """How a masked loop body treats masked steps: states hold, the output carries or zeros."""

    mask_slot: int  # the TensorList of per-step masks
    output: MaskedOutput
    output_slot: int  # the loop variable that holds the previous output
    zeros_slot: Optional[int] = None  # ZERO: the loop constant the output takes at masked steps


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
    linear_before_reset: bool = False  # GRU only
    masking: Optional[Masking] = None

    def slot_of(self, role: StateRole) -> int:
        return dict(self.states)[role]


@dataclass(frozen=True)
class Wiring:
    """Where one direction of a layer sits in the outer graph: its input and what it replaces."""

    x: str  # time-major input [T, B, F], in the order the Keras loop steps through it
    x_unreversed: Optional[str] = None  # for a backward pass: the input before Keras reversed it
    sequence_output: tuple[str, ...] = ()  # become Y squeezed to [T, B, H], in step order
    reversed_output: tuple[str, ...] = ()  # [B, T, H]: the step-order sequence reversed in time (Keras's
    # Bidirectional reverses its backward layer's output, putting a backward pass back in time order)
    last_output: tuple[str, ...] = ()  # become Y_h, [1, B, H]
    final_states: tuple[tuple[StateRole, str], ...] = ()  # become a state, [B, H]
    initial_states: tuple[tuple[StateRole, str], ...] = ()  # [B, H] tensors; absent roles start at zero
    mask: Optional[str] = None  # time-major [T, B] or [T, B, 1] bool, in step order
    mask_unreversed: Optional[str] = None  # for a backward pass: the mask before Keras reversed it
    mask_source: str = ""  # where the mask comes from, for the report
    masked_output: Optional[MaskedOutput] = None


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
    linear_before_reset: bool  # GRU only
    W: np.ndarray  # [G*H, F], ONNX gate order
    R: np.ndarray  # [G*H, H]
    B: np.ndarray  # [2*G*H] = [Wb, Rb]
    activations: tuple[Activation, ...]
    wiring: Wiring


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
