"""GRU cells: Keras ``GRU`` / ``GRUCell`` in Keras 3 and tf_keras, both ``reset_after`` modes.

Keras computes ``h' = z * h + (1 - z) * hh`` with ``z = ra(x Wz + h Rz + b)``,
``r = ra(x Wr + h Rr + b)`` and
- reset_after=True:  ``hh = a(x Wh + bx + r * (h Rh + bh))``  -> ONNX linear_before_reset=1;
- reset_after=False: ``hh = a(x Wh + b + (r * h) Rh)``        -> ONNX linear_before_reset=0.
Keras's gate order z, r, h is ONNX's; the activations are (f, g) = (ra, a).
"""
from __future__ import annotations

import numpy as np

from ..description import BodyMatch, CellKind, GateForm, NoMatch, Skeleton, StateRole, require
from .affine import Term
from .body import BodyView
from .equations import gate_terms


def step(x, states: dict, weights: dict, activations, attributes: dict) -> dict:
    """ONNX's GRU step: gates z, r, h; activations f, g; ``linear_before_reset`` chooses where the
    reset gate applies."""
    f, g = activations
    h = states[StateRole.HIDDEN]
    inputs, recurrents = gate_terms(x, h, weights, 3)
    z, r = f(inputs[0] + recurrents[0]), f(inputs[1] + recurrents[1])
    if attributes.get("linear_before_reset", 0):
        candidate = g(inputs[2] + r * recurrents[2])
    else:
        hidden = h.shape[-1]
        R_h, Rb_h = weights["R"][2 * hidden:], np.split(weights["B"], 2)[1][2 * hidden:]
        candidate = g(inputs[2] + (r * h) @ R_h.T + Rb_h)
    return {StateRole.HIDDEN: (1 - z) * candidate + z * h}


KIND = CellKind(keras_name="GRU", onnx_op="GRU", scope_hint="gru", state_roles=(StateRole.HIDDEN,), step=step,
                tf2onnx_contexts=("gru_rewriter_context",))


def match(view: BodyView, skeleton: Skeleton) -> BodyMatch:
    h_slot, h_prev = skeleton.single_state("GRU")
    x_t, constants = skeleton.x_t, skeleton.constant_slots

    # h_t = z * h_{t-1} + (1 - z) * hh
    products = [view.producer(t) for t in view.sum_terms(skeleton.y_t)]
    require(len(products) == 2 and all(p is not None and p.type == "Mul" for p in products),
            "h_t is not z * h + (1 - z) * hh", skeleton.y_t)
    carried = [p for p in products if h_prev in view.operands(p)]
    require(len(carried) == 1, "h_t does not scale the previous state once", skeleton.y_t)
    (z,) = [t for t in view.operands(carried[0]) if t != h_prev]
    (update,) = [p for p in products if p is not carried[0]]
    one_minus_z = [t for t in view.operands(update) if _is_one_minus(view, t, z)]
    require(len(one_minus_z) == 1, "the new-state term is not (1 - z) * hh", update.name)
    (candidate,) = [t for t in view.operands(update) if t != one_minus_z[0]]

    z_pre, gate_activation = view.gate(z)
    hh_pre, candidate_activation = view.gate(candidate)

    # hh's pre-activation: x terms plus one reset term
    terms = view.terms(hh_pre, constants)
    resets = [(term, reading) for term, reading in ((t, _reset_reading(view, t, h_prev, constants)) for t in terms)
              if reading is not None]
    require(len(resets) == 1, "the candidate does not apply the reset gate once", hh_pre)
    ((reset_term, (r, recurrent_part, reset_after)),) = resets
    r_pre, r_activation = view.gate(r)
    require(r_activation == gate_activation, "the reset and update gates use different activations",
            r)

    input_part = [t for t in terms if t is not reset_term]
    x_affine = view.affine_of(input_part, x_t, h_prev, hh_pre)
    require(x_affine.recurrent_weight is None and x_affine.input_weight is not None,
            "the candidate's input part is not x @ W + b", hh_pre)
    if reset_after:
        h_affine = view.affine(recurrent_part, x_t, h_prev, constants)
        require(h_affine.input_weight is None and h_affine.recurrent_weight is not None,
                "the reset gate does not scale h @ R + b", reset_term.tensor)
        candidate_form = GateForm(x_affine.input_weight, h_affine.recurrent_weight,
                                  x_affine.bias(), h_affine.bias())
    else:
        candidate_form = GateForm(x_affine.input_weight, recurrent_part, x_affine.bias())

    def form(pre: str) -> GateForm:
        affine = view.affine(pre, x_t, h_prev, constants)
        require(affine.input_weight is not None, "a GRU gate has no x_t @ W term", pre)
        return GateForm(affine.input_weight, affine.recurrent_weight, affine.bias())

    return BodyMatch(
        kind=KIND,
        gates=(form(z_pre), form(r_pre), candidate_form),
        activations=(gate_activation, candidate_activation),
        states=((StateRole.HIDDEN, h_slot),),
        input_slot=skeleton.input_slot, output_slot=skeleton.output_slot,
        output_every_step=skeleton.output_every_step,
        attributes=(("linear_before_reset", int(reset_after)),))


def _is_one_minus(view: BodyView, tensor: str, z: str) -> bool:
    node = view.producer(tensor)
    return (node is not None and node.type == "Sub"
            and view.scalar(node.input[0]) == 1.0 and view.resolve(node.input[1]) == z)


def _reset_reading(view: BodyView, term: Term, h_prev: str, constants: frozenset):
    """For the reset term of hh: (r, what r applies to, reset_after), else None.

    reset_after:  ``r * (h @ Rh + bh)``, a leaf that is no product -> (r, that tensor, True)
    reset_before: ``(r * h) @ Rh``, a product                       -> (r, the weight Rh, False)
    """
    if term.weight is not None and term.operand is not None:
        inner = view.producer(term.operand)
        if inner is None or inner.type != "Mul":
            return None
        factors = [view.unbroadcast(t) for t in inner.input]
        if view.unbroadcast(h_prev) not in factors:
            return None
        (r,) = [t for t in factors if t != view.unbroadcast(h_prev)] or [h_prev]
        return r, term.weight, False
    node = view.producer(term.tensor)
    if term.weight is not None or node is None or node.type != "Mul":
        return None
    first, second = view.operands(node)
    # the part r scales depends on h alone (h @ Rh + bh); r itself depends on x too
    for r, part in ((first, second), (second, first)):
        if _recurrent_only(view, part, h_prev, constants) and not _recurrent_only(view, r, h_prev, constants):
            return r, part, True
    return None


def _recurrent_only(view: BodyView, tensor: str, h_prev: str, constants: frozenset) -> bool:
    """Whether ``tensor`` is ``h @ R (+ b)``, with no x term and no activation."""
    try:
        affine = view.affine(tensor, x_t="", h_prev=h_prev, constant_slots=constants)
    except NoMatch:
        return False
    return affine.recurrent_weight is not None and affine.input_weight is None
