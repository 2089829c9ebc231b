"""Latency of the runtime targets in their runtimes: ours against a hand-built floor and stock tf2onnx.

    python benchmarks/runtimes.py                 # LSTM, GRU, SimpleRNN; batch 1 and 8; T=100, F=64, H=128
    python benchmarks/runtimes.py --smoke         # one case, a few rounds: checks the script runs

Each runtime runs in the interpreter ``TF2ONNX_RNN_<RUNTIME>_PYTHON`` names (or this one, where it has the
runtime): the models are written here, then compiled and timed there by ``tf2onnx_rnn/runtime_runs.py
--time``, interleaved round by round after a warm-up, one model after another. The floor is the best graph
of the same layer a person would write for that runtime: Transpose -> the native node -> Transpose where the
runtime computes the node (IREE, ncnn), else the input's MatMul over every step and, per step, one recurrent
MatMul and the gates (TVM). Stock is tf2onnx 1.17's ``from_keras``: its Loops run in none of these runtimes,
which the table says. ncnn computes one batch row at a time: its batch 8 runs the rows one after another.
Every model is checked against Keras before it is timed; ours/floor is the median of the rounds' ratios (the
two run one after the other in each round, so a slow moment slows both). Results: benchmarks/results/runtimes.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

TIME, FEATURES, UNITS = 100, 64, 128
KINDS = ("LSTM", "GRU", "SimpleRNN")
RUNTIMES = ("iree", "tvm", "ncnn")


def keras_layer(kind: str, seed: int = 0):
    import keras

    x = keras.Input((TIME, FEATURES), name="x")
    layer = getattr(keras.layers, kind)(UNITS, return_sequences=True)
    model = keras.Model(x, layer(x))
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model, layer


def onnx_weights(kind: str, layer) -> tuple:
    """(op, W, R, B, attributes) in ONNX's layout from the Keras layer's weights (gate orders mapped)."""
    kernel, recurrent, bias = [np.asarray(w) for w in layer.get_weights()]
    if kind == "LSTM":  # Keras i, f, c, o -> ONNX i, o, f, c
        def order(m):
            return np.concatenate([m[..., :UNITS], m[..., 3 * UNITS:], m[..., UNITS:2 * UNITS],
                                   m[..., 2 * UNITS:3 * UNITS]], axis=-1)
        w, r = order(kernel).T, order(recurrent).T
        b = np.concatenate([order(bias), np.zeros(4 * UNITS, np.float32)])
        return "LSTM", w, r, b, {}
    if kind == "GRU":  # z, r, h in both; reset_after: linear_before_reset=1, bias [input, recurrent]
        return "GRU", kernel.T, recurrent.T, bias.reshape(-1), {"linear_before_reset": 1}
    return "RNN", kernel.T, recurrent.T, np.concatenate([bias, np.zeros(UNITS, np.float32)]), {}


def native_floor(kind: str, layer, batch: int) -> onnx.ModelProto:
    """Transpose -> the native node -> Squeeze -> Transpose."""
    op, w, r, b, attrs = onnx_weights(kind, layer)
    inits = [numpy_helper.from_array(a[None].astype(np.float32), n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node(op, ["xt", "W", "R", "B"], ["Y"], hidden_size=UNITS, **attrs),
             helper.make_node("Squeeze", ["Y", "axis1"], ["ys"]),
             helper.make_node("Transpose", ["ys"], ["y"], perm=[1, 0, 2])]
    return _model(nodes, inits, batch)


def steps_floor(kind: str, layer, batch: int) -> onnx.ModelProto:
    """The input's MatMul over every step, then per step the recurrent MatMul and the gates, by hand."""
    op, w, r, b, attrs = onnx_weights(kind, layer)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    wb, rb = b[:gates * UNITS], b[gates * UNITS:]
    lbr = op == "GRU"
    inputs_bias = wb + (rb if not lbr else np.concatenate([rb[:2 * UNITS], np.zeros(UNITS, np.float32)]))
    rbh = np.concatenate([np.zeros(2 * UNITS), rb[2 * UNITS:]]) if lbr else None
    inits = {"Wt": w.T, "bias": inputs_bias, "Rt": r.T, "Rbh": rbh, "sizes": np.ones(TIME, np.int64),
             "gate_sizes": np.full(gates, UNITS, np.int64),
             "h0": np.zeros((1, batch, UNITS)), "one": np.ones(1), "axis1": np.array([1], np.int64)}
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["xt", "Wt"], ["xw0"]), helper.make_node("Add", ["xw0", "bias"], ["xw"]),
             helper.make_node("Split", ["xw", "sizes"], [f"x{t}" for t in range(TIME)], axis=0)]
    h, c = "h0", "h0"

    def add(op: str, inputs: list, output: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output] if isinstance(output, str) else output, **attrs))
        return output

    for t in range(TIME):
        p, x = f"s{t}_", f"x{t}"
        hr = add("MatMul", [h, "Rt"], p + "hr")
        if op == "RNN":
            h = add("Tanh", [add("Add", [x, hr], p + "a")], p + "h")
        elif op == "LSTM":
            total = add("Add", [x, hr], p + "a")
            gi, go, gf, gg = add("Split", [total, "gate_sizes"], [p + g for g in "iofg"], axis=-1)
            i_, o_, f_ = (add("Sigmoid", [g], g + "s") for g in (gi, go, gf))
            c = add("Add", [add("Mul", [f_, c], p + "fc"), add("Mul", [i_, add("Tanh", [gg], p + "tg")], p + "ig")],
                    p + "c")
            h = add("Mul", [o_, add("Tanh", [c], p + "tc")], p + "h")
        else:
            xz, xr, xh = add("Split", [x, "gate_sizes"], [p + "xz", p + "xr", p + "xh"], axis=-1)
            hz, hrr, hh = add("Split", [add("Add", [hr, "Rbh"], p + "hrb"), "gate_sizes"],
                              [p + "hz", p + "hrr", p + "hh"], axis=-1)
            z = add("Sigmoid", [add("Add", [xz, hz], p + "az")], p + "z")
            r_ = add("Sigmoid", [add("Add", [xr, hrr], p + "ar")], p + "r")
            n = add("Tanh", [add("Add", [xh, add("Mul", [r_, hh], p + "rh")], p + "ah")], p + "n")
            h = add("Add", [add("Mul", [add("Sub", ["one", z], p + "omz"), n], p + "a1"),
                            add("Mul", [z, h], p + "a2")], p + "h")
    nodes += [helper.make_node("Concat", [f"s{t}_h" for t in range(TIME)], ["ys"], axis=0),
              helper.make_node("Transpose", ["ys"], ["y"], perm=[1, 0, 2])]
    integers = ("sizes", "gate_sizes", "axis1")
    tensors = [numpy_helper.from_array(np.asarray(v, np.int64 if k in integers else np.float32), k)
               for k, v in inits.items() if v is not None]
    return _model(nodes, tensors, batch)


