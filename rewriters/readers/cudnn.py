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

from dataclasses import dataclass
from typing import Optional

import numpy as np
from tf2onnx.graph_builder import GraphBuilder

from ..cells.evaluate import NotEvaluable, evaluate
from ..description import CellKind, Direction, MaskedOutput, NoMatch, Pass, StateRole, Wiring, require
from ..outcome import KerasMaskReading
from .adapt import (
    constant_list,
    is_constant,
    is_zero,
    mask_source,
    per_row_reversal,
    require_not_graph_outputs,
    reversals,
    tensor_key,
)
from .cudnn_params import MODES, Layout, Mode, decode, solve_features, solve_hidden

OPS = ("CudnnRNN", "CudnnRNNV2", "CudnnRNNV3")
_X, _H, _C, _PARAMS, _LENGTHS = range(5)  # the op's inputs
_Y, _H_OUT, _C_OUT = range(3)  # its outputs used
_STATES = ((StateRole.HIDDEN, _H, _H_OUT), (StateRole.CELL, _C, _C_OUT))


def _attr(node, key: str, default=None):
    value = node.get_attr_value(key, default)
    return value.decode() if isinstance(value, bytes) else value


def mode_of(node) -> Mode:
    mode = MODES.get(str(_attr(node, "rnn_mode", "lstm")))
    require(mode is not None, f"{node.type}'s rnn_mode {_attr(node, 'rnn_mode')!r} is none of "
            f"{', '.join(MODES)}", node.name)
    return mode


def kind_of(node) -> CellKind:
    """The cell family the op's mode is (a pass of it pairs with a loop's of that family: a Keras
    Bidirectional may hold one layer cuDNN takes and one it does not)."""
    from .. import cell_kinds

    mode = MODES.get(str(_attr(node, "rnn_mode", "lstm")), MODES["lstm"])
    return next(kind for kind in cell_kinds() if kind.onnx_op == mode.onnx_op and not kind.form_of)


# -- how the op's rows are masked ------------------------------------------------------------------
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


# -- the op as a whole ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Op:
    node: object
    mode: Mode
    layout: Layout
    time_major: bool
    params: np.ndarray  # the flat buffer's values

    @property
    def dtype(self) -> np.dtype:
        return self.params.dtype

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def what(self) -> str:
        return f"{self.node.type} ({self.mode.name})"

    @property
    def time_axis(self) -> int:
        return 0 if self.time_major else 1

    @property
    def state_axis(self) -> int:
        """The axis of layers x directions in the initial and final states: [L*D, B, H] time-major,
        [B, L*D, H] batch-major."""
        return 0 if self.time_major else 1


def read_op(graph, node) -> _Op:
    """The op's mode, sizes and layout, or :class:`NoMatch` naming what ONNX cannot compute."""
    mode = mode_of(node)
    what = f"{node.type} ({mode.name})"
    require(int(_attr(node, "num_proj", 0) or 0) == 0, f"{what} projects its output (num_proj): ONNX's "
            f"{mode.onnx_op} has no projection", node.name)
    direction = str(_attr(node, "direction", "unidirectional"))
    require(direction in ("unidirectional", "bidirectional"), f"{what}'s direction {direction!r}", node.name)
    directions = 2 if direction == "bidirectional" else 1
    time_major_ = bool(_attr(node, "time_major", True)) if node.type == "CudnnRNNV3" else True
    x_shape, h_shape = graph.get_shape(node.input[_X]) or [], graph.get_shape(node.input[_H]) or []
    require(len(x_shape) in (0, 3), f"{what}'s input is not of rank 3", node.name)
    features = x_shape[-1] if x_shape and x_shape[-1] not in (None, -1) else None
    state_axis = 0 if time_major_ else 1
    pseudo = h_shape[state_axis] if len(h_shape) == 3 else -1
    require(pseudo not in (None, -1) and pseudo > 0 and pseudo % directions == 0, f"{what}'s number of layers is "
            "not known statically (its initial state's layers x directions axis)", node.name)
    try:
        params = np.asarray(evaluate(graph, node.input[_PARAMS]))
    except NotEvaluable as error:
        raise NoMatch(f"{what}'s params are not constant: {error.reason}", error.node_name) from error
    require(params.dtype.kind == "f", f"{what}'s params are {params.dtype}", node.name)
    layers = pseudo // directions
    input_mode = str(_attr(node, "input_mode", "linear_input"))
    require(input_mode in ("linear_input", "skip_input", "auto_select"), f"{what}'s input_mode {input_mode!r}",
            node.name)
    hidden = h_shape[-1] if h_shape[-1] not in (None, -1) else None
    require(hidden is not None or features is not None, f"{what}'s input features and hidden size are not known "
            "statically", node.name)
    if hidden is None:
        skip = {"skip_input": True, "auto_select": None}.get(input_mode, False)
        hidden = solve_hidden(mode, params.size, features, layers, directions, skip)
    elif features is None:
        features = solve_features(mode, params.size, hidden, layers, directions, input_mode)
    require(hidden is not None and features is not None, f"{what}'s params ({params.size} values) fit no sizes of "
            f"{layers} layer(s) in {directions} direction(s)", node.name)
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and features == hidden)
    require(not skip or features == hidden, f"{what} uses input_mode='skip_input' with {features} input features "
            f"and hidden size {hidden}: it adds its input to each gate only where the two are equal", node.name)
    dropout = float(_attr(node, "dropout", 0.0) or 0.0)
    require(layers == 1 or dropout == 0 or not _attr(node, "is_training", True), f"{what} drops out {dropout:g} of "
            "each layer's outputs at random between its layers (is_training): ONNX's nodes compute no dropout",
            node.name)
    layout = Layout(mode, layers, directions, int(hidden), features, skip)
    return _Op(node, mode, layout, time_major_, params)


