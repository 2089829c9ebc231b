"""An ONNX ``LSTM``, ``GRU`` or ``RNN`` node as its steps written out for a fixed time length.

The lowest rung of the ladder, for a runtime that computes no recurrent node (TVM) or not this one
(ncnn's missing ``linear_before_reset=0``, a read ``Y_c``): the node's own equations, as ONNX defines
them, in ``MatMul``, ``Add``, ``Mul``, ``Split``, ``Concat`` and the activations' ops, which every runtime
computes. The input's work stays one ``MatMul`` over every step (the input weights and both biases that
sit outside the recurrence, added once), split into steps; each step adds its recurrent product and
applies the gates. A reverse pass walks the steps backwards and writes each output at its own step, as
ONNX's reverse direction does. A constant or computed ``sequence_lens`` (forward passes only) keeps a
row's state and zeroes its output from its length on, by arithmetic on a 0/1 step mask (exact for finite
values). What this cannot write (weights that are not constants, ``input_forget``, ``layout=1``, a reverse
pass with ``sequence_lens``) raises :class:`CannotLower` naming it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ...description import RECURRENT_NODES, TAKES_ALPHA, TAKES_BETA, Activation
from ...runtimes import (
    FORWARD,
    INITIAL_C,
    INITIAL_H,
    PEEPHOLES,
    REVERSE,
    SEQUENCE_LENS,
    Y_C,
    Y_H,
    Y,
)
from ..builder import Writer
from ..graph import attribute


class CannotLower(Exception):
    """A node the lowering cannot write in the runtime's ops; the message says why."""


def activations_of(node: onnx.NodeProto, directions: int) -> list:
    """Per direction, the node's activation functions with their alpha and beta, the lists consumed in order
    by the functions that take them, as onnxruntime reads them (read by position, a list of one value per
    function gives a bidirectional node's second HardSigmoid another function's value: measured)."""
    op = node.op_type
    names = list(attribute(node, "activations", []))
    per = len(RECURRENT_NODES[op].default_activations)
    names = names or list(RECURRENT_NODES[op].default_activations) * directions
    alphas, betas = iter(attribute(node, "activation_alpha", [])), iter(attribute(node, "activation_beta", []))
    made = [Activation(n, next(alphas, None) if n in TAKES_ALPHA else None,
                       next(betas, None) if n in TAKES_BETA else None) for n in names]
    return [made[d * per:(d + 1) * per] for d in range(directions)]


