"""TensorFlow 1.x recurrent graphs, built as TF 1.x built them and frozen, for the tests.

Graph mode (``tf.Graph().as_default()``), the TF1 cells of ``tf.compat.v1.nn.rnn_cell`` (taken from
tf_keras's legacy cells, which is what that module exports beside Keras 3; TensorFlow 2.15's Keras 2
has them too), and the drivers of TensorFlow itself: ``dynamic_rnn``, ``bidirectional_dynamic_rnn``,
``static_rnn``, and the fused ``BlockLSTM`` / ``BlockLSTMV2`` ops that ``LSTMBlockFusedCell`` left,
wrapped as it wrapped them. Each graph is built in one control-flow form:

- ``v1``: TF 1.x's ``Enter``/``Merge``/``Switch``/``NextIteration``/``Exit`` loops over
  ``TensorArrayV3`` with ref variables (``VariableV2``): what a TF 1.x ``.pb`` holds;
- ``v2``: functional ``While`` loops over TensorLists (``tf.compat.v1`` with control flow v2).

The form is chosen per graph (TensorFlow's module globals, restored after), so the suite's process
is left as it was. Every variable, biases included, is randomized; the graph is frozen with
``convert_variables_to_constants``. The input is ``x`` [batch, time, features] with a dynamic batch
and time (time-major [time, batch, features] for the fused ops), ``seq_len`` [batch] int32 where the
case has lengths.
"""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import numpy as np

FEATURES, UNITS, PROJECTION = 3, 4, 3
FORMS = ("v1", "v2")
_DIR = tempfile.mkdtemp(prefix="tf1_graphs_")


def _legacy():
    """The TF1 cells and wrappers: tf_keras's legacy modules (Keras 2's in TensorFlow 2.15)."""
    try:
        from tf_keras.src.layers.rnn import legacy_cell_wrappers, legacy_cells
    except ImportError:  # older tf_keras layouts
        from tf_keras.layers.rnn import legacy_cell_wrappers, legacy_cells  # type: ignore
    return legacy_cells, legacy_cell_wrappers