def fused_passes(graph, node, name: str) -> tuple:
    """(the passes a cuDNN op computes, one per layer and direction, layer by layer; its
    :class:`~.outcome.KerasMaskReading` where its lengths are a Keras mask's counts, else None)."""
    op = read_op(graph, node)
    weights = decode(op.params, op.layout, node.name)
    rows = _rows(graph, op)
    x, x_unreversed = _input(graph, op, rows)
    outputs = _Outputs(graph, op, rows, backward=x_unreversed is not None)
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
                            **outputs.sequence(layer, direction), **_mask_wiring(graph, op, rows, backward))
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


def _loop_name(op: _Op, layer: int, direction: int) -> str:
    """A row's name: the op's, with its layer where it has several and ``(backward)`` for a bidirectional
    op's backward half, as a Keras Bidirectional's two loops have two rows."""
    name = op.name + (f" (layer {layer})" if op.layout.layers > 1 else "")
    return name + (" (backward)" if direction == 1 else "")


# -- the rows' masking --------------------------------------------------------------------------------
def _rows(graph, op: _Op):
    """How the op masks its rows: :class:`Full`, :class:`Lengths` or :class:`KerasMask`."""
    node = op.node
    if node.type != "CudnnRNNV3" or len(node.input) <= _LENGTHS or not node.input[_LENGTHS]:
        return Full()
    lengths = node.input[_LENGTHS]
    if _fills_time(graph, lengths, node.input[_X], op.time_axis):
        return Full()
    reversal = graph.get_node_by_output(node.input[_X])  # go_backwards: Keras counts the steps it reverses
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
    from onnx import TensorProto

    if graph.get_dtype(mask) != TensorProto.BOOL or len(graph.get_shape(mask) or []) != 2:
        return None
    return mask, axes[0]


def _mask_wiring(graph, op: _Op, rows, backward: bool) -> dict:
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


# -- the input -------------------------------------------------------------------------------------
def _input(graph, op: _Op, rows) -> tuple:
    """(the time-major input the op steps through, the time-major input before a reversal in time or
    None): Keras 3 reverses a go_backwards layer's rows within their lengths (which, lengths filling
    the time axis or a Keras mask's counts, is Keras's go_backwards over the mask); tf_keras reverses
    its input in time."""
    x = op.node.input[_X]
    producer = graph.get_node_by_output(x)
    if producer is not None and producer.type == "ReverseSequence":
        require(op.layout.directions == 1 and op.layout.layers == 1, f"{op.what} over both directions or several "
                "layers reads its input reversed within lengths", op.name)
        require(producer.get_attr_value("seq_dim") == op.time_axis
                and producer.get_attr_value("batch_dim", 0) == 1 - op.time_axis,
                f"{op.what}'s input is reversed along axes other than its time and batch", op.name)
        require(_same_lengths(graph, producer.input[1], op, rows), f"{op.what}'s input is reversed within lengths "
                "other than its own", op.name)
        unreversed = _time_major(graph, op, producer.input[0])
        return unreversed, unreversed
    x_tm = _time_major(graph, op, x)
    if isinstance(rows, Full) and op.time_major and op.layout.layers == 1 and op.layout.directions == 1:
        unreversed = per_row_reversal(graph, x, None, None, op.name)  # tf_keras: Transpose(ReverseV2(x, 1))
        if unreversed is not None:
            return unreversed, unreversed
    return x_tm, None


