"""A pass over the written model: a recurrent node's sequence read both by a next recurrent node and, batch-major,
by another reader (a stacked layer whose first sequence also feeds a skip connection) has its batch-major read
taken from the node's 4-D ``Y`` (``Squeeze(Transpose(Y, [2, 0, 1, 3]), 2)`` for ``Transpose(Squeeze(Y, 1),
[1, 0, 2])``), and the next node reads the squeezed sequence itself where it read it swapped there and back: the
same values. OpenVINO 2026.4 computes the former reads wrongly, silently (1.0 off on LSTM, GRU and RNN alike:
measured on hand-built graphs), and these exactly."""
from __future__ import annotations

import onnx

from ..obstacles import shared_y_transposes
from ..runtimes import RECURRENT_OPS
from .builder import Writer
from .graph import constant_values, names_of, opset_of, readers_of, static_shapes, sweep


def batch_major_from_4d(model_proto: onnx.ModelProto) -> int:
    """Rewrite each such read of the main graph; returns how many. Each read changes once its rewrite is built."""
    graph = model_proto.graph
    constants, readers = constant_values(graph), readers_of(graph)
    swapped = {t.output[0] for t in graph.node if t.op_type == "Transpose" and t.output}
    reshaped = any(n.op_type == "Reshape" and n.input and n.input[0] in swapped for n in graph.node)
    shapes = static_shapes(model_proto) if reshaped else None  # a swap back written as a Reshape: at batch 1
    found = [(node, *read) for node in graph.node if node.op_type in RECURRENT_OPS
             for read in shared_y_transposes(node, readers, constants, shapes)]
    if not found:
        return 0
    outputs, taken, opset, renames = {o.name for o in graph.output}, names_of(graph), opset_of(model_proto), {}
    for node, squeeze, swap, back in found:
        renames.update({b.output[0]: squeeze.output[0] for b in back if b.output[0] not in outputs})
        base = swap.name or swap.output[0]
        w = Writer(graph, opset, taken)
        moved = w.op("Transpose", [node.output[0]], f"{base}__from_4d", perm=[2, 0, 1, 3])
        w.squeeze(moved, [2], base, output_names=list(swap.output))
        w.replace([swap])
    for n in graph.node:
        n.input[:] = [renames.get(name, name) for name in n.input]
    sweep(graph, nodes=True)
    return len(found)
