"""A reader for TF 1.x's fused LSTM ops, ``BlockLSTM`` and ``BlockLSTMV2`` (what ``LSTMBlockFusedCell``
left, in many speech models): one op over a whole time-major sequence, read into the
:class:`~.description.Pass` the one emitter builds a native ONNX ``LSTM`` from.

The op runs ``seq_len_max`` steps for every row and zeroes its cell states and outputs after them:
ONNX's LSTM with ``sequence_lens`` that value for every row. Its kernel is ``[x, h] @ w`` with the
gates in the order TensorFlow's kernel reads them, i, ci, f, o for ``BlockLSTM`` and i, f, ci, o for
``BlockLSTMV2``; ``BlockLSTM`` adds ``forget_bias`` to the forget gate (``BlockLSTMV2`` adds none);
``use_peephole`` adds ``wci``, ``wcf`` and ``wco`` (ONNX's P). What ONNX cannot compute is refused,
naming it: a ``cell_clip`` above zero (BlockLSTM's default, 3, clips), and the op's per-step cell
states or gate values used other than at the last step (ONNX's LSTM gives the cell state only at the
end). The op has no tf2onnx handler, so a refused op is the conversion's error.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto
from tf2onnx.graph_builder import GraphBuilder

from ..cells import lstm_block
from ..cells.evaluate import NotEvaluable, evaluate
from ..description import Activation, Direction, MaskedOutput, NoMatch, Pass, StateRole, Wiring, require
from .adapt import constant_list, is_zero, require_not_graph_outputs, tensor_key

OPS = {"BlockLSTM": (0, 2, 1, 3), "BlockLSTMV2": (0, 1, 2, 3)}  # kernel blocks of gates (i, f, ci, o)
_SEQ_LEN_MAX, _X, _CS_PREV, _H_PREV, _W, _WCI, _WCF, _WCO, _B = range(9)  # the op's inputs
_CS, _H = 1, 6  # its outputs used: cell states and outputs, each [T, B, H]


def kind_of(node):
    """The cell kind a fused op's row names: the LSTM family, as the op."""
    return replace(lstm_block.KIND, keras_name=node.type)


def fused_passes(graph, node, name: str) -> list:
    """The one pass a ``BlockLSTM`` / ``BlockLSTMV2`` op computes."""
    clip = float(node.get_attr_value("cell_clip", 3.0 if node.type == "BlockLSTM" else 0.0))
    require(clip <= 0, f"{node.type} clips its cell state at {clip:g} each step (cell_clip): ONNX's LSTM has no such "
            "clip", node.name)
    for index, tensor in enumerate(node.output):
        if index not in (_CS, _H):
            require(not graph.find_output_consumers(tensor), f"{node.type}'s output {index} (a gate) is used: ONNX's "
                    "LSTM gives only h and the final states", node.name)
    wrapped = _wrapped(graph, node)
    if wrapped is not None:
        return [_pass(graph, node, name, **wrapped)]
    sequence = [c.output[0] for c in graph.find_output_consumers(node.output[_H])]
    last_h, sequence = _last_steps(graph, node, node.output[_H]), [node.output[_H]] if sequence else []
    last_c = _last_steps(graph, node, node.output[_CS])
    require(not graph.find_output_consumers(node.output[_CS]) or last_c is not None,
            f"{node.type}'s cell state is used at steps before the last: ONNX's LSTM gives it only at the end",
            node.name)
    require(last_c is None or _runs_every_step(graph, node), f"{node.type}'s last cell state is used, and it may "
            "stop before the last step (seq_len_max), after which its cell states are zeros", node.name)
    if last_h:  # h read only at its last step: that is Y_h, and the sequence is unused
        sequence = []
    return [_pass(graph, node, name, sequence=sequence, last_step=last_h or [],
                  final=[(StateRole.CELL, tensor) for tensor in last_c or ()], lengths=_lengths(graph, node),
                  source="seq_len_max")]


