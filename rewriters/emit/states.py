"""How a layer's recurrent states meet the model: wiring variants of the one emitter.

:data:`MODEL_STATES`: the states the model itself gives and uses. :class:`StreamedStates`: every
state is a graph input and a graph output, to run a sequence chunk by chunk.
:data:`EXPLICIT_ZERO_STATES` (the portable target): a state that starts at zero is given to the node
as zeros. One is chosen per conversion by :func:`select_states`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from onnx import helper
from tf2onnx import utils

from ..description import Direction, NodeDirection, NoMatch, RecurrentLayer, StateRole
from .emission import Emission


class StateWiring:
    """How a layer's recurrent states meet the model: the states the model itself gives and uses.

    A wiring variant of the one emitter; :class:`StreamedStates` is the other. The emitter asks
    the variant three things: the layer as the node will see it, what a carried output starts
    from, and what to add once the node is built.
    """

    def prepare(self, graph, layer: RecurrentLayer, x: str) -> RecurrentLayer:
        """``layer`` as the node is built from it (``x``: its input as the graph has it now)."""
        return layer

    def carried_start(self, emission: Emission, index: int) -> Optional[str]:
        """[B, H]: what a masked pass's carried output is before its first kept step (None: zeros,
        as Keras starts every call)."""
        return None

    def final_roles(self, layer: RecurrentLayer) -> set:
        """The states the layer's node must give at its end: those the model uses."""
        return {role for pass_ in layer.passes for role, _ in pass_.wiring.final_states}

    def finish(self, emission: Emission, node) -> tuple:
        """Add what the variant needs around the built node; returns the :class:`StateIO` it added."""
        return ()


MODEL_STATES = StateWiring()


class ExplicitZeroStates(StateWiring):
    """The model's own states, with every state that starts at zero given to the node as zeros
    [B, H] built from the input's shape rather than left absent. tract builds an absent initial state
    inside its recurrent op from facts that go wrong: an LSTM whose sequence and final states are
    all used stops there ("Clashing resolution for expression"), and a batch size left symbolic aborts
    the process; given states run in both cases (measured on tract 0.23)."""

    def prepare(self, graph, layer: RecurrentLayer, x: str) -> RecurrentLayer:
        zeros = {}  # hidden size -> the [B, H] zeros of this layer's input
        passes = []
        for pass_ in layer.passes:
            given = dict(pass_.wiring.initial_states)
            absent = [role for role in pass_.kind.state_roles if role not in given]
            if not absent:
                passes.append(pass_)
                continue
            if pass_.hidden_size not in zeros:
                zeros[pass_.hidden_size] = _zero_states(graph, x, layer.batch_major, pass_)
            states = pass_.wiring.initial_states + tuple((role, zeros[pass_.hidden_size]) for role in absent)
            constant = pass_.wiring.constant_states + tuple(absent)
            passes.append(replace(pass_, wiring=replace(pass_.wiring, initial_states=states,
                                                        constant_states=constant, zero_states=tuple(absent))))
        return replace(layer, passes=tuple(passes))


EXPLICIT_ZERO_STATES = ExplicitZeroStates()


def _zero_states(graph, x: str, batch_major: bool, pass_) -> str:
    """[B, H] zeros of the pass's type, B read from the layer's input ``x`` at run time."""
    shape = graph.make_node("Shape", [x]).output[0]
    batch_axis = graph.make_const(utils.make_name(f"{pass_.name}_batch_axis"),
                                  np.array([0 if batch_major else 1], np.int64)).output[0]
    batch = graph.make_node("Gather", [shape, batch_axis], attr={"axis": 0}).output[0]
    hidden = graph.make_const(utils.make_name(f"{pass_.name}_hidden_size"),
                              np.array([pass_.hidden_size], np.int64)).output[0]
    size = graph.make_node("Concat", [batch, hidden], attr={"axis": 0}).output[0]
    zero = helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(np.dtype(pass_.dtype)), [1], [0])
    return graph.make_node("ConstantOfShape", [size], attr={"value": zero}).output[0]


@dataclass(frozen=True)
class StateIO:
    """One recurrent state of a streamed layer as the model's input and output."""

    input: str  # graph input the layer starts from ("" when the model gives that state itself)
    output: str  # graph output: the state the layer ends with


