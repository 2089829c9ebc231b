"""Rewrites of a recurrent node that keep it native: the rungs above its steps written out.

- :func:`as_forward_nodes`: a ``reverse`` or ``bidirectional`` node as forward nodes, each backward pass
  over its input reversed along time by a ``Slice`` of step -1 and its ``Y`` reversed back (IREE lowers
  forward nodes only, but for LSTM's bidirectional one). Exact without ``sequence_lens``, whose per-row
  reversal this is not.
- :func:`last_step_as_y_h`: a read ``Y_h`` taken from ``Y`` (the last step of a forward pass, the first
  of a backward one), for runtimes that fail on a read ``Y_h`` (ncnn, rknn's GRU). Exact without
  ``sequence_lens``.
- :func:`zero_initial_states`: absent initial states given as zeros of the static batch (rknn's LSTM), and
  :func:`drop_zero_states`: initial states that are constant zeros left out, as ONNX's default (ncnn maps
  a node only without them).
- :func:`read_through_squeeze`: a forward node's ``Y`` read once, by a ``Squeeze`` of its direction axis,
  and its ``Y_h`` taken from that (ncnn maps a node only when so read); :func:`read_merged`: a bidirectional
  node's ``Y`` read once, its directions merged into the hidden axis, ``[T, B, 2H]`` (ncnn's own
  bidirectional layer), each direction's part and ``Y_h`` taken from that.
"""
from __future__ import annotations

import numpy as np
import onnx

from ...obstacles import squeezes_axis_1
from ...runtimes import BIDIRECTIONAL, FORWARD, INITIAL_C, INITIAL_H, REVERSE, SEQUENCE_LENS, Y_C, Y_H, Y
from ..builder import INT64_MAX, INT64_MIN, Writer
from ..graph import attribute, attributes, readers_of
from ..graph import slot as _slot
from .steps import CannotLower


def _reversed(w: Writer, x: str, base: str) -> str:
    return w.slice(x, -1, INT64_MIN, 0, base, step=-1)


def as_forward_nodes(graph: onnx.GraphProto, node: onnx.NodeProto, constants, w: Writer) -> None:
    """``node`` (reverse or bidirectional) as one forward node per direction."""
    direction = attribute(node, "direction")
    if _slot(node.input, SEQUENCE_LENS):
        raise CannotLower(f"a {direction} {node.op_type} with sequence_lens reverses each row by its length")
    base = (node.name or node.output[0]).replace("/", "_")
    count = 2 if direction == BIDIRECTIONAL else 1
    ys, hs, cs = [], [], []
    for d in range(count):
        backward = direction == REVERSE or d == 1
        inputs = [_reversed(w, node.input[0], f"{base}_x_reversed") if backward else node.input[0]]
        for slot in range(1, len(node.input)):
            name = node.input[slot]
            if not name or slot == SEQUENCE_LENS:
                inputs.append("")
            elif count == 1:
                inputs.append(name)
            else:
                value = constants(name)
                inputs.append(w.const(value[d:d + 1], f"{base}_{slot}_d{d}") if value is not None
                              else w.slice(name, d, d + 1, 0, f"{base}_{slot}_d{d}"))
        attrs = {k: v for k, v in attributes(node).items() if k != "direction"}
        if "activations" in attrs:
            per = len(attrs["activations"]) // count
            for key in ("activations", "activation_alpha", "activation_beta"):
                if key in attrs and len(attrs[key]) == per * count:
                    attrs[key] = attrs[key][d * per:(d + 1) * per]
        outs = [w.name(f"{base}_d{d}_Y"), w.name(f"{base}_d{d}_Y_h")] + \
               ([w.name(f"{base}_d{d}_Y_c")] if node.op_type == "LSTM" else [])
        w.op(node.op_type, inputs, f"{base}_d{d}", output_names=outs, direction="forward", **attrs)
        ys.append(_reversed(w, outs[0], f"{base}_d{d}_Y_back") if backward else outs[0])
        hs.append(outs[1])
        cs.append(outs[2] if node.op_type == "LSTM" else None)
    for slot, parts, axis in ((Y, ys, 1), (Y_H, hs, 0), (Y_C, cs, 0)):
        name = _slot(node.output, slot)
        if name:
            w.op("Concat" if count > 1 else "Identity", parts if count > 1 else parts[:1], f"{base}_out{slot}",
                 output_names=[name], **({"axis": axis} if count > 1 else {}))
    w.replace([node])


