"""The mask arithmetic of a masked layer, built once per mask and shared by the layers it masks.

Compaction moves each row's kept steps to the front, in order; outputs go back through a gather
from the node's outputs at the compacted position each step takes its value from. Where the
consumers take an ``If`` (:class:`AtRunTime`), both are paid only by a batch that needs them: a
batch whose every row keeps its steps first (post-padded, full) feeds the node its input as it is.

Every attribute a consumer could read otherwise than ONNX is written out, defaults included:
onnx2torch 1.5.15 takes an absent ``reverse`` of ``CumSum`` as 1.
"""
from __future__ import annotations

import copy
from typing import Callable, Optional

import numpy as np
from onnx import TensorProto, helper
from tf2onnx import utils
from tf2onnx.graph_builder import GraphBuilder

from ..description import MaskedOutput, NoMatch
from .bool_masks import SWAP, unit_axis_moves


class Always:
    """Compaction and restore in every run: what consumers without ``If`` (tract, onnx2torch) need.
    The portable and training forms take it."""

    def choose(self, mask: "MaskTensors", condition: str, lean: Callable, heavy: Callable) -> str:
        return heavy(mask)

    def ahead(self, mask: "MaskTensors", condition: str) -> None:
        """Build ``condition``'s tensor now, in ``mask``'s graph (nothing here: no condition is tested)."""

    def describe(self, compacted: bool) -> str:
        return "compacted" if compacted else ""


class AtRunTime(Always):
    """Decided once per run: an ``If`` on a condition of the mask (:attr:`MaskTensors.post_padded`,
    :attr:`MaskTensors.all_kept`) runs the lean branch, which reads the node's input or output as it
    is, when no row needs the work, and the heavy one otherwise. Both branches are exact for the
    batches they run on; the heavy one for any mask. Each branch builds what only it reads: what the
    lean one skips is never computed."""

    def choose(self, mask: "MaskTensors", condition: str, lean: Callable, heavy: Callable) -> str:
        return mask.conditional(getattr(mask, condition), lean, heavy)

    def ahead(self, mask: "MaskTensors", condition: str) -> None:
        getattr(mask, condition)

    def describe(self, compacted: bool) -> str:
        return "compacted when a row's kept steps do not come first" if compacted else ""


ALWAYS, AT_RUN_TIME = Always(), AtRunTime()


def _built_once(builder):
    """A property whose graph nodes are built on first use and reused after."""

    def get(self):
        if builder.__name__ not in self._cache:
            self._cache[builder.__name__] = builder(self)
        return self._cache[builder.__name__]

    return property(get, doc=builder.__doc__)


