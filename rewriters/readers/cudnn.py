"""A reader for cuDNN's recurrent ops, ``CudnnRNN``, ``CudnnRNNV2`` and ``CudnnRNNV3``: what Keras 3 traces
an LSTM or GRU layer as where TensorFlow sees a GPU, what tf_keras's ``CuDNNLSTM`` / ``CuDNNGRU`` write,
and what TF 1.x's cuDNN layers leave. Each layer and direction of an op becomes a
:class:`~.description.Pass` the one emitter builds a native node from; TensorFlow has no CPU kernel for
these ops and tf2onnx no handler (its ``CudnnRNN`` handler takes GRU only, with cuDNN's gates read in
ONNX's order), so an op this reader refuses is the conversion's error, in one line naming the op.

What is read (:mod:`.cudnn_params` holds the modes and the weights' layout):

- the attributes: ``rnn_mode``, ``direction``, ``input_mode`` (``skip_input`` adds the input to each gate
  of layer 0: exact as identity matrices where input and hidden sizes are equal; ``auto_select`` skips
  exactly then), ``time_major`` (V3), ``num_proj`` (a projection: refused) and ``dropout`` (between layers
  when ``is_training``: refused where it acts);
- the sizes: layers x directions and the hidden size from the initial state's shape, the features from
  the input's; the weights from ``params`` (a constant, or anything the evaluator computes from constants);
- how rows are masked (V3's ``sequence_lengths``): lengths filling the time axis (Keras and tf_keras
  write them when there is no mask) mask nothing; lengths that are a Keras mask's row counts make the
  layer Keras's masked layer as Keras computes it on a CPU (:class:`KerasMask`: exact for every mask,
  where the GPU takes right-padded masks only); other lengths are ONNX's ``sequence_lens`` (cuDNN's
  outputs past a row's length are zeros, its final states those of the row's last step);
- what Keras writes around the op: for ``go_backwards`` a ``ReverseSequence`` of the input and of the
  output by the lengths and a reversal in time (a reversal in time of the input, for tf_keras), its
  ``Bidirectional``'s reversal of the backward half's output, and the time-major swaps.
"""
from __future__ import annotations

from ..cells.evaluate import attr
from ..description import CellKind, Direction, MaskedOutput, Pass, Wiring, require
from ..outcome import KerasMaskReading
from .adapt import per_row_reversal
from .cudnn_op import OPS, CudnnOp, X, read_op
from .cudnn_outputs import Outputs
from .cudnn_params import MODES, decode
from .cudnn_rows import Full, KerasMask, mask_wiring, rows_of, same_lengths, transposed

__all__ = ["OPS", "fused_passes", "kind_of"]


def kind_of(node) -> CellKind:
    """The cell family the op's mode is (a pass of it pairs with a loop's of that family: a Keras
    Bidirectional may hold one layer cuDNN takes and one it does not)."""
    from .. import cell_kinds

    mode = MODES.get(str(attr(node, "rnn_mode", "lstm")), MODES["lstm"])
    return next(kind for kind in cell_kinds() if kind.onnx_op == mode.onnx_op and not kind.form_of)


def fused_passes(graph, node, name: str) -> tuple:
    """(the passes a cuDNN op computes, one per layer and direction, layer by layer; its
    :class:`~.outcome.KerasMaskReading` where its lengths are a Keras mask's counts, else None)."""
    op = read_op(graph, node)
    weights = decode(op.params, op.layout, node.name)
    rows = rows_of(graph, op)
    x, x_unreversed = _input(graph, op, rows)
    outputs = Outputs(graph, op, rows, backward=x_unreversed is not None)
    layout = op.layout
    passes = []
    layer_input, layer_input_unreversed = x, x_unreversed
    for layer in range(layout.layers):
        halves = []
        for direction in range(layout.directions):
            pseudo = layer * layout.directions + direction
            backward = direction == 1 or layer_input_unreversed is not None
            wiring = Wiring(x=layer_input, x_unreversed=layer_input_unreversed or (layer_input if backward else None),
                            reverse_x=layer_input_unreversed is not None,
                            **outputs.initial_states(pseudo),
                            final_states=outputs.final_states(pseudo),
                            **outputs.sequence(layer, direction), **mask_wiring(graph, op, rows, backward))
            halves.append(Pass(loop=_loop_name(op, layer, direction), kind=kind_of(node),
                               name=f"{name} (layer {layer})" if layout.layers > 1 else name,
                               direction=Direction.BACKWARD if backward else Direction.FORWARD,
                               hidden_size=layout.hidden, input_size=layout.features_of(layer), dtype=op.dtype,
                               attributes=op.mode.attributes, activations=op.mode.activations, wiring=wiring,
                               note=f"read from cuDNN's {node.type} op",
                               W=weights[pseudo].W, R=weights[pseudo].R, B=weights[pseudo].B))
        passes.extend(halves)
        layer_input, layer_input_unreversed = outputs.layer_output(layer), None
    outputs.rewire()
    reading = None
    if isinstance(rows, KerasMask):
        reading = KerasMaskReading(rows.mask, rows.time_axis, passes[0].wiring.masked_output is MaskedOutput.CARRY,
                                   x_unreversed is not None)
    return passes, reading


def _loop_name(op: CudnnOp, layer: int, direction: int) -> str:
    """A row's name: the op's, with its layer where it has several and ``(backward)`` for a bidirectional
    op's backward half, as a Keras Bidirectional's two loops have two rows."""
    name = op.name + (f" (layer {layer})" if op.layout.layers > 1 else "")
    return name + (" (backward)" if direction == 1 else "")


def _input(graph, op: CudnnOp, rows) -> tuple:
    """(the time-major input the op steps through, the time-major input before a reversal in time or
    None): Keras 3 reverses a go_backwards layer's rows within their lengths (which, lengths filling
    the time axis or a Keras mask's counts, is Keras's go_backwards over the mask); tf_keras reverses
    its input in time."""
    x = op.node.input[X]
    producer = graph.get_node_by_output(x)
    if producer is not None and producer.type == "ReverseSequence":
        require(op.layout.directions == 1 and op.layout.layers == 1, f"{op.what} over both directions or several "
                "layers reads its input reversed within lengths", op.name)
        require(producer.get_attr_value("seq_dim") == op.time_axis
                and producer.get_attr_value("batch_dim", 0) == 1 - op.time_axis,
                f"{op.what}'s input is reversed along axes other than its time and batch", op.name)
        require(same_lengths(graph, producer.input[1], op, rows), f"{op.what}'s input is reversed within lengths "
                "other than its own", op.name)
        unreversed = _time_major(graph, op, producer.input[0])
        return unreversed, unreversed
    x_tm = _time_major(graph, op, x)
    if isinstance(rows, Full) and op.time_major and op.layout.layers == 1 and op.layout.directions == 1:
        unreversed = per_row_reversal(graph, x, None, None, op.name)  # tf_keras: Transpose(ReverseV2(x, 1))
        if unreversed is not None:
            return unreversed, unreversed
    return x_tm, None


def _time_major(graph, op: CudnnOp, x: str) -> str:
    return x if op.time_major else transposed(graph, x, [1, 0, 2])