@contextlib.contextmanager
def graph_form(form: str):
    """A new graph built in control-flow ``form`` ("v1": TF 1.x loops and ref variables; "v2":
    functional loops and resource variables), TensorFlow's settings restored afterwards."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    try:  # where TensorFlow keeps whether new variables are resource variables (2.16 and later, then 2.15)
        from tensorflow.python.ops import resource_variables_toggle as toggle
    except ImportError:
        from tensorflow.python.ops import variable_scope as toggle
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2, toggle._DEFAULT_USE_RESOURCE
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = form == "v2"
    toggle._DEFAULT_USE_RESOURCE = form == "v2"
    try:
        with tf.Graph().as_default() as graph:
            yield graph
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2, toggle._DEFAULT_USE_RESOURCE = saved


def make_cell(kind: str):
    cells, wrappers = _legacy()
    import tensorflow as tf

    if kind == "lstm":
        return cells.LSTMCell(UNITS, forget_bias=0.7)
    if kind == "basic_lstm":
        return cells.BasicLSTMCell(UNITS)
    if kind == "gru":
        return cells.GRUCell(UNITS)
    if kind == "basic_rnn":
        return cells.BasicRNNCell(UNITS)
    if kind == "lstm_peepholes":
        return cells.LSTMCell(UNITS, use_peepholes=True)
    if kind == "lstm_projection":
        return cells.LSTMCell(UNITS, num_proj=PROJECTION)
    if kind == "lstm_cell_clip":
        return cells.LSTMCell(UNITS, cell_clip=0.5)
    if kind == "lstm_projection_clip":  # the projection clipped (proj_clip)
        return cells.LSTMCell(UNITS, num_proj=PROJECTION, proj_clip=0.1)
    if kind == "lstm_cell_clip_projection":  # the cell state clipped, then projected
        return cells.LSTMCell(UNITS, num_proj=PROJECTION, cell_clip=0.3)
    if kind == "multi_lstm":
        return cells.MultiRNNCell([cells.LSTMCell(UNITS), cells.LSTMCell(UNITS)])
    if kind == "multi_mixed":
        return cells.MultiRNNCell([cells.GRUCell(UNITS), cells.LSTMCell(UNITS), cells.BasicRNNCell(UNITS)])
    if kind == "dropout_lstm":  # keep_prob a placeholder defaulting to 1, as TF1 training scripts had it
        keep = tf.compat.v1.placeholder_with_default(1.0, [], name="keep_prob")
        return wrappers.DropoutWrapper(cells.LSTMCell(UNITS), input_keep_prob=keep, output_keep_prob=keep)
    if kind == "lstm_block_cell":
        return _block_cell("LSTMBlockCell")
    if kind == "gru_block_cell":
        return _block_cell("GRUBlockCell")
    raise ValueError(kind)


def _block_cell(op: str):
    """A cell stepping TensorFlow's ``LSTMBlockCell`` or ``GRUBlockCell`` op, as contrib's cells did."""
    cells, _ = _legacy()
    import tensorflow as tf

    class BlockCell(cells.LayerRNNCell):
        @property
        def state_size(self):
            return cells.LSTMStateTuple(UNITS, UNITS) if op == "LSTMBlockCell" else UNITS

        @property
        def output_size(self):
            return UNITS

        def build(self, input_shape):
            rows = int(input_shape[-1]) + UNITS
            if op == "LSTMBlockCell":
                self.w = self.add_weight("kernel", shape=[rows, 4 * UNITS])
                self.b = self.add_weight("bias", shape=[4 * UNITS])
            else:
                self.w_ru = self.add_weight("gates/kernel", shape=[rows, 2 * UNITS])
                self.b_ru = self.add_weight("gates/bias", shape=[2 * UNITS])
                self.w_c = self.add_weight("candidate/kernel", shape=[rows, UNITS])
                self.b_c = self.add_weight("candidate/bias", shape=[UNITS])
            super().build(input_shape)

        def call(self, inputs, state):
            if op == "GRUBlockCell":
                h = tf.raw_ops.GRUBlockCell(x=inputs, h_prev=state, w_ru=self.w_ru, w_c=self.w_c, b_ru=self.b_ru,
                                            b_c=self.b_c)[3]
                return h, h
            c, h = state
            zeros = tf.zeros([UNITS])
            outputs = tf.raw_ops.LSTMBlockCell(x=inputs, cs_prev=c, h_prev=h, w=self.w, wci=zeros, wcf=zeros,
                                               wco=zeros, b=self.b, forget_bias=1.0, cell_clip=-1.0,
                                               use_peephole=False)
            return outputs[6], cells.LSTMStateTuple(outputs[1], outputs[6])

    BlockCell.__name__ = op  # the scope its weights take: lstm_block_cell, gru_block_cell
    return BlockCell(UNITS)


def _flat(state) -> list:
    import tensorflow as tf

    return tf.nest.flatten(state)


def _dynamic(kind: str, x, lengths) -> dict:
    import tensorflow as tf

    output, state = tf.compat.v1.nn.dynamic_rnn(make_cell(kind), x, sequence_length=lengths, dtype=tf.float32)
    return {"y": output, **{f"state_{i}": s for i, s in enumerate(_flat(state))}}


def _bidirectional(kind: str, x, lengths) -> dict:
    import tensorflow as tf

    (forward, backward), (state_fw, state_bw) = tf.compat.v1.nn.bidirectional_dynamic_rnn(
        make_cell(kind), make_cell(kind), x, sequence_length=lengths, dtype=tf.float32)
    return {"y_fw": forward, "y_bw": backward, **{f"state_fw_{i}": s for i, s in enumerate(_flat(state_fw))},
            **{f"state_bw_{i}": s for i, s in enumerate(_flat(state_bw))}}


def _static(kind: str, x, lengths, time: int) -> dict:
    import tensorflow as tf

    steps = tf.unstack(x, num=time, axis=1)  # static_rnn takes a list of [batch, features] steps
    outputs, state = tf.compat.v1.nn.static_rnn(make_cell(kind), steps, sequence_length=lengths, dtype=tf.float32)
    return {"y": tf.stack(outputs, axis=1), **{f"state_{i}": s for i, s in enumerate(_flat(state))}}


def _fused(kind: str, x, lengths) -> dict:
    """``BlockLSTM`` / ``BlockLSTMV2`` over time-major ``x``, wrapped as contrib's ``LSTMBlockFusedCell``
    wrapped it: ``seq_len_max`` the longest row, outputs masked past each row's length, the final
    state gathered at each row's length."""
    import tensorflow as tf

    peepholes = "peepholes" in kind
    time, batch = tf.shape(x)[0], tf.shape(x)[1]
    w = tf.compat.v1.get_variable("lstm_cell/kernel", [FEATURES + UNITS, 4 * UNITS])
    b = tf.compat.v1.get_variable("lstm_cell/bias", [4 * UNITS])
    diagonals = [tf.compat.v1.get_variable(f"lstm_cell/w_{g}_diag", [UNITS]) if peepholes else tf.zeros([UNITS])
                 for g in "ifo"]
    zeros = tf.zeros(tf.stack([batch, UNITS]))
    longest = tf.cast(tf.reduce_max(lengths) if lengths is not None else time, tf.int64)
    arguments = dict(seq_len_max=longest, x=x, cs_prev=zeros, h_prev=zeros, w=w, wci=diagonals[0],
                     wcf=diagonals[1], wco=diagonals[2], b=b, cell_clip=3.0 if "clip" in kind else -1.0,
                     use_peephole=peepholes)
    result = tf.raw_ops.BlockLSTMV2(**arguments) if "v2" in kind else tf.raw_ops.BlockLSTM(forget_bias=1.0,
                                                                                         **arguments)
    cs, h = result[1], result[6]
    if lengths is None:
        return {"y": h, "state_c": cs[-1], "state_h": h[-1]}
    mask = tf.expand_dims(tf.transpose(tf.sequence_mask(lengths, time, dtype=tf.float32)), -1)
    y = h * mask
    rows = lengths * batch + tf.range(batch)
    final = {name: tf.gather(tf.reshape(tf.concat([tf.expand_dims(zeros, 0), seq], 0), [-1, UNITS]), rows)
             for name, seq in (("state_c", cs), ("state_h", y))}
    return {"y": y, **final}


