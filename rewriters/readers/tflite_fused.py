"""A reader for TFLite's fused recurrent ops: ``UNIDIRECTIONAL_SEQUENCE_LSTM`` (a tf_keras LSTM
exported to TFLite), ``BIDIRECTIONAL_SEQUENCE_LSTM``, ``UNIDIRECTIONAL_SEQUENCE_RNN`` and
``BIDIRECTIONAL_SEQUENCE_RNN`` (other converters'): their weights, biases, states and options read
into the :class:`~.description.Pass` (one per direction) the one emitter builds a native ONNX
``LSTM`` or ``RNN`` from.

tf2onnx has no handler for these ops and drops their absent optional inputs from the node, so which
input is which comes from the file itself: the source hands each fused op's input positions to the
rewriter (:data:`OPS` holds each op's layout). What ONNX cannot compute exactly is refused with the
option named:

- a projection, layer normalisation, an auxiliary input: ONNX's LSTM and RNN have none;
- a coupled input gate (no input-gate weights) and peepholes: not read here;
- ``cell_clip``, an LSTM op clipping its cell state at each step, which ONNX's LSTM cannot. It is
  kept exact where it can never act: a cell state starting from zero grows by at most one a step
  (``|c_t| <= f |c_t-1| + i |g| <= |c_t-1| + 1`` with sigmoid gates and a tanh candidate), so a
  fixed sequence no longer than the clip is never clipped. Longer or dynamic sequences are refused
  unless the conversion drops the clip (``drop_cell_clip``): the model then equals the Keras layer
  (which never clips) and the TFLite file wherever ``|c|`` stays within the clip;
- integer (full-integer quantized) weights: the op's integer arithmetic has no exact ONNX form; with
  ``dequantize`` the node computes in float with the weights dequantized as stored. Float16 weights
  are widened exactly, as the TFLite kernel does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx

from ..cells.evaluate import NotEvaluable, attr, evaluate
from ..description import (
    Activation,
    Approximations,
    CellKind,
    Direction,
    FusedLayout,
    NoMatch,
    Pass,
    StateRole,
    Wiring,
    require,
)
from .adapt import constant_list, require_not_graph_outputs

_X = 0  # every fused op's sequence input


@dataclass(frozen=True)
class _Half:
    """One direction's input positions: per gate in the op's gate order, then its states and the
    optional inputs ONNX has no place for."""

    input_weights: tuple[int, ...]
    recurrent_weights: tuple[int, ...]
    biases: tuple[int, ...]
    states: tuple[int, ...]  # the state variables, which the interpreter starts at zero
    peepholes: tuple[int, ...] = ()
    projection: tuple[int, ...] = ()
    layer_norm: tuple[int, ...] = ()
    aux_weights: tuple[int, ...] = ()


def _lstm_half(first: int, states: tuple, layer_norm: tuple = (), aux_weights: tuple = ()) -> _Half:
    """An LSTM direction's positions from its first weight's: 4 input and 4 recurrent weights,
    3 peepholes, 4 biases, the projection's weights and bias (TFLite's schema)."""
    return _Half(input_weights=tuple(range(first, first + 4)), recurrent_weights=tuple(range(first + 4, first + 8)),
                 peepholes=tuple(range(first + 8, first + 11)), biases=tuple(range(first + 11, first + 15)),
                 projection=(first + 15, first + 16), states=states, layer_norm=layer_norm, aux_weights=aux_weights)


@dataclass(frozen=True)
class FusedOp:
    """A fused recurrent op's layout: the ONNX op it becomes, its gate order, its directions."""

    onnx_op: str
    gates: tuple[str, ...]  # the op's gate order (LSTM: i, f, c, o)
    onnx_gates: tuple[str, ...]  # ONNX's gate order
    halves: tuple[_Half, ...]  # forward, then backward
    aux_input: Optional[int] = None

    @property
    def what(self) -> str:
        return f"the fused {'bidirectional ' if len(self.halves) > 1 else ''}{self.onnx_op}"


