"""The rungs of single ops other than recurrent nodes and Scans: each op a runtime lacks, or reads otherwise
than ONNX, written in ops it computes, the same values. Chosen by (op type, obstacle kind) from
:data:`OP_RUNGS`; each takes (node, shapes, constants, writer) and returns True once the graph changed, or
raises :class:`.steps.CannotLower` naming what it cannot write.
"""
from __future__ import annotations

import numpy as np

from ...runtimes import Kind
from ..builder import Writer
from ..graph import attribute
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


def _reversal_as_concat(node, shapes: dict, constants: dict, w: Writer) -> bool:
    """A ``Slice`` reversing a whole static axis, as its pieces concatenated in reverse order."""
    values = [constants.get(name) for name in node.input[1:5]]
    shape = shapes.get(node.input[0])
    if any(v is None for v in values) or shape is None or len(values[0]) != 1:
        raise CannotLower("a Slice with step -1 reverses no whole axis of known size")
    start, end, axis, step = (int(v[0]) for v in values)
    axis = axis % len(shape)
    size = shape[axis]
    if not size or step != -1 or start not in (-1, size - 1) or end > -size - 1:
        raise CannotLower("a Slice with step -1 reverses no whole axis of known size")
    pieces = w.split(node.input[0], [1] * shape[axis], axis, f"{node.output[0]}_piece")
    w.op("Concat", pieces[::-1], f"{node.output[0]}_reversed", output_names=[node.output[0]], axis=axis)
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


OP_RUNGS = {("Concat", Kind.EMPTY): _concat_of_parts, ("GatherElements", Kind.GATHER): _gather_as_pieces,
            ("Slice", Kind.SLICE): _reversal_as_concat, ("Gemm", Kind.GEMM): _gemm_as_matmul,
            ("Split", Kind.SPLIT): _split_sized, ("Pad", Kind.PAD): _pad_moded}