def last_step_as_y_h(graph: onnx.GraphProto, node: onnx.NodeProto, w: Writer) -> None:
    """``node``'s read ``Y_h`` computed from its ``Y`` instead."""
    if _slot(node.input, SEQUENCE_LENS):
        raise CannotLower(f"{node.op_type}'s Y_h with sequence_lens is not Y's last step")
    base = (node.name or node.output[0]).replace("/", "_")
    direction = attribute(node, "direction", "forward")
    y = node.output[Y] or w.name(f"{base}_Y")
    parts = []
    for d, backward in enumerate([direction == REVERSE] if direction != BIDIRECTIONAL else [False, True]):
        step = w.slice(y, 0 if backward else -1, 1 if backward else INT64_MAX, 0, f"{base}_last{d}")
        if direction == BIDIRECTIONAL:
            step = w.slice(step, d, d + 1, 1, f"{base}_last{d}_dir")
        parts.append(w.squeeze(step, [0], f"{base}_last{d}_h"))
    y_h = node.output[Y_H]
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.output[Y] = y
    copy.output[Y_H] = ""
    while copy.output and not copy.output[-1]:  # no trailing unnamed output (onnxruntime 1.26 refuses one)
        del copy.output[-1]
    w.nodes.insert(0, copy)
    w.op("Concat" if len(parts) > 1 else "Identity", parts, f"{base}_Y_h", output_names=[y_h],
         **({"axis": 0} if len(parts) > 1 else {}))
    w.replace([node])


def zero_initial_states(graph: onnx.GraphProto, node: onnx.NodeProto, batch: int, dtype, w: Writer) -> None:
    """``node`` given zeros [directions, batch, hidden] for each initial state it lacks."""
    directions = 2 if attribute(node, "direction", "forward") == BIDIRECTIONAL else 1
    hidden = int(attribute(node, "hidden_size"))
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    slots = (INITIAL_H, INITIAL_C) if node.op_type == "LSTM" else (INITIAL_H,)
    while len(copy.input) <= slots[-1]:
        copy.input.append("")
    for slot in slots:
        if not copy.input[slot]:
            copy.input[slot] = w.const(np.zeros((directions, batch, hidden), dtype),
                                       f"{node.name or node.output[0]}_zeros{slot}")
    w.nodes.append(copy)
    w.replace([node])


def zero_states_given(node: onnx.NodeProto, constants: dict) -> bool:
    """Whether every initial state ``node`` is given is a constant of zeros."""
    given = [_slot(node.input, slot) for slot in (INITIAL_H, INITIAL_C) if _slot(node.input, slot)]
    return all(constants.get(name) is not None and not np.any(constants[name]) for name in given)


