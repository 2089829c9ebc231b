"""Graphs holding cuDNN's recurrent ops, made here the way Keras and TensorFlow make them on a GPU
machine, and the canonical computations they equal, for the tests.

No GPU is needed to build such a graph (graph construction runs no kernel); none of them runs here:

- :func:`gpu_machine`: TensorFlow lists a GPU, as it does on a machine that has one. Keras 3 then traces
  an LSTM or GRU layer whose configuration cuDNN takes as one ``CudnnRNNV3`` (its probe,
  ``_is_gpu_available``, reads that list); ``model.export`` under it writes what a GPU machine writes.
- :func:`raw_graph`: a TF 1.x graph calling ``CudnnRNN``, ``CudnnRNNV2`` or ``CudnnRNNV3`` itself, as TF
  1.x's cuDNN layers did, its ``params`` built here (:func:`params_of`, written independently of the
  converter's reading) from weights drawn per gate in cuDNN's order.
- :func:`canonical_model`: the same weights in Keras 3's canonical layers (``LSTM``, ``GRU(reset_after=True)``,
  ``SimpleRNN``; ``Bidirectional`` for both directions; a ``Masking`` layer for lengths), run on the CPU:
  the oracle of a raw graph. cuDNN's gates are Keras's (LSTM i, f, c, o) or Keras's with its first two
  swapped (GRU r, z, h against Keras's z, r, h); a GRU's recurrent bias stays inside the reset product in
  both.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import numpy as np

_DIR = tempfile.mkdtemp(prefix="cudnn_graphs_")
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
KERAS_LAYER = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "SimpleRNN", "rnn_relu": "SimpleRNN"}


@contextlib.contextmanager
def gpu_machine():
    """Inside the block TensorFlow lists a GPU (``tf.config.list_logical_devices``), as on a machine that
    has one: Keras 3's probe then answers yes when a model is traced or exported."""
    import tensorflow as tf

    real = tf.config.list_logical_devices

    def listed(device_type=None):
        found = list(real(device_type))
        if device_type in (None, "GPU"):
            found.append(tf.config.LogicalDevice("/device:GPU:0", "GPU"))
        return found

    tf.config.list_logical_devices = listed
    try:
        yield
    finally:
        tf.config.list_logical_devices = real


def cudnn_ops(graph_def) -> list:
    """The cuDNN recurrent ops of a graph def (its functions' included)."""
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return [n.op for n in nodes if n.op.startswith("CudnnRNN")]


def traced(model, specs=None):
    """The graph def of ``model(x, training=False)`` traced by a ``tf.function`` for ``specs`` (by default
    the model's inputs'), as an export traces it: under :func:`gpu_machine`, as a GPU machine does."""
    import tensorflow as tf

    specs = specs or [tf.TensorSpec(t.shape, t.dtype) for t in model.inputs]
    call = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
    return call.get_concrete_function(*specs).graph.as_graph_def()


def export_on_gpu_machine(model, name: str) -> str:
    """``model.export`` where TensorFlow lists a GPU (Keras 3): the SavedModel a GPU machine writes."""
    path = os.path.join(_DIR, name)
    with gpu_machine():
        model.export(path, verbose=False)
    return path


