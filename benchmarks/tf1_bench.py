"""A legacy TF 1.x graph in onnxruntime: a bidirectional LSTM over ``sequence_length``.

``bidirectional_dynamic_rnn`` over two ``LSTMCell``s, built in TF 1.x's own control flow (what a TF 1.x
``.pb`` holds) and frozen, T=100 steps, 64 features, 128 units; converted by this package and by stock
tf2onnx (its command line), against the hand-built floor: Transpose -> one bidirectional ONNX LSTM node
with the lengths as ``sequence_lens`` -> Transpose, Reshape. Rows of mixed lengths (the first full).
onnxruntime on one thread, runners interleaved round by round; medians in ms. All three are checked
against the TensorFlow session first.

    python benchmarks/tf1_bench.py [--out benchmarks/results/tf1_graph.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TIME, FEATURES, UNITS, FORGET_BIAS = 100, 64, 128, 1.0


def build(folder: str) -> tuple:
    """The frozen graph's path, and its kernels and biases (forward, backward) as TensorFlow holds them."""
    import tensorflow as tf

    import tf1_graphs

    cells, _ = tf1_graphs._legacy()
    with tf1_graphs.graph_form("v1") as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, FEATURES], name="x")
        lengths = tf.compat.v1.placeholder(tf.int32, [None], name="seq_len")
        (forward, backward), _ = tf.compat.v1.nn.bidirectional_dynamic_rnn(
            cells.LSTMCell(UNITS, forget_bias=FORGET_BIAS), cells.LSTMCell(UNITS, forget_bias=FORGET_BIAS), x,
            sequence_length=lengths, dtype=tf.float32)
        tf.identity(tf.concat([forward, backward], -1), name="y")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            rng = np.random.default_rng(0)
            for variable in tf.compat.v1.global_variables():
                session.run(variable.assign(rng.uniform(-0.1, 0.1, variable.shape.as_list()).astype(np.float32)))
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), ["y"])
            weights = {v.name.split(":")[0]: session.run(v) for v in tf.compat.v1.global_variables()}
    path = os.path.join(folder, "bidirectional_lstm.pb")
    with open(path, "wb") as stream:
        stream.write(frozen.SerializeToString())
    return path, frozen, [(weights[f"bidirectional_rnn/{d}/lstm_cell/kernel"],
                           weights[f"bidirectional_rnn/{d}/lstm_cell/bias"]) for d in ("fw", "bw")]


def floor(directions: list):
    """Transpose -> one bidirectional LSTM (TF1's i, j, f, o blocks as ONNX's i, o, f, c) -> Transpose, Reshape."""
    import onnx
    from onnx import TensorProto, helper

    order = (0, 3, 2, 1)  # i, o, f, c from i, j, f, o
    Ws, Rs, Bs = [], [], []
    for kernel, bias in directions:
        blocks = [slice(g * UNITS, (g + 1) * UNITS) for g in order]
        Ws.append(np.concatenate([kernel[:FEATURES, b].T for b in blocks]))
        Rs.append(np.concatenate([kernel[FEATURES:, b].T for b in blocks]))
        shifted = bias.copy()
        shifted[2 * UNITS:3 * UNITS] += FORGET_BIAS
        Bs.append(np.concatenate([np.concatenate([shifted[b] for b in blocks]), np.zeros(4 * UNITS, np.float32)]))
    initializers = [helper.make_tensor(name, TensorProto.FLOAT, value.shape, value.ravel())
                    for name, value in (("W", np.stack(Ws)), ("R", np.stack(Rs)), ("B", np.stack(Bs)))]
    initializers.append(helper.make_tensor("shape", TensorProto.INT64, [3], [0, 0, -1]))
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
             helper.make_node("LSTM", ["x_tm", "W", "R", "B", "seq_len"], ["Y"], hidden_size=UNITS,
                              direction="bidirectional"),
             helper.make_node("Transpose", ["Y"], ["y_bm"], perm=[2, 0, 1, 3]),
             helper.make_node("Reshape", ["y_bm", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "floor", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", FEATURES]),
        helper.make_tensor_value_info("seq_len", TensorProto.INT32, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "time", 2 * UNITS])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def session(model_proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "tf1_graph.md"))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from run import _time_block
    from stock_formats import stock_graph_def

    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def

    folder = tempfile.mkdtemp(prefix="tf1_bench_")
    path, frozen, directions = build(folder)
    models = {"ours": convert_graph_def(path, inputs=["x:0", "seq_len:0"], outputs=["y:0"]),
              "stock": stock_graph_def(path, ["x:0", "seq_len:0"], ["y:0"]), "floor": floor(directions)}
    ops = {name: sorted({n.op_type for n in m.graph.node} & {"LSTM", "Loop", "Scan"}) for name, m in models.items()}
    sessions = {name: session(model) for name, model in models.items()}
    lines = ["# A TF 1.x bidirectional LSTM over sequence_length in onnxruntime", "",
             f"Written by `benchmarks/tf1_bench.py`: T={TIME}, F={FEATURES}, H={UNITS}, one thread, "
             f"{args.rounds} interleaved rounds, medians in ms. Recurrent ops: ours {ops['ours']}, stock "
             f"{ops['stock']}, floor {ops['floor']}.", "",
             "| batch | ours ms | floor ms | stock ms | ours/floor | stock/ours | max error vs TensorFlow "
             "(ours, stock) |",
             "|---|---|---|---|---|---|---|"]
    for batch in (1, 16):
        lengths = np.array([TIME - 5 * (i % 10) for i in range(batch)], np.int32)
        x = np.random.default_rng(batch).standard_normal((batch, TIME, FEATURES)).astype(np.float32)
        (expected,) = tf1_graphs.tensorflow_outputs(frozen, ["x:0", "seq_len:0"], ["y:0"], [x, lengths])
        feeds = {name: {i.name: (x if i.name.startswith("x") else lengths) for i in s.get_inputs()}
                 for name, s in sessions.items()}
        errors = {name: float(np.max(np.abs(s.run(None, feeds[name])[0] - expected))) for name, s in sessions.items()}
        assert max(errors.values()) < 1e-4, errors
        times = {name: [] for name in sessions}
        for _ in range(args.rounds):
            for name, s in sessions.items():
                times[name].append(_time_block(lambda s=s, f=feeds[name]: s.run(None, f), 0.05) * 1000)
        ms = {name: statistics.median(values) for name, values in times.items()}
        lines.append(f"| {batch} | {ms['ours']:.3f} | {ms['floor']:.3f} | {ms['stock']:.3f} | "
                     f"{ms['ours'] / ms['floor']:.2f} | {ms['stock'] / ms['ours']:.2f} | "
                     f"{errors['ours']:.1e}, {errors['stock']:.1e} |")
        print(lines[-1], flush=True)
    with open(args.out, "w") as stream:
        stream.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
