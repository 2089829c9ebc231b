"""How long each runtime takes to compile a model whose layers are written out as their steps, by length.

    python benchmarks/long_sequences.py                       # each runtime at the lengths around its minute
    python benchmarks/long_sequences.py --times 25 50 --runtimes tvm

An LSTM(64) and a GRU(64) over F=16 features at batch 1, Keras 3, random weights, converted with the tvm
target (both layers written out as their steps: the form every runtime falls back to where it lacks a
layer's node, its activations or its mask), then compiled in each runtime as ``tf2onnx_rnn/runtime_runs.py``
prepares a model there (its interpreter named by ``TF2ONNX_RNN_<RUNTIME>_PYTHON``), once per length, in a
fresh process, and run once against Keras. The table gives the written model's nodes and the seconds each
runtime took to prepare it; the rows' facts (``steps_in_a_minute``: the steps written out a runtime compiles
in about a minute) come from it.
Results: benchmarks/results/long_sequences.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "..", "tf2onnx_rnn", "runtime_runs.py")
FEATURES, UNITS = 16, 64
# the lengths measured by default: around where each runtime's compile passes a minute (about 27 nodes a step)
LENGTHS = {"tvm": [50, 100, 200, 300, 400], "iree": [50, 100, 200, 300, 400], "ncnn": [100, 200, 400, 600, 700],
           "rknn": [4, 8, 16, 20, 25]}

import numpy as np  # noqa: E402

_PREPARE = """
import json, sys, time, importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("runtime_runs", sys.argv[1])
runs = importlib.util.module_from_spec(spec); spec.loader.exec_module(runs)
feeds = dict(np.load(sys.argv[4]))
start = time.perf_counter()
run = runs.PREPARERS[sys.argv[2]](sys.argv[3], feeds, sys.argv[5])
prepared = time.perf_counter() - start
out = run(feeds)
np.savez(sys.argv[6], *out)
print(json.dumps({"seconds": prepared}))
"""


def model(time: int):
    import keras

    x = keras.Input(batch_shape=(1, time, FEATURES), name="x")
    h = keras.layers.LSTM(UNITS, return_sequences=True)(x)
    m = keras.Model(x, keras.layers.GRU(UNITS, return_sequences=True)(h))
    rng = np.random.default_rng(3)
    m.set_weights([(rng.standard_normal(w.shape) * 0.2).astype(np.float32) for w in m.get_weights()])
    return m


def measure(runtime: str, time: int, work: str) -> dict:
    import onnx
    import tensorflow as tf

    from tf2onnx_rnn import convert_keras
    from tf2onnx_rnn.rewriters.runtimes import BY_KEY
    from tf2onnx_rnn.runtime_check import python_for

    keras_model = model(time)
    path = os.path.join(work, f"{time}.onnx")
    if not os.path.exists(path):
        proto = convert_keras(keras_model, input_signature=[tf.TensorSpec((1, time, FEATURES), tf.float32, name="x")],
                              target="tvm")
        onnx.save(proto, path)
    proto = onnx.load(path)
    x = np.random.default_rng(time).standard_normal((1, time, FEATURES)).astype(np.float32)
    feeds, outputs = os.path.join(work, "feeds.npz"), os.path.join(work, "out.npz")
    np.savez(feeds, x=x)
    python = python_for(BY_KEY[runtime])
    row = {"runtime": runtime, "time": time, "nodes": len(proto.graph.node)}
    if python is None:
        return {**row, "seconds": None, "note": "not installed"}
    scratch = tempfile.mkdtemp(dir=work)
    env = dict(os.environ, PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))  # its pnnx
    done = subprocess.run([python, "-c", _PREPARE, RUNNER, runtime, path, feeds, scratch, outputs],
                          capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        return {**row, "seconds": None, "note": (done.stderr.strip().splitlines() or ["failed"])[-1][:120]}
    got = np.load(outputs)["arr_0"].reshape(1, time, UNITS)
    error = float(np.max(np.abs(got - np.asarray(keras_model(x, training=False)))))
    return {**row, "seconds": json.loads(done.stdout.strip().splitlines()[-1])["seconds"], "error": error}


def minute(rows: list, runtime: str):
    """The nodes ``runtime`` compiles in about a minute: interpolated between the two lengths measured around
    it (None where the lengths do not bracket a minute)."""
    runs = sorted((r["nodes"], r["seconds"]) for r in rows if r["runtime"] == runtime and r.get("seconds") is not None)
    for (nodes, seconds), (more, longer) in zip(runs, runs[1:]):
        if seconds <= 60 < longer:
            return int(nodes + (60 - seconds) * (more - nodes) / (longer - seconds))
    return None


def render(measured: dict) -> str:
    lines = [measured["header"], "", "| runtime | steps | nodes | compile s | max abs error |", "|---|---|---|---|---|"]
    for r in measured["rows"]:
        seconds = f"{r['seconds']:.1f}" if r.get("seconds") is not None else r.get("note", "-")
        error = f"{r['error']:.1e}" if "error" in r else "-"
        lines.append(f"| {r['runtime']} | {r['time']} | {r['nodes']} | {seconds} | {error} |")
    runtimes = dict.fromkeys(r["runtime"] for r in measured["rows"])
    lines += ["", "Compiled in about a minute (interpolated between the lengths around it; the rows' "
              "`nodes_in_a_minute`): " + "; ".join(f"{k} {minute(measured['rows'], k) or 'not bracketed'} nodes"
                                                   for k in runtimes) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, nargs="+", help="the lengths, for every runtime named (default: LENGTHS)")
    parser.add_argument("--runtimes", nargs="+", default=["tvm", "iree", "ncnn", "rknn"])
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--render", action="store_true", help="write the table again from the results' json")
    args = parser.parse_args(argv)
    path = os.path.join(args.out, "long_sequences.json")
    if args.render:
        with open(path) as handle:
            measured = json.load(handle)
    else:
        rows = []
        with tempfile.TemporaryDirectory() as work:
            for runtime in args.runtimes:
                for time in args.times or LENGTHS[runtime]:
                    rows.append(measure(runtime, time, work))
                    print(json.dumps(rows[-1]), flush=True)
        import platform
        import time as clock

        when = clock.strftime("%Y-%m-%d %H:%M UTC", clock.gmtime())
        header = (f"Written by `python benchmarks/long_sequences.py` on {when} "
                  f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average at the end "
                  f"{os.getloadavg()[0]:.2f}). An LSTM({UNITS}) and a GRU({UNITS}) over {FEATURES} features "
                  "at batch 1, the tvm target's form (every layer's steps written out); compile s: preparing the model "
                  "as tf2onnx_rnn/runtime_runs.py does, in a fresh process.")
        measured = {"header": header, "rows": rows}
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w") as handle:
            json.dump(measured, handle, indent=1)
    with open(os.path.join(args.out, "long_sequences.md"), "w") as handle:
        handle.write(render(measured))
    print(render(measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