# -- raw TF 1.x graphs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RawCase:
    """One cuDNN op as a TF 1.x graph calls it."""

    op: str = "CudnnRNNV3"  # CudnnRNN, CudnnRNNV2, CudnnRNNV3
    mode: str = "lstm"  # lstm, gru, rnn_tanh, rnn_relu
    layers: int = 1
    bidirectional: bool = False
    time_major: bool = True  # False: V3 only, the input [B, T, F] and the states [B, L*D, H]
    lengths: bool = False  # V3 only: a seq_len input [B]
    initial_state: bool = False  # h0 (and c0) as inputs, else zeros
    skip_input: bool = False  # input_mode skip_input (the features are the hidden size)
    features: int = 3
    hidden: int = 4

    @property
    def id(self) -> str:
        parts = [self.op, self.mode, f"{self.layers}layer", "bi" if self.bidirectional else "uni",
                 "tm" if self.time_major else "bm"]
        parts += [flag for flag, on in (("lengths", self.lengths), ("init", self.initial_state),
                                        ("skip", self.skip_input)) if on]
        return "-".join(parts)

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def input_size(self) -> int:
        return self.hidden if self.skip_input else self.features

    def features_of(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.hidden * self.directions


@dataclass(frozen=True)
class Gates:
    """One pseudo-layer's weights per gate, in cuDNN's order: input matrices [H, F] (None where the layer
    skips its input), recurrent matrices [H, H], input and recurrent biases [H]."""

    W: Optional[tuple]
    R: tuple
    Wb: tuple
    Rb: tuple


def draw_weights(case: RawCase, seed: int) -> list:
    """Random weights per pseudo-layer (layer 0 forward, layer 0 backward, layer 1 forward...)."""
    rng = np.random.default_rng(seed)
    gates, hidden = GATES[case.mode], case.hidden

    def draw(*shape):
        return tuple((rng.standard_normal(shape) * 0.5).astype(np.float32) for _ in range(gates))

    found = []
    for layer in range(case.layers):
        for _ in range(case.directions):
            skipped = layer == 0 and case.skip_input
            found.append(Gates(None if skipped else draw(hidden, case.features_of(layer)), draw(hidden, hidden),
                               draw(hidden), draw(hidden)))
    return found


def params_of(weights: list) -> np.ndarray:
    """The flat buffer: every pseudo-layer's matrices (input, then recurrent, gate by gate), then every
    pseudo-layer's biases (input, then recurrent): TensorFlow's canonical order."""
    matrices = [m for g in weights for m in (g.W or ()) + g.R]
    biases = [b for g in weights for b in g.Wb + g.Rb]
    return np.concatenate([m.reshape(-1) for m in matrices] + list(biases)).astype(np.float32)


def raw_graph(case: RawCase, seed: int = 0):
    """(path of the frozen .pb, input names, output names, the drawn weights): the op over ``x`` (and
    ``seq_len``, ``h0``, ``c0`` where the case has them), its output, final h (and c) as outputs. The
    inputs are batch-major ([B, T, F], [B, L*D, H], [B]: what the suite's random inputs give consistent
    sizes) and moved to the op's layout in the graph; the outputs are in the op's layout."""
    import tensorflow as tf

    weights = draw_weights(case, seed)
    pseudo = case.layers * case.directions
    lstm = case.mode == "lstm"

    def laid_out(tensor):
        return tf.transpose(tensor, [1, 0, 2]) if case.time_major else tensor

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, case.input_size], name="x")
        batch, steps = tf.shape(x)[0], tf.shape(x)[1]
        inputs = ["x:0"]
        if case.initial_state:
            h0 = tf.compat.v1.placeholder(tf.float32, [None, pseudo, case.hidden], name="h0")
            c0 = tf.compat.v1.placeholder(tf.float32, [None, pseudo, case.hidden], name="c0") if lstm else h0
            inputs += ["h0:0", "c0:0"] if lstm else ["h0:0"]
            h0, c0 = laid_out(h0), laid_out(c0)
        else:
            zeros = [pseudo, batch, case.hidden] if case.time_major else [batch, pseudo, case.hidden]
            h0 = c0 = tf.zeros(tf.stack(zeros))
        kwargs = dict(input=laid_out(x), input_h=h0, input_c=c0, params=tf.constant(params_of(weights), name="params"),
                      rnn_mode=case.mode, input_mode="skip_input" if case.skip_input else "linear_input",
                      direction="bidirectional" if case.bidirectional else "unidirectional", is_training=False)
        if case.op == "CudnnRNNV3":
            if case.lengths:
                lengths = tf.compat.v1.placeholder(tf.int32, [None], name="seq_len")
                inputs.append("seq_len:0")
            else:
                lengths = tf.fill([batch], steps)
            outputs = tf.raw_ops.CudnnRNNV3(sequence_lengths=lengths, time_major=case.time_major, **kwargs)
        else:
            outputs = getattr(tf.raw_ops, case.op)(**kwargs)
        names = [tf.identity(outputs[0], name="y"), tf.identity(outputs[1], name="h")]
        if lstm:
            names.append(tf.identity(outputs[2], name="c"))
        graph_def = graph.as_graph_def()
    path = os.path.join(_DIR, f"{case.id}-{seed}.pb")
    with open(path, "wb") as f:
        f.write(graph_def.SerializeToString())
    return path, inputs, [f"{t.name}" for t in names], weights


