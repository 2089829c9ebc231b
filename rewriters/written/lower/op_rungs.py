"""The rungs of single ops other than recurrent nodes and Scans: each op a runtime lacks, or reads otherwise
than ONNX, written in ops it computes, the same values. Chosen by (op type, obstacle kind) from
:data:`OP_RUNGS`; each takes (node, shapes, constants, writer) and returns True once the graph changed, or
raises :class:`.steps.CannotLower` naming what it cannot write.
"""
from __future__ import annotations

import numpy as np

from ...runtimes import Kind
from ..builder import Writer
from ..graph import attribute, slot
from .steps import CannotLower


def _gemm_as_matmul(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """``Gemm(A, B, C)`` (no transpose of A, scales of 1) as ``Add(C, MatMul(A, B))``: the same sum."""
    if attribute(node, "transA", 0) or attribute(node, "alpha", 1.0) != 1.0 or attribute(node, "beta", 1.0) != 1.0:
        raise CannotLower("a Gemm with transA or scales other than 1 has no MatMul form here")
    b = node.input[1]
    if attribute(node, "transB", 0):
        if constants.get(b) is None:
            raise CannotLower("a Gemm with a computed transposed B has no MatMul form here")
        b = w.const(constants[b].T.copy(), f"{b}_transposed")
    product = w.op("MatMul", [node.input[0], b], f"{node.output[0]}_product")
    w.op("Add", [node.input[2], product], f"{node.output[0]}_sum", output_names=[node.output[0]])
    w.replace([node])
    return True


def _split_sized(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``Split`` into equal parts given those parts' sizes: the same pieces."""
    shape = shapes.get(node.input[0])
    axis = int(attribute(node, "axis", 0))
    count = len(node.output)
    if not shape or not shape[axis % len(shape)] or shape[axis % len(shape)] % count:
        raise CannotLower("a Split into equal parts of an axis of unknown size has no sized form here")
    size = shape[axis % len(shape)] // count
    if w.opset >= 13:
        inputs = [node.input[0], w.ints([size] * count, f"{node.output[0]}_sizes")]
        w.op("Split", inputs, node.name or node.output[0], output_names=list(node.output), axis=axis)
    else:
        w.op("Split", [node.input[0]], node.name or node.output[0], output_names=list(node.output), axis=axis,
             split=[size] * count)
    w.replace([node])
    return True


def _slice_as_pieces(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``Slice`` of constant starts, ends, axes and steps over static axes, each axis it steps along other than
    by 1 (a reversal, every other step) as that axis's pieces concatenated in the order picked, the others by a
    ``Slice`` of step 1: the same values."""
    shape = shapes.get(node.input[0])
    names = [slot(node.input, k) for k in range(1, 5)]  # starts, ends, axes, steps ("" where not given)
    starts, ends, axes, steps = (constants.get(name) if name else None for name in names)
    if not shape or any(name and value is None for name, value in zip(names, (starts, ends, axes, steps))):
        raise CannotLower("a Slice of computed bounds or of unknown shape has no pieces form here")
    axes = np.ravel(axes) if axes is not None else np.arange(np.size(starts))
    steps = np.ravel(steps) if steps is not None else np.ones(np.size(starts), np.int64)
    x = node.input[0]
    for start, end, axis, step in zip(np.ravel(starts), np.ravel(ends), axes, steps):
        axis = int(axis) % len(shape)
        if not shape[axis]:
            raise CannotLower("a Slice along an axis of unknown size has no pieces form here")
        picked = list(range(*slice(int(start), int(end), int(step)).indices(shape[axis])))
        if picked == list(range(shape[axis])):
            continue
        base = f"{node.output[0]}_axis{axis}"
        if int(step) == 1:
            x = w.slice(x, picked[0], picked[-1] + 1, axis, base) if picked else w.slice(x, 0, 0, axis, base)
            continue
        pieces = w.split(x, [1] * shape[axis], axis, f"{base}_piece")
        x = w.op("Concat", [pieces[i] for i in picked], f"{base}_picked", axis=axis) if picked else \
            w.slice(x, 0, 0, axis, base)
    if w.nodes and list(w.nodes[-1].output) == [x]:  # the last piece written is the Slice's output
        w.nodes[-1].output[0] = node.output[0]
    else:
        w.op("Identity", [x], f"{node.output[0]}_sliced", output_names=[node.output[0]])
    w.replace([node])
    return True


def _gather_as_pieces(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``GatherElements`` whose constant index picks along its axis the same positions at every other
    coordinate (a reversal, a permutation): the data's pieces along that axis concatenated in the picked
    order, the same values."""
    index, shape = constants.get(node.input[1]), shapes.get(node.input[0])
    if index is None or not shape or not all(shape) or index.ndim != len(shape):
        raise CannotLower("a GatherElements of a computed index or of unknown shapes has no pieces form here")
    axis = int(attribute(node, "axis", 0)) % len(shape)
    if any(index.shape[k] != shape[k] for k in range(len(shape)) if k != axis):
        raise CannotLower("a GatherElements of an index shaped otherwise than its data has no pieces form here")
    picks = np.moveaxis(np.asarray(index, np.int64) % shape[axis], axis, 0).reshape(index.shape[axis], -1)
    if not (picks == picks[:, :1]).all():
        raise CannotLower("a GatherElements picking differently along its other axes has no pieces form here")
    pieces = w.split(node.input[0], [1] * shape[axis], axis, f"{node.output[0]}_piece")
    w.op("Concat", [pieces[int(k)] for k in picks[:, 0]], f"{node.output[0]}_picked",
         output_names=[node.output[0]], axis=axis)
    w.replace([node])
    return True


def _concat_of_parts(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``Concat`` without its empty constant inputs (an ``Identity`` where one input is left): the same."""
    kept = [name for name in node.input if not (name in constants and np.size(constants[name]) == 0)]
    if not kept:
        raise CannotLower("a Concat of empty constants alone has no form here")
    if len(kept) == 1:
        w.op("Identity", kept, node.name or node.output[0], output_names=list(node.output))
    else:
        w.op("Concat", kept, node.name or node.output[0], output_names=list(node.output),
             axis=int(attribute(node, "axis")))
    w.replace([node])
    return True


def _pad_moded(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``Pad`` that leaves its mode to ONNX's default, with that mode written: the same."""
    w.op("Pad", list(node.input), node.name or node.output[0], output_names=list(node.output), mode="constant")
    w.replace([node])
    return True


def _reduced_with_a_unit_axis(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``ReduceSum`` or ``ReduceMean`` of one axis given as an input, of a tensor with another axis of size 1 (a
    batch of one), as the same reduction of both axes, the unit axis put back where ``keepdims`` is 0: the same
    values (ncnn reduces along two axes given, and along one given not at all; measured at ranks 2-4)."""
    shape = shapes.get(node.input[0])
    axis = int(np.ravel(constants[node.input[1]])[0]) % len(shape) if shape else 0
    unit = next((k for k, size in enumerate(shape or ()) if size == 1 and k != axis), None)
    if unit is None or not 2 <= len(shape) <= 4:
        raise CannotLower(f"a {node.op_type} of one axis has another form here only for a tensor of rank 2 to 4 "
                          "with another axis of size 1")
    name, keep = node.name or node.output[0], int(attribute(node, "keepdims", 1))
    both = w.ints(sorted((unit, axis)), f"{node.output[0]}_axes")
    reduced = w.op(node.op_type, [node.input[0], both], name if keep else f"{node.output[0]}_reduced",
                   output_names=list(node.output) if keep else None, keepdims=keep)
    if not keep:  # the unit axis back, where it stands once the reduced one is gone
        w.op("Unsqueeze", [reduced, w.ints([unit - (axis < unit)], f"{node.output[0]}_unit")],
             f"{node.output[0]}_unsqueezed", output_names=list(node.output))
    w.replace([node])
    return True


OP_RUNGS = {("Concat", Kind.EMPTY): _concat_of_parts, ("GatherElements", Kind.GATHER): _gather_as_pieces,
            ("Slice", Kind.SLICE): _slice_as_pieces, ("Gemm", Kind.GEMM): _gemm_as_matmul,
            ("Split", Kind.SPLIT): _split_sized, ("Pad", Kind.PAD): _pad_moded,
            **{(op, Kind.REDUCE): _reduced_with_a_unit_axis for op in ("ReduceSum", "ReduceMean")}}
