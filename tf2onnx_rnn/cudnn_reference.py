"""The reference a model holding cuDNN's recurrent ops is checked against where TensorFlow cannot run them.

TensorFlow has no CPU kernel for ``CudnnRNN``, ``CudnnRNNV2`` or ``CudnnRNNV3``: on a machine without a
GPU, a SavedModel or graph holding one does not run, and a check that ran it would have nothing to
compare. So there the output shape check and verification run the frozen graph with each such op
computed by TensorFlow ops that run here: :func:`reference_graph` puts, in each op's place, a call of a
function written from cuDNN's equations (its weights sliced from ``params`` by the documented layout,
:mod:`.rewriters.readers.cudnn_params`), which computes the op's outputs:

- past each row's length (V3's ``sequence_lengths``), outputs are zeros and the states those of the row's
  last step; a bidirectional op's backward half runs each row reversed within its length;
- an op whose lengths are a Keras mask's counts (the converter's :class:`~.rewriters.outcome.KerasMaskReading`)
  computes Keras's masked layer on a CPU from that mask, as the converter read it: the states hold at a
  masked step, which outputs the last output (or zeros, in a Bidirectional). Keras's check that the mask
  is right-padded, which cuDNN needs and a CPU does not, is left out (its ``Assert`` ops become no-ops);
  for a go_backwards layer, whose input Keras reverses within the lengths, the function computes the
  step-order outputs of Keras's reversal over the mask and gives them in the form Keras's reversals
  after the op turn back into them.

The report and the verification table name this reference. On a machine with a GPU the source itself
is the reference.

Restoring a TF 1.x cuDNN layer's checkpoint (or TF1 SavedModel) runs ``CudnnRNNCanonicalToParams``,
which writes the canonical weights the checkpoint holds into the opaque ``params`` buffer: GPU-only too.
:func:`canonical_to_params_on_cpu` writes that op as the buffer's documented layout, every weight's values
then every bias's, in the order the op takes them; the converter reads the buffer by the same layout, so
a model restored from canonical weights converts to them whatever cuDNN's own layout is.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .rewriters.readers.cudnn_params import MODES, Layout, pieces, solve_features, solve_hidden

OPS = ("CudnnRNN", "CudnnRNNV2", "CudnnRNNV3")
CANONICAL_TO_PARAMS = ("CudnnRNNCanonicalToParams", "CudnnRNNCanonicalToParamsV2")
NAME = "TensorFlow, its cuDNN ops computed by CPU ops (no GPU here)"


def cudnn_ops(graph_def) -> list:
    """The cuDNN recurrent ops of a frozen graph (its main graph's)."""
    return [node for node in graph_def.node if node.op in OPS]


def held_in_functions(graph_def) -> bool:
    """Whether a function of the graph holds a cuDNN op (the reference replaces the main graph's only)."""
    return any(node.op in OPS for function in graph_def.library.function for node in function.node_def)


def canonical_to_params_on_cpu(graph_def) -> int:
    """Each ``CudnnRNNCanonicalToParams`` (V2) node of ``graph_def`` (in place) computed by CPU ops: a
    ``ConcatV2`` of its weights' then its biases' values, flattened. Returns how many it replaced."""
    from tensorflow.core.framework import attr_value_pb2, node_def_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    added, count = [], 0
    for node in graph_def.node:
        if node.op not in CANONICAL_TO_PARAMS:
            continue
        count += 1
        dtype = node.attr["T"].type
        if node.op == "CudnnRNNCanonicalToParams":
            sizes = (node.attr["num_params"].i,) * 2
        else:
            sizes = (node.attr["num_params_weights"].i, node.attr["num_params_biases"].i)
        data = [name for name in node.input if not name.startswith("^")]
        controls = [name for name in node.input if name.startswith("^")]
        values = data[3:3 + sizes[0] + sizes[1]]  # after num_layers, num_units, input_size
        shape = node_def_pb2.NodeDef(name=f"{node.name}/flat_shape", op="Const")
        shape.attr["dtype"].type = types_pb2.DT_INT32
        shape.attr["value"].tensor.CopyFrom(tensor_pb2.TensorProto(
            dtype=types_pb2.DT_INT32, tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[
                tensor_shape_pb2.TensorShapeProto.Dim(size=1)]), int_val=[-1]))
        axis = node_def_pb2.NodeDef(name=f"{node.name}/axis", op="Const")
        axis.attr["dtype"].type = types_pb2.DT_INT32
        axis.attr["value"].tensor.CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=[0]))
        added += [shape, axis]
        flat = []
        for index, value in enumerate(values):
            reshape = node_def_pb2.NodeDef(name=f"{node.name}/flat_{index}", op="Reshape", input=[value, shape.name])
            reshape.attr["T"].type = dtype
            reshape.attr["Tshape"].type = types_pb2.DT_INT32
            added.append(reshape)
            flat.append(reshape.name)
        name = node.name
        node.Clear()
        node.name, node.op = name, "ConcatV2"
        node.input.extend(flat + [axis.name] + controls)
        node.attr["N"].i = len(flat)
        node.attr["T"].type = dtype
        node.attr["Tidx"].CopyFrom(attr_value_pb2.AttrValue(type=types_pb2.DT_INT32))
    graph_def.node.extend(added)
    return count