def raw_feeds(case: RawCase, batch: int, time: int, seed: int) -> dict:
    """Inputs by name, batch-major: x (zeros past each row's length), seq_len (one row full, the last of
    three or more empty), h0, c0."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, time, case.input_size)).astype(np.float32)
    lengths = rng.integers(1, time + 1, batch).astype(np.int32)
    if case.lengths:
        lengths[0], lengths[-1] = time, 0 if batch > 2 else lengths[-1]
        x[np.arange(time)[None, :] >= lengths[:, None]] = 0.0
    pseudo = case.layers * case.directions
    feeds = {"x": x}
    if case.initial_state:
        for name in ("h0", "c0") if case.mode == "lstm" else ("h0",):
            feeds[name] = rng.standard_normal((batch, pseudo, case.hidden)).astype(np.float32)
    if case.lengths:
        feeds["seq_len"] = lengths
    return feeds


# -- the canonical equivalents --------------------------------------------------------------------------
def keras_weights(mode: str, gates: Gates, hidden: int) -> list:
    """A Keras 3 layer's weights (kernel, recurrent kernel, bias) from one pseudo-layer's cuDNN gates."""
    order = {"lstm": (0, 1, 2, 3), "gru": (1, 0, 2)}.get(mode, (0,))  # Keras's gates, as cuDNN's indices
    W = gates.W if gates.W is not None else tuple(np.eye(hidden, dtype=np.float32) for _ in order)
    kernel = np.concatenate([W[g].T for g in order], axis=1)
    recurrent = np.concatenate([gates.R[g].T for g in order], axis=1)
    if mode == "gru":
        bias = np.stack([np.concatenate([gates.Wb[g] for g in order]), np.concatenate([gates.Rb[g] for g in order])])
    else:
        bias = np.concatenate([gates.Wb[g] + gates.Rb[g] for g in order])
    return [kernel, recurrent, bias]


def canonical_outputs(case: RawCase, weights: list, feeds: dict) -> list:
    """What the op computes, by Keras 3's canonical layers on the CPU: [y, h (, c)] in the op's layout.
    Steps past a row's length are masked (a Masking layer over zeros there): their outputs are zeros,
    the final states those of the row's last step, as cuDNN gives them."""
    x, lengths = feeds["x"], feeds.get("seq_len")
    states = [feeds[name] for name in ("h0", "c0") if name in feeds] if case.initial_state else None
    batch, time = x.shape[:2]
    if lengths is None:
        lengths = np.full(batch, time, np.int32)
    kept = np.arange(time)[None, :] < lengths[:, None]
    layer_input = x * kept[..., None]
    finals = {"h": [], "c": []}
    for layer in range(case.layers):
        halves = []
        for direction in range(case.directions):
            pseudo = layer * case.directions + direction
            y, h, c = run_layer(case, weights[pseudo], layer_input, kept, direction == 1,
                                 None if states is None else [s[:, pseudo] for s in states])
            halves.append(y)
            finals["h"].append(h)
            finals["c"].append(c)
        layer_input = np.concatenate(halves, axis=-1) * kept[..., None]
    y = layer_input
    outputs = [y.transpose(1, 0, 2) if case.time_major else y]
    for role in ("h", "c") if case.mode == "lstm" else ("h",):
        stacked = np.stack(finals[role])  # [L*D, B, H]
        outputs.append(stacked if case.time_major else stacked.transpose(1, 0, 2))
    return outputs