class MaskTensors:
    """Tensors derived from one time-major mask [T, B], each built on first use.

    Compaction moves each row's kept steps to the front, in order; outputs go back through
    ``source``: at step t, the compacted position of the latest kept step up to t.
    """

    def __init__(self, graph, mask: Optional[str], float_type: np.dtype, where_ints: bool = False,
                 choice: Always = ALWAYS):
        self.graph, self.builder = graph, GraphBuilder(graph)
        self.where_ints = where_ints  # the 0/1 ints made by a Where (the portable target: tract's CumSum)
        self.choice = choice if graph.opset >= 12 else ALWAYS  # ArgMax's select_last_index: opset 12
        self.float_type_np = np.dtype(float_type)
        self._cache: dict = {}
        self._mask = mask

    def within(self, graph) -> "MaskTensors":
        """The same mask's tensors for a branch ``graph`` of an ``If``: what this one has built is read
        from outside; what the branch asks for next is built inside it, and stays there."""
        inner = copy.copy(self)
        inner.graph, inner.builder, inner._cache = graph, GraphBuilder(graph), dict(self._cache)
        return inner

    def conditional(self, condition: str, lean: Callable, heavy: Callable) -> str:
        """An ``If`` on the bool scalar ``condition``: ``lean(tensors)`` builds the then-branch's output,
        ``heavy(tensors)`` the else-branch's, each with this mask's tensors for its branch. Both give the
        layer's float type at the same rank."""
        dtype = helper.np_dtype_to_tensor_dtype(self.float_type_np)
        branches, rank = {}, None
        for attribute, build in (("then_branch", lean), ("else_branch", heavy)):
            branch = self.graph.create_new_graph_with_same_config()
            branch.parent_graph = self.graph
            inner = self.within(branch)
            output = build(inner)
            if branch.get_node_by_output(output, search_in_parent_graphs=False) is None:  # made inside it
                output = inner.op("Identity", [output])
            shape = self.graph.get_shape(output) or branch.get_shape(output)
            rank = rank if shape is None else len(shape)
            branch.add_graph_output(output, dtype, shape)
            branches[attribute] = branch
        if rank is None:
            raise NoMatch("internal: the rank of a conditional mask tensor is unknown")
        return self.graph.make_node("If", [condition], branches=branches, shapes=[[-1] * rank],
                                    dtypes=[dtype]).output[0]

    def choose(self, condition: str, lean: Callable, heavy: Callable) -> str:
        """``heavy``'s tensor, or, where the choice is made at run time (:class:`AtRunTime`), ``lean``'s
        when ``condition`` (an attribute naming a bool scalar) holds."""
        return self.choice.choose(self, condition, lean, heavy)

    def unless_needed(self, lean: Callable, heavy: Callable, post_padded: bool) -> str:
        """``lean``'s tensor when no step is masked or, if it holds for them too (``post_padded``), when
        every row's kept steps come first; ``heavy``'s otherwise. The cheaper test first: a batch with
        nothing masked never computes the other."""
        if not post_padded:
            return self.choose("all_kept", lean, heavy)
        # the second test is built outside the Ifs: every If of this mask then reads the same tensor, so
        # that the If-branch pass can merge the Ifs a Bidirectional's halves meet in (its Concat), and
        # it moves the test into the one branch that reads it
        self.choice.ahead(self, "post_padded")
        return self.choose("all_kept", lean, lambda tensors: tensors.choose("post_padded", lean, heavy))

    @_built_once
    def post_padded(self) -> str:
        """The bool scalar: every row's kept steps come first (full rows too), so that compaction is the
        identity. A row's last kept step is its count less one exactly then (ArgMax's last index; a
        row with none reads T - 1 and takes the heavy branch). ArgMax over int32: onnxruntime before
        1.20 has no int64 ArgMax."""
        flags = self.op("Cast", [self.flags], to=TensorProto.INT32)
        last = self.op("ArgMax", [flags], axis=self.laid_out[1], keepdims=0, select_last_index=1)
        gap = self.op("ReduceMax", [self.op("Sub", [last, self.counts])], keepdims=0)
        return self.op("Less", [gap, self.const(0)])

    @_built_once
    def all_kept(self) -> str:
        """The bool scalar: no step of any row is masked."""
        return self.op("Cast", [self.op("ReduceMin", [self.flags], keepdims=0)], to=TensorProto.BOOL)

    @_built_once
    def laid_out(self) -> tuple:
        """(mask, time axis): the mask as it is made, [T, B] or, read from before Keras's move of it to
        time-major (and its expansion to [B, T, 1]), [B, T]."""
        mask = self._mask
        if len(self.graph.get_shape(mask) or []) == 3:
            # Keras's [B, T] mask expanded to [B, T, 1] and moved: read from before the expansion
            root, moves = unit_axis_moves(self.graph, mask)
            if len(self.graph.get_shape(root) or []) == 2 and moves in ((), (SWAP,)):
                return root, 1 if moves else 0
            mask = self.builder.make_squeeze({"data": mask, "axes": [2]})
        return mask, 0

    @_built_once
    def bool(self) -> str:
        """[T, B] bool: the mask. Cast from :attr:`ints` where they are the flags: a branch of an ``If``
        then reads the mask in one form, not both a tensor and its Cast (onnxruntime's optimizer warns
        that it cannot rename the Cast's output in the branch)."""
        if not self.where_ints:
            return self.op("Cast", [self.ints], to=TensorProto.BOOL)
        mask, time_axis = self.laid_out
        if time_axis:
            mask = self.op("Transpose", [mask], perm=[1, 0])
        if self.graph.get_dtype(mask) == TensorProto.BOOL:
            return mask  # no Cast of a bool (OpenVINO folds one on a model input, naming the input after it)
        return self.op("Cast", [mask], to=TensorProto.BOOL)

    @_built_once
    def flags(self) -> str:
        """The mask as int64 0/1, laid out as it is made (:attr:`laid_out`): what the lengths and the
        run-time conditions read, with no transpose. Keras's ``Any`` is still TensorFlow's op here
        (:func:`.bool_masks.integer_any` rewrites it after the loops); on the written model
        :mod:`.if_branches` reads these flags from its uint8s."""
        return self.op("Cast", [self.laid_out[0]], to=TensorProto.INT64)

    def op(self, op_type: str, inputs, **attrs) -> str:
        return self.graph.make_node(op_type, inputs, attr=attrs).output[0]

    def const(self, value, dtype=np.int64) -> str:
        return self.graph.make_const(utils.make_name("mask_const"), np.array(value, dtype)).output[0]

    @_built_once
    def ints(self) -> str:
        """[T, B] int64: 1 at kept steps. The :attr:`flags` (a Cast: onnxruntime runs it in a third of a
        Where's time, measured), but for tract (``where_ints``) a Where: tract casts to int64 as its
        symbolic dimension type, which its CumSum cannot add."""
        if not self.where_ints:
            flags, time_axis = self.flags, self.laid_out[1]
            return self.op("Transpose", [flags], perm=[1, 0]) if time_axis else flags
        return self.op("Where", [self.bool, self.const(1), self.const(0)])

    @_built_once
    def shape(self) -> str:
        """[2]: T and B."""
        return self.op("Shape", [self.bool])

    @_built_once
    def time(self) -> str:
        """The scalar T."""
        return self.op("Gather", [self.shape, self.const(0)], axis=0)

    @_built_once
    def batch(self) -> str:
        """The scalar B."""
        return self.op("Gather", [self.shape, self.const(1)], axis=0)

    @_built_once
    def batch_index(self) -> str:
        """[B]: 0 .. B-1, to turn (step, row) into a row of a [T*B, ...] flattening."""
        return self.op("Range", [self.const(0), self.batch, self.const(1)])

    @_built_once
    def counts(self) -> str:
        """[B] int64: kept steps per row."""
        if self.where_ints:
            return self.builder.make_reduce_sum({"data": self.ints, "axes": [0], "keepdims": 0})
        return self.builder.make_reduce_sum({"data": self.flags, "axes": [self.laid_out[1]], "keepdims": 0})

    @_built_once
    def lengths(self) -> str:
        """[B] int32: kept steps per row, the node's sequence_lens."""
        return self.op("Cast", [self.counts], to=TensorProto.INT32)

    @_built_once
    def source(self) -> str:
        """[T, B]: compacted position of the latest kept step at or before t (-1 before any)."""
        return self.op("Sub", [self.op("CumSum", [self.ints, self.const(0)], exclusive=0, reverse=0), self.const(1)])

    @_built_once
    def source_rows(self) -> str:
        """[T, B]: ``source`` as rows of a flattened [T*B, H] output (clamped at 0)."""
        return self.rows_at(self.op("Max", [self.source, self.const(0)]))

    @_built_once
    def steps(self) -> str:
        """[T, 1]: 0 .. T-1."""
        return self.builder.make_unsqueeze({"data": self.op("Range", [self.const(0), self.time, self.const(1)]),
                                            "axes": [1]})

    @_built_once
    def compaction_rows(self) -> str:
        """[T, B]: for compacted position k, the row of the flattened input to read.

        Every step's compacted position, scattered: a kept step goes to its rank among the row's
        kept steps (``source`` there, shared with the restore), a masked one past them all, in order
        (the row's count plus its rank among the masked steps, ``t - source - 1``). A row's positions
        are a permutation of 0 .. T-1, so the scatter writes each once. Where the masked steps land
        does not matter: past each row's kept count the node's outputs are dropped. (A scatter, not
        a sort: OpenVINO's TopK alone took 3% of a masked LSTM's time at batch 1, measured. ScatterND
        on the flattened rows: onnx2torch 1.5.15 has no ScatterElements.)"""
        masked = self.op("Sub", [self.op("Add", [self.steps, self.last_position]), self.source])
        position = self.op("Where", [self.bool, self.source, masked])
        # what is written over: any [T*B] tensor that nothing else reads (OpenVINO copies one it shares)
        canvas = self.op("Range", [self.const(0), self.op("Mul", [self.time, self.batch]), self.const(1)])
        written = self.builder.make_unsqueeze({"data": self.rows_at(position), "axes": [2]})
        flat = self.op("ScatterND", [canvas, written, self.rows_at(self.steps)])
        return self.op("Reshape", [flat, self.shape])

    def rows_at(self, position: str) -> str:
        """[T, B] (or [1, B]) compacted positions -> rows of a flattened [T*B, ...] tensor."""
        return self.op("Add", [self.op("Mul", [position, self.batch]), self.batch_index])

    @_built_once
    def last_position(self) -> str:
        """[1, B]: each row's count less one, the position of its last kept step once compacted."""
        return self.op("Sub", [self.builder.make_unsqueeze({"data": self.counts, "axes": [0]}), self.const(1)])

    @_built_once
    def kept(self) -> str:
        """[T, B, 1] bool: the kept steps."""
        return self.builder.make_unsqueeze({"data": self.bool, "axes": [2]})

    @_built_once
    def started(self) -> str:
        """[T, B, 1] bool: from the first kept step on."""
        started = self.op("Greater", [self.source, self.const(-1)])
        return self.builder.make_unsqueeze({"data": started, "axes": [2]})

    @_built_once
    def zero(self) -> str:
        """A scalar zero of the layer's float type."""
        return self.const(0, self.float_type_np)

    @_built_once
    def nonempty(self) -> str:
        """[B, 1] bool: rows with at least one kept step."""
        return self.builder.make_unsqueeze({"data": self.op("Greater", [self.counts, self.const(0)]), "axes": [1]})

    def kept_at(self, step: int) -> str:
        """[1, B, 1] bool: whether ``step`` (0 or -1) is kept."""
        return self.op("Gather", [self.kept, self.const([step])], axis=0)

    def compact(self, x: str) -> str:
        """[T, B, F] -> the same with each row's kept steps moved to the front, in order (``x`` itself
        when :attr:`post_padded`, where the choice is made at run time)."""
        return self.unless_needed(lambda tensors: x, lambda tensors: tensors.gathered(x), post_padded=True)

    def gathered(self, x: str) -> str:
        """:meth:`compact`'s gather."""
        return self.op("Gather", [self.op("Flatten", [x], axis=2), self.compaction_rows], axis=0)

    @_built_once
    def kept_source(self) -> str:
        """[T, B]: ``source`` at kept steps, -1 at the others."""
        return self.op("Where", [self.bool, self.source, self.const(-1)])

    @_built_once
    def following(self) -> str:
        """[T, B]: compacted position of the earliest kept step at or after t (the row's kept count
        when none comes after): the kept steps before t, counted."""
        return self.op("CumSum", [self.ints, self.const(0)], exclusive=1, reverse=0)

    @_built_once
    def following_rows(self) -> str:
        """[T, B]: ``following`` as rows of a flattened [T*B, H] output (clamped at T - 1)."""
        last = self.op("Sub", [self.time, self.const(1)])
        return self.rows_at(self.op("Min", [self.following, last]))

    @_built_once
    def ahead(self) -> str:
        """[T, B, 1] bool: a kept step at or after t."""
        counts = self.builder.make_unsqueeze({"data": self.counts, "axes": [0]})
        return self.builder.make_unsqueeze({"data": self.op("Less", [self.following, counts]), "axes": [2]})

    def restore_from_node(self, y: str, index: int, directions: int, output: MaskedOutput,
                          backward: bool = False) -> str:
        """[T, B, H]: pass ``index``'s outputs at every step, read straight from the node's Y
        [T, directions, B, H] when the node ran with sequence_lens, so its outputs past each row's
        kept count are zeros (onnxruntime writes them). A step with no output of its own (before the
        row's first kept step; with ZERO, every masked step) reads the row's position -1, that is
        T - 1: such a row has fewer than T kept steps, so that position is one of the zeros. A pass
        that steps ``backward`` through X carries back in time: a masked step reads the next kept
        step's position, or the row's count (a zero) when none follows. No Where over the outputs,
        no Slice of the directions."""
        if ("flat", y) not in self._cache:
            self._cache[("flat", y)] = self.op("Flatten", [y], axis=3)  # [T * directions * B, H]
        batch = self.batch
        source = (self.kept_source if output is MaskedOutput.ZERO else
                  self.following if backward else self.source)
        if ("rows", source, directions) not in self._cache:  # pass 0's rows; pass k's are k * B on
            stride = batch if directions == 1 else self.op("Mul", [batch, self.const(directions)])
            self._cache[("rows", source, directions)] = self.op("Add", [self.op("Mul", [source, stride]),
                                                                        self.batch_index])
        rows = self._cache[("rows", source, directions)]
        if index:
            rows = self.op("Add", [rows, batch if index == 1 else self.op("Mul", [batch, self.const(index)])])
        return self.op("Gather", [self._cache[("flat", y)], rows], axis=0)

    def restore(self, y: str, output: MaskedOutput, start: Optional[str] = None, backward: bool = False) -> str:
        """[T, B, H] outputs at compacted positions -> Keras's outputs at every step; a carried
        output is ``start`` ([B, H], zeros when None) before each row's first kept step, or, for a
        pass stepping ``backward`` through X, zeros after its last one."""
        flat = self.op("Flatten", [y], axis=2)
        if output is MaskedOutput.ZERO:
            spread = self.op("Gather", [flat, self.source_rows], axis=0)
            return self.op("Where", [self.kept, spread, self.zero])
        # selecting on the bool mask, with no float Cast: exact, and safe in float16 conversion
        if backward:
            return self.op("Where", [self.ahead, self.op("Gather", [flat, self.following_rows], axis=0),
                                     self.zero])
        spread = self.op("Gather", [flat, self.source_rows], axis=0)
        return self.op("Where", [self.started, spread, self.zero if start is None else start])