_LSTM_GATES, _ONNX_LSTM_GATES = ("i", "f", "c", "o"), ("i", "o", "f", "c")
OPS = {
    "TFL_UNIDIRECTIONAL_SEQUENCE_LSTM": FusedOp("LSTM", _LSTM_GATES, _ONNX_LSTM_GATES, (
        _lstm_half(1, states=(18, 19), layer_norm=(20, 21, 22, 23)),)),
    "TFL_BIDIRECTIONAL_SEQUENCE_LSTM": FusedOp("LSTM", _LSTM_GATES, _ONNX_LSTM_GATES, (
        _lstm_half(1, states=(35, 36), aux_weights=(40, 41, 42, 43)),
        _lstm_half(18, states=(37, 38), aux_weights=(44, 45, 46, 47))), aux_input=39),
    "TFL_UNIDIRECTIONAL_SEQUENCE_RNN": FusedOp("RNN", ("h",), ("h",), (_Half((1,), (2,), (3,), states=(4,)),)),
    "TFL_BIDIRECTIONAL_SEQUENCE_RNN": FusedOp("RNN", ("h",), ("h",), (
        _Half((1,), (2,), (3,), states=(4,), aux_weights=(10,)),
        _Half((5,), (6,), (7,), states=(8,), aux_weights=(11,))), aux_input=9),
}
# the op's fused activation as an ONNX one, with the bound of its values (None: unbounded)
_ACTIVATIONS = {"TANH": (Activation("Tanh"), 1.0), "SIGMOID": (Activation("Sigmoid"), 1.0),
                "RELU": (Activation("Relu"), None), "NONE": (Activation("Affine", 1.0, 0.0), None)}


def kind_of(onnx_op: str) -> CellKind:
    """The cell family whose node is ``onnx_op``."""
    from .. import cell_kinds

    found = [kind for kind in cell_kinds() if kind.onnx_op == onnx_op and not kind.form_of]
    require(len(found) == 1, f"no cell family becomes ONNX's {onnx_op}")
    return found[0]


def op_name(node) -> str:
    """The op as the file names it (its first output): tf2onnx's reader suffixes a quantized output's."""
    return node.name[:-len("_prequant")] if node.name.endswith("_prequant") else node.name


def fused_passes(graph, node, layout: Optional[FusedLayout], name: str,
                 allowed: Approximations = Approximations()) -> list:
    """The passes a fused recurrent op computes (one per direction); ``layout``: what the file says of
    the op (its input positions present, in the node's input order; who reads its state variables)."""
    op = OPS[node.type]
    require(layout is not None and len(layout.positions) == len(node.input), "the op's input positions are "
            "unknown (the file's layout was not read)", node.name)
    inputs = dict(zip(layout.positions, node.input))
    require(op.aux_input not in inputs, f"{op.what} takes an auxiliary input (ONNX's {op.onnx_op} has none)",
            node.name)
    activation, bound = _ACTIVATIONS.get(str(attr(node, "fused_activation_function", "TANH")), (None, None))
    require(activation is not None, f"{op.what}'s activation {attr(node, 'fused_activation_function')} has no "
            "ONNX recurrent equivalent", node.name)
    batch_major = not attr(node, "time_major", 0)
    _check_merged_batch(graph, node, op, inputs[_X], batch_major)
    if op.onnx_op == "LSTM":
        _check_clip(graph, node, inputs[_X], batch_major, bound, allowed)
        activations = (Activation("Sigmoid"), activation, activation)
    else:
        activations = (activation,)
    x, x_unreversed = _source(graph, inputs[_X], batch_major, len(op.halves))
    outputs = _outputs(graph, node, op, batch_major)
    for half in op.halves:
        _check_half(graph, op, half, inputs, node.name)
    weights = [_weights(graph, op, half, inputs, node.name, allowed) for half in op.halves]
    shared = _shared_states(graph, node, op, inputs, layout)  # the last step: it rewires the op's readers
    passes = []
    for index, half in enumerate(op.halves):
        backward = index == 1 or x_unreversed is not None
        wiring = Wiring(x=x, x_unreversed=x_unreversed or (x if backward else None), batch_major=batch_major,
                        final_states=shared[index][0], **outputs[index])
        # a row per direction, as for a Keras Bidirectional's two loops
        passes.append(Pass(loop=op_name(node) + (" (backward)" if index else ""), name=name, kind=kind_of(op.onnx_op),
                           direction=Direction.BACKWARD if backward else Direction.FORWARD,
                           activations=activations, attributes=(), wiring=wiring,
                           note="; ".join(filter(None, (_dequantized_note(graph, inputs, half), shared[index][1]))),
                           **weights[index]))
    _merge_outputs(graph, node, passes)
    return passes


def _check_half(graph, op: FusedOp, half: _Half, inputs: dict, where: str) -> None:
    for positions, what in ((half.projection[:1], f"a projection (ONNX's {op.onnx_op} has none)"),
                            (half.layer_norm, f"layer normalisation (ONNX's {op.onnx_op} has none)"),
                            (half.peepholes, "peepholes"), (half.aux_weights, "auxiliary input weights")):
        require(not any(p in inputs for p in positions), f"{op.what} uses {what}", where)
    require(half.input_weights[0] in inputs, f"{op.what} couples its input gate to its forget gate (no input-gate "
            "weights)", where)
    for state in half.states:
        require(state not in inputs or _starts_at_zero(graph, inputs[state]), f"{op.what}'s state starts from a "
                "value other than the interpreter's zeros", where)