def _pass(graph, node, name: str, sequence: list, last_step: list, final: list, lengths: str, source: str) -> Pass:
    require_not_graph_outputs(graph, sequence + last_step + [tensor for _, tensor in final], node.name)
    starts = tuple((role, node.input[index]) for role, index in
                   ((StateRole.HIDDEN, _H_PREV), (StateRole.CELL, _CS_PREV)) if not is_zero(graph, node.input[index]))
    wiring = Wiring(x=node.input[_X], sequence_output=tuple(sequence), last_step_output=tuple(last_step),
                    initial_states=starts, final_states=tuple(final), lengths=lengths,
                    masked_output=MaskedOutput.ZERO, mask_source=source)
    return Pass(loop=node.name, name=name, kind=kind_of(node), direction=Direction.FORWARD,
                activations=(Activation("Sigmoid"), Activation("Tanh"), Activation("Tanh")), attributes=(),
                wiring=wiring, **_weights(graph, node))


def _wrapped(graph, node):
    """The op as ``LSTMBlockFusedCell`` wraps it given a ``sequence_length`` L: its outputs masked past
    each row's length (``h * sequence_mask(L)``), its final states gathered at each row's length from
    ``[initial state; cell states]`` and ``[initial output; masked outputs]`` (rows ``L * B + b``). That
    is ONNX's LSTM with L as ``sequence_lens``: Y, Y_c and Y_h. None when the op is not wrapped so."""
    h_readers = graph.find_output_consumers(node.output[_H])
    if len(h_readers) != 1 or h_readers[0].type != "Mul":
        return None
    masked = h_readers[0].output[0]
    mask = [t for t in h_readers[0].input if t != node.output[_H]]
    gathers = {role: _gathered(graph, tensor) for role, tensor in ((StateRole.CELL, node.output[_CS]),
                                                                    (StateRole.HIDDEN, masked))}
    found = [g for g in gathers.values() if g]
    lengths = {tensor_key(graph, lengths) for gathered in found for _, lengths in gathered}
    if not found or len(lengths) != 1 or len(mask) != 1:
        return None
    some_lengths = found[0][0][1]
    require(_masks_past(graph, mask[0], some_lengths), f"{node.type}'s outputs are multiplied by something other "
            "than each row's mask of the lengths its final states are read at", node.name)
    others = [c for c in graph.find_output_consumers(masked) if c.type != "ConcatV2"]
    final = [(role, out) for role, gathered in gathers.items() for out, _ in gathered or ()]
    return dict(sequence=[masked] if others else [], last_step=[], final=final, lengths=some_lengths,
                source=f"sequence_length {some_lengths.split(':')[0]}")


def _gathered(graph, sequence: str):
    """[(gathered tensor, lengths)] for every reader of ``sequence`` [T, B, H] that gathers it at each
    row's length from ``[initial; sequence]``; [] when none reads it so, None when another reads it
    (a masked output's other readers aside)."""
    found = []
    for concat in graph.find_output_consumers(sequence):
        if concat.type != "ConcatV2":
            if concat.type == "Mul" or graph.get_node_by_output(sequence).type == "Mul":
                continue
            return None
        reshape = [c for c in graph.find_output_consumers(concat.output[0]) if c.type == "Reshape"]
        for gather in (g for r in reshape for g in graph.find_output_consumers(r.output[0])):
            index = graph.get_node_by_output(gather.input[1])
            if gather.type not in ("GatherV2", "Gather") or index is None or index.type not in ("AddV2", "Add"):
                return None
            product = graph.get_node_by_output(index.input[0])
            if product is None or product.type != "Mul":
                return None
            found.append((gather.output[0], product.input[0]))
    return found


def _masks_past(graph, mask: str, lengths: str) -> bool:
    """Whether ``mask`` is built from ``Less(range, lengths)`` (a sequence mask of ``lengths``)."""
    pending, seen = [mask], set()
    while pending:
        node = graph.get_node_by_output(pending.pop())
        if node is None or node.name in seen or len(seen) > 16:
            continue
        seen.add(node.name)
        if node.type == "Less":
            return any(tensor_key(graph, t) == tensor_key(graph, lengths) or _casts_of(graph, t, lengths)
                       for t in node.input)
        pending.extend(node.input)
    return False