def _model(nodes, inits, batch: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "floor",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, TIME, FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, TIME, UNITS])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _python(runtime: str):
    sys.path.insert(0, os.path.join(HERE, ".."))
    from tf2onnx_rnn.rewriters.runtimes import BY_KEY
    from tf2onnx_rnn.runtime_check import python_for

    return python_for(BY_KEY[runtime])


def _in_runtime(python: str, runtime: str, paths: list, x: np.ndarray, rounds: int, work: str):
    """Each model's outputs there (checked first), then {path: median seconds}; None where it fails."""
    import tf2onnx_rnn.runtime_runs as runs

    feeds = os.path.join(work, "feeds.npz")
    np.savez(feeds, x=x)
    env = dict(os.environ, PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
    outputs = {}
    for path in paths:
        out = path + ".out.npz"
        done = subprocess.run([python, runs.__file__, runtime, path, feeds, out], capture_output=True, text=True,
                              env=env)
        outputs[path] = np.load(out)["out0"] if done.returncode == 0 else done.stderr.strip().splitlines()[-1:]
    timed = [p for p in paths if not isinstance(outputs[p], list)]
    times_path = os.path.join(work, "times.json")
    subprocess.run([python, runs.__file__, "--time", runtime, feeds, str(rounds), times_path] + timed, check=True,
                   capture_output=True, env=env)
    with open(times_path) as handle:
        times = json.load(handle)
    return outputs, {p: statistics.median(t) * 1e3 for p, t in times.items()}, times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help="comma-separated: iree, tvm, ncnn")
    args = parser.parse_args(argv)
    import tensorflow as tf
    import tf2onnx

    sys.path.insert(0, os.path.join(HERE, ".."))
    from tf2onnx_rnn import convert_keras

    kinds, batches, rounds = (KINDS[:1], (1,), 3) if args.smoke else (KINDS, (1, 8), args.rounds)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for runtime in args.runtimes.split(","):
            python = _python(runtime)
            if python is None:
                print(f"{runtime}: not installed (set TF2ONNX_RNN_{runtime.upper()}_PYTHON); skipped")
                continue
            for kind in kinds:
                model, layer = keras_layer(kind)
                for batch in batches:
                    x = np.random.default_rng(batch).standard_normal((batch, TIME, FEATURES)).astype(np.float32)
                    want = np.asarray(model(x, training=False))
                    conv_batch = 1 if runtime == "ncnn" else batch
                    spec = [tf.TensorSpec((conv_batch, TIME, FEATURES), tf.float32, name="x")]
                    ours = convert_keras(model, input_signature=spec, target=runtime)
                    floor = (steps_floor if runtime == "tvm" else native_floor)(kind, layer, conv_batch)
                    stock, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
                    paths = {}
                    for name, proto in (("ours", ours), ("floor", floor), ("stock", stock)):
                        paths[name] = os.path.join(work, f"{runtime}_{kind}_{batch}_{name}.onnx")
                        onnx.save(proto, paths[name])
                    outputs, medians, times = _in_runtime(python, runtime, list(paths.values()), x, rounds, work)
                    for name in ("ours", "floor"):
                        got = outputs[paths[name]]
                        if isinstance(got, list) or not np.allclose(np.reshape(got, want.shape), want, atol=1e-4):
                            raise SystemExit(f"{runtime} {kind} batch {batch}: {name} differs from Keras or fails: "
                                             f"{got if isinstance(got, list) else np.abs(got - want).max()}")
                    stock_ms = medians.get(paths["stock"])
                    ratios = [o / f for o, f in zip(times[paths["ours"]], times[paths["floor"]])]
                    row = dict(runtime=runtime, kind=kind, batch=batch, ours=medians[paths["ours"]],
                               floor=medians[paths["floor"]], ratio=statistics.median(ratios), stock=stock_ms,
                               stock_runs=not isinstance(outputs[paths["stock"]], list))
                    rows.append(row)
                    print(row, flush=True)
    _write(rows, args.smoke)
    return 0


def _write(rows: list, smoke: bool) -> None:
    lines = ["| runtime | layer | batch | ours ms | floor ms | ours/floor | stock |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        stock = f"{r['stock']:.3f} ms" if r["stock_runs"] and r["stock"] else "does not run (Loop)"
        lines.append(f"| {r['runtime']} | {r['kind']} | {r['batch']} | {r['ours']:.3f} | {r['floor']:.3f} | "
                     f"{r['ratio']:.2f} | {stock} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not smoke:
        results = os.path.join(HERE, "results")
        name = "runtimes" if len({r["runtime"] for r in rows}) == len(RUNTIMES) else \
            "runtimes_" + "_".join(sorted({r["runtime"] for r in rows}))
        with open(os.path.join(results, f"{name}.md"), "w") as handle:
            handle.write(text)
        with open(os.path.join(results, f"{name}.json"), "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    sys.exit(main())