def _shared_states(graph, node, op: FusedOp, inputs: dict, layout: FusedLayout) -> list:
    """Per direction: (final states other ops read, a note). TFLite's converter may give a state
    variable and another op's zero input one tensor; the interpreter runs the op first, so the
    other op reads the state the op leaves. That op is rewired here to this one's final state
    (through an Identity the emitter feeds), exactly as the interpreter computes."""
    after, before = dict(layout.readers_after), dict(layout.readers_before)
    for position, readers in before.items():
        require(not readers, f"{op.what}'s state variable is read by {', '.join(readers)} before the op runs, "
                "which the conversion does not model", node.name)
    found = []
    for half in op.halves:
        states, readers_of_half = [], []
        for role, position in zip((StateRole.HIDDEN, StateRole.CELL), half.states):
            readers = [graph.get_node_by_name(r) for r in after.get(position, ())]
            readers = [r for r in readers if r is not None]
            if position not in inputs or not readers:
                continue
            pending = f"{op_name(node)}__final_{role.name.lower()}"
            identity = graph.make_node("Identity", [pending], op_name_scope=op_name(node))
            for reader in readers:
                graph.replace_input(reader, inputs[position], identity.output[0])
            states.append((role, pending))
            readers_of_half.extend(r.name for r in readers)
        note = (f"the file's converter gave {', '.join(sorted(set(readers_of_half)))} this layer's state variable as "
                "its zero input: as in the TFLite interpreter, it reads the state this layer leaves (the Keras model "
                "gives it zeros)") if readers_of_half else ""
        found.append((tuple(states), note))
    return found


def _check_merged_batch(graph, node, op: FusedOp, x: str, batch_major: bool) -> None:
    """TFLite's bidirectional LSTM kernel, batch-major with merged outputs, gives rows past the second
    of a batch that are not its two directions joined (measured: the unmerged op and the ONNX node
    agree, the merged kernel does not): the conversion would differ from the file there."""
    if node.type != "TFL_BIDIRECTIONAL_SEQUENCE_LSTM" or not batch_major or len(node.output) != 1:
        return
    shape = graph.get_shape(x) or []
    require(len(shape) == 3 and shape[0] == 1, f"{op.what} merges its outputs batch-major over a batch other than "
            "1, where the TFLite kernel's rows after the second are not its two directions joined: the conversion "
            "would differ from the file there", node.name)


def _check_clip(graph, node, x: str, batch_major: bool, bound: Optional[float], allowed: Approximations) -> None:
    """A cell clip is exact to leave out where it can never act (see the module's note)."""
    clip = float(attr(node, "cell_clip", 0.0) or 0.0)
    require(float(attr(node, "proj_clip", 0.0) or 0.0) == 0.0, "the fused LSTM clips a projection", node.name)
    if clip <= 0 or allowed.drop_cell_clip:
        return
    shape = graph.get_shape(x) or []
    steps = shape[1 if batch_major else 0] if len(shape) == 3 else -1
    never = bound is not None and steps is not None and 0 < steps and steps * bound <= clip
    over = "a dynamic number of" if not steps or steps < 0 else steps
    require(never, f"the fused LSTM clips its cell state at +-{clip:g} each step (cell_clip), which ONNX's LSTM "
            f"cannot: over {over} steps the clip can act, and the model would differ from the TFLite file there (it "
            "would equal the Keras layer, which does not clip); convert with drop_cell_clip=True (--drop-cell-clip) "
            "to leave it out", node.name)


def _weights(graph, op: FusedOp, half: _Half, inputs: dict, where: str, allowed: Approximations) -> dict:
    """W, R, B in ONNX gate order from the op's per-gate [units, features] weights."""
    order = [op.gates.index(gate) for gate in op.onnx_gates]
    try:
        W = np.concatenate([_value(graph, inputs[half.input_weights[g]], op, where, allowed) for g in order])
        R = np.concatenate([_value(graph, inputs[half.recurrent_weights[g]], op, where, allowed) for g in order])
        hidden = R.shape[1]
        biases = [_value(graph, inputs[half.biases[g]], op, where, allowed) if half.biases[g] in inputs
                  else np.zeros(hidden, np.float32) for g in order]
    except KeyError as missing:
        raise NoMatch(f"{op.what} lacks its input {missing}", where) from None
    gates = len(op.gates)
    require(W.ndim == 2 and R.ndim == 2 and R.shape == (gates * hidden, hidden), f"{op.what}'s weights are not "
            "per-gate matrices", where)
    B = np.concatenate(biases + [np.zeros(gates * hidden, np.float32)])
    return dict(hidden_size=hidden, input_size=W.shape[1], dtype=np.dtype(np.float32), W=W, R=R, B=B)