def _casts_of(graph, tensor: str, lengths: str) -> bool:
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type in ("Cast", "ExpandDims", "Identity"):
        if tensor_key(graph, node.input[0]) == tensor_key(graph, lengths):
            return True
        node = graph.get_node_by_output(node.input[0])
    return False


def _last_steps(graph, node, tensor: str):
    """The tensors that read ``tensor`` [T, B, H] at its last step only (``t[-1]``), or None when another
    reader uses it."""
    readers = graph.find_output_consumers(tensor)
    last = []
    for reader in readers:
        if reader.type != "StridedSlice" or constant_list(graph, reader.input[1]) != [-1] \
                or reader.get_attr_value("shrink_axis_mask", 0) != 1:
            return None
        last.append(reader.output[0])
    return last or None


def _lengths(graph, node) -> str:
    """[B] int64: ``seq_len_max`` for every row (the op zeroes what follows it)."""
    shape = graph.make_node("Shape", [node.input[_X]]).output[0]
    batch = GraphBuilder(graph).make_slice({"data": shape, "starts": [1], "ends": [2], "axes": [0]})
    longest = graph.make_node("Cast", [node.input[_SEQ_LEN_MAX]], attr={"to": TensorProto.INT64}).output[0]
    return graph.make_node("Expand", [longest, batch]).output[0]


def _runs_every_step(graph, node) -> bool:
    """Whether ``seq_len_max`` is the input's length: a constant equal to its static length, or its
    shape's first dimension (how LSTMBlockFusedCell passes it without lengths)."""
    tensor, static = node.input[_SEQ_LEN_MAX], (graph.get_shape(node.input[_X]) or [None])[0]
    value = constant_list(graph, tensor)
    if value is not None:
        return static is not None and static > 0 and value == [static]
    source = graph.get_node_by_output(tensor)
    while source is not None and source.type in ("Cast", "Identity"):
        source = graph.get_node_by_output(source.input[0])
    if source is None or source.type not in ("StridedSlice", "Gather", "GatherV2"):
        return False
    shape = graph.get_node_by_output(source.input[0])
    return shape is not None and shape.type == "Shape" and shape.input[0] == node.input[_X] \
        and constant_list(graph, source.input[1]) == [0]


def _weights(graph, node) -> dict:
    """W, R, B and P in ONNX's gate order (i, o, f, c) from the op's kernel, bias and peepholes."""
    try:
        w, b = (np.asarray(evaluate(graph, node.input[index])) for index in (_W, _B))
        peepholes = [np.asarray(evaluate(graph, node.input[index])) for index in (_WCI, _WCO, _WCF)] \
            if node.get_attr_value("use_peephole", False) else None
    except NotEvaluable as error:
        raise NoMatch(f"a weight of {node.type} is not constant: {error.reason}", error.node_name) from error
    hidden = w.shape[1] // 4
    require(w.ndim == 2 and w.shape[1] == 4 * hidden and b.shape == (4 * hidden,), f"{node.type}'s kernel or bias "
            "is not [F + H, 4H] / [4H]", node.name)
    features = w.shape[0] - hidden
    i, f, c, o = (slice(block * hidden, (block + 1) * hidden) for block in OPS[node.type])
    order = (i, o, f, c)
    forget_bias = float(node.get_attr_value("forget_bias", 1.0)) if node.type == "BlockLSTM" else 0.0
    bias = np.concatenate([b[block] + (forget_bias if block == f else 0.0) for block in order])
    return dict(hidden_size=hidden, input_size=features, dtype=w.dtype,
                W=np.concatenate([w[:features, block].T for block in order]),
                R=np.concatenate([w[features:, block].T for block in order]),
                B=np.concatenate([bias, np.zeros_like(bias)]).astype(w.dtype),
                P=None if peepholes is None else np.concatenate(peepholes).astype(w.dtype))
