"""What a wiring variant sees of the node being emitted.

The emitter hands each node it builds to the variants chosen for the conversion (:mod:`.mask_forms`:
how the mask reaches the node; :mod:`.states`: how states meet the model) and they call back into it.
This protocol is that surface, declared apart: the variants import it, the emitter implements it and
imports the variants, so imports run one way (emitter -> variants -> this module).
"""
from __future__ import annotations

from typing import Any, Optional, Protocol

from ..description import RecurrentLayer, StateRole


class Emission(Protocol):
    """One recurrent node being built (:class:`.emitter.Emission` is the one implementation)."""

    graph: Any  # tf2onnx's graph the node is built in
    context: Any  # the conversion's :class:`.emitter.EmitContext`: its state wiring, its shared mask tensors
    layer: RecurrentLayer  # the layer, its states prepared by the state wiring
    mask: Any  # the layer's :class:`.mask_tensors.MaskTensors` (or lengths'), None when unmasked
    compacted: bool  # whether each row's kept steps are moved to its start before the node

    @property
    def x(self) -> str:
        """The node's input, in the order it steps through it."""

    def current(self, tensor: str) -> str:
        """``tensor`` as it is now called (another node may have replaced it)."""

    def reversed_in_time(self, sequence: str) -> str:
        """``sequence`` [T, B, ...] reversed along time."""

    @staticmethod
    def node_y(node) -> str:
        """The node's Y: [T, directions, B, H]."""

    def node_state(self, node, index: int, role: StateRole) -> str:
        """[1, B, H]: the state the node ends pass ``index`` with."""

    def final_state(self, node, index: int, role: StateRole) -> str:
        """[B, H]: pass ``index``'s last state as the layer gives it."""

    def per_direction(self, tensor: str, index: int, axis: int, builder: Optional[Any] = None) -> str:
        """Pass ``index``'s slice of a per-direction output, the direction axis removed."""

    def direction_of(self, y: str, index: int, tensors: Any) -> str:
        """[T, B, H]: pass ``index``'s outputs from the node's Y, as an ``If`` branch's output."""