def with_stand_ins(graph_def) -> tuple:
    """(``graph_def`` with each cuDNN op computed by CPU ops, what :func:`put_back` needs): a TF 1.x session
    places every node of its graph before it runs any, so a graph holding a cuDNN op cannot even restore its
    variables on a CPU. Restored and frozen with the stand-ins, the graph gets its own nodes back by
    :func:`put_back`."""
    originals = {node.name: _copy(node) for node in graph_def.node if node.op in OPS}
    if not originals:
        return graph_def, ({}, set())
    functions: set = set()
    return reference_graph(graph_def, added=functions), (originals, functions)


def put_back(graph_def, stand_ins: tuple) -> None:
    """The cuDNN ops' own nodes in place of their stand-ins in a graph frozen from :func:`with_stand_ins`'s
    (in place), and the stand-ins' functions gone."""
    originals, functions = stand_ins
    for node in graph_def.node:
        if node.name in originals:
            node.CopyFrom(originals[node.name])
    kept = [f for f in graph_def.library.function if f.signature.name not in functions]
    del graph_def.library.function[:]
    graph_def.library.function.extend(kept)


def _copy(node):
    from tensorflow.core.framework import node_def_pb2

    copy = node_def_pb2.NodeDef()
    copy.CopyFrom(node)
    return copy