@dataclass(frozen=True)
class Case:
    """One TF1 graph: the driver (dynamic, bidirectional, static, fused), the cell, lengths or not,
    the control-flow form."""

    driver: str
    cell: str
    lengths: bool
    form: str = "v1"

    @property
    def id(self) -> str:
        return f"{self.driver}-{self.cell}-{'seq_len' if self.lengths else 'no_len'}-{self.form}"

    @property
    def time_major(self) -> bool:
        return self.driver == "fused"


STATIC_TIME = 6  # static_rnn unstacks a fixed number of steps
FUSED_BATCH = 3  # the batch of a fused op's graph given lengths


@dataclass
class Built:
    """A frozen graph: the file, its input and output tensors, and TensorFlow's session on it."""

    case: Case
    path: str
    graph_def: object
    inputs: list
    outputs: list

    def run(self, feeds: list) -> list:
        """TensorFlow's outputs for ``feeds`` (arrays in the order of ``inputs``)."""
        return tensorflow_outputs(self.graph_def, self.inputs, self.outputs, feeds)


def _build(case: Case, x_shape: list, lengths_shape: list, seed: int):
    """``case``'s tensors in the current graph, inputs of those shapes, every variable randomized: (the
    input placeholders, the output names, a session holding the values)."""
    import tensorflow as tf

    x = tf.compat.v1.placeholder(tf.float32, x_shape, name="x")
    lengths = tf.compat.v1.placeholder(tf.int32, lengths_shape, name="seq_len") if case.lengths else None
    if case.driver == "dynamic":
        tensors = _dynamic(case.cell, x, lengths)
    elif case.driver == "bidirectional":
        tensors = _bidirectional(case.cell, x, lengths)
    elif case.driver == "static":
        tensors = _static(case.cell, x, lengths, STATIC_TIME)
    else:
        tensors = _fused(case.cell, x, lengths)
    names = sorted(tensors)
    outputs = [tf.identity(tensors[name], name=name) for name in names]
    session = tf.compat.v1.Session()
    session.run(tf.compat.v1.global_variables_initializer())
    rng = np.random.default_rng(seed)
    for variable in tf.compat.v1.global_variables():
        session.run(variable.assign(rng.uniform(-0.8, 0.8, variable.shape.as_list()).astype(np.float32)))
    return [x] + ([lengths] if lengths is not None else []), names, outputs, session


@functools.lru_cache(maxsize=None)
def built(case: Case, seed: int = 1) -> Built:
    """``case`` built, randomized, frozen and written to a file, once per process."""
    import tensorflow as tf

    with graph_form(case.form) as graph:
        time = STATIC_TIME if case.driver == "static" else None
        # a time-major graph given lengths has a fixed batch: random inputs cannot tell its batch axis
        batch = FUSED_BATCH if case.time_major and case.lengths else None
        shape = [time, batch, FEATURES] if case.time_major else [None, time, FEATURES]
        _, names, _, session = _build(case, shape, [batch], seed)
        with session:
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), names)
    path = os.path.join(_DIR, case.id + ".pb")
    with open(path, "wb") as stream:
        stream.write(frozen.SerializeToString())
    return Built(case, path, frozen, ["x:0"] + (["seq_len:0"] if case.lengths else []), [n + ":0" for n in names])


def tflite_file(case: Case, batch: int, time: int, seed: int = 1) -> str:
    """``case`` (a batch-major driver in the functional form) at a fixed [batch, time] signature, converted
    to TFLite as TF 1.x's converter does it from a session; the file's path."""
    import tensorflow as tf

    with graph_form(case.form):
        inputs, _, outputs, session = _build(case, [batch, time, FEATURES], [batch], seed)
        with session:
            data = tf.compat.v1.lite.TFLiteConverter.from_session(session, inputs, outputs).convert()
    path = os.path.join(_DIR, f"{case.id}-{batch}x{time}.tflite")
    with open(path, "wb") as stream:
        stream.write(data)
    return path


def tensorflow_outputs(graph_def, inputs: list, outputs: list, feeds: list) -> list:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(outputs, dict(zip(inputs, feeds)))


def feeds_for(case: Case, lengths: Optional[list], time: int, seed: int = 0) -> list:
    """The inputs: ``x`` of ``len(lengths)`` rows (batch-major, or time-major for the fused ops), and
    the lengths where the case takes them."""
    batch = len(lengths) if lengths is not None else 3
    x = np.random.default_rng(seed).standard_normal((batch, time, FEATURES)).astype(np.float32)
    if case.time_major:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    return [x] + ([np.asarray(lengths, np.int32)] if case.lengths else [])