def _value(graph, tensor: str, op: FusedOp, where: str, allowed: Approximations) -> np.ndarray:
    """A weight's value: a constant, a float16 one widened (as the TFLite kernel computes), or with
    ``dequantize`` an integer one dequantized."""
    require(_stored_type(graph, tensor) in (None, onnx.TensorProto.FLOAT16) or allowed.dequantize,
            f"{op.what} is quantized to integers (full-integer quantization): its integer arithmetic has no exact "
            "ONNX form; convert with dequantize=True (--dequantize) to compute in float with the weights as stored",
            where)
    try:
        return np.asarray(evaluate(graph, tensor), np.float32)
    except NotEvaluable as error:
        raise NoMatch(f"a weight of {op.what} is not constant: {error.reason}", error.node_name) from error


def _stored_type(graph, tensor: str) -> Optional[int]:
    """The element type a dequantized weight is stored as, or None for a plain constant."""
    producer = graph.get_node_by_output(tensor)
    if producer is None or producer.type not in ("TFL_DEQUANTIZE", "DequantizeLinear"):
        return None
    return graph.get_dtype(producer.input[0])


def _dequantized_note(graph, inputs: dict, half: _Half) -> str:
    weights = half.input_weights + half.recurrent_weights + half.biases
    if any(_stored_type(graph, inputs[p]) not in (None, onnx.TensorProto.FLOAT16) for p in weights if p in inputs):
        return ("computed in float with the weights dequantized as stored, not in the TFLite kernel's integer "
                "arithmetic: outputs differ from the TFLite interpreter by that arithmetic's error")
    return ""


def _starts_at_zero(graph, tensor: str) -> bool:
    """A state variable (no producer: the interpreter's zeros, also when quantized, as the interpreter
    fills a quantized variable with its zero point) or a zero constant."""
    producer = graph.get_node_by_output(tensor)
    if producer is not None and producer.type == "TFL_DEQUANTIZE" \
            and graph.get_node_by_output(producer.input[0]) is None:
        return True
    if producer is None:
        return True
    try:
        return not np.any(evaluate(graph, tensor))
    except NotEvaluable:
        return False


def _reverses_time(graph, node, batch_major: bool) -> bool:
    time_axis = 1 if batch_major else 0
    return node is not None and node.type in ("ReverseV2", "Reverse") \
        and constant_list(graph, node.input[1]) in ([time_axis], [time_axis - 3])


def _source(graph, x: str, batch_major: bool, halves: int) -> tuple:
    """The input as the op steps through it, and for a one-direction op behind a reversal in time (a
    tf_keras Bidirectional's backward layer, go_backwards) the input before it, else None."""
    producer = graph.get_node_by_output(x)
    if halves == 1 and batch_major and _reverses_time(graph, producer, batch_major):
        return x, producer.input[0]
    return x, None


def _outputs(graph, node, op: FusedOp, batch_major: bool) -> list:
    """Each direction's outputs: the op's sequence (batch- or time-major as its input), its reversal in
    time (a tf_keras Bidirectional's backward half), or a bidirectional op's halves in time order."""
    if len(op.halves) == 1:
        output = node.output[0]
        consumers = graph.find_output_consumers(output)
        if consumers and batch_major and all(_reverses_time(graph, c, batch_major) for c in consumers):
            found = tuple(c.output[0] for c in consumers)
            require_not_graph_outputs(graph, found, node.name)
            return [dict(reversed_output=found)]
        require_not_graph_outputs(graph, [output], node.name)
        return [dict(sequence_output=(output,))]
    require(len(node.output) in (1, 2), f"{op.what} has {len(node.output)} outputs", node.name)
    require_not_graph_outputs(graph, node.output, node.name)
    halves = node.output if len(node.output) == 2 else [f"{node.name}__{half}" for half in ("forward", "backward")]
    return [dict(sequence_output=(halves[0],)), dict(time_order_output=(halves[1],))]


def _merge_outputs(graph, node, passes: list) -> None:
    """A bidirectional op with ``merge_outputs`` has one output, both halves joined on the last axis:
    the halves' tensors are joined by a Concat that takes the op's place."""
    if len(passes) != 2 or len(node.output) != 1:
        return
    halves = [passes[0].wiring.sequence_output[0], passes[1].wiring.time_order_output[0]]
    merged = graph.make_node("Concat", halves, attr={"axis": -1}, op_name_scope=node.name)
    graph.replace_all_inputs(node.output[0], merged.output[0])