def run_layer(case: RawCase, gates: Gates, x: np.ndarray, kept: np.ndarray, backward: bool, start) -> tuple:
    """One layer and direction over [B, T, F] as a Keras 3 layer computes it, masked by ``kept`` (the
    layer called with its mask: a functional model drops a Masking layer's mask where an initial state is
    given): its outputs in time order, zeros at masked steps; its final states."""
    import keras

    features = x.shape[-1]
    kind = KERAS_LAYER[case.mode]
    kwargs = dict(units=case.hidden, return_sequences=True, return_state=True, go_backwards=backward)
    if kind == "SimpleRNN":
        kwargs["activation"] = "relu" if case.mode == "rnn_relu" else "tanh"
    if kind == "GRU":
        kwargs["reset_after"] = True
    layer = getattr(keras.layers, kind)(**kwargs)
    layer.build((None, None, features))
    layer.set_weights(keras_weights(case.mode, gates, case.hidden))
    import tensorflow as tf  # tensors: Keras 2 takes no numpy initial states

    out = layer(tf.constant(x), mask=tf.constant(kept),
                initial_state=None if start is None else [tf.constant(s) for s in start])
    y, states = np.asarray(out[0]), [np.asarray(s) for s in out[1:]]
    if backward:
        y = y[:, ::-1]
    y = y * kept[..., None]
    return y, states[0], states[1] if len(states) > 1 else None


# -- TF 1.x checkpoints holding canonical weights ------------------------------------------------------------
def canonical_lstm_weights(case: RawCase, seed: int) -> list:
    """Per pseudo-layer, TF 1.x's canonical LSTM weights as ``tf.contrib.cudnn_rnn``'s checkpoints held them:
    a ``CudnnCompatibleLSTMCell`` kernel [in + H, 4H] with its gates in the order i, c, f, o, and one bias
    [4H]."""
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((case.features_of(pseudo // case.directions) + case.hidden, 4 * case.hidden))
              * 0.5).astype(np.float32), (rng.standard_normal(4 * case.hidden) * 0.5).astype(np.float32))
            for pseudo in range(case.layers * case.directions)]


def canonical_names(case: RawCase) -> list:
    """The checkpoint names of each pseudo-layer's kernel and bias, as ``tf.contrib.cudnn_rnn.CudnnLSTM``
    wrote them."""
    names = []
    for layer in range(case.layers):
        for direction in ("fw", "bw")[:case.directions]:
            scope = (f"cudnn_lstm/stack_bidirectional_rnn/cell_{layer}/bidirectional_rnn/{direction}"
                     if case.bidirectional else f"cudnn_lstm/rnn/multi_rnn_cell/cell_{layer}")
            names.append((f"{scope}/cudnn_compatible_lstm_cell/kernel", f"{scope}/cudnn_compatible_lstm_cell/bias"))
    return names


