"""What stock tf2onnx and tf2onnx-rnn make of TFLite files, frozen graphs and models from GPU machines: the
measurement behind the format table of docs/tflite-and-graphs.md and the GPU row of docs/conversions.md.

Every TFLite model of ``tests/test_tflite.py`` (both Keras flavors, batch 1 and 5, fixed and
dynamic time) and the frozen Keras graphs of ``tests/test_graph_def.py`` are converted by stock
tf2onnx (``tf2onnx.convert.from_tflite``; for graphs its command line) and by this package, and so
are TF 1.x graphs (``tests/tf1_graphs.py``: dynamic_rnn, bidirectional_dynamic_rnn, static_rnn and the
fused BlockLSTM ops over TF1's cells, with and without sequence_length, in TF 1.x's own control flow and
with functional loops), and models as they leave a GPU machine (cuDNN's ops: ``tests/cudnn_graphs.py``).
For each, the result: the
recurrent ops in the written graph (``LSTM``, ``Loop`` ...), or the error, and whether
onnxruntime loads and matches the TFLite interpreter (or TensorFlow) on random inputs.

    python benchmarks/stock_formats.py [--out benchmarks/results/formats.md]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RECURRENT = ("LSTM", "GRU", "RNN", "Loop", "Scan")


def _kinds(model_proto) -> str:
    """The recurrent ops of a model (with counts), or what else it keeps that onnxruntime cannot run."""
    counts = collections.Counter(n.op_type for n in model_proto.graph.node)
    found = [f"{op}x{counts[op]}" if counts[op] > 1 else op for op in RECURRENT if counts[op]]
    foreign = sorted({op for op in counts if op.startswith(("TFL_", "TensorList"))})
    return " ".join(found + [f"unconverted {', '.join(foreign)}"] if foreign else found) or "no recurrent op"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:110] if lines else ''}"


def _compare(model_proto, reference, x) -> str:
    """``x``: the one input's value, or input name -> value."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
        feed = {i.name: x[i.name.split(":")[0]] for i in session.get_inputs()} if isinstance(x, dict) else \
            {session.get_inputs()[0].name: x}
        actual = session.run(None, feed)
    except Exception as error:  # noqa: BLE001 - what onnxruntime says is the measurement
        return f"onnxruntime: {_first_line(error)}"
    expected = reference(x)
    if [a.shape for a in actual] != [e.shape for e in expected]:
        return "wrong shapes"
    return f"max error {max(float(np.max(np.abs(a - e))) for a, e in zip(actual, expected)):.1e}"


def stock_tflite(path: str):
    from tf2onnx import convert

    model_proto, _ = convert.from_tflite(path)
    return model_proto


def stock_graph_def(path: str, inputs: list, outputs: list):
    """Stock tf2onnx's command line on the frozen graph, in a process of its own (as a user runs it)."""
    import subprocess
    import tempfile

    import onnx

    with tempfile.TemporaryDirectory() as folder:
        target = os.path.join(folder, "stock.onnx")
        command = [sys.executable, "-m", "tf2onnx.convert", "--graphdef", path, "--inputs", ",".join(inputs),
                   "--outputs", ",".join(outputs), "--output", target]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "Error" in line] or done.stderr.splitlines()[-1:]
            raise RuntimeError(errors[-1].strip() if errors else f"exit code {done.returncode}")
        return onnx.load(target)


def measure(name: str, stock, ours, reference, x: np.ndarray) -> tuple:
    row = [name]
    for convert in (stock, ours):
        try:
            model_proto = convert()
        except Exception as error:  # noqa: BLE001 - a failure is the measurement
            row.append(f"fails: {_first_line(error)}")
            continue
        row.append(f"{_kinds(model_proto)}; {_compare(model_proto, reference, x)}")
    return tuple(row)


