"""TensorFlow's ``GRUBlockCell`` op stepped in a loop (contrib's ``GRUBlockCell``): the GRU family, one op.

The op computes ``[r, u] = sigmoid([x, h] @ w_ru + b_ru)``, ``c = tanh([x, r * h] @ w_c + b_c)`` and
``h' = u * h + (1 - u) * c``: ONNX's GRU with ``linear_before_reset=0`` and z = u.
"""
from __future__ import annotations

import numpy as np

from ..description import Activation, BodyMatch, CellKind, GateForm, Skeleton, StateRole, require
from . import gru
from .body import BodyView

KIND = CellKind(keras_name="GRUBlockCell", onnx_op="GRU", scope_hint="gru_block_cell", state_roles=(StateRole.HIDDEN,),
                step=gru.step, form_of="GRU")

_OP = "GRUBlockCell"
_X, _H, _W_RU, _W_C, _B_RU, _B_C = range(6)  # the op's inputs
_H_OUT = 3  # its output h


def match(view: BodyView, skeleton: Skeleton) -> BodyMatch:
    h_slot, h_prev = skeleton.single_state("GRU")
    op = view.producer(skeleton.y_t)
    require(op is not None and op.type == _OP and skeleton.y_t == op.output[_H_OUT],
            f"h_t is not a {_OP} op's h", skeleton.y_t)
    operands = view.operands(op)
    require(operands[_X] == view.resolve(skeleton.x_t) and operands[_H] == view.resolve(h_prev),
            f"the {_OP} op does not read x_t and the loop's state", op.name)
    sources = [view.static_source(operands[index], skeleton.constant_slots) for index in (_W_RU, _W_C, _B_RU, _B_C)]
    require(all(source is not None for source in sources), f"the {_OP} op's weights vary from step to step", op.name)
    w_ru, w_c, b_ru, b_c = sources

    def columns(source, block: int, count: int, rows: str):
        """Block ``block`` of ``count`` column blocks of a kernel, its x rows (the first F) or h rows (the last H)."""
        def value(values):
            w = np.asarray(source(values))
            hidden = w.shape[1] // count
            part = w[:w.shape[0] - hidden] if rows == "x" else w[w.shape[0] - hidden:]
            return part[:, block * hidden:(block + 1) * hidden]
        return value

    def bias(source, block: int, count: int):
        def value(values):
            b = np.asarray(source(values))
            hidden = b.shape[0] // count
            return b[block * hidden:(block + 1) * hidden]
        return value

    update, reset = (GateForm(columns(w_ru, block, 2, "x"), columns(w_ru, block, 2, "h"), bias(b_ru, block, 2))
                     for block in (1, 0))
    candidate = GateForm(columns(w_c, 0, 1, "x"), columns(w_c, 0, 1, "h"), bias(b_c, 0, 1))
    return BodyMatch(
        kind=KIND, gates=(update, reset, candidate), activations=(Activation("Sigmoid"), Activation("Tanh")),
        states=((StateRole.HIDDEN, h_slot),), input_slot=skeleton.input_slot, output_slot=skeleton.output_slot,
        output_every_step=skeleton.output_every_step, attributes=(("linear_before_reset", 0),))