def apply(w: Writer, activation: Activation, x: str, base: str) -> str:
    """``x`` through one of ONNX's recurrent activation functions, in plain ops."""
    name, alpha, beta = activation.name.lower(), activation.alpha, activation.beta
    if name in ("sigmoid", "tanh", "relu", "softplus"):
        return w.op({"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "softplus": "Softplus"}[name], [x], base)
    if name == "softsign":  # x / (1 + |x|): IREE 3.13 has no Softsign op below opset 22; pnnx takes x / (|x| + 1)
        # for its F.softsign, which ncnn has no layer for, and leaves 1 + |x| as it is (measured)
        one_plus = w.op("Add", [w.const(w.float(1.0), f"{base}_one"), w.op("Abs", [x], base)], base)
        return w.op("Div", [x, one_plus], base)
    if name == "thresholdedrelu":
        return w.op("ThresholdedRelu", [x], base, alpha=1.0 if alpha is None else alpha)
    if name == "hardsigmoid":
        return w.op("HardSigmoid", [x], base, alpha=0.2 if alpha is None else alpha,
                    beta=0.5 if beta is None else beta)
    if name == "leakyrelu":
        return w.op("LeakyRelu", [x], base, alpha=0.01 if alpha is None else alpha)
    if name == "elu":
        return w.op("Elu", [x], base, alpha=1.0 if alpha is None else alpha)
    if name == "affine":
        scaled = w.op("Mul", [x, w.const(w.float(1.0 if alpha is None else alpha), f"{base}_alpha")], base)
        return w.op("Add", [scaled, w.const(w.float(0.0 if beta is None else beta), f"{base}_beta")], base)
    if name == "scaledtanh":
        inner = w.op("Mul", [x, w.const(w.float(1.0 if beta is None else beta), f"{base}_beta")], base)
        return w.op("Mul", [w.op("Tanh", [inner], base),
                            w.const(w.float(1.0 if alpha is None else alpha), f"{base}_alpha")], base)
    raise CannotLower(f"activation {activation.name} has no plain-op form here")


@dataclass
class _Pass:
    """One direction of the node, its constants as numpy arrays."""

    w: np.ndarray  # [G*H, F]
    r: np.ndarray  # [G*H, H]
    wb: np.ndarray  # [G*H]
    rb: np.ndarray  # [G*H]
    p: np.ndarray  # [3H] or None
    reverse: bool
    activations: list
    linear_before_reset: bool = False


def node_as_steps(graph: onnx.GraphProto, node: onnx.NodeProto, steps: int, batch: int, constants, w: Writer) -> None:
    """Write ``node`` (in ``graph``) as ``steps`` steps; ``constants(name)`` reads a constant's value (or None);
    ``batch`` is the static batch size (for zero initial states)."""
    op, hidden = node.op_type, int(attribute(node, "hidden_size"))
    direction = attribute(node, "direction", FORWARD)
    if attribute(node, "layout", 0) or attribute(node, "input_forget", 0):
        raise CannotLower(f"{op} with layout=1 or input_forget has no steps form here")
    passes = passes_of(node, constants, hidden, direction)
    lengths = node.input[SEQUENCE_LENS] if len(node.input) > SEQUENCE_LENS and node.input[SEQUENCE_LENS] else ""
    if lengths and any(p.reverse for p in passes):
        raise CannotLower(f"a reverse {op} pass with sequence_lens has no steps form here")
    base = (node.name or node.output[0]).replace("/", "_")
    w.dtype = passes[0].w.dtype
    x = node.input[0]
    clip = attribute(node, "clip")
    masks = _step_masks(w, lengths, steps, base) if lengths else None
    ys, finals_h, finals_c = [], [], []
    for d, p in enumerate(passes):
        h0 = _initial(w, node, INITIAL_H, d, len(passes), batch, hidden, f"{base}_h0")
        c0 = _initial(w, node, INITIAL_C, d, len(passes), batch, hidden, f"{base}_c0") if op == "LSTM" else None
        y, h, c = _direction(w, op, p, x, steps, hidden, h0, c0, clip, masks, f"{base}_d{d}")
        ys.append(w.unsqueeze(y, [1], f"{base}_y{d}"))
        finals_h.append(h)
        finals_c.append(c)
    outputs = list(node.output) + [""] * (3 - len(node.output))
    if outputs[Y]:
        w.op("Concat", ys, f"{base}_Y", output_names=[outputs[Y]], axis=1)
    if outputs[Y_H]:
        w.op("Concat", finals_h, f"{base}_Y_h", output_names=[outputs[Y_H]], axis=0)
    if op == "LSTM" and outputs[Y_C]:
        w.op("Concat", finals_c, f"{base}_Y_c", output_names=[outputs[Y_C]], axis=0)
    w.replace([node])


def passes_of(node, constants, hidden: int, direction: str) -> list:
    """The node's directions, their weights read as constants (``constants(name)``: a value or None)."""
    op, gates = node.op_type, RECURRENT_NODES[node.op_type].gates
    values = [constants(node.input[k]) if len(node.input) > k and node.input[k] else None for k in (1, 2, 3)]
    if values[0] is None or values[1] is None or (len(node.input) > 3 and node.input[3] and values[2] is None):
        raise CannotLower(f"{op}'s weights are not constants")
    peep = constants(node.input[PEEPHOLES]) if len(node.input) > PEEPHOLES and node.input[PEEPHOLES] else None
    if len(node.input) > PEEPHOLES and node.input[PEEPHOLES] and peep is None:
        raise CannotLower(f"{op}'s peepholes are not constants")
    count = values[0].shape[0]
    activations = activations_of(node, count)
    passes = []
    for d in range(count):
        bias = values[2][d] if values[2] is not None else np.zeros(2 * gates * hidden, values[0].dtype)
        passes.append(_Pass(values[0][d], values[1][d], bias[:gates * hidden], bias[gates * hidden:],
                            None if peep is None else peep[d], direction == REVERSE or (d == 1), activations[d],
                            bool(attribute(node, "linear_before_reset", 0))))
    return passes


def _initial(w: Writer, node, slot: int, d: int, count: int, batch: int, hidden: int, base: str) -> str:
    """[1, B, H]: the pass's initial state, given (sliced to its direction) or zeros."""
    given = node.input[slot] if len(node.input) > slot else ""
    if given:
        return w.slice(given, d, d + 1, 0, base) if count > 1 else given
    if not batch:
        raise CannotLower(f"{node.op_type} without initial states needs a static batch to start from zeros")
    return w.const(np.zeros((1, batch, hidden), w.dtype), base)


def _step_masks(w: Writer, lengths: str, steps: int, base: str) -> list:
    """Per step, [1, B, 1] floats: 1 where the step is within the row's length, else 0."""
    lengths = w.op("Cast", [lengths], f"{base}_lengths", to=onnx.TensorProto.INT64)
    masks = []
    for t in range(steps):
        within = w.op("Less", [w.const(np.int64(t), f"{base}_t{t}"), lengths], f"{base}_within{t}")
        as_float = w.op("Cast", [within], f"{base}_mask{t}", to=onnx.helper.np_dtype_to_tensor_dtype(w.dtype))
        masks.append(w.op("Reshape", [as_float, w.ints([1, -1, 1], f"{base}_mask_shape")], f"{base}_mask{t}"))
    return masks


def _direction(w: Writer, op: str, p: _Pass, x: str, steps: int, hidden: int, h: str, c, clip, masks, base: str):
    """One pass: (Y of this direction [T, B, H], its final h [1, B, H], its final c or None)."""
    gates = RECURRENT_NODES[op].gates
    projected = w.op("MatMul", [x, w.const(np.ascontiguousarray(p.w.T), f"{base}_W")], f"{base}_xw")
    projected = w.op("Add", [projected, w.const(outside_bias(op, p, hidden), f"{base}_bias")], f"{base}_xwb")
    pieces = w.split(projected, [1] * steps, 0, f"{base}_step")
    order = range(steps - 1, -1, -1) if p.reverse else range(steps)
    outputs = [None] * steps
    for t in order:
        new_h, new_c = cell(w, op, p, pieces[t], h, c, hidden, gates, clip, f"{base}_t{t}")
        if masks is not None:
            new_h, new_c = (_keep(w, masks[t], new, old, f"{base}_t{t}_keep") if new else None
                            for new, old in ((new_h, h), (new_c, c)))
            outputs[t] = w.op("Mul", [new_h, masks[t]], f"{base}_t{t}_y")
        else:
            outputs[t] = new_h
        h, c = new_h, new_c
    if masks is not None:  # a row of length 0 ends in zero states, as onnxruntime computes it
        h, c = (w.op("Mul", [state, masks[0]], f"{base}_final") if state else None for state in (h, c))
    y = w.op("Concat", outputs, f"{base}_Y", axis=0) if steps > 1 else outputs[0]
    return y, h, c


def outside_bias(op: str, p: _Pass, hidden: int) -> np.ndarray:
    """The biases added to the input's part, outside the recurrence: both, but a GRU applying its reset after
    the product keeps its candidate's recurrent bias inside it."""
    outside = p.wb + p.rb
    if op == "GRU" and p.linear_before_reset:
        outside = np.concatenate([outside[:2 * hidden], p.wb[2 * hidden:]])
    return outside.astype(p.w.dtype)


def _keep(w: Writer, mask: str, new: str, old: str, base: str) -> str:
    """mask * new + (1 - mask) * old: new within the row's length, old past it."""
    one_minus = w.op("Sub", [w.const(w.float(1.0), f"{base}_one"), mask], base)
    return w.op("Add", [w.op("Mul", [new, mask], base), w.op("Mul", [old, one_minus], base)], base)


def cell(w: Writer, op: str, p: _Pass, xw: str, h: str, c, hidden: int, gates: int, clip, base: str):
    """One step: (the new h, the new c or None); ``xw`` [..., B, G*H] holds the input's part, ``h`` and ``c``
    [..., B, H] the states."""
    def act(k, value, name):
        if clip is not None:
            value = w.op("Clip", [value, w.const(w.float(-clip), f"{name}_lo"),
                                  w.const(w.float(clip), f"{name}_hi")], f"{name}_clip")
        return apply(w, p.activations[k], value, name)

    if op == "RNN":  # the recurrent product first: OpenVINO 2026.4 fuses a Scan's step Tanh(Add(x, MatMul(h, R)))
        # into its RNN cell with the operands mixed up, silently (measured: 1.7 off; the other order is exact)
        total = w.op("Add", [w.op("MatMul", [h, _weight(w, p, "R", p.r)], base), xw], base)
        return act(0, total, f"{base}_h"), None
    if op == "LSTM":
        total = w.op("Add", [xw, w.op("MatMul", [h, _weight(w, p, "R", p.r)], base)], base)
        i, o, f, g = w.split(total, [hidden] * 4, -1, f"{base}_gates")
        if p.p is not None:
            pi, po, pf = (w.const(p.p[k * hidden:(k + 1) * hidden], f"{base}_p{k}", key=(id(p), "P", k))
                          for k in range(3))
            i = w.op("Add", [i, w.op("Mul", [c, pi], base)], base)
            f = w.op("Add", [f, w.op("Mul", [c, pf], base)], base)
        i, f, g = act(0, i, f"{base}_i"), act(0, f, f"{base}_f"), act(1, g, f"{base}_g")
        new_c = w.op("Add", [w.op("Mul", [f, c], base), w.op("Mul", [i, g], base)], f"{base}_c")
        if p.p is not None:
            o = w.op("Add", [o, w.op("Mul", [new_c, po], base)], base)
        o = act(0, o, f"{base}_o")
        return w.op("Mul", [o, apply(w, p.activations[2], new_c, f"{base}_hc")], f"{base}_h"), new_c
    return _gru(w, p, xw, h, hidden, act, base), None


def _gru(w: Writer, p: _Pass, xw: str, h: str, hidden: int, act, base: str) -> str:
    xz, xr, xh = w.split(xw, [hidden] * 3, -1, f"{base}_x")
    if p.linear_before_reset:
        recurrent = w.op("Add", [w.op("MatMul", [h, _weight(w, p, "R", p.r)], base),
                                 w.const(np.concatenate([np.zeros(2 * hidden, p.rb.dtype), p.rb[2 * hidden:]]),
                                         f"{base}_Rbh", key=(id(p), "Rbh"))], base)
        hz, hr, hh = w.split(recurrent, [hidden] * 3, -1, f"{base}_r")
        z, r = act(0, w.op("Add", [xz, hz], base), f"{base}_z"), act(0, w.op("Add", [xr, hr], base), f"{base}_rg")
        candidate = act(1, w.op("Add", [xh, w.op("Mul", [r, hh], base)], base), f"{base}_hh")
    else:
        zr = w.op("MatMul", [h, _weight(w, p, "Rzr", p.r[:2 * hidden])], base)
        hz, hr = w.split(zr, [hidden] * 2, -1, f"{base}_r")
        z, r = act(0, w.op("Add", [xz, hz], base), f"{base}_z"), act(0, w.op("Add", [xr, hr], base), f"{base}_rg")
        reset = w.op("MatMul", [w.op("Mul", [r, h], base), _weight(w, p, "Rh", p.r[2 * hidden:])], base)
        candidate = act(1, w.op("Add", [xh, reset], base), f"{base}_hh")
    one_minus = w.op("Sub", [w.const(w.float(1.0), f"{base}_one"), z], base)
    return w.op("Add", [w.op("Mul", [one_minus, candidate], base), w.op("Mul", [z, h], base)], f"{base}_h")


def _weight(w: Writer, p: _Pass, what: str, matrix: np.ndarray) -> str:
    """``matrix`` transposed, as one constant every step of the pass reads."""
    return w.const(np.ascontiguousarray(matrix.T), what, key=(id(p), what))