class StreamedStates(StateWiring):
    """Streaming: every state is a graph input ``<layer>/h_in`` (``c_in``) the layer starts from and
    a graph output ``<layer>/h_out`` (``c_out``) it ends with, [batch, units] (a StackedRNNCells
    layer's cell k: ``<layer>/cell_<k>/h_in`` ...). Feeding each call's
    outputs as the next call's inputs runs a sequence chunk by chunk exactly as whole.

    A state the model computes from its own inputs (``initial_state=``) stays the model's; a
    constant one (zero, or a stateful layer's stored state, frozen) becomes the input. Where the
    batch size is fixed, that input carries the constant as its default: an initializer of the
    same name, which a feed overrides (a caller feeding only the data starts where the source
    does). With a dynamic batch no initializer can hold it, and the input stays required. Only
    forward passes of the main graph stream: a backward pass needs the future.
    """

    def prepare(self, graph, layer: RecurrentLayer, x: str) -> RecurrentLayer:
        if layer.direction is not NodeDirection.FORWARD or layer.first.direction is not Direction.FORWARD:
            raise NoMatch("cannot stream: a backward pass (Bidirectional or go_backwards) needs the whole "
                          "sequence")
        if graph.parent_graph is not None:
            raise NoMatch("cannot stream: the layer runs inside another loop")
        pass_ = layer.first
        given = dict(pass_.wiring.initial_states)
        states = []
        for role in pass_.kind.state_roles:
            tensor = given.get(role)
            if tensor is not None and role not in pass_.wiring.constant_states:
                states.append((role, tensor))
                continue
            name = self.name(pass_, role, "in")
            require_free(graph, name)
            shape = [_batch_of(graph, layer.x, layer.batch_major), pass_.hidden_size]
            dtype = helper.np_dtype_to_tensor_dtype(np.dtype(pass_.dtype))
            default = default_state(graph, tensor, shape, pass_.dtype)
            if default is None:
                graph.add_graph_input(name, dtype, shape)
            else:
                const = graph.make_const(utils.make_name(f"{name}_default"), default)
                graph.add_graph_input_with_default(name, const, dtype, shape)
            states.append((role, name))
        streamed = replace(pass_, wiring=replace(pass_.wiring, initial_states=tuple(states), constant_states=()))
        return replace(layer, passes=(streamed,))

    def final_roles(self, layer: RecurrentLayer) -> set:
        return super().final_roles(layer) | set(layer.first.kind.state_roles)  # every state is an output

    def carried_start(self, emission: Emission, index: int) -> Optional[str]:
        # in a whole sequence a masked step repeats the last kept step's output, which is the state
        # carried in (zero only where the stream starts)
        tensor = dict(emission.layer.passes[index].wiring.initial_states).get(StateRole.HIDDEN)
        return tensor if tensor == self.name(emission.layer.passes[index], StateRole.HIDDEN, "in") else None

    def finish(self, emission: Emission, node) -> tuple:
        pass_, graph = emission.layer.first, emission.graph
        given = dict(pass_.wiring.initial_states)
        added = []
        for role in pass_.kind.state_roles:
            name = self.name(pass_, role, "out")
            require_free(graph, name)
            graph.make_node("Identity", [emission.final_state(node, 0, role)], outputs=[name])
            graph.add_graph_output(name, helper.np_dtype_to_tensor_dtype(np.dtype(pass_.dtype)),
                                   [_batch_of(graph, emission.layer.x, emission.layer.batch_major),
                                    pass_.hidden_size])
            streamed_in = self.name(pass_, role, "in")
            added.append(StateIO(streamed_in if given.get(role) == streamed_in else "", name))
        return tuple(added)

    @staticmethod
    def name(pass_, role: StateRole, end: str) -> str:
        """``<layer>/h_in`` ...; a stack's cells are ``<layer>/cell_<k>/h_in`` ..."""
        cell = f"/cell_{pass_.stack[0]}" if pass_.stacked else ""
        return f"{pass_.name}{cell}/{role.value}_{end}"


def require_free(graph, name: str) -> None:
    """A streamed state's name must not be taken (two layers of one name, or a model tensor)."""
    if graph.get_node_by_output(name) is not None:
        raise NoMatch(f"cannot stream: the name {name} is already taken in the graph")


def _batch_of(graph, x: str, batch_major: bool = False) -> int:
    """The batch size of a layer's input, time-major [T, B, F] (or [B, T, F]), -1 when dynamic."""
    shape = graph.get_shape(x) or []
    axis = 0 if batch_major else 1
    return shape[axis] if len(shape) == 3 and shape[axis] is not None and shape[axis] > 0 else -1


def default_state(graph, start: Optional[str], shape: list, dtype) -> Optional[np.ndarray]:
    """The value a streamed state input defaults to: what the layer starts from in the source
    (``start``, a constant; None: zeros) as [batch, units], or None where no initializer can hold it
    exactly (a dynamic batch, a start that is not a constant of that shape)."""
    if any(size is None or size < 0 for size in shape):
        return None
    if start is None:
        return np.zeros(shape, np.dtype(dtype))
    node = graph.get_node_by_output(start)
    while node is not None and node.type == "Identity":
        node = graph.get_node_by_output(node.input[0])
    if node is None or not node.is_const():
        return None
    value = node.get_tensor_value(as_list=False)
    try:
        return np.array(np.broadcast_to(value, shape), np.dtype(dtype))
    except ValueError:  # not of the layer's batch and units: no default rather than a wrong one
        return None


def select_states(streaming: bool, portable: bool = False) -> StateWiring:
    """The state wiring of a conversion: streamed states, or the model's own (in the portable form
    with zero states given explicitly)."""
    if streaming:
        return StreamedStates()
    return EXPLICIT_ZERO_STATES if portable else MODEL_STATES