def reference_graph(graph_def, keras_masks: Optional[dict] = None, added: Optional[set] = None):
    """``graph_def`` with each cuDNN op computed by CPU ops (``keras_masks``: op name -> how the converter
    read an op whose lengths are a Keras mask's counts) and Keras's right-padding ``Assert`` ops made
    no-ops; ``added`` collects the names of the functions that compute them."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2, graph_pb2

    keras_masks = keras_masks or {}
    imported = tf.Graph()
    with imported.as_default():
        tf.import_graph_def(graph_def, name="")
    result = graph_pb2.GraphDef()
    result.CopyFrom(graph_def)
    known = {f.signature.name for f in result.library.function}
    for node in result.node:
        name, controls = node.name, [tensor for tensor in node.input if tensor.startswith("^")]
        if node.op == "Assert":
            node.Clear()
            node.name, node.op = name, "NoOp"
            node.input.extend(controls)
            continue
        if node.op not in OPS:
            continue
        reading = keras_masks.get(name)
        concrete, inputs, outputs = _function(imported, name, reading)
        for function in [concrete.function_def] + list(concrete.graph.as_graph_def().library.function):
            if function.signature.name not in known:
                result.library.function.add().CopyFrom(function)
                known.add(function.signature.name)
                if added is not None:
                    added.add(function.signature.name)
        node.Clear()
        node.name, node.op = name, "PartitionedCall"
        node.input.extend([tensor.name for tensor in inputs] + controls)
        for key, types in (("Tin", [t.dtype.as_datatype_enum for t in inputs]),
                           ("Tout", [t.dtype.as_datatype_enum for t in outputs])):
            node.attr[key].CopyFrom(attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(type=types)))
        node.attr["f"].CopyFrom(attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(
            name=concrete.function_def.signature.name)))
    return result


def _function(graph, name: str, reading) -> tuple:
    """(the concrete function computing one cuDNN op on the CPU, the tensors it takes, the op's outputs)."""
    import tensorflow as tf

    operation = graph.get_operation_by_name(name)
    inputs = list(operation.inputs)
    if reading is not None:
        inputs.append(graph.get_tensor_by_name(reading.mask if ":" in reading.mask else reading.mask + ":0"))
    signature = [tf.TensorSpec(t.shape, t.dtype) for t in inputs]
    time_major = operation.get_attr("time_major") if operation.type == "CudnnRNNV3" else True
    layout = _layout(operation, time_major)
    dtype, count = operation.inputs[0].dtype, len(operation.outputs)

    def compute(*args):
        x, h0, c0, params = args[:4]
        lengths = args[4] if operation.type == "CudnnRNNV3" else None
        mask = args[-1] if reading is not None else None
        y, h, c = _compute(x, h0, c0, params, lengths, mask, layout, time_major, reading)
        extra = [tf.zeros([0], dtype)] + ([tf.zeros([0], tf.int8)] if count > 4 else [])
        return [y, h, c] + extra

    concrete = tf.function(compute, input_signature=signature, autograph=False).get_concrete_function()
    return concrete, inputs, list(operation.outputs)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _layout(operation, time_major: bool) -> Layout:
    """The op's sizes, as the converter reads them (from its initial state's and input's static shapes)."""
    mode = MODES[_text(operation.get_attr("rnn_mode"))]
    directions = 2 if _text(operation.get_attr("direction")) == "bidirectional" else 1
    input_mode = _text(operation.get_attr("input_mode"))
    x_shape, h_shape = operation.inputs[0].shape, operation.inputs[1].shape
    pseudo = h_shape[0 if time_major else 1]
    layers = pseudo // directions
    params = int(np.prod(operation.inputs[3].shape))
    features, hidden = x_shape[-1], h_shape[-1]
    if hidden is None:
        hidden = solve_hidden(mode, params, features, layers, directions,
                              {"skip_input": True, "auto_select": None}.get(input_mode, False))
    elif features is None:
        features = solve_features(mode, params, hidden, layers, directions, input_mode)
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and features == hidden)
    return Layout(mode, layers, directions, int(hidden), int(features), skip)


def _compute(x, h0, c0, params, lengths, mask, layout: Layout, time_major: bool, reading):
    """The op's outputs (y, h, c) in its own layout."""
    import tensorflow as tf

    if layout.mode.name != "lstm":  # cuDNN reads no cell state (Keras passes a scalar 0)
        c0 = tf.zeros_like(h0)
    if not time_major:
        x, h0, c0 = (tf.transpose(t, [1, 0, 2]) for t in (x, h0, c0))
    steps, batch = tf.shape(x)[0], tf.shape(x)[1]
    lengths = tf.fill([batch], steps) if lengths is None else tf.cast(lengths, tf.int32)
    weights = _weights(params, layout)
    if reading is not None:
        kept = tf.cast(mask, tf.bool)
        kept = kept if reading.time_axis == 0 else tf.transpose(kept)
        if reading.backward:  # the op's input is Keras's reversal within the lengths: undone, then Keras's own
            x = tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1)
            x, kept = tf.reverse(x, [0]), tf.reverse(kept, [0])
        y, h, c = _run(x, kept, h0[0], c0[0], weights[0], layout, 0, reading.carry)
        if reading.backward:  # what Keras's reversals after the op turn into its step-order outputs
            y = tf.reverse_sequence(tf.reverse(y, [0]), lengths, seq_axis=0, batch_axis=1)
        finals_h, finals_c = [h], [c]
    else:
        kept = tf.transpose(tf.sequence_mask(lengths, steps))
        layer_input, finals_h, finals_c = x, [], []
        for layer in range(layout.layers):
            halves = []
            for direction in range(layout.directions):
                pseudo = layer * layout.directions + direction
                source = layer_input if direction == 0 else tf.reverse_sequence(layer_input, lengths, 0, 1)
                y, h, c = _run(source, kept, h0[pseudo], c0[pseudo], weights[pseudo], layout, layer, False)
                halves.append(y if direction == 0 else tf.reverse_sequence(y, lengths, 0, 1))
                finals_h.append(h)
                finals_c.append(c)
            layer_input = tf.concat(halves, axis=-1)
        y = layer_input
    h, c = tf.stack(finals_h), tf.stack(finals_c)
    if not time_major:
        y, h, c = (tf.transpose(t, [1, 0, 2]) for t in (y, h, c))
    return y, h, c


