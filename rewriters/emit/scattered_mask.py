"""A mask's arithmetic in the scattered form: the portable and training forms' compaction and restore.

Each row's kept steps are written to the front of the node's input by one ``ScatterND`` and the
node's outputs read back by one ``GatherND``, with no ``If`` and no computed ``sequence_lens``
(tract takes it only as a constant, onnx2torch not at all). It reads the mask's own tensors from
:class:`.mask_tensors.MaskTensors`; the form that takes it is :class:`.mask_forms.PortableMask`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from onnx import TensorProto

from ..description import MaskedOutput
from .bool_masks import SWAP, axis_moves
from .mask_tensors import MaskTensors, _built_once


class ScatteredMask:
    """A mask's tensors in the scattered form, the portable and training forms' (no ``If``, no computed
    ``sequence_lens``): each row's kept steps written to the front of the node's input by one
    ScatterND, the node's outputs read back by one GatherND.

    The arithmetic runs on the mask as it is laid out (:attr:`MaskTensors.laid_out`: Keras's [B, T]
    mask is not transposed), on tensors with a trailing unit axis; a step's place in a time-major
    [T, B, ...] tensor is the pair (position, row). OpenVINO pays about 1.5 us per node under
    dynamic shapes, more than this work itself at batch 1: the form is built for few nodes (two
    CumSums, no Shape, Range or Flatten), and with onnx2torch's ops (no ScatterElements, no
    GatherND ``batch_dims``)."""

    def __init__(self, mask: MaskTensors):
        self.mask, self.graph, self.builder = mask, mask.graph, mask.builder
        self._cache: dict = {}

    @classmethod
    def of(cls, mask: MaskTensors) -> "ScatteredMask":
        """``mask``'s scattered form, one per mask (its layers share it)."""
        if "scattered" not in mask._cache:
            mask._cache["scattered"] = cls(mask)
        return mask._cache["scattered"]

    @property
    def laid_out(self) -> tuple:
        return self.mask.laid_out

    def op(self, op_type: str, inputs, **attrs) -> str:
        return self.mask.op(op_type, inputs, **attrs)

    def const(self, value, dtype=np.int64) -> str:
        return self.mask.const(value, dtype)

    @_built_once
    def laid_bool(self) -> str:
        """The bool mask as laid out, with a trailing unit axis: [B, T, 1] or [T, B, 1]."""
        mask = self.laid_out[0]
        if self.graph.get_dtype(mask) != TensorProto.BOOL:
            mask = self.op("Cast", [mask], to=TensorProto.BOOL)
        return self.builder.make_unsqueeze({"data": mask, "axes": [2]})

    @_built_once
    def laid_ints(self) -> str:
        """:attr:`laid_bool` as int64 0/1 (a Where: tract's CumSum cannot add a Cast's ints, see :attr:`ints`)."""
        return self.op("Where", [self.laid_bool, self.const(1), self.const(0)])

    @_built_once
    def kept_through(self) -> str:
        """Kept steps up to and including each step, laid out: its compacted position plus one when kept."""
        return self.op("CumSum", [self.laid_ints, self.const(self.laid_out[1])], exclusive=0, reverse=0)

    @_built_once
    def masked_through(self) -> str:
        """Masked steps up to and including each step, laid out."""
        masked = self.op("Where", [self.laid_bool, self.const(0), self.const(1)])
        return self.op("CumSum", [masked, self.const(self.laid_out[1])], exclusive=0, reverse=0)

    @_built_once
    def laid_counts(self) -> str:
        """Each row's kept steps: [B, 1, 1] or [1, B, 1]."""
        return self.builder.make_reduce_sum({"data": self.laid_ints, "axes": [self.laid_out[1]], "keepdims": 1})

    @_built_once
    def nonempty(self) -> str:
        """[B, 1] bool: the rows with a kept step, from :attr:`laid_counts`."""
        return self.builder.make_squeeze({"data": self.op("Greater", [self.laid_counts, self.const(0)]),
                                          "axes": [2 if self.laid_out[1] else 0]})

    @_built_once
    def row_pairs(self) -> str:
        """(0, row) for each row, laid out ([B, 1, 2] or [1, B, 2]): a count of the rows up to each,
        less one, with no Shape or Range."""
        units = self.op("Add", [self.op("Mul", [self.laid_counts, self.const(0)]), self.const([0, 1])])
        rows = self.op("CumSum", [units, self.const(1 - self.laid_out[1])], exclusive=0, reverse=0)
        return self.op("Sub", [rows, self.const([0, 1])])

    def pairs(self, position: str, less_one: bool = False) -> str:
        """Laid-out positions (``less_one``: each less one) -> (position, row) pairs, the index of a
        time-major [T, B, ...] tensor."""
        pairs = self.op("Add", [self.op("Mul", [position, self.const([1, 0])]), self.row_pairs])
        return self.op("Sub", [pairs, self.const([1, 0])]) if less_one else pairs

    def in_time_order(self, laid: str) -> str:
        """A tensor laid out as the mask is -> time-major (a swap of the first two axes when batch-major)."""
        return self.op("Transpose", [laid], perm=[1, 0, 2]) if self.laid_out[1] else laid

    def scattered(self, x: str, reversed_: bool) -> str:
        """[T, B, F]: ``x`` with each row's kept steps moved to the front, in order or, ``reversed_``, last
        kept step first; the masked steps follow, in order (where they land does not matter: the
        node's outputs past each row's kept count are never read, and a recurrence does not reach
        back). One ScatterND of each step to its position; a row's positions are a permutation of
        0 .. T-1, so each is written once. A batch-major mask's steps are read from ``x`` before its
        move to time-major where the graph has it (no copy back)."""
        counts, through = self.laid_counts, self.kept_through
        # each position plus one (the one taken off the pairs: a node fewer, ``through`` itself)
        kept = self.op("Add", [self.op("Sub", [counts, through]), self.const(1)]) if reversed_ else through
        masked = self.op("Add", [counts, self.masked_through])
        position = self.op("Where", [self.laid_bool, kept, masked])
        laid_x = x
        if self.laid_out[1]:
            root, moves = axis_moves(self.graph, x)
            laid_x = root if moves == (SWAP,) else self.op("Transpose", [x], perm=[1, 0, 2])
        return self.op("ScatterND", [x, self.pairs(position, less_one=True), laid_x])

    def _gathered(self, y: str, first: Optional[str], position: str) -> str:
        """Time-major: the node's outputs ``y`` [T, B, H] at each laid-out compacted ``position`` plus one,
        with ``first`` ([1, B, H]; zeros when None) at 0: one GatherND from ``y`` after ``first`` (a
        step with no kept step to read reads ``first``). Zeros come from a Pad (no tensor of zeros:
        onnxruntime's training build cannot differentiate two Concats reading one that needs no
        gradient, and tf2onnx merges equal ones). Time-major: tf2onnx's optimizers would move a
        transpose of ``y`` past it, a copy of the whole of it."""
        key = ("table", y, first)
        if key not in self._cache:
            self._cache[key] = self.op("Pad", [y, self.const([1, 0, 0, 0, 0, 0])], mode="constant") \
                if first is None else self.op("Concat", [first, y], axis=0)
        return self.in_time_order(self.op("GatherND", [self._cache[key], self.pairs(position)]))

    def restored(self, y: str, output: MaskedOutput, start: Optional[str], reversed_: bool) -> str:
        """[T, B, H]: a node's outputs ``y`` [T, B, H], run over :meth:`scattered` input (or over input
        whose kept steps come first), -> Keras's outputs at every step: at a masked step the latest
        kept step's output (``start`` [B, H], or zeros, before the first), or zeros (``ZERO``). A pass
        run ``reversed_`` carries back in time, zeros after each row's last kept step. One GatherND."""
        through = self.kept_through
        position = self.op("Add", [self.op("Sub", [self.laid_counts, through]), self.laid_ints]) if reversed_ \
            else through
        if output is MaskedOutput.ZERO:
            position = self.op("Where", [self.laid_bool, position, self.const(0)])
        first = None
        if start is not None and not reversed_ and output is not MaskedOutput.ZERO:
            first = self.builder.make_unsqueeze({"data": start, "axes": [0]})
        return self._gathered(y, first, position)

    def last_kept(self, y: str) -> str:
        """[1, B, H]: the output of a node run over :meth:`scattered` input at each row's last kept
        step, which is its state there; zeros for a row with none."""
        return self._gathered(y, None, self.laid_counts)
