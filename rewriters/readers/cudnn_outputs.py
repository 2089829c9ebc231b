"""Which tensors of the graph a cuDNN op's passes replace, and the nodes that rebuild the op's outputs.

A pass's sequence and final states are names the emitter's outputs take the place of: for an op of one
layer and direction, the graph's own tensors where Keras's reading of them is recognised (its swap to
batch-major, a go_backwards layer's reversals back into step order, a Bidirectional's reversal of its
backward half, a Squeeze or index of one state); otherwise pending names joined by direction and layer
into the op's layout, which :meth:`Outputs.rewire` puts in place of the op's outputs once every pass is
read. The graph reads each pending name through an Identity whose shape and type are known.
"""
from __future__ import annotations

from typing import Optional

from tf2onnx.graph_builder import GraphBuilder

from ..description import StateRole, require
from .adapt import constant_list, is_constant, is_zero, require_not_graph_outputs, reversals
from .cudnn_op import C_OUT, H_OUT, C, CudnnOp, H, X, Y
from .cudnn_rows import KerasMask, Lengths, same_lengths, transposed

_STATES = ((StateRole.HIDDEN, H, H_OUT), (StateRole.CELL, C, C_OUT))


class Outputs:
    """Which tensors of the graph each pass's outputs replace, and the nodes that rebuild the op's
    outputs from them: a pass's sequence and final states are names the emitter's outputs take the
    place of (a lone layer and direction's are the graph's own tensors where Keras's reading of them is
    recognised), joined by direction and layer into the op's layout; :meth:`rewire` puts those joins in
    place of the op's outputs once every pass is read."""

    def __init__(self, graph, op: CudnnOp, rows, backward: bool):
        self.graph, self.op, self.rows, self.backward = graph, op, rows, backward
        self.builder = GraphBuilder(graph)
        self._rewiring: list = []  # (the op's output, its replacement)
        self._stand_ins: dict = {}  # a pending name -> the Identity the graph reads it through
        self._layers: dict = {}  # layer -> its time-major output
        self._states: dict = {role: self._state_readers(role) for role, _, _ in _STATES}
        node = op.node
        self._used_sequence = bool(graph.find_output_consumers(node.output[Y]))

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
        """(role, input, output) of each state the op's mode carries (LSTM: h and c; others: h)."""
        return [(role, slot, out) for role, slot, out in _STATES
                if role is StateRole.HIDDEN or self.op.mode.name == "lstm"]

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
        out = self.op.node.output[H_OUT if role is StateRole.HIDDEN else C_OUT]
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
        y = node.output[Y]
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
            require(reader.type == "ReverseSequence" and same_lengths(graph, reader.input[1], op, self.rows)
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
            require(reader.type == "ReverseSequence" and same_lengths(graph, reader.input[1], op, self.rows)
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
            dtype = self.graph.get_dtype(self.op.node.input[X])
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
            self._replace(node.output[Y], joined)
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
    """Whether ``node`` reverses a rank-3 tensor along ``axes`` (counted from either end)."""
    return node.type in ("ReverseV2", "Reverse") and \
        constant_list(graph, node.input[1]) in (axes, [a - 3 for a in axes])
