"""LSTM cells: Keras ``LSTM`` / ``LSTMCell`` in Keras 3 and tf_keras.

Keras computes, with ``z = x @ kernel + h @ recurrent_kernel + bias`` split into i, f, c, o:
``c' = ra(f) * c + ra(i) * a(c~)`` and ``h' = ra(o) * a(c')``. ONNX's LSTM gate order is
i, o, f, c and its activations are (f, g, h) = (ra, a, a).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..description import BodyMatch, CellKind, GateForm, Skeleton, StateRole, require
from .affine import Term
from .body import BodyView
from .equations import gate_terms


def step(x, states: dict, weights: dict, activations, attributes: dict) -> dict:
    """ONNX's LSTM step: gates i, o, f, c; activations f, g, h; peepholes P = [Pi, Po, Pf] on the
    previous cell state (i, f) and the new one (o)."""
    f, g, h = activations
    i, o, forget, c = (a + b for a, b in zip(*gate_terms(x, states[StateRole.HIDDEN], weights, 4)))
    previous = states[StateRole.CELL]
    p_i, p_o, p_f = np.split(weights["P"], 3) if weights.get("P") is not None else (0, 0, 0)
    cell = f(forget + p_f * previous) * previous + f(i + p_i * previous) * g(c)
    return {StateRole.HIDDEN: f(o + p_o * cell) * h(cell), StateRole.CELL: cell}


KIND = CellKind(keras_name="LSTM", onnx_op="LSTM", scope_hint="lstm", state_roles=(StateRole.HIDDEN, StateRole.CELL),
                step=step,
                tf2onnx_contexts=("lstm_rewriter_context",))


def match(view: BodyView, skeleton: Skeleton) -> BodyMatch:
    require(len(skeleton.state_inputs) == 2,
            f"an LSTM carries 2 states, this loop carries {len(skeleton.state_inputs)}")
    h_slots = [s for s, out in skeleton.state_outputs.items() if out == skeleton.y_t]
    require(len(h_slots) == 1, "no state of the loop equals its per-step output")
    h_slot = h_slots[0]
    (c_slot,) = set(skeleton.state_inputs) - {h_slot}
    h_prev, c_prev = skeleton.state_inputs[h_slot], skeleton.state_inputs[c_slot]
    c_new = skeleton.state_outputs[c_slot]

    # h_t = ra(o) * a(c_t)
    h_new = view.producer(skeleton.y_t)
    require(h_new is None or h_new.type != "MatMul",
            "h_t is projected after o * a(c_t) (TF1's num_proj): ONNX's LSTM has no projection", skeleton.y_t)
    require(h_new is not None and h_new.type == "Mul", "h_t is not a product o * a(c_t)", skeleton.y_t)
    require(not any(_clips(view, t, c_new) for t in view.operands(h_new)),
            "the cell state is clipped each step (TF1's cell_clip): ONNX's LSTM has no such clip", h_new.name)
    h_factors = {t: view.gate(t) for t in view.operands(h_new)}
    from_cell = [t for t, (pre, _) in h_factors.items() if pre == c_new]
    require(len(from_cell) == 1 and len(h_factors) == 2,
            "h_t is not o * a(c_t) for the loop's cell state", h_new.name)
    (output_gate,) = set(h_factors) - set(from_cell)
    output_activation = h_factors[from_cell[0]][1]

    # c_t = ra(f) * c_{t-1} + ra(i) * a(c~)
    products = [view.producer(t) for t in view.sum_terms(c_new)]
    require(len(products) == 2 and all(p is not None and p.type == "Mul" for p in products),
            "c_t is not f * c + i * g", c_new)
    carried = [p for p in products if c_prev in view.operands(p)]
    require(len(carried) == 1, "c_t does not scale the previous cell state once", c_new)
    (forget,) = [t for t in view.operands(carried[0]) if t != c_prev]
    (update,) = [p for p in products if p is not carried[0]]
    factors = {t: view.gate(t) for t in view.operands(update)}
    gate_activation = view.gate(forget)[1]
    # i and c~ enter as a product, so when both use the gates' activation either may be i
    inputs = [t for t in view.operands(update) if factors[t][1] == gate_activation]
    require(inputs, "no factor of i * g uses the gates' activation", update.name)
    input_gate = inputs[0]
    (candidate,) = [t for t in view.operands(update) if t != input_gate] or [input_gate]
    require(view.gate(output_gate)[1] == gate_activation,
            "the output gate's activation differs from the input and forget gates'", h_new.name)

    def form(gate: str, cell_state: Optional[str] = None) -> GateForm:
        """The gate's affine form, and its peephole on ``cell_state`` where it adds one."""
        pre, _ = view.gate(gate)
        terms = view.terms(pre, skeleton.constant_slots)
        peepholes = [(term, weight) for term, weight in ((t, _peephole(view, t, cell_state, skeleton.constant_slots))
                                                         for t in terms) if weight is not None]
        require(len(peepholes) <= 1, "a gate adds the cell state more than once", pre)
        affine = view.affine_of([t for t in terms if all(t is not p for p, _ in peepholes)], skeleton.x_t, h_prev,
                                pre)
        require(affine.input_weight is not None, "an LSTM gate has no x_t @ W term", pre)
        return GateForm(affine.input_weight, affine.recurrent_weight, affine.bias(),
                        peephole=peepholes[0][1] if peepholes else None)

    return BodyMatch(
        kind=KIND,
        # ONNX i, o, f, c; peepholes read the previous cell state for i and f, the new one for o
        gates=(form(input_gate, c_prev), form(output_gate, c_new), form(forget, c_prev), form(candidate)),
        activations=(gate_activation, factors[candidate][1], output_activation),
        states=((StateRole.HIDDEN, h_slot), (StateRole.CELL, c_slot)),
        input_slot=skeleton.input_slot, output_slot=skeleton.output_slot,
        output_every_step=skeleton.output_every_step)


def _peephole(view: BodyView, term: Term, cell_state: Optional[str], constants: frozenset):
    """The weight of a term ``w * cell_state`` (a peephole: w one value per unit, constant), else None."""
    if cell_state is None or term.weight is not None:
        return None
    node = view.producer(term.tensor)
    if node is None or node.type != "Mul" or cell_state not in view.operands(node):
        return None
    (other,) = [t for t in view.operands(node) if t != cell_state] or [cell_state]
    weight = view.static_source(other, constants)
    shape = view.graph.get_shape(other)
    return weight if weight is not None and shape is not None and len(shape) == 1 else None


def _clips(view: BodyView, tensor: str, c_new: str) -> bool:
    """Whether ``tensor`` is an activation of a cell state the loop carries clipped (the state itself is
    the result of a Minimum or Maximum with a constant)."""
    _, chain = view.activation_chain(tensor)
    return any(node.type in ("Minimum", "Maximum") and node.output[0] == c_new for node in chain)
