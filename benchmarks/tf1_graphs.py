"""TF1-style recurrent graphs (``tf.compat.v1.nn.dynamic_rnn`` / ``bidirectional_dynamic_rnn`` over
LSTMCell, GRUCell and BasicRNNCell, with and without ``sequence_length``), frozen with functional
while-loops, for ``stock_formats.py``. Run in a process of its own (TF1 cells need tf_keras)::

    TF_USE_LEGACY_KERAS=1 python benchmarks/tf1_graphs.py OUT_DIR

writes ``<name>.pb`` and ``<name>.npz`` (inputs and TensorFlow's outputs) per graph.
"""
from __future__ import annotations

import os
import sys

import numpy as np

BATCH, TIME, FEATURES, UNITS = 3, 6, 3, 4
CELLS = ("LSTMCell", "GRUCell", "BasicRNNCell")


def build(out_dir: str, cell_name: str, bidirectional: bool, with_lengths: bool) -> str:
    import tensorflow as tf

    v1 = tf.compat.v1
    name = f"{cell_name}_{'bidirectional' if bidirectional else 'dynamic'}_rnn{'_seqlen' if with_lengths else ''}"
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(len(name))
        x = v1.placeholder(tf.float32, [None, TIME, FEATURES], name="x")
        lengths = v1.placeholder(tf.int32, [None], name="lengths") if with_lengths else None
        cell = lambda: getattr(v1.nn.rnn_cell, cell_name)(UNITS)  # noqa: E731
        if bidirectional:
            (forward, backward), _ = v1.nn.bidirectional_dynamic_rnn(cell(), cell(), x, sequence_length=lengths,
                                                                     dtype=tf.float32)
            y = tf.concat([forward, backward], -1)
        else:
            y, _ = v1.nn.dynamic_rnn(cell(), x, sequence_length=lengths, dtype=tf.float32)
        tf.identity(y, name="y")
        rng = np.random.default_rng(0)
        feed = {"x:0": rng.standard_normal((BATCH, TIME, FEATURES)).astype(np.float32)}
        if with_lengths:
            feed["lengths:0"] = np.array([TIME, 4, 2], np.int32)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            frozen = v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), ["y"])
            expected = session.run("y:0", feed)
    with open(os.path.join(out_dir, name + ".pb"), "wb") as stream:
        stream.write(frozen.SerializeToString())
    np.savez(os.path.join(out_dir, name + ".npz"), expected=expected, **{k.split(":")[0]: v for k, v in feed.items()})
    return name


def main(out_dir: str) -> None:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.enable_control_flow_v2()
    for cell_name in CELLS:
        for bidirectional in (False, True):
            for with_lengths in (False, True):
                print(build(out_dir, cell_name, bidirectional, with_lengths), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
