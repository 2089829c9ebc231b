"""LSTM cells: Keras ``LSTM`` / ``LSTMCell`` in Keras 3 and tf_keras.

Keras computes, with ``z = x @ kernel + h @ recurrent_kernel + bias`` split into i, f, c, o:
``c' = ra(f) * c + ra(i) * a(c~)`` and ``h' = ra(o) * a(c')``. ONNX's LSTM gate order is
i, o, f, c and its activations are (f, g, h) = (ra, a, a).
"""
from __future__ import annotations

from ..description import BodyMatch, CellKind, GateForm, Skeleton, StateRole, require
from .body import BodyView
from .equations import gate_terms


def step(x, states: dict, weights: dict, activations, attributes: dict) -> dict:
    """ONNX's LSTM step: gates i, o, f, c; activations f, g, h."""
    f, g, h = activations
    i, o, forget, c = (a + b for a, b in zip(*gate_terms(x, states[StateRole.HIDDEN], weights, 4)))
    cell = f(forget) * states[StateRole.CELL] + f(i) * g(c)
    return {StateRole.HIDDEN: f(o) * h(cell), StateRole.CELL: cell}


KIND = CellKind(keras_name="LSTM", onnx_op="LSTM", scope_hint="lstm", state_roles=(StateRole.HIDDEN, StateRole.CELL),
                default_activations=("Sigmoid", "Tanh", "Tanh"), step=step,
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
    require(h_new is not None and h_new.type == "Mul", "h_t is not a product o * a(c_t)", skeleton.y_t)
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

    def form(gate: str) -> GateForm:
        pre, _ = view.gate(gate)
        affine = view.affine(pre, skeleton.x_t, h_prev, skeleton.constant_slots)
        require(affine.input_weight is not None, "an LSTM gate has no x_t @ W term", pre)
        return GateForm(affine.input_weight, affine.recurrent_weight, affine.bias())

    return BodyMatch(
        kind=KIND,
        gates=tuple(form(g) for g in (input_gate, output_gate, forget, candidate)),  # ONNX i, o, f, c
        activations=(gate_activation, factors[candidate][1], output_activation),
        states=((StateRole.HIDDEN, h_slot), (StateRole.CELL, c_slot)),
        input_slot=skeleton.input_slot, output_slot=skeleton.output_slot,
        output_every_step=skeleton.output_every_step)