def _weights(params, layout: Layout) -> list:
    """Per pseudo-layer, per kind (W, R, Wb, Rb), the gates in cuDNN's order, sliced from ``params``."""
    import tensorflow as tf

    flat = tf.reshape(params, [-1])
    found = [{"W": [], "R": [], "Wb": [], "Rb": []} for _ in range(layout.pseudo_layers)]
    for piece in pieces(layout):
        found[piece.pseudo_layer][piece.what].append(tf.reshape(flat[piece.offset:piece.offset + piece.size],
                                                                piece.shape))
    return found


def _run(x, kept, h, c, weights: dict, layout: Layout, layer: int, carry: bool):
    """One direction over time-major ``x``: the states hold where ``kept`` [T, B] is false, which outputs
    the last output (``carry``) or zeros. Returns (outputs [T, B, H], final h, final c)."""
    import tensorflow as tf

    mode = layout.mode.name
    skip = layer == 0 and layout.skip_input

    def pre(x_t, h_t, gate: int, reset=None):
        input_part = x_t if skip else tf.matmul(x_t, weights["W"][gate], transpose_b=True)
        recurrent = tf.matmul(h_t, weights["R"][gate], transpose_b=True) + weights["Rb"][gate]
        if reset is not None:
            recurrent = reset * recurrent
        return input_part + weights["Wb"][gate] + recurrent

    def cell(x_t, h_t, c_t):
        if mode == "lstm":
            i, f = tf.sigmoid(pre(x_t, h_t, 0)), tf.sigmoid(pre(x_t, h_t, 1))
            g, o = tf.tanh(pre(x_t, h_t, 2)), tf.sigmoid(pre(x_t, h_t, 3))
            c_new = f * c_t + i * g
            return o * tf.tanh(c_new), c_new
        if mode == "gru":
            r, z = tf.sigmoid(pre(x_t, h_t, 0)), tf.sigmoid(pre(x_t, h_t, 1))
            n = tf.tanh(pre(x_t, h_t, 2, reset=r))
            return (1 - z) * n + z * h_t, c_t
        activation = tf.nn.relu if mode == "rnn_relu" else tf.tanh
        return activation(pre(x_t, h_t, 0)), c_t

    def step(state, elements):
        h_t, c_t, out = state
        x_t, k_t = elements
        h_new, c_new = cell(x_t, h_t, c_t)
        k = k_t[:, None]
        return (tf.where(k, h_new, h_t), tf.where(k, c_new, c_t),
                tf.where(k, h_new, out if carry else tf.zeros_like(h_new)))

    hs, cs, ys = tf.scan(step, (x, kept), initializer=(h, c, tf.zeros_like(h)))
    return ys, hs[-1], cs[-1]


class CpuReference:
    """A source's checks run against its frozen graph with its cuDNN ops computed by CPU ops: what a
    conversion is checked against where TensorFlow lists no GPU (:func:`checked_source`)."""

    def __init__(self, source, frozen, keras_masks: dict):
        self.source, self.frozen, self.keras_masks = source, frozen, keras_masks

    def verify(self, model_proto, tolerance: float, values: bool = True):
        from .sources.outside_ops import executed_ops, outside, refuse_outside
        from .verify import verify_graph_def

        graph_def = reference_graph(self.frozen.graph_def, self.keras_masks)
        if getattr(self.source, "safe_mode", True):
            refuse_outside(outside(executed_ops(graph_def, self.frozen.output_names)),
                           "verification runs the frozen graph, which runs")
        return verify_graph_def(graph_def, self.frozen.input_names,
                                self.frozen.output_names, model_proto, tolerance=tolerance, values=values,
                                reference_name=NAME)


def checked_source(source, frozen, keras_masks: dict):
    """What a conversion's checks run: ``source`` itself, or where its frozen graph holds cuDNN ops and
    TensorFlow lists no GPU to run them, :class:`CpuReference`."""
    from .keras_kernels import gpu_visible

    graph_def = getattr(frozen, "graph_def", None)
    if graph_def is None or not cudnn_ops(graph_def) or gpu_visible():
        return source
    return CpuReference(source, frozen, keras_masks)
