"""Latency of Keras's ConvLSTM2D: ours (a Scan of the loop's own step) against a Scan built by hand (the
floor) and stock tf2onnx's Loop, in onnxruntime and OpenVINO.

    python benchmarks/conv_lstm.py              # batch 1 and 8, results in benchmarks/results/
    python benchmarks/conv_lstm.py --smoke      # batch 1, one short round: checks the script runs

The case: ``ConvLSTM2D(32, 3, padding="same", return_sequences=True)`` over T=20 frames of 16x16x3, Keras 3,
batch 1 and 8. The floor: the input's convolution of every frame at once (time folded into the batch, the
four gates' filters in one ``Conv`` with their bias), then a Scan whose step is one recurrent ``Conv`` of
the hidden state, the Add, a Split into the four gates and the LSTM arithmetic, with both states
channels-first across steps; Transposes to and from Keras's channels-last layout outside. Every runner is
checked against Keras before it is timed; onnxruntime and OpenVINO each run on one thread (OpenVINO at f32),
interleaved round by round, medians reported with ours/floor and stock/ours.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from custom_cells import runners_of, table, timed  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

TIME, SIDE, CHANNELS, FILTERS, KERNEL = 20, 16, 3, 32, 3


def build_model(seed: int = 0):
    import keras

    x = keras.Input((None, SIDE, SIDE, CHANNELS), name="x")
    layer = keras.layers.ConvLSTM2D(FILTERS, KERNEL, padding="same", return_sequences=True)
    model = keras.Model(x, layer(x))
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model, layer


def make_input(batch: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, TIME, SIDE, SIDE, CHANNELS)).astype(np.float32)


def floor_model(layer):
    """The hand-built Scan (see the module's note)."""
    f32 = TensorProto.FLOAT
    kernel, recurrent, bias = (np.asarray(w) for w in layer.cell.get_weights())
    pad = KERNEL // 2

    def ints(name: str, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    initializers = [numpy_helper.from_array(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)), "Wx"),
                    numpy_helper.from_array(bias.astype(np.float32), "B"),
                    ints("minus_one", [-1]), ints("two", [2]), ints("five", [5]), ints("zero", [0]),
                    ints("one", [1]), ints("state_rest", [FILTERS, SIDE, SIDE])]
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 4, 2, 3]),  # [T, B, C, H, W]
             helper.make_node("Shape", ["x_tm"], ["x_shape"]),
             helper.make_node("Slice", ["x_shape", "two", "five"], ["frame"]),
             helper.make_node("Concat", ["minus_one", "frame"], ["folded_shape"], axis=0),
             helper.make_node("Reshape", ["x_tm", "folded_shape"], ["folded"]),
             helper.make_node("Conv", ["folded", "Wx", "B"], ["gates_folded"], kernel_shape=[KERNEL, KERNEL],
                              pads=[pad] * 4),
             helper.make_node("Slice", ["x_shape", "zero", "two"], ["time_batch"]),
             helper.make_node("Shape", ["gates_folded"], ["gates_shape"]),
             helper.make_node("Slice", ["gates_shape", "one", "five"], ["gates_frame"]),
             helper.make_node("Concat", ["time_batch", "gates_frame"], ["gates_shape_tm"], axis=0),
             helper.make_node("Reshape", ["gates_folded", "gates_shape_tm"], ["gates"]),  # [T, B, 4F, H, W]
             helper.make_node("Slice", ["x_shape", "one", "two"], ["batch"]),
             helper.make_node("Concat", ["batch", "state_rest"], ["state_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["state_shape"], ["zeros"])]
    body_init = [numpy_helper.from_array(np.ascontiguousarray(recurrent.transpose(3, 2, 0, 1)), "Wh")]
    body = [helper.make_node("Conv", ["h", "Wh"], ["hg"], kernel_shape=[KERNEL, KERNEL], pads=[pad] * 4),
            helper.make_node("Add", ["g_t", "hg"], ["z"]),
            helper.make_node("Split", ["z"], ["zi", "zf", "zc", "zo"], axis=1, num_outputs=4),
            helper.make_node("Sigmoid", ["zi"], ["i"]), helper.make_node("Sigmoid", ["zf"], ["f"]),
            helper.make_node("Tanh", ["zc"], ["cc"]), helper.make_node("Sigmoid", ["zo"], ["o"]),
            helper.make_node("Mul", ["f", "c"], ["fc"]), helper.make_node("Mul", ["i", "cc"], ["ic"]),
            helper.make_node("Add", ["fc", "ic"], ["c_new"]), helper.make_node("Tanh", ["c_new"], ["tc"]),
            helper.make_node("Mul", ["o", "tc"], ["h_new"]), helper.make_node("Identity", ["h_new"], ["y_t"])]
    state = [None, FILTERS, SIDE, SIDE]
    graph = helper.make_graph(
        body, "step", [helper.make_tensor_value_info("h", f32, state), helper.make_tensor_value_info("c", f32, state),
                       helper.make_tensor_value_info("g_t", f32, [None, 4 * FILTERS, SIDE, SIDE])],
        [helper.make_tensor_value_info(n, f32, None) for n in ("h_new", "c_new", "y_t")], body_init)
    nodes += [helper.make_node("Scan", ["zeros", "zeros", "gates"], ["h_last", "c_last", "y_tm"], body=graph,
                               num_scan_inputs=1),
              helper.make_node("Transpose", ["y_tm"], ["y"], perm=[1, 0, 3, 4, 2])]
    model = helper.make_model(
        helper.make_graph(nodes, "floor", [helper.make_tensor_value_info("x", f32, [None, None, SIDE, SIDE, CHANNELS])],
                          [helper.make_tensor_value_info("y", f32, None)], initializers),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def stock_convert(model):
    """Stock tf2onnx's conversion of the model (its Loop), at the same opset."""
    import tensorflow as tf
    import tf2onnx

    from tf2onnx_rnn.probes import stamp_ir_version

    spec = [tf.TensorSpec((None, None, SIDE, SIDE, CHANNELS), tf.float32, name="x")]
    model_proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    stamp_ir_version(model_proto)  # an IR version the installed onnxruntime loads
    return model_proto


def time_case(batch: int, rounds: int, block: float) -> dict:
    from tf2onnx_rnn import convert_keras

    model, layer = build_model()
    x = make_input(batch)
    want = np.asarray(model(x, training=False))
    protos = {"ours": convert_keras(model, opset=17), "floor": floor_model(layer), "stock": stock_convert(model)}
    runners, errors = runners_of(protos)
    for name, run in runners.items():
        if run is not None:
            error = float(np.max(np.abs(np.asarray(run(x)) - want) / np.maximum(np.abs(want), 1.0)))
            if error > 1e-5:
                raise AssertionError(f"ConvLSTM2D b{batch} {name} differs from Keras by {error:.3g} (relative)")
    return timed(f"ConvLSTM2D, batch {batch}", runners, x, rounds, block, errors)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    batches = [1] if args.smoke else [1, 8]
    rounds, block = (1, 0.05) if args.smoke else (args.rounds, 0.25)
    results = [time_case(batch, rounds, block) for batch in batches]
    text = table(results)
    print(text)
    if not args.smoke:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "conv_lstm.md"), "w") as stream:
            stream.write("# ConvLSTM2D: the Scan form\n\n" + __doc__.split("\n\n", 2)[2] + "\n" + text + "\n")
        with open(os.path.join(args.out, "conv_lstm.json"), "w") as stream:
            json.dump(results, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