def tflite_rows() -> list:
    import test_tflite as models
    from tf2onnx_rnn import convert_tflite

    rows = []
    cases = [(f, n, b, models.TIME) for f, n in models.CASES for b in models.BATCHES]
    cases += [(f, n, 2, None) for f in models.parity.FLAVORS for n in models.DYNAMIC_TIME]
    cases += [("tf_keras", "stack_lstm_gru", b, models.TIME) for b in models.BATCHES]
    for flavor, name, batch, time in cases:
        built = models.exported(flavor, name, batch, time)
        x = models.inputs_for(name, batch, time or 7, seed=0)

        def reference(x, path=built.path):
            return list(models.run_tflite(path, x).values())

        label = f"{flavor} {name} b{batch} {'T dynamic' if time is None else f'T={time}'}"
        rows.append(measure(label, lambda: stock_tflite(built.path),
                            lambda: convert_tflite(built.path, drop_cell_clip=time is None), reference, x))
        print(" | ".join(rows[-1]), flush=True)
    return rows


def graph_def_rows() -> list:
    import test_graph_def as graphs
    from tf2onnx_rnn import convert_graph_def

    rows = []
    for flavor in graphs.parity.FLAVORS:
        for lowered in (False, True):
            model, path, inputs, outputs = graphs.frozen_keras(flavor, lowered)
            x = np.random.default_rng(0).standard_normal((3, 6, graphs.FEATURES)).astype(np.float32)
            label = f"{flavor} LSTM -> Bidirectional(GRU), frozen, lower_control_flow={lowered}"
            rows.append(measure(label, lambda: stock_graph_def(path, inputs, outputs),
                                lambda: convert_graph_def(path, inputs=inputs, outputs=outputs),
                                lambda x, model=model: [np.asarray(model(x, training=False))], x))
            print(" | ".join(rows[-1]), flush=True)
    return rows


def tf1_cases() -> list:
    """The graphs of ``tests/test_tf1_graphs.py``: those that fuse, those kept as Loops, a ``BlockLSTM``
    that clips its cell state (refused), ``static_rnn`` given lengths (kept as its steps)."""
    import test_tf1_graphs as cases

    return cases.FUSED + cases.KEPT + [cases.Case("fused", "block_lstm_clip", True)] + \
        [cases.Case("static", "lstm", True, form) for form in cases.tf1_graphs.FORMS]


