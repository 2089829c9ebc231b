"""Names for a converted model's dynamic dimensions, in place of tf2onnx's ``unk__214``.

An input's dynamic axis is named for what it is where that is known, else for where it is:

- ``batch``: a Keras model's inputs at axis 0 (Keras feeds every input the same samples), and any
  input axis the graph carries, unchanged, to a recurrent node's batch axis;
- ``time``: an input axis the graph carries to a recurrent node's sequence axis, or to the axis a
  ``Scan`` steps through (the Scan form's layers), whether or not an output keeps it;
- ``<input>_dim<k>`` otherwise. Where two inputs have batch or time axes not known to be one
  (two sequences of their own lengths), each is ``<input>_batch`` / ``<input>_time``.

"Carries" is read from ONNX shape inference run with a symbol of its own on every input axis:
the symbol that reaches a node's ``X`` (``initial_h``, ``sequence_lens``) is the axis's. An output
axis takes an input axis's name only when the output shape check (or verification) measured it
equal to that axis in every round, the inputs' axes at sizes of their own; where several input
axes measured alike, shape inference's symbol for the output axis picks among them, else none
does. Every other dynamic output axis is ``<output>_dim<k>``, never shared. The graph's
intermediate shapes follow the renaming where a tf2onnx symbol maps to one name, and lose the
symbol where it does not.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import onnx

from .rewriters.written.graph import attribute, subgraphs

logger = logging.getLogger("tf2onnx_rnn")

# recurrent op -> (input slots whose axis 1 is the batch in layout 0: initial states, and the slot of sequence_lens)
_RECURRENT = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}
_SEQUENCE_LENS = 4


def name_dimensions(model_proto: onnx.ModelProto, measured: Sequence = (), keras: bool = False,
                    state_inputs: Sequence[str] = (), infer: bool = True) -> str:
    """Name the dynamic axes of ``model_proto``'s inputs and outputs (in place) and rename its
    intermediate shapes to match; return the names in one line for the report.

    ``measured``: the rounds the model ran, as :attr:`verify.VerificationResult.measured`;
    ``keras``: the source is a Keras model (its inputs' axis 0 is the batch); ``state_inputs``: the
    streamed states, which are not a Keras input; ``infer``: shape inference may run (not on a
    model too large for protobuf).
    """
    try:
        return _named(model_proto, measured, keras, state_inputs, infer)
    except Exception as error:  # noqa: BLE001 - names only: the model computes the same with tf2onnx's
        logger.warning("dynamic dimensions keep tf2onnx's names: internal error: %s: %s", type(error).__name__, error,
                       exc_info=True)
        return ""


def _named(model_proto: onnx.ModelProto, measured: Sequence, keras: bool, state_inputs: Sequence[str],
           infer: bool) -> str:
    graph = model_proto.graph
    axes = [(value.name, axis) for value in graph.input for axis, dim in enumerate(_dims(value)) if _dynamic(dim)]
    classes = _Classes(axes)
    if keras:
        classes.union_all([(name, 0) for name, axis in axes if axis == 0 and name not in state_inputs], "batch")
    symbols = _inferred(model_proto, axes) if infer and axes else None
    if symbols is not None:
        _read_recurrent_nodes(symbols, classes)
    names = classes.names()
    renames: dict = {}  # tf2onnx's symbol -> the new name, None where it takes two
    for value in graph.input:
        for axis, dim in enumerate(_dims(value)):
            if (value.name, axis) in names:
                _rename(dim, names[(value.name, axis)], renames)
    taken = set(names.values())
    for value in graph.output:
        for axis, dim in enumerate(_dims(value)):
            if _dynamic(dim):
                name = _output_name(value.name, axis, measured, classes, names, symbols)
                if name is None:
                    name = _free(f"{value.name}_dim{axis}", taken)
                    taken.add(name)
                _rename(dim, name, renames)
    _rename_intermediates(graph, renames)
    return "; ".join(f"{value.name}[{', '.join(_shown(dim) for dim in _dims(value))}]"
                     for value in list(graph.input) + list(graph.output) if any(_dynamic(d) for d in _dims(value)))


class _Classes:
    """Input axes known to be one dimension (union-find), and whether each is a batch or a time axis."""

    def __init__(self, axes: list):
        self.axes = axes
        self.parent = {axis: axis for axis in axes}
        self.roles: dict = {}  # root -> {"batch", "time"}

    def root(self, axis):
        while self.parent[axis] != axis:
            self.parent[axis] = self.parent[self.parent[axis]]
            axis = self.parent[axis]
        return axis

    def union_all(self, axes: list, role: Optional[str] = None) -> None:
        axes = [axis for axis in axes if axis in self.parent]
        if not axes:
            return
        roles = set()
        for axis in axes:
            roles |= self.roles.pop(self.root(axis), set())
        first = self.root(axes[0])
        for axis in axes[1:]:
            self.parent[self.root(axis)] = first
        self.roles[first] = roles | ({role} if role else set())

    def names(self) -> dict:
        """Input axis -> its name: ``batch`` / ``time`` for the one class of that role, qualified by
        the first input's name where several are, ``<input>_dim<k>`` for the rest."""
        members: dict = {}
        for axis in self.axes:
            members.setdefault(self.root(axis), []).append(axis)
        role_of = {root: next(iter(roles)) for root, roles in self.roles.items() if len(roles) == 1}
        count = {role: sum(1 for r in role_of.values() if r == role) for role in ("batch", "time")}
        names, taken = {}, set()
        for root, group in members.items():
            first_input, first_axis = group[0]
            role = role_of.get(root)
            if role and count[role] == 1:
                name = role
            elif role:
                name = f"{first_input}_{role}"
            else:
                name = f"{first_input}_dim{first_axis}"
            name = _free(name, taken)
            taken.add(name)
            names.update({axis: name for axis in group})
        return names


def _read_recurrent_nodes(symbols: dict, classes: _Classes) -> None:
    """Union the input axes whose symbols reach a recurrent node's batch axis, and mark them (and
    those reaching its sequence axis) with their role."""
    by_symbol = {f"__axis_{index}": axis for index, axis in enumerate(classes.axes)}
    for node, shapes in symbols.get("__nodes__", ()):
        if node.op_type == "Scan":  # each scanned input's scanned axis (0 unless the node says)
            scanned = list(node.input)[len(node.input) - (attribute(node, "num_scan_inputs") or 0):]
            axes = list(attribute(node, "scan_input_axes") or [0] * len(scanned))
            for name, axis in zip(scanned, axes):
                x = shapes.get(name) or []
                if -len(x) <= axis < len(x) and x[axis] in by_symbol:
                    classes.union_all([by_symbol[x[axis]]], "time")
            continue
        time_axis, batch_axis = (1, 0) if attribute(node, "layout") == 1 else (0, 1)
        x = shapes.get(node.input[0]) or []
        batch = [x[batch_axis] if len(x) > batch_axis else None]
        for slot in _RECURRENT[node.op_type]:
            if len(node.input) > slot and node.input[slot]:
                state = shapes.get(node.input[slot]) or []
                batch.append(state[batch_axis] if len(state) > batch_axis else None)
        if len(node.input) > _SEQUENCE_LENS and node.input[_SEQUENCE_LENS]:
            lengths = shapes.get(node.input[_SEQUENCE_LENS]) or []
            batch.append(lengths[0] if lengths else None)
        classes.union_all([by_symbol[s] for s in batch if s in by_symbol], "batch")
        if len(x) > time_axis and x[time_axis] in by_symbol:
            classes.union_all([by_symbol[x[time_axis]]], "time")


def _inferred(model_proto: onnx.ModelProto, axes: list) -> Optional[dict]:
    """ONNX shape inference over a copy whose input axes each carry a symbol of their own
    (``__axis_<i>``) and whose intermediate shapes are dropped: {"__nodes__": [(recurrent node,
    {its inputs' shapes as symbols or sizes})], output name: its shape}. None when inference fails."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model_proto)
    del copy.graph.value_info[:]
    index = {axis: i for i, axis in enumerate(axes)}
    for value in copy.graph.input:
        for axis, dim in enumerate(_dims(value)):
            if (value.name, axis) in index:
                dim.dim_param = f"__axis_{index[(value.name, axis)]}"
    for value in copy.graph.output:
        for dim in _dims(value):
            if _dynamic(dim):
                dim.Clear()
    try:
        # with data propagation: a Scan form's hoisted work reshapes by shapes it computes
        inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True)
    except Exception as error:  # noqa: BLE001 - then no axis is named from the graph
        logger.info("dimension names without shape inference: %s: %s", type(error).__name__, error)
        return None
    shapes = {value.name: [_symbol(d) for d in _dims(value)]
              for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)}
    recurrent = [node for node in inferred.graph.node
                 if (node.op_type in _RECURRENT or node.op_type == "Scan") and node.domain in ("", "ai.onnx")]
    found = {"__nodes__": [(node, {name: shapes.get(name) for name in node.input}) for node in recurrent]}
    found.update({value.name: shapes.get(value.name) for value in inferred.graph.output})
    return found


def _output_name(output: str, axis: int, measured: Sequence, classes: _Classes, names: dict,
                 symbols: Optional[dict]) -> Optional[str]:
    """The name of the input axis this output axis measured equal to in every round (None: no one)."""
    if not measured:
        return None
    candidates = []
    for root in {classes.root(a) for a in classes.axes}:
        members = [a for a in classes.axes if classes.root(a) == root]
        if all(_size(round_, members) is not None and _size(round_, members) == _out_size(round_, output, axis)
               for round_ in measured):
            candidates.append(root)
    if len(candidates) == 1:
        return names[candidates[0]]
    if len(candidates) > 1 and symbols is not None:  # shape inference tells which of them it is
        shape = symbols.get(output) or []
        by_symbol = {f"__axis_{index}": a for index, a in enumerate(classes.axes)}
        inferred = by_symbol.get(shape[axis]) if len(shape) > axis else None
        if inferred is not None and classes.root(inferred) in candidates:
            return names[inferred]
    return None


def _size(round_, members: list) -> Optional[int]:
    """The size a class of input axes was fed in a round (None: none of them fed)."""
    inputs, _ = round_
    sizes = {inputs[name][axis] for name, axis in members if name in inputs and len(inputs[name]) > axis}
    return sizes.pop() if len(sizes) == 1 else None


def _out_size(round_, output: str, axis: int) -> Optional[int]:
    _, outputs = round_
    shape = outputs.get(output)
    return shape[axis] if shape is not None and len(shape) > axis else None


def _rename_intermediates(graph: onnx.GraphProto, renames: dict) -> None:
    """Every value_info dim (subgraphs' included) carrying a tf2onnx symbol of an input or output
    takes its new name; a ``unk__`` symbol mapped to no single name is dropped (the dim stays unknown)."""
    for value in graph.value_info:
        for dim in _dims(value):
            if dim.HasField("dim_param"):
                new = renames.get(dim.dim_param)
                if new:
                    dim.dim_param = new
                elif dim.dim_param.startswith("unk__"):
                    dim.ClearField("dim_param")
    for node in graph.node:
        for sub in subgraphs(node):
            _rename_intermediates(sub, renames)


def _rename(dim, name: str, renames: dict) -> None:
    old = dim.dim_param if dim.HasField("dim_param") else ""
    if old:
        renames[old] = name if renames.get(old, name) == name else None
    dim.dim_param = name


def _free(name: str, taken: set) -> str:
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name}_{number}"
    return candidate


def _dims(value) -> list:
    tensor_type = value.type.tensor_type
    return list(tensor_type.shape.dim) if tensor_type.HasField("shape") else []


def _dynamic(dim) -> bool:
    return not dim.HasField("dim_value")


def _symbol(dim):
    return dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)


def _shown(dim) -> str:
    return str(dim.dim_value) if dim.HasField("dim_value") else dim.dim_param

