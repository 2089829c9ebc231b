"""A pass over the written model: a recurrent node's sequence read both by a next recurrent node and, batch-major,
by another reader (a stacked layer whose first sequence also feeds a skip connection) has its batch-major read
taken from the node's 4-D ``Y`` (``Squeeze(Transpose(Y, [2, 0, 1, 3]), 2)`` for ``Transpose(Squeeze(Y, 1),
[1, 0, 2])``), and the next node reads the squeezed sequence itself where it read it swapped there and back: the
same values. OpenVINO 2026.4 computes the former reads wrongly, silently (1.0 off on LSTM, GRU and RNN alike:
measured on hand-built graphs), and these exactly."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..obstacles import shared_y_transposes
from ..runtimes import RECURRENT_OPS
from .graph import constant_values, opset_of, readers_of, set_nodes, static_shapes, sweep


def batch_major_from_4d(model_proto: onnx.ModelProto) -> int:
    """Rewrite each such read of the main graph; returns how many. The graph changes once the rewrite is built."""
    graph = model_proto.graph
    constants, readers = constant_values(graph), readers_of(graph)
    swapped = {t.output[0] for t in graph.node if t.op_type == "Transpose" and t.output}
    reshaped = any(n.op_type == "Reshape" and n.input and n.input[0] in swapped for n in graph.node)
    shapes = static_shapes(model_proto) if reshaped else None  # a swap back written as a Reshape: at batch 1
    outputs = {o.name for o in graph.output}
    replaced, made, renames = {}, [], {}
    for node in [n for n in graph.node if n.op_type in RECURRENT_OPS]:
        for squeeze, swap, back in shared_y_transposes(node, readers, constants, shapes):
            renames.update({b.output[0]: squeeze.output[0] for b in back if b.output[0] not in outputs})
            base = swap.name or swap.output[0]
            moved = f"{base}__from_4d"
            nodes = [helper.make_node("Transpose", [node.output[0]], [moved], name=moved, perm=[2, 0, 1, 3])]
            if opset_of(model_proto) >= 13:
                made.append(numpy_helper.from_array(np.array([2], np.int64), f"{base}__axes"))
                nodes.append(helper.make_node("Squeeze", [moved, made[-1].name], list(swap.output), name=base))
            else:
                nodes.append(helper.make_node("Squeeze", [moved], list(swap.output), name=base, axes=[2]))
            replaced[id(swap)] = nodes
    if not replaced:
        return 0
    kept = []
    for n in graph.node:
        for new in replaced.get(id(n), [n]):
            new.input[:] = [renames.get(name, name) for name in new.input]
            kept.append(new)
    set_nodes(graph, kept)
    graph.initializer.extend(made)
    sweep(graph, nodes=True)
    return len(replaced)