def tf1_rows() -> list:
    """Every TF 1.x graph of ``tests/test_tf1_graphs.py`` (both control-flow forms), on rows of lengths
    4, 2 and 0 at T=6: every row shorter than the input, where a loop bounded by the longest row
    returns fewer steps than TensorFlow."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def

    rows = []
    for case in tf1_cases():
        built = tf1_graphs.built(case)
        for lengths, time in (([6, 6, 6], 6),) if case.driver == "static" and not case.lengths else (([4, 2, 0], 6),):
            feeds = tf1_graphs.feeds_for(case, lengths, time)
            feed = {name.split(":")[0]: value for name, value in zip(built.inputs, feeds)}
            label = f"{case.id}, lengths {lengths if case.lengths else '-'}, T={time}"
            rows.append(measure(label, lambda: stock_graph_def(built.path, built.inputs, built.outputs),
                                lambda: convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs),
                                lambda x, built=built, feeds=feeds: built.run(feeds), feed))
            print(" | ".join(rows[-1]), flush=True)
    return rows


def stock_saved_model(path: str):
    """Stock tf2onnx's command line on a SavedModel, in a process of its own; the model it wrote, even
    when it logged unsupported ops (it still exits 0 then)."""
    import subprocess
    import tempfile

    import onnx

    with tempfile.TemporaryDirectory() as folder:
        target = os.path.join(folder, "stock.onnx")
        done = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", path, "--output", target],
                              capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "Error" in line] or done.stderr.splitlines()[-1:]
            raise RuntimeError(errors[-1].strip() if errors else f"exit code {done.returncode}")
        return onnx.load(target)


def gpu_rows() -> list:
    """Models as they leave a GPU machine (``tests/cudnn_graphs.py``): Keras 3 models exported where
    TensorFlow lists a GPU (their LSTM and GRU layers ``CudnnRNNV3`` ops), tf_keras's ``CuDNNLSTM`` and
    ``CuDNNGRU``, and TF 1.x graphs of ``CudnnRNN`` in each mode; against the CPU computation (Keras on the
    CPU, the canonical twin, or Keras's canonical layers with the same weights)."""
    import keras
    import tf_keras
    from tf2onnx import convert as stock_convert

    import cudnn_graphs
    import parity
    import test_cudnn
    from tf2onnx_rnn import convert_graph_def, convert_keras, convert_saved_model

    rows = []
    x = np.random.default_rng(0).standard_normal((3, 6, 3)).astype(np.float32)
    for name, build in (("LSTM -> GRU", lambda i: keras.layers.GRU(4)(keras.layers.LSTM(4, return_sequences=True)(i))),
                        ("Masking -> Bidirectional(LSTM)", lambda i: keras.layers.Bidirectional(
                            keras.layers.LSTM(4))(keras.layers.Masking()(i)))):
        inputs = keras.Input((None, 3), name="x")
        model = keras.Model(inputs, build(inputs))
        parity.randomize_weights(model, 1)
        path = cudnn_graphs.export_on_gpu_machine(model, name.replace(" ", "").replace(">", ""))
        rows.append(measure(f"Keras 3 {name}, exported on a GPU machine", lambda: stock_saved_model(path),
                            lambda: convert_saved_model(path), lambda x, m=model: [np.asarray(m(x))], x))
        print(" | ".join(rows[-1]), flush=True)
    for kind, structure in (("LSTM", "plain"), ("GRU", "bidi-concat")):
        model, twin, _ = test_cudnn._cudnn_layer_case(kind, structure)
        signature = [__import__("tensorflow").TensorSpec([None, None, 3], "float32", name="x")]
        rows.append(measure(f"tf_keras CuDNN{kind}, {structure}",
                            lambda m=model: stock_convert.from_keras(m, input_signature=signature, opset=17)[0],
                            lambda m=model: convert_keras(m), lambda x, t=twin: parity.keras_outputs(t, [x]), x))
        print(" | ".join(rows[-1]), flush=True)
    for mode, layers in (("lstm", 1), ("gru", 1), ("gru", 2), ("rnn_tanh", 1)):
        case = cudnn_graphs.RawCase(op="CudnnRNN", mode=mode, layers=layers)
        path, inputs, outputs, weights = cudnn_graphs.raw_graph(case, seed=3)
        feeds = cudnn_graphs.raw_feeds(case, 3, 5, 1)
        rows.append(measure(f"TF 1.x {case.id}", lambda: stock_graph_def(path, inputs, outputs),
                            lambda: convert_graph_def(path, inputs=inputs, outputs=outputs),
                            lambda feed, c=case, w=weights: cudnn_graphs.canonical_outputs(c, w, feed), feeds))
        print(" | ".join(rows[-1]), flush=True)
    del tf_keras
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "formats.md"))
    parser.add_argument("--only", choices=("tflite", "graphs", "tf1", "gpu"), help="measure one section only")
    args = parser.parse_args()
    import tensorflow as tf
    import tf2onnx

    chosen = {"tflite": ("TFLite files", tflite_rows), "graphs": ("Frozen graphs", graph_def_rows),
              "tf1": ("TF 1.x graphs", tf1_rows), "gpu": ("Models from GPU machines (cuDNN ops)", gpu_rows)}
    try:
        sections = [(title, rows()) for key, (title, rows) in chosen.items() if args.only in (None, key)]
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1
    lines = [f"# Stock tf2onnx {tf2onnx.__version__} and tf2onnx-rnn on TFLite files, frozen graphs and models "
             "from GPU machines", "", f"TensorFlow {tf.__version__}; written by `benchmarks/stock_formats.py`. "
             "Errors are against the TFLite interpreter (TFLite files), Keras (frozen Keras graphs), the "
             "TensorFlow session (TF 1.x graphs) or the CPU computation (models from GPU machines: Keras on the "
             "CPU, tf_keras's canonical twin of a CuDNN layer, Keras's canonical layers with a TF 1.x op's "
             "weights) on one random batch.", ""]
    for title, rows in sections:
        lines += [f"## {title}", "", "| model | stock tf2onnx | tf2onnx-rnn |", "|---|---|---|"]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows] + [""]
    with open(args.out, "w") as stream:
        stream.write("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
