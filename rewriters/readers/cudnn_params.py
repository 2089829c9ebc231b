"""cuDNN's recurrent weights: the modes of TensorFlow's ``CudnnRNN`` ops and the layout of their flat
``params`` buffer, read into ONNX's W, R and B.

A mode is a cell family with cuDNN's gate order (LSTM: i, f, c, o; GRU: r, z, h, its recurrent bias
applied inside the reset gate's product, which is ONNX's ``linear_before_reset=1``; RNN: one gate,
tanh or relu). The buffer holds, for one layer in one direction, every gate's input matrix (``[H, F]``,
row-major), every gate's recurrent matrix (``[H, H]``), every gate's input bias, then every gate's
recurrent bias. For several layers or both directions, TensorFlow asks cuDNN for each piece's offset
and assumes none; :func:`pieces` lays them out as TensorFlow's canonical order and MXNet's cuDNN cell
do: every pseudo-layer's matrices first (layer 0 forward, layer 0 backward, layer 1 forward...), then
every pseudo-layer's biases in the same order (docs/conversions.md names the evidence and what no CPU
can confirm). Layer ``k > 0`` of a bidirectional stack reads both directions' outputs, ``2H`` features;
``skip_input`` leaves layer 0 without input matrices (it adds its input, of size ``H``, to each gate).

Nothing here reads a graph: the reader (:mod:`.cudnn`) and the verification's reference
(``tf2onnx_rnn.cudnn_reference``) both slice the buffer by :func:`pieces`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..description import Activation, require


@dataclass(frozen=True)
class Mode:
    """One ``rnn_mode``: the ONNX node it becomes and cuDNN's gate order against ONNX's."""

    name: str  # TensorFlow's rnn_mode
    onnx_op: str
    gates: tuple[str, ...]  # cuDNN's gate order
    onnx_gates: tuple[str, ...]  # ONNX's
    activations: tuple[Activation, ...]  # ONNX's, per direction
    attributes: tuple = ()  # the family's own ONNX attributes

    @property
    def gate_count(self) -> int:
        return len(self.gates)


_SIGMOID, _TANH = Activation("Sigmoid"), Activation("Tanh")
MODES = {mode.name: mode for mode in (
    Mode("lstm", "LSTM", ("i", "f", "c", "o"), ("i", "o", "f", "c"), (_SIGMOID, _TANH, _TANH)),
    Mode("gru", "GRU", ("r", "z", "h"), ("z", "r", "h"), (_SIGMOID, _TANH), (("linear_before_reset", 1),)),
    Mode("rnn_tanh", "RNN", ("h",), ("h",), (_TANH,)),
    Mode("rnn_relu", "RNN", ("h",), ("h",), (Activation("Relu"),)),
)}


@dataclass(frozen=True)
class Layout:
    """The sizes of one op: layers, directions, hidden size, input features, and whether layer 0 skips its
    input matrices (``skip_input``)."""

    mode: Mode
    layers: int
    directions: int
    hidden: int
    features: int
    skip_input: bool = False

    def features_of(self, layer: int) -> int:
        return self.features if layer == 0 else self.hidden * self.directions

    @property
    def pseudo_layers(self) -> int:
        return self.layers * self.directions


@dataclass(frozen=True)
class Piece:
    """One matrix or bias of the buffer: its pseudo-layer (``layer * directions + direction``), what it is
    (``W`` input matrix, ``R`` recurrent matrix, ``Wb`` input bias, ``Rb`` recurrent bias), its gate in
    cuDNN's order, its shape and where it starts."""

    pseudo_layer: int
    what: str
    gate: int
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def pieces(layout: Layout) -> list:
    """Every piece of the buffer in order: each pseudo-layer's matrices, then each one's biases."""
    found, offset = [], 0
    gates, hidden = layout.mode.gate_count, layout.hidden
    for section in (("W", "R"), ("Wb", "Rb")):
        for pseudo in range(layout.pseudo_layers):
            layer = pseudo // layout.directions
            for what in section:
                if what == "W" and layer == 0 and layout.skip_input:
                    continue
                shape = {"W": (hidden, layout.features_of(layer)), "R": (hidden, hidden)}.get(what, (hidden,))
                for gate in range(gates):
                    found.append(Piece(pseudo, what, gate, shape, offset))
                    offset += int(np.prod(shape))
    return found


def size_of(layout: Layout) -> int:
    last = pieces(layout)[-1]
    return last.offset + last.size


def solve_hidden(mode: Mode, size: int, features: int, layers: int, directions: int,
                 skip: Optional[bool]) -> Optional[int]:
    """The hidden size that makes the buffer ``size`` long, or None when none does (``skip``: whether
    layer 0 skips its input matrices; None: where the features equal the hidden size, as
    ``auto_select``)."""
    for hidden in range(1, size + 1):
        skips = (features == hidden) if skip is None else skip
        taken = size_of(Layout(mode, layers, directions, hidden, features, skips))
        if taken == size:
            return hidden
        if taken > size and size_of(Layout(mode, layers, directions, hidden, features, True)) > size:
            return None
    return None


def solve_features(mode: Mode, size: int, hidden: int, layers: int, directions: int,
                   input_mode: str) -> Optional[int]:
    """The input features that make the buffer ``size`` long, or None when none do: layer 0's input
    matrices take ``directions * gates * hidden`` values per feature (none when it skips its input,
    whose features are then the hidden size)."""
    if input_mode == "skip_input":
        return hidden if size_of(Layout(mode, layers, directions, hidden, hidden, True)) == size else None
    base = size_of(Layout(mode, layers, directions, hidden, 0))
    per_feature = directions * mode.gate_count * hidden
    features, rest = divmod(size - base, per_feature)
    if rest or features < 1 or (input_mode == "auto_select" and features == hidden):
        return None
    return features


@dataclass(frozen=True)
class Weights:
    """One pseudo-layer's ONNX W [G*H, F], R [G*H, H] and B [2*G*H], gates in ONNX's order."""

    W: np.ndarray
    R: np.ndarray
    B: np.ndarray


def decode(params: np.ndarray, layout: Layout, where: str = "") -> list:
    """Each pseudo-layer's :class:`Weights` from the flat buffer (a layer that skips its input gets
    identity input matrices: it adds its input, of the hidden size, to each gate)."""
    flat = np.asarray(params).reshape(-1)
    expected = size_of(layout)
    require(flat.size == expected, f"params holds {flat.size} values where {layout.layers} layer(s) of "
            f"{layout.mode.name} in {layout.directions} direction(s), {layout.features} features and hidden size "
            f"{layout.hidden} take {expected}", where)
    found: dict = {}
    for piece in pieces(layout):
        found[piece.pseudo_layer, piece.what, piece.gate] = flat[piece.offset:piece.offset + piece.size].reshape(
            piece.shape)
    mode, hidden = layout.mode, layout.hidden
    order = [mode.gates.index(gate) for gate in mode.onnx_gates]
    weights = []
    for pseudo in range(layout.pseudo_layers):
        def gates_of(what: str, pseudo=pseudo) -> np.ndarray:
            if (pseudo, what, 0) not in found:  # skip_input: the input itself, to each gate
                return np.concatenate([np.eye(hidden, dtype=flat.dtype)] * mode.gate_count)
            return np.concatenate([found[pseudo, what, gate] for gate in order])
        weights.append(Weights(W=gates_of("W"), R=gates_of("R"),
                               B=np.concatenate([gates_of("Wb"), gates_of("Rb")])))
    return weights
