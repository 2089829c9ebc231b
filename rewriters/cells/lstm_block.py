"""TensorFlow's ``LSTMBlockCell`` op stepped in a loop (contrib's ``LSTMBlockCell``): the LSTM family, one op.

The op computes ``[i, ci, f, o] = [x, h] @ w + b`` (the kernel's gate order is i, ci, f, o: the
order TensorFlow's kernel reads, whatever its documentation lists), ``i = sigmoid(i + wci * c)``,
``f = sigmoid(f + forget_bias + wcf * c)``, ``cs = i * tanh(ci) + f * c``, ``o = sigmoid(o + wco * cs)``
and ``h = o * tanh(cs)``, with peepholes only when ``use_peephole`` is set: ONNX's LSTM, with
``forget_bias`` in the forget gate's bias and the peepholes as P. A ``cell_clip`` above zero clips
``cs``, which ONNX's LSTM cannot.
"""
from __future__ import annotations

import numpy as np

from ..description import Activation, BodyMatch, CellKind, GateForm, Skeleton, StateRole, require
from . import lstm
from .body import BodyView

KIND = CellKind(keras_name="LSTMBlockCell", onnx_op="LSTM", scope_hint="lstm_block_cell",
                state_roles=(StateRole.HIDDEN, StateRole.CELL),
                step=lstm.step, form_of="LSTM")

_OP = "LSTMBlockCell"
_X, _CS, _H, _W, _WCI, _WCF, _WCO, _B = range(8)  # the op's inputs
_CS_OUT, _H_OUT = 1, 6  # its outputs
_I, _CI, _F, _O = range(4)  # the kernel's gate blocks


def match(view: BodyView, skeleton: Skeleton) -> BodyMatch:
    carried = len(skeleton.state_inputs)
    require(carried == 2, f"an LSTM carries 2 states, this loop carries {carried}")
    op = view.producer(skeleton.y_t)
    require(op is not None and op.type == _OP, f"h_t is not an {_OP} op's output", skeleton.y_t)
    require(skeleton.y_t == op.output[_H_OUT], f"the output is not the {_OP} op's h", skeleton.y_t)
    operands = view.operands(op)
    require(operands[_X] == view.resolve(skeleton.x_t), f"the {_OP} op does not read x_t", op.name)
    slots = {view.resolve(tensor): slot for slot, tensor in skeleton.state_inputs.items()}
    require(operands[_H] in slots and operands[_CS] in slots, f"the {_OP} op does not read the loop's states", op.name)
    h_slot, c_slot = slots[operands[_H]], slots[operands[_CS]]
    outputs = skeleton.state_outputs
    require(outputs[h_slot] == op.output[_H_OUT] and outputs[c_slot] == op.output[_CS_OUT],
            f"the loop does not carry the {_OP} op's h and cs", op.name)
    clip = float(op.get_attr_value("cell_clip", 3.0))
    require(clip <= 0, f"the {_OP} op clips its cell state at {clip:g} (cell_clip): ONNX's LSTM has no such clip",
            op.name)
    return BodyMatch(
        kind=KIND, gates=block_gates(view, skeleton, op, operands, (_I, _O, _F, _CI)),
        activations=(Activation("Sigmoid"), Activation("Tanh"), Activation("Tanh")),
        states=((StateRole.HIDDEN, h_slot), (StateRole.CELL, c_slot)),
        input_slot=skeleton.input_slot, output_slot=skeleton.output_slot, output_every_step=skeleton.output_every_step)


def block_gates(view: BodyView, skeleton: Skeleton, op, operands: list, order: tuple) -> tuple:
    """The ONNX gates (i, o, f, c) of the op's kernel blocks ``order``, with ``forget_bias`` and peepholes."""
    constants = skeleton.constant_slots
    sources = {index: view.static_source(operands[index], constants) for index in (_W, _B, _WCI, _WCF, _WCO)}
    require(sources[_W] is not None and sources[_B] is not None, f"the {_OP} op's weights vary from step to step",
            op.name)
    forget_bias = float(op.get_attr_value("forget_bias", 1.0))
    peepholes = bool(op.get_attr_value("use_peephole", False))
    diagonals = {_I: _WCI, _O: _WCO, _F: _WCF}

    def gate(block: int) -> GateForm:
        def kernel(values, rows):
            """The block's columns of the kernel's x rows (the first F) or h rows (the last H)."""
            w = np.asarray(sources[_W](values))
            hidden = w.shape[1] // 4
            part = w[:w.shape[0] - hidden] if rows == "x" else w[w.shape[0] - hidden:]
            return part[:, block * hidden:(block + 1) * hidden]

        def bias(values):
            b = np.asarray(sources[_B](values))
            hidden = b.shape[0] // 4
            return b[block * hidden:(block + 1) * hidden] + (forget_bias if block == _F else 0.0)

        peephole = None
        if peepholes and block in diagonals:
            require(sources[diagonals[block]] is not None, f"the {_OP} op's peepholes vary from step to step", op.name)
            peephole = sources[diagonals[block]]
        return GateForm(lambda values: kernel(values, "x"), lambda values: kernel(values, "h"), bias, peephole=peephole)

    return tuple(gate(block) for block in order)