def gates_of_canonical(case: RawCase, canonical: list) -> list:
    """cuDNN's gates (i, f, c, o) of canonical weights, as the checkpoint's restore gives them: each matrix
    transposed, each bias halved between input and recurrent."""
    found = []
    for pseudo, (kernel, bias) in enumerate(canonical):
        features = case.features_of(pseudo // case.directions)
        blocks = [slice(g * case.hidden, (g + 1) * case.hidden) for g in (0, 2, 1, 3)]  # i, f, c, o of i, c, f, o
        found.append(Gates(tuple(kernel[:features, b].T.copy() for b in blocks),
                           tuple(kernel[features:, b].T.copy() for b in blocks),
                           tuple(bias[b] / 2 for b in blocks), tuple(bias[b] / 2 for b in blocks)))
    return found


def _contrib_layer(case: RawCase, canonical: list):
    """In the default graph, a ``CudnnLSTM`` layer as ``tf.contrib.cudnn_rnn`` built one: a ``CudnnRNN`` op over
    an opaque ``params`` variable, and the saveable that restores it from canonical weights through
    ``CudnnRNNCanonicalToParams`` (its save tensors are the canonical values themselves). Returns the saver."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_cudnn_rnn_ops
    from tensorflow.python.training.saving import saveable_object

    names = canonical_names(case)
    size = params_of(gates_of_canonical(case, canonical)).size
    x = tf.compat.v1.placeholder(tf.float32, [None, None, case.features], name="x")
    opaque = tf.compat.v1.get_variable("cudnn_lstm/opaque_kernel", [size], initializer=tf.zeros_initializer())
    zeros = tf.zeros(tf.stack([case.layers * case.directions, tf.shape(x)[0], case.hidden]))
    direction = "bidirectional" if case.bidirectional else "unidirectional"
    y = tf.raw_ops.CudnnRNN(input=tf.transpose(x, [1, 0, 2]), input_h=zeros, input_c=zeros, params=opaque,
                            rnn_mode="lstm", direction=direction, is_training=False)[0]
    tf.identity(y, name="y")

    class CanonicalWeights(saveable_object.SaveableObject):
        """Restores the opaque variable from canonical weights, as contrib's CudnnOpaqueParamsSaveable."""

        def __init__(self):
            specs = [saveable_object.SaveSpec(tf.constant(value), "", name)
                     for pair, values in zip(names, canonical) for name, value in zip(pair, values)]
            super().__init__(opaque, specs, "cudnn_lstm/opaque_kernel")

        def restore(self, restored, shapes):
            weights, biases = [], []
            for pseudo in range(len(canonical)):
                kernel, bias = restored[2 * pseudo], restored[2 * pseudo + 1]
                features = case.features_of(pseudo // case.directions)
                gates = [tf.transpose(part) for part in tf.split(kernel[:features], 4, axis=1)]
                recurrent = [tf.transpose(part) for part in tf.split(kernel[features:], 4, axis=1)]
                order = (0, 2, 1, 3)  # cuDNN's i, f, c, o of TF's i, c, f, o
                weights += [gates[g] for g in order] + [recurrent[g] for g in order]
                halves = tf.split(bias, 4)
                biases += [halves[g] / 2 for g in order] * 2
            params = gen_cudnn_rnn_ops.cudnn_rnn_canonical_to_params(
                num_layers=case.layers, num_units=case.hidden, input_size=case.features, weights=weights,
                biases=biases, rnn_mode="lstm", direction=direction)
            return tf.compat.v1.assign(opaque, params)

    return tf.compat.v1.train.Saver(var_list=[CanonicalWeights()])


def _write_canonical(case: RawCase, canonical: list, prefix: str) -> None:
    """A checkpoint of the canonical weights under their names (written from a graph of plain variables: a
    session over the layer's own graph would place its cuDNN op, which has no CPU kernel)."""
    import tensorflow as tf

    with tf.Graph().as_default():
        variables = {name: tf.compat.v1.Variable(value, name=name.replace("/", "_"))
                     for pair, values in zip(canonical_names(case), canonical) for name, value in zip(pair, values)}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver(var_list=variables).save(session, prefix, write_meta_graph=False)


def contrib_checkpoint(case: RawCase, seed: int, directory: str) -> tuple:
    """A TF 1.x checkpoint of a ``CudnnLSTM`` layer as ``tf.contrib.cudnn_rnn`` wrote one: canonical weights
    under their names, and a meta graph whose saver restores the layer's opaque params from them
    (:func:`_contrib_layer`). Returns (the meta graph's path, inputs, outputs, the canonical weights)."""
    import tensorflow as tf

    canonical = canonical_lstm_weights(case, seed)
    prefix = os.path.join(directory, "model")
    _write_canonical(case, canonical, prefix)
    with tf.Graph().as_default():
        _contrib_layer(case, canonical).export_meta_graph(prefix + ".meta")
    return prefix + ".meta", ["x:0"], ["y:0"], canonical


def contrib_saved_model(case: RawCase, seed: int, directory: str) -> tuple:
    """A TF 1.x SavedModel of the same layer, as ``SavedModelBuilder`` writes one with the layer's saver (its
    meta graph tagged ``serve`` with a serving signature from ``x`` to ``y``, the canonical weights in
    ``variables/``). Returns (its path, the canonical weights)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    canonical = canonical_lstm_weights(case, seed)
    path = os.path.join(directory, "saved_model")
    os.makedirs(os.path.join(path, "variables"))
    _write_canonical(case, canonical, os.path.join(path, "variables", "variables"))
    with tf.Graph().as_default() as graph:
        meta = _contrib_layer(case, canonical).export_meta_graph()
        meta.meta_info_def.tags.append("serve")
        meta.signature_def["serving_default"].CopyFrom(tf.compat.v1.saved_model.predict_signature_def(
            {"x": graph.get_tensor_by_name("x:0")}, {"y": graph.get_tensor_by_name("y:0")}))
    saved = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    saved.meta_graphs.add().CopyFrom(meta)
    with open(os.path.join(path, "saved_model.pb"), "wb") as stream:
        stream.write(saved.SerializeToString())
    return path, canonical


def computed_lengths_graph(directory: str, seed: int = 0) -> tuple:
    """A TF 1.x graph over ``x`` [B, T, 3] alone whose ``CudnnRNNV3`` (LSTM, two layers, both directions,
    batch-major) takes lengths and initial states it computes from ``x``: each row's count of non-zero
    steps (not a Keras mask's: counted in floats, then cast) and states of each row's mean. Returns (the
    .pb's path, inputs, outputs, a callable computing the same on the CPU with Keras's canonical layers)."""
    import tensorflow as tf

    case = RawCase(mode="lstm", layers=2, bidirectional=True, time_major=False, lengths=True, initial_state=True)
    weights = draw_weights(case, seed)
    pseudo = case.layers * case.directions
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, case.features], name="x")
        steps = tf.sign(tf.reduce_max(tf.abs(x), axis=-1))
        lengths = tf.cast(tf.reduce_sum(steps, axis=1), tf.int32)
        start = tf.tile(tf.reduce_mean(x, axis=[1, 2])[:, None, None], [1, pseudo, case.hidden]) * 0.5
        outputs = tf.raw_ops.CudnnRNNV3(input=x, input_h=start, input_c=-start, params=tf.constant(params_of(weights)),
                                        sequence_lengths=lengths, rnn_mode="lstm", direction="bidirectional",
                                        time_major=False, is_training=False)
        for name, tensor in zip(("y", "h", "c"), outputs[:3]):
            tf.identity(tensor, name=name)
        graph_def = graph.as_graph_def()
    path = os.path.join(directory, "computed_lengths.pb")
    with open(path, "wb") as stream:
        stream.write(graph_def.SerializeToString())

    def reference(x, training=False):
        x = np.asarray(x)
        start = np.tile(x.mean(axis=(1, 2))[:, None, None], (1, pseudo, case.hidden)).astype(np.float32) * 0.5
        feeds = {"x": x, "seq_len": (np.abs(x).max(axis=-1) > 0).sum(axis=1).astype(np.int32), "h0": start,
                 "c0": -start}
        return canonical_outputs(case, weights, feeds)

    return path, ["x:0"], ["y:0", "h:0", "c:0"], reference