def _same_lengths(graph, tensor: str, op: _Op, rows) -> bool:
    if isinstance(rows, Full):
        return _fills_time(graph, tensor, op.node.input[_X], op.time_axis) or \
            tensor_key(graph, tensor) == tensor_key(graph, op.node.input[_LENGTHS] if len(op.node.input) > _LENGTHS
                                                    else None)
    own = rows.tensor if isinstance(rows, Lengths) else rows.lengths
    return tensor_key(graph, tensor) == tensor_key(graph, own)


def _time_major(graph, op: _Op, x: str) -> str:
    return x if op.time_major else transposed(graph, x, [1, 0, 2])


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


# -- the outputs ----------------------------------------------------------------------------------------
class _Outputs:
    """Which tensors of the graph each pass's outputs replace, and the nodes that rebuild the op's
    outputs from them: a pass's sequence and final states are names the emitter's outputs take the
    place of (a lone layer and direction's are the graph's own tensors where Keras's reading of them is
    recognised), joined by direction and layer into the op's layout; :meth:`rewire` puts those joins in
    place of the op's outputs once every pass is read."""

    def __init__(self, graph, op: _Op, rows, backward: bool):
        self.graph, self.op, self.rows, self.backward = graph, op, rows, backward
        self.builder = GraphBuilder(graph)
        self._rewiring: list = []  # (the op's output, its replacement)
        self._stand_ins: dict = {}  # a pending name -> the Identity the graph reads it through
        self._layers: dict = {}  # layer -> its time-major output
        self._states: dict = {role: self._state_readers(role) for role, _, _ in _STATES}
        node = op.node
        self._used_sequence = bool(graph.find_output_consumers(node.output[_Y]))

    # states
    def initial_states(self, pseudo: int) -> dict:
        """The Wiring fields of what pseudo-layer ``pseudo`` starts from (zeros where not given)."""
        given, constant = [], []
        for role, slot, _ in self._roles():
            tensor = self.op.node.input[slot]
            if _zero_state(self.graph, tensor):
                continue
            given.append((role, self._state_part(tensor, pseudo)))
            if is_constant(self.graph, tensor):
                constant.append(role)
        return dict(initial_states=tuple(given), constant_states=tuple(constant))

    def _roles(self):
        return [(role, slot, out) for role, slot, out in _STATES if role is StateRole.HIDDEN or self.op.mode.name == "lstm"]

    def _state_part(self, tensor: str, pseudo: int) -> str:
        """[B, H]: pseudo-layer ``pseudo``'s part of a state tensor [L*D, B, H] or [B, L*D, H]."""
        axis = self.op.state_axis
        producer = self.graph.get_node_by_output(tensor)
        if self.op.layout.pseudo_layers == 1 and producer is not None and producer.type == "ExpandDims" \
                and constant_list(self.graph, producer.input[1]) in ([axis], [axis - 3]):
            return producer.input[0]
        part = self.builder.make_slice({"data": tensor, "starts": [pseudo], "ends": [pseudo + 1], "axes": [axis]})
        return self.builder.make_squeeze({"data": part, "axes": [axis]})

    def _state_readers(self, role: StateRole) -> Optional[dict]:
        """pseudo-layer -> the [B, H] tensors that read its part of the op's final state ``role``, where every
        reader takes one part (a Squeeze of a lone part, a StridedSlice of one index); None when some
        reader reads it whole."""
        out = self.op.node.output[_H_OUT if role is StateRole.HIDDEN else _C_OUT]
        readers = self.graph.find_output_consumers(out)
        found: dict = {}
        axis = self.op.state_axis
        for reader in readers:
            if reader.type == "Squeeze" and self.op.layout.pseudo_layers == 1 \
                    and list(reader.get_attr_value("axes") or reader.get_attr_value("squeeze_dims") or []) in (
                        [axis], [axis - 3]):
                found.setdefault(0, []).append(reader.output[0])
                continue
            index = _shrunk_index(self.graph, reader, axis)
            if index is None:
                return None
            found.setdefault(index, []).append(reader.output[0])
        return found

    def final_states(self, pseudo: int) -> tuple:
        found = []
        for role, _, out in self._roles():
            tensor = self.op.node.output[out]
            if not self.graph.find_output_consumers(tensor):
                continue
            readers = self._states[role]
            if readers is not None:
                parts = readers.get(pseudo, [])
                require_not_graph_outputs(self.graph, parts, self.op.name)
                found.extend((role, part) for part in parts)
                continue
            found.append((role, self._state(role, pseudo)))
        return tuple(found)

    # sequences
    def sequence(self, layer: int, direction: int) -> dict:
        """The Wiring fields of a pass's sequence output: a lone layer and direction's as Keras reads it,
        else each layer's halves, which the next layer (and the op's output) reads joined."""
        layout = self.op.layout
        if layout.pseudo_layers == 1:
            return self._last_sequence() if self._used_sequence else {}
        if layer == layout.layers - 1 and not self._used_sequence:
            return {}
        return {"sequence_output" if direction == 0 else "time_order_output": (self._half(layer, direction),)}

    def _half(self, layer: int, direction: int) -> str:
        return self._pending(f"y{layer}" + ("_backward" if direction else ""), [-1, -1, self.op.layout.hidden])

    def layer_output(self, layer: int) -> str:
        """[T, B, H * directions]: a layer's time-major output, which the next layer reads."""
        if layer not in self._layers:
            halves = [self._stand_in(self._half(layer, d)) for d in range(self.op.layout.directions)]
            width = self.op.layout.hidden * len(halves)
            self._layers[layer] = halves[0] if len(halves) == 1 else self.graph.make_node(
                "Concat", halves, attr={"axis": -1}, shapes=[[-1, -1, width]],
                dtypes=[self.graph.get_dtype(halves[0])]).output[0]
        return self._layers[layer]

    def _last_sequence(self) -> dict:
        """A one-direction op's sequence: the tensors Keras reads it as, in step order."""
        graph, op, node = self.graph, self.op, self.op.node
        y = node.output[_Y]
        if self.backward:
            steps = self._backward_steps(y)
            if steps is None:  # reversed within lengths: the rows in time order
                return self._time_order(y)
        else:
            steps = [y]
        if op.time_major:
            require_not_graph_outputs(graph, steps, op.name)
            found = reversals(graph, steps)
            return dict(reversed_output=tuple(found)) if found else dict(sequence_output=tuple(steps))
        flips = [c for s in steps for c in graph.find_output_consumers(s)]
        if flips and all(_reverses(graph, c, [1]) for c in flips):
            found = [c.output[0] for c in flips]
            require_not_graph_outputs(graph, found, op.name)
            return dict(reversed_output=tuple(found))
        pending = self._half(op.layout.layers - 1, 0)
        swapped = transposed(graph, self._stand_in(pending), [1, 0, 2])
        for tensor in steps:
            self._replace(tensor, swapped)
        return dict(sequence_output=(pending,))

    def _backward_steps(self, y: str) -> Optional[list]:
        """A go_backwards layer's outputs in step order: Keras 3 reverses the op's outputs within the
        lengths, then in time (``ReverseV2(ReverseSequence(y, lengths))``), which for lengths that fill the
        time axis or count a mask's kept steps is the step order of Keras's go_backwards over the mask;
        tf_keras uses the op's outputs as they are. None for other lengths, whose per-row reversal is the
        rows in time order."""
        graph, op = self.graph, self.op
        if isinstance(self.rows, Lengths):
            return None
        readers = graph.find_output_consumers(y)
        if not any(r.type == "ReverseSequence" for r in readers):
            require(not isinstance(self.rows, KerasMask), f"{op.what}'s outputs of rows reversed within their "
                    "lengths are used unreversed", op.name)
            return [y]
        steps = []
        for reader in readers:
            require(reader.type == "ReverseSequence" and _same_lengths(graph, reader.input[1], op, self.rows)
                    and reader.get_attr_value("seq_dim") == op.time_axis, f"{op.what}'s outputs are used other "
                    "than reversed back within its lengths", op.name)
            for flip in graph.find_output_consumers(reader.output[0]):
                require(_reverses(graph, flip, [op.time_axis]), f"{op.what}'s outputs reversed within lengths are "
                        "used other than reversed in time", op.name)
                steps.append(flip.output[0])
        return steps

    def _time_order(self, y: str) -> dict:
        """A pass reversed within ``Lengths`` whose outputs are reversed back by them: the rows in time
        order (ONNX's reverse direction over those lengths)."""
        graph, op = self.graph, self.op
        found = []
        for reader in graph.find_output_consumers(y):
            require(reader.type == "ReverseSequence" and _same_lengths(graph, reader.input[1], op, self.rows)
                    and reader.get_attr_value("seq_dim") == op.time_axis, f"{op.what}'s outputs of rows reversed "
                    "within their lengths are used unreversed", op.name)
            found.append(reader.output[0])
        require_not_graph_outputs(graph, found, op.name)
        return dict(time_order_output=tuple(found)) if op.time_major else dict(reversed_output=tuple(found))

    # the op's outputs, rebuilt
    def _pending(self, suffix: str, shape: list) -> str:
        """A name the emitter's output will take the place of (a pass's wiring claims it); the graph reads
        it through an Identity whose shape and type are known (:meth:`_stand_in`)."""
        name = f"{self.op.name}__{suffix}"
        if name not in self._stand_ins:
            dtype = self.graph.get_dtype(self.op.node.input[_X])
            self._stand_ins[name] = self.graph.make_node("Identity", [name], shapes=[shape],
                                                         dtypes=[dtype]).output[0]
        return name

    def _stand_in(self, pending: str) -> str:
        return self._stand_ins[pending]

    def _state(self, role: StateRole, pseudo: int) -> str:
        return self._pending(f"{role.name.lower()}{pseudo}", [-1, self.op.layout.hidden])

    def _replace(self, old: str, new: str) -> None:
        self._rewiring.append((old, new))

    def rewire(self) -> None:
        """The op's outputs read whole take their parts' joins; called when every pass is read."""
        graph, op, node = self.graph, self.op, self.op.node
        layout = op.layout
        if self._used_sequence and layout.pseudo_layers > 1:
            joined = self.layer_output(layout.layers - 1)
            if not op.time_major:
                joined = transposed(graph, joined, [1, 0, 2])
            self._replace(node.output[_Y], joined)
        for role, _, out in self._roles():
            if self._states[role] is None and graph.find_output_consumers(node.output[out]):
                parts = [self.builder.make_unsqueeze({"data": self._stand_in(self._state(role, pseudo)),
                                                      "axes": [op.state_axis]})
                         for pseudo in range(layout.pseudo_layers)]
                joined = parts[0] if len(parts) == 1 else graph.make_node(
                    "Concat", parts, attr={"axis": op.state_axis}).output[0]
                self._replace(node.output[out], joined)
        require_not_graph_outputs(graph, [old for old, _ in self._rewiring], op.name)
        for old, new in self._rewiring:
            graph.replace_all_inputs(old, new)