def drop_zero_states(graph: onnx.GraphProto, node: onnx.NodeProto, w: Writer) -> None:
    """``node`` without its constant zero initial states: ONNX's default initial state is zero."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for slot in (INITIAL_H, INITIAL_C):
        if len(copy.input) > slot:
            copy.input[slot] = ""
    while copy.input and not copy.input[-1]:
        del copy.input[-1]
    w.nodes.append(copy)
    w.replace([node])


def read_through_squeeze(graph: onnx.GraphProto, node: onnx.NodeProto, constants: dict, w: Writer) -> None:
    """A forward ``node`` whose ``Y`` one ``Squeeze`` of axis 1 alone reads: a Squeeze of axis 1 that read it
    becomes an ``Identity`` of that one, any other reader reads its ``Unsqueeze``, and ``Y_h`` is its last step.
    Exact without ``sequence_lens``."""
    if _slot(node.input, SEQUENCE_LENS) or attribute(node, "direction", FORWARD) != FORWARD:
        raise CannotLower(f"only a forward {node.op_type} without sequence_lens reads its Y_h from Y")
    if any(o.name == node.output[Y] for o in graph.output):
        raise CannotLower(f"{node.op_type}'s Y is a model output")
    base = (node.name or node.output[0]).replace("/", "_")
    y = node.output[Y] or w.name(f"{base}_Y")
    readers = [r for r in readers_of(graph).get(y, []) if r is not None] if node.output[Y] else []
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.output[Y] = y
    y_h = _slot(node.output, Y_H)
    if y_h:
        copy.output[Y_H] = ""
    while copy.output and not copy.output[-1]:
        del copy.output[-1]
    w.nodes.append(copy)
    squeezed = w.squeeze(y, [1], f"{base}_Y_squeezed")
    squeeze_of_y = w.nodes[-1].name  # the one reader of Y left
    if y_h:
        w.op("Slice", [squeezed, w.ints([-1], f"{base}_last_start"), w.ints([INT64_MAX], f"{base}_last_end"),
                       w.ints([0], f"{base}_last_axis")], f"{base}_last", output_names=[y_h])
    replaced, others = [], []
    for reader in readers:
        if squeezes_axis_1(reader, constants):
            w.op("Identity", [squeezed], f"{base}_squeezed_again", output_names=list(reader.output))
            replaced.append(reader)
        else:
            others.append(reader)
    unsqueezed = w.unsqueeze(squeezed, [1], f"{base}_Y_again") if others else None
    w.replace([node] + replaced)
    for reader in graph.node if others else ():  # the others read the Unsqueeze, in place: they stand after it
        if reader.name != squeeze_of_y and y in reader.input:
            for k, name in enumerate(reader.input):
                if name == y:
                    reader.input[k] = unsqueezed


def read_merged(graph: onnx.GraphProto, node: onnx.NodeProto, constants: dict, shape: list, w: Writer) -> None:
    """A bidirectional ``node`` (``shape``: its input's, static) whose ``Y`` is read once, by a Transpose(0, 2, 1, 3)
    and a Reshape to [T, B, 2H]: a Slice of one direction along axis 1 that only Squeezes of axis 1 read becomes
    a Slice of that along its last axis, any other reader reads [T, 2, B, H] made back from it, ``Y_h`` is the
    forward half's last step and the backward half's first. Exact without ``sequence_lens``."""
    if _slot(node.input, SEQUENCE_LENS) or attribute(node, "direction") != BIDIRECTIONAL:
        raise CannotLower(f"only a bidirectional {node.op_type} without sequence_lens is read merged")
    if any(o.name == node.output[Y] for o in graph.output):
        raise CannotLower(f"{node.op_type}'s Y is a model output")
    base, hidden = (node.name or node.output[0]).replace("/", "_"), int(attribute(node, "hidden_size"))
    steps, batch = shape[0], shape[1]
    if not steps or not batch:
        raise CannotLower(f"a bidirectional {node.op_type} is read merged only at a fixed time length and batch")
    y, every = node.output[Y] or w.name(f"{base}_Y"), readers_of(graph)
    readers = [r for r in every.get(y, []) if r is not None] if node.output[Y] else []
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.output[Y] = y
    y_h = _slot(node.output, Y_H) if _slot(node.output, Y_H) in every else ""  # an unread Y_h is not made
    if len(copy.output) > Y_H:
        copy.output[Y_H] = ""
    while copy.output and not copy.output[-1]:
        del copy.output[-1]
    w.nodes.append(copy)
    swapped = w.op("Transpose", [y], f"{base}_Y_swapped", perm=[0, 2, 1, 3])
    merged = w.op("Reshape", [swapped, w.ints([steps, batch, 2 * hidden], f"{base}_merged_shape")], f"{base}_merged")
    if y_h:
        halves = [w.slice(w.slice(merged, t, t + 1, 0, f"{base}_h{d}_step"), d * hidden, (d + 1) * hidden, 2,
                          f"{base}_h{d}") for d, t in ((0, steps - 1), (1, 0))]
        w.op("Concat", halves, f"{base}_Y_h", output_names=[y_h], axis=0)
    replaced, others = _direction_reads(graph, readers, merged, hidden, constants, w, base)
    if others:
        unmerged = w.op("Reshape", [merged, w.ints([steps, batch, 2, hidden], f"{base}_unmerged_shape")],
                        f"{base}_unmerged")
        again = w.op("Transpose", [unmerged], f"{base}_Y_again", perm=[0, 2, 1, 3])
    w.replace([node] + replaced)
    for reader in others:  # in place: they stand after what they now read
        for k, name in enumerate(reader.input):
            if name == y:
                reader.input[k] = again


def _direction_reads(graph, readers: list, merged: str, hidden: int, constants: dict, w: Writer, base: str) -> tuple:
    """(the readers of Y replaced, the others): each Slice of one direction along axis 1 read only by Squeezes of
    axis 1 is replaced, with those Squeezes, by a Slice of ``merged`` along its last axis."""
    every = readers_of(graph)
    replaced, others = [], []
    for reader in readers:
        values = [constants.get(name) for name in reader.input[1:4]] if reader.op_type == "Slice" else [None]
        steps = constants.get(reader.input[4]) if reader.op_type == "Slice" and _slot(reader.input, 4) else [1]
        squeezes = every.get(reader.output[0], [None]) if reader.op_type == "Slice" else [None]
        if any(v is None or np.size(v) != 1 for v in values) or steps is None or int(np.ravel(steps)[0]) != 1 \
                or int(np.ravel(values[2])[0]) != 1 or not all(squeezes_axis_1(q, constants) for q in squeezes):
            others.append(reader)
            continue
        d = int(np.ravel(values[0])[0]) % 2
        if min(int(np.ravel(values[1])[0]), 2) != d + 1:
            others.append(reader)
            continue
        part = w.slice(merged, d * hidden, (d + 1) * hidden, 2, f"{base}_part{d}")
        for squeeze in squeezes:
            w.op("Identity", [part], f"{base}_part{d}_read", output_names=list(squeeze.output))
        replaced += [reader] + squeezes
    return replaced, others
