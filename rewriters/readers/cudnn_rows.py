"""How a cuDNN op masks its rows (V3's ``sequence_lengths``), read into one of three forms:

- :class:`Full`: no lengths, or lengths that fill the time axis (what Keras and tf_keras write without a
  mask: ``Fill([B], shape(x)[time])``, of the input before a go_backwards reversal too);
- :class:`KerasMask`: lengths that are a Keras mask's row counts (``Sum(Cast(mask), time)``): the layer is
  read as Keras computes it on a CPU from that mask, exact for every mask, where cuDNN takes right-padded
  ones only; its masked steps output zeros in a ``Bidirectional`` (Keras names the halves ``forward_<layer>``
  and ``backward_<layer>``) and the last output elsewhere;
- :class:`Lengths`: any other lengths, ONNX's ``sequence_lens`` (cuDNN's outputs past a row's length are
  zeros, its final states those of the row's last step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from onnx import TensorProto

from ..description import MaskedOutput, require
from .adapt import constant_list, mask_source, tensor_key
from .cudnn_op import LENGTHS, CudnnOp, X


@dataclass(frozen=True)
class Full:
    """Every row runs every step (no lengths, or lengths that fill the time axis)."""


@dataclass(frozen=True)
class Lengths:
    """Each row runs its first ``tensor`` steps ([B] integers); the outputs past them are zeros."""

    tensor: str


@dataclass(frozen=True)
class KerasMask:
    """The lengths are a Keras mask's row counts (``sum(cast(mask), time axis)``): the layer is read as
    Keras computes it on a CPU from that mask, its masked steps holding the states and outputting zeros
    (in a ``Bidirectional``) or the last output."""

    mask: str  # the bool mask as Keras lays it out
    time_axis: int  # its time axis: 1 for [B, T], 0 for [T, B]
    lengths: str  # the op's lengths (Keras's ReverseSequences reverse by them)


def rows_of(graph, op: CudnnOp):
    """How the op masks its rows: :class:`Full`, :class:`Lengths` or :class:`KerasMask`."""
    node = op.node
    if node.type != "CudnnRNNV3" or len(node.input) <= LENGTHS or not node.input[LENGTHS]:
        return Full()
    lengths = node.input[LENGTHS]
    if _fills_time(graph, lengths, node.input[X], op.time_axis):
        return Full()
    reversal = graph.get_node_by_output(node.input[X])  # go_backwards: Keras counts the steps it reverses
    if reversal is not None and reversal.type == "ReverseSequence" and \
            _fills_time(graph, lengths, reversal.input[0], op.time_axis):
        return Full()
    found = _keras_mask(graph, lengths)
    if found is not None:
        require(op.layout.layers == 1 and op.layout.directions == 1, f"{op.what}'s lengths are a mask's counts "
                "over several layers or both directions, which Keras never writes", op.name)
        return KerasMask(found[0], found[1], lengths)
    require(len(graph.get_shape(lengths) or [None]) == 1, f"{op.what}'s sequence_lengths are not one per row",
            op.name)
    return Lengths(lengths)


def _fills_time(graph, lengths: str, x: str, time_axis: int) -> bool:
    """Whether every row's length is the input's time length: ``Fill([B], shape(x)[time])`` (what Keras and
    tf_keras write without a mask), or constants equal to a static time length."""
    values = constant_list(graph, lengths)
    static = (graph.get_shape(x) or [None, None])[time_axis]
    if values is not None:
        return static not in (None, -1) and all(v == static for v in values)
    fill = _through(graph, lengths, ("Identity", "Cast"))
    if fill is None or fill.type != "Fill":
        return False
    value = constant_list(graph, fill.input[1])
    if value is not None:
        return static not in (None, -1) and value == [static]
    return _is_dimension(graph, fill.input[1], x, time_axis)


def _is_dimension(graph, tensor: str, x: str, axis: int) -> bool:
    """Whether ``tensor`` is ``shape(x)[axis]`` (a StridedSlice or Gather of a Shape, through casts)."""
    node = _through(graph, tensor, ("Identity", "Cast", "Reshape", "Squeeze"))
    if node is None or node.type not in ("StridedSlice", "Gather", "GatherV2"):
        return False
    shape = _through(graph, node.input[0], ("Identity",))
    return (shape is not None and shape.type == "Shape" and tensor_key(graph, shape.input[0]) == tensor_key(graph, x)
            and constant_list(graph, node.input[1]) == [axis])


def _through(graph, tensor: str, kinds: tuple):
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type in kinds and node.input:
        node = graph.get_node_by_output(node.input[0])
    return node


def _keras_mask(graph, lengths: str) -> Optional[tuple]:
    """(mask, its time axis) when ``lengths`` is ``Sum(Cast(mask), time axis)`` of a bool [B, T] or [T, B]
    mask (Keras's ``_compute_sequence_length_from_mask``), else None."""
    total = _through(graph, lengths, ("Identity",))
    if total is None or total.type != "Sum" or total.get_attr_value("keep_dims", False):
        return None
    axes = constant_list(graph, total.input[1])
    cast = graph.get_node_by_output(total.input[0])
    if axes not in ([0], [1]) or cast is None or cast.type != "Cast":
        return None
    mask = cast.input[0]
    if graph.get_dtype(mask) != TensorProto.BOOL or len(graph.get_shape(mask) or []) != 2:
        return None
    return mask, axes[0]


def mask_wiring(graph, op: CudnnOp, rows, backward: bool) -> dict:
    """The Wiring fields of the op's masking."""
    if isinstance(rows, Lengths):
        return dict(lengths=rows.tensor, masked_output=MaskedOutput.ZERO,
                    mask_source=f"sequence_lengths {rows.tensor.split(':')[0]} of {op.node.type}")
    if isinstance(rows, KerasMask):
        mask = _time_major_mask(graph, rows)
        output = MaskedOutput.ZERO if _bidirectional_half(graph, op.name) else MaskedOutput.CARRY
        return dict(mask=mask, mask_unreversed=mask if backward else None, masked_output=output,
                    mask_source=f"{mask_source(graph, rows.mask)} (the counts {op.node.type} took as lengths)")
    return {}


def _time_major_mask(graph, rows: KerasMask) -> str:
    return rows.mask if rows.time_axis == 0 else transposed(graph, rows.mask, [1, 0])


def _bidirectional_half(graph, name: str) -> bool:
    """Whether the op is a half of a Keras ``Bidirectional``, whose masked steps output zeros: Keras names
    its halves ``forward_<layer>`` and ``backward_<layer>`` under the Bidirectional's scope, and the graph
    holds the other half's scope too."""
    scopes = name.split("/")
    for index, scope in enumerate(scopes):
        for own, other in (("forward_", "backward_"), ("backward_", "forward_")):
            if scope.startswith(own):
                sibling = "/".join(scopes[:index] + [other + scope[len(own):]]) + "/"
                if any(n.name.startswith(sibling) for n in graph.get_nodes()):
                    return True
    return False


def same_lengths(graph, tensor: str, op: CudnnOp, rows) -> bool:
    if isinstance(rows, Full):
        return _fills_time(graph, tensor, op.node.input[X], op.time_axis) or \
            tensor_key(graph, tensor) == tensor_key(graph, op.node.input[LENGTHS] if len(op.node.input) > LENGTHS
                                                    else None)
    own = rows.tensor if isinstance(rows, Lengths) else rows.lengths
    return tensor_key(graph, tensor) == tensor_key(graph, own)


def transposed(graph, tensor: str, perm: list) -> str:
    """``tensor`` transposed by ``perm``: the graph's own Transpose where it has one (two layers over one
    input then read one tensor), else a new one, its shape and type known (a mask's ``If`` branches
    need them)."""
    for consumer in graph.find_output_consumers(tensor):
        if consumer.type == "Transpose" and consumer.input[0] == tensor and _perm(graph, consumer) == perm:
            return consumer.output[0]
    shape = graph.get_shape(tensor)
    return graph.make_node("Transpose", [tensor], attr={"perm": perm}, dtypes=[graph.get_dtype(tensor)],
                           shapes=[[shape[axis] for axis in perm] if shape else None]).output[0]


def _perm(graph, node) -> Optional[list]:
    perm = constant_list(graph, node.input[1]) if len(node.input) > 1 else node.get_attr_value("perm")
    return None if perm is None else list(perm)