class LengthTensors(MaskTensors):
    """The tensors of a mask given as each row's length (TF1's ``sequence_length``): the steps before a
    row's length kept, those from it on masked. Its counts are the lengths themselves, and the mask is
    built only where a form asks for it."""

    def __init__(self, graph, lengths: str, x: str, float_type: np.dtype, where_ints: bool = False):
        super().__init__(graph, None, float_type, where_ints)
        self._lengths, self._x = lengths, x

    @_built_once
    def time(self) -> str:
        return self.op("Gather", [self.op("Shape", [self._x]), self.const(0)], axis=0)

    @_built_once
    def batch(self) -> str:
        return self.op("Gather", [self.op("Shape", [self._lengths]), self.const(0)], axis=0)

    @_built_once
    def counts(self) -> str:
        return self.op("Cast", [self._lengths], to=TensorProto.INT64)

    @_built_once
    def lengths(self) -> str:
        return self.op("Cast", [self._lengths], to=TensorProto.INT32)

    @_built_once
    def laid_out(self) -> tuple:
        """(:attr:`bool`, 0): the mask is made time-major, from the lengths (its flags are its Cast)."""
        return self.bool, 0

    @_built_once
    def bool(self) -> str:
        """[T, B] bool: step t is kept in a row when t < its length."""
        lengths = self.builder.make_unsqueeze({"data": self.counts, "axes": [0]})
        return self.op("Less", [self.steps, lengths])