def _zero_state(graph, tensor: str) -> bool:
    """Whether an initial state is zeros (through Keras's ExpandDims)."""
    node = graph.get_node_by_output(tensor)
    while node is not None and node.type in ("ExpandDims", "Reshape", "Identity"):
        tensor, node = node.input[0], graph.get_node_by_output(node.input[0])
    return is_zero(graph, tensor)


def _shrunk_index(graph, node, axis: int) -> Optional[int]:
    """The index a StridedSlice takes along ``axis`` alone, dropping that axis and keeping the others whole
    (``h[k]``, ``h[:, k]``), else None."""
    if node.type != "StridedSlice" or node.get_attr_value("shrink_axis_mask", 0) != 1 << axis:
        return None
    if node.get_attr_value("ellipsis_mask", 0) or node.get_attr_value("new_axis_mask", 0):
        return None
    begin, strides = constant_list(graph, node.input[1]), constant_list(graph, node.input[3])
    whole = node.get_attr_value("begin_mask", 0) & node.get_attr_value("end_mask", 0)
    if begin is None or len(begin) != axis + 1 or any(s != 1 for s in strides or [0]):
        return None
    if any(not whole >> before & 1 for before in range(axis)):
        return None
    return int(begin[axis])


def _reverses(graph, node, axes: list) -> bool:
    return node.type in ("ReverseV2", "Reverse") and constant_list(graph, node.input[1]) in (axes, [a - 3 for a in axes])
