"""Simple RNN cells: Keras ``SimpleRNN`` / ``SimpleRNNCell`` in Keras 3 and tf_keras.

Keras computes ``h' = a(x @ kernel + bias + h @ recurrent_kernel)``: ONNX's RNN with one
activation f = a.
"""
from __future__ import annotations

from ..description import BodyMatch, CellKind, GateForm, Skeleton, StateRole, require
from .body import BodyView
from .equations import gate_terms


def step(x, states: dict, weights: dict, activations, attributes: dict) -> dict:
    """ONNX's RNN step: one gate, activation f."""
    (f,) = activations
    ((inputs,), (recurrent,)) = gate_terms(x, states[StateRole.HIDDEN], weights, 1)
    return {StateRole.HIDDEN: f(inputs + recurrent)}


KIND = CellKind(keras_name="SimpleRNN", onnx_op="RNN", scope_hint="simple_rnn", state_roles=(StateRole.HIDDEN,),
                step=step)


def match(view: BodyView, skeleton: Skeleton) -> BodyMatch:
    h_slot, h_prev = skeleton.single_state("simple RNN")
    pre, activation = view.gate(skeleton.y_t)
    affine = view.affine(pre, skeleton.x_t, h_prev, skeleton.constant_slots)
    require(affine.input_weight is not None, "h_t has no x_t @ W term", pre)
    return BodyMatch(
        kind=KIND,
        gates=(GateForm(affine.input_weight, affine.recurrent_weight, affine.bias()),),
        activations=(activation,),
        states=((StateRole.HIDDEN, h_slot),),
        input_slot=skeleton.input_slot, output_slot=skeleton.output_slot,
        output_every_step=skeleton.output_every_step)
