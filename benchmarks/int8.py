"""int8 quantization of converted Keras recurrent models: accuracy, size and speed per recipe.

    python benchmarks/int8.py                     # results in benchmarks/results/int8.md
    python benchmarks/int8.py --quick --out /tmp  # fewer timing rounds and training steps

Part 1 (recipes). Three Keras 3 models, one per kind, x [B, 50, 16] -> Dense(64, relu) ->
LSTM / GRU / SimpleRNN(128) -> Dense(10), in two weight states: as initialised by Keras
(glorot_uniform kernels, orthogonal recurrent kernels) with small biases N(0, 0.05), and after
a few hundred Adam steps on a toy task (classify the frequency of noisy sinusoids). Inputs are
the task's standardised signals (|x| < 4). Each model is converted with ``convert_keras`` and
quantized with onnxruntime's tools by several recipes. For each: max and mean absolute error
and top-1 agreement against Keras ``model(x, training=False)`` on 256 held-out sequences run in
batches of 16 (dynamic quantization takes its activation ranges from the batch), the model
file size, and the median latency at batch 1 and 16 relative to the float model (onnxruntime,
one intra-op thread, all recipes of one model interleaved round by round in one process).

Part 2 (attribution). A plain LSTM(128, return_sequences=True) on x [16, 50, 16] ~ N(0, 1)
with weights from Keras's init up to random N(0, sigma). The error of onnxruntime's
DynamicQuantizeLSTM is compared with a numpy model of that kernel in which each rounding
(W and R per tensor or per channel, X per tensor over the whole sequence, H per step) can be
switched on alone, to tell which rounding causes the error and how it grows over time.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))

import numpy as np  # noqa: E402

TIME, FEATURES, EMBED, HIDDEN, CLASSES = 50, 16, 64, 128, 10
EVAL_SAMPLES, EVAL_BATCH = 256, 16
KINDS = ("LSTM", "GRU", "SimpleRNN")
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
NATIVE = {"LSTM": "LSTM", "GRU": "GRU", "SimpleRNN": "RNN"}
INT_OPS = ("DynamicQuantizeLSTM", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
           "QLinearMatMul", "QGemm")


# -- data and models -------------------------------------------------------------------------
def toy_data(n: int, rng: np.random.Generator):
    """Noisy sinusoids whose frequency (one of CLASSES) is the label, standardised."""
    labels = rng.integers(0, CLASSES, n)
    freq = 0.02 + 0.015 * labels
    steps = np.arange(TIME)[None, :, None]
    phase = rng.uniform(0, 2 * np.pi, (n, 1, FEATURES))
    amp = rng.uniform(0.5, 1.5, (n, 1, FEATURES))
    x = amp * np.sin(2 * np.pi * freq[:, None, None] * steps + phase) + rng.normal(0, 0.3, (n, TIME, FEATURES))
    return (x / x.std()).astype(np.float32), labels


def small_biases(model, rng: np.random.Generator, std: float = 0.05):
    for var in model.weights:
        if var.path.endswith("bias"):
            var.assign(rng.normal(0, std, tuple(var.shape)).astype(np.float32))


def classifier(kind: str, seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((TIME, FEATURES))
    h = keras.layers.Dense(EMBED, activation="relu")(inp)
    h = getattr(keras.layers, kind)(HIDDEN)(h)
    model = keras.Model(inp, keras.layers.Dense(CLASSES)(h))
    small_biases(model, np.random.default_rng(seed))
    return model


def train(model, steps: int, seed: int) -> None:
    import keras

    x, y = toy_data(64 * steps, np.random.default_rng(seed + 1))
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)


def keras_out(model, x: np.ndarray) -> np.ndarray:
    return np.asarray(model(x, training=False))


# -- quantization recipes --------------------------------------------------------------------
class _Calibration:
    """CalibrationDataReader over realistic inputs (the task's training distribution)."""

    def __init__(self, name: str, x: np.ndarray, batch: int = 32):
        self._feeds = iter([{name: x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self):
        return next(self._feeds, None)


def recipes(calibration: np.ndarray):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    def dyn(**kw):
        return lambda src, dst, _name: quantize_dynamic(src, dst, **kw)

    def static(src, dst, name):
        quantize_static(src, dst, _Calibration(name, calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)

    return {
        "dynamic, default (QInt8, per tensor)": dyn(weight_type=QuantType.QInt8),
        "dynamic, per_channel=True": dyn(per_channel=True),
        "dynamic, reduce_range=True": dyn(reduce_range=True),
        "dynamic, weight_type=QUInt8": dyn(weight_type=QuantType.QUInt8),
        "dynamic, MatMul/Gemm only": dyn(op_types_to_quantize=["MatMul", "Gemm"]),
        "dynamic, MatMul/Gemm only, per_channel": dyn(op_types_to_quantize=["MatMul", "Gemm"], per_channel=True),
        "dynamic, recurrent node only": dyn(op_types_to_quantize=["LSTM", "GRU", "RNN"]),
        "dynamic, recurrent node only, per_channel": dyn(op_types_to_quantize=["LSTM", "GRU", "RNN"],
                                                         per_channel=True),
        "static QDQ, per_channel (calibrated)": static,
    }


def describe_ops(model) -> tuple[str, str]:
    """(integer ops, float compute ops left) of a (quantized) model."""
    producers = {out: node for node in model.graph.node for out in node.output}
    quantized, left = Counter(), Counter()
    for node in model.graph.node:
        if node.op_type in INT_OPS:
            quantized[node.op_type] += 1
        elif node.op_type in RECURRENT_OPS + ("MatMul", "Gemm"):
            weight = producers.get(node.input[1]) if len(node.input) > 1 else None
            if weight is not None and weight.op_type == "DequantizeLinear":
                quantized[node.op_type + " (QDQ)"] += 1
            else:
                left[node.op_type] += 1

    def text(counter):
        return ", ".join(f"{op}" + (f" x{n}" if n > 1 else "") for op, n in sorted(counter.items())) or "-"

    return text(quantized), text(left)


# -- measuring -------------------------------------------------------------------------------
def session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def run_batched(sess, x: np.ndarray, batch: int = EVAL_BATCH) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + batch]})[0] for i in range(0, len(x), batch)])


def medians(sessions: dict, x: np.ndarray, rounds: int, warmup: int = 20) -> dict:
    """Median seconds per run of each session, all sessions interleaved round by round."""
    feeds = {key: {s.get_inputs()[0].name: x} for key, s in sessions.items()}
    times = {key: [] for key in sessions}
    order = list(sessions)
    for r in range(warmup + rounds):
        if r % 2:
            order.reverse()
        for key in order:
            start = time.perf_counter()
            sessions[key].run(None, feeds[key])
            if r >= warmup:
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(v) for key, v in times.items()}


@dataclass
class Row:
    kind: str
    weights: str
    recipe: str
    int_ops: str = ""
    float_ops: str = ""
    max_err: float = float("nan")
    mean_err: float = float("nan")
    rel_err: float = float("nan")  # max abs error / max abs Keras output
    agree: float = float("nan")
    size_kb: float = float("nan")
    ms: dict = field(default_factory=dict)  # batch -> median ms
    error: str = ""


def convert_native(model, kind: str, path: str) -> None:
    """Convert with this package and insist on the native node: a Loop would measure something else."""
    import onnx

    from tf2onnx_rnn import convert_keras

    convert_keras(model, output_path=path)
    ops = {node.op_type for node in onnx.load(path).graph.node}
    if NATIVE[kind] not in ops:
        raise RuntimeError(f"{kind} was not converted to a native {NATIVE[kind]} node (ops: {sorted(ops)})")


def measure_model(kind: str, weights: str, model, x_eval, calibration, rounds: int, workdir: str) -> list:
    import onnx

    ref = keras_out(model, x_eval)
    base = os.path.join(workdir, f"{kind}-{weights}".replace(" ", "_"))
    float_path = base + ".onnx"
    convert_native(model, kind, float_path)
    input_name = onnx.load(float_path).graph.input[0].name
    paths = {"float (no quantization)": float_path}
    rows = {}
    for i, (recipe, quantize) in enumerate(recipes(calibration).items()):
        path = f"{base}.q{i}.onnx"
        try:
            with contextlib.redirect_stdout(sys.stderr):
                quantize(float_path, path, input_name)
            paths[recipe] = path
        except Exception as exc:  # a recipe the tools refuse is a result too
            rows[recipe] = Row(kind, weights, recipe, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    sessions = {}
    for recipe, path in paths.items():
        row = Row(kind, weights, recipe)
        row.int_ops, row.float_ops = describe_ops(onnx.load(path))
        row.size_kb = os.path.getsize(path) / 1024
        try:
            sessions[recipe] = session(path)
        except Exception as exc:
            row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            rows[recipe] = row
            continue
        out = run_batched(sessions[recipe], x_eval)
        diff = np.abs(out - ref)
        row.max_err, row.mean_err = float(diff.max()), float(diff.mean())
        row.rel_err = row.max_err / float(np.abs(ref).max())
        row.agree = float(np.mean(out.argmax(-1) == ref.argmax(-1)))
        rows[recipe] = row
    for batch in (1, 16):
        for recipe, seconds in medians(sessions, x_eval[:batch], rounds).items():
            rows[recipe].ms[batch] = seconds * 1e3
    order = list(paths) + [r for r in rows if r not in paths]
    return [rows[r] for r in order]


# -- part 2: a numpy model of DynamicQuantizeLSTM ---------------------------------------------
def _round(v):
    return np.rint(v)  # round half to even, as onnxruntime's quantizers


def fake_weights(w: np.ndarray, per_channel: bool, qmax: int = 127) -> np.ndarray:
    """Symmetric int8 weights as onnxruntime's LSTMQuant stores them; channels = gate units (columns of a
    Keras kernel, rows of ONNX W/R)."""
    absmax = np.abs(w).max(axis=0, keepdims=True) if per_channel else np.abs(w).max()
    scale = np.where(absmax == 0, 1.0, absmax / qmax)
    return np.clip(_round(w / scale), -qmax, qmax) * scale


def fake_activation(a: np.ndarray) -> np.ndarray:
    """uint8 per-tensor quantization of a GEMM input, as the kernel does at run time (range includes 0)."""
    lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    scale = (hi - lo) / 255 if hi > lo else 1.0
    zero = float(np.clip(_round(-lo / scale), 0, 255))
    return (np.clip(_round(a / scale) + zero, 0, 255) - zero) * scale


def numpy_lstm(x, kernel, recurrent, bias, wq=None, per_channel=False, qx=False, qh=False):
    """Keras LSTM forward (gates i, f, c, o) with optional int8 roundings; returns [B, T, H]."""
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    if wq:
        kernel, recurrent = fake_weights(kernel, per_channel), fake_weights(recurrent, per_channel)
    batch, steps, _ = x.shape
    hidden = recurrent.shape[0]
    xs = x.transpose(1, 0, 2).reshape(steps * batch, -1)  # one GEMM over all steps, as the kernel
    zx = (fake_activation(xs) if qx else xs) @ kernel
    zx = zx.reshape(steps, batch, -1)
    h = np.zeros((batch, hidden))
    c = np.zeros((batch, hidden))
    out = []
    for t in range(steps):
        z = zx[t] + (fake_activation(h) if qh else h) @ recurrent + bias
        i, f, g, o = np.split(z, 4, axis=-1)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        out.append(h)
    return np.stack(out, axis=1)


ATTRIBUTION_CASES = (  # (weights: None = Keras init, else std of random normal weights; input std)
    (None, 1.0), (None, 5.0), (0.1, 1.0), (0.2, 1.0), (0.3, 1.0), (0.4, 1.0), (0.5, 1.0), (1.0, 1.0))


def attribution(workdir: str, cases=ATTRIBUTION_CASES) -> list:
    import keras
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(7)
    x1 = rng.standard_normal((16, TIME, FEATURES)).astype(np.float32)
    rows = []
    for sigma, x_std in cases:
        x = (x1 * x_std).astype(np.float32)
        keras.utils.set_random_seed(3)
        inp = keras.Input((TIME, FEATURES))
        model = keras.Model(inp, keras.layers.LSTM(HIDDEN, return_sequences=True)(inp))
        if sigma is None:
            small_biases(model, np.random.default_rng(3))
            label = "Keras init, biases N(0, 0.05)"
        else:
            for var in model.weights:
                var.assign(rng.normal(0, sigma, tuple(var.shape)).astype(np.float32))
            label = f"random N(0, {sigma})"
        label += "" if x_std == 1.0 else f", x ~ N(0, {x_std:g})"
        kernel, recurrent, bias = (np.asarray(v, np.float64) for v in model.layers[1].get_weights())
        ref = keras_out(model, x)
        path = os.path.join(workdir, "plain.onnx")
        convert_native(model, "LSTM", path)
        errs = {"float ONNX": np.abs(run_batched(session(path), x) - ref)}
        for name, kw in (("ORT default", {}), ("ORT per_channel", {"per_channel": True})):
            with contextlib.redirect_stdout(sys.stderr):
                quantize_dynamic(path, path + ".q.onnx", **kw)
            errs[name] = np.abs(run_batched(session(path + ".q.onnx"), x) - ref)
        sim = {
            "sim, all (default)": dict(wq=True, qx=True, qh=True),
            "sim, W and R only": dict(wq=True),
            "sim, W and R per channel only": dict(wq=True, per_channel=True),
            "sim, X only": dict(qx=True),
            "sim, H only": dict(qh=True),
        }
        for name, kw in sim.items():
            errs[name] = np.abs(numpy_lstm(x, kernel, recurrent, bias, **kw) - ref)
        rows.append((label, float(np.abs(kernel).max()), float(np.abs(recurrent).max()), errs))
    return rows


# -- report ----------------------------------------------------------------------------------
def _f(v, fmt="{:.4f}"):
    return "-" if v != v else fmt.format(v)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
        flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
        vnni = "VNNI" if ("avx512_vnni" in flags or "avx_vnni" in flags) else "no VNNI"
        return f"{name or platform.processor()} ({os.cpu_count()} cores, {vnni})"
    except OSError:
        return platform.processor()


def write_report(path: str, rows: list, accuracy: dict, attrib: list, args) -> None:
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    lines = [
        "# int8 quantization of converted recurrent models",
        "",
        f"Written by `python benchmarks/int8.py{' --quick' if args.quick else ''}`: onnxruntime "
        f"{onnxruntime.__version__}, TensorFlow {tf.__version__}, tf2onnx {tf2onnx.__version__}, "
        f"{cpu_name()}. Speed: median of {args.rounds} interleaved runs per recipe after 20 warm-up runs, "
        "one intra-op thread, as a ratio to the float model measured in the same run (float ms in brackets). "
        "The CPU is shared, so the ratios are indicative.",
        "",
        f"Models: x [B, {TIME}, {FEATURES}] -> Dense({EMBED}, relu) -> kind({HIDDEN}) -> Dense({CLASSES}). "
        "Weights `init`: Keras's initializers (glorot_uniform, orthogonal) with biases N(0, 0.05); "
        f"`trained`: after {args.steps} Adam steps (batch 64) on the toy task, float top-1 accuracy "
        + ", ".join(f"{k} {v:.0%}" for k, v in accuracy.items()) + ". "
        f"Errors: absolute, on the {CLASSES} logits, against Keras `model(x, training=False)` on "
        f"{EVAL_SAMPLES} held-out standardised sequences run in batches of {EVAL_BATCH}; `agree` = same "
        "argmax as Keras. `int8 ops`: what the recipe put in the graph; `float left`: recurrent and "
        "MatMul/Gemm nodes it left in float.",
        "",
        "| model | weights | recipe | int8 ops | float left | max abs err | mean abs err | max err / max abs y "
        "| agree | size KB | b1 time | b16 time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    floats = {}
    for row in rows:
        if row.recipe.startswith("float"):
            floats[(row.kind, row.weights)] = row
    for row in rows:
        if row.error:
            lines.append(f"| {row.kind} | {row.weights} | {row.recipe} | failed: {row.error} | | | | | | | | |")
            continue
        base = floats[(row.kind, row.weights)]
        if row is base:
            speed = [f"1.00 ({row.ms[b]:.3f} ms)" for b in (1, 16)]
        else:
            speed = [f"{row.ms[b] / base.ms[b]:.2f}" for b in (1, 16)]
        lines.append(
            f"| {row.kind} | {row.weights} | {row.recipe} | {row.int_ops} | {row.float_ops} | "
            f"{_f(row.max_err)} | {_f(row.mean_err, '{:.5f}')} | {_f(100 * row.rel_err, '{:.2f}%')} | "
            f"{_f(100 * row.agree, '{:.1f}%')} | "
            f"{row.size_kb:.0f} | {speed[0]} | {speed[1]} |")
    names = list(attrib[0][3])
    lines += [
        "",
        "## What onnxruntime does (its quantization tools and CPU kernels)",
        "",
        "- Dynamic quantization (`quantize_dynamic`, IntegerOps) knows Conv, MatMul, Attention, LSTM, Gather, "
        "Transpose and EmbedLayerNormalization. There is no integer GRU or RNN: those nodes stay float whatever "
        "the options, and so does Gemm (not in the dynamic registry; these models have none, tf2onnx emits "
        "Dense as MatMul). Static quantization (QDQ or QOperator) has no recurrent operator at all.",
        "- LSTM -> `com.microsoft.DynamicQuantizeLSTM`. W [D, 4H, F] and R [D, 4H, H] are quantized to "
        "symmetric int8 whatever `weight_type` says (the LSTM quantizer hard-codes INT8), then stored "
        "transposed as [D, F, 4H] and [D, H, 4H] for the integer GEMM. Without `per_channel` the channel axis "
        "is the direction, so one scale covers all four gates of W (and one of R); with `per_channel` there is "
        "one scale per gate unit (row of W/R). `reduce_range` narrows the weights to [-64, 64] (7 bits), "
        "meant for U8S8 kernels on x86 CPUs without VNNI.",
        "- At run time the kernel quantizes the GEMM inputs to uint8 with ranges taken from the data: X once "
        "for the whole sequence and batch (one GEMM over all steps), H at every step over the batch. Gates, "
        "cell state and activations stay float. The error of one step is small; what the recurrence does "
        "with it over the sequence decides the final error (second table).",
    ]
    lines += [
        "",
        "## Where the LSTM error comes from",
        "",
        f"A plain `LSTM({HIDDEN}, return_sequences=True)` on x [16, {TIME}, {FEATURES}] ~ N(0, 1) unless said, all "
        f"{TIME} outputs compared with Keras. `ORT ...`: onnxruntime's DynamicQuantizeLSTM from "
        "`quantize_dynamic`. `sim, ...`: a numpy LSTM with onnxruntime's roundings switched on one at a time: "
        "W and R symmetric int8 (per tensor, or per gate unit), X uint8 with one range for the whole "
        "sequence, H uint8 with one range per step. Each cell: max abs error over all steps / at step 1. "
        "`float ONNX` is the unquantized conversion: where it too is far from Keras, float32 rounding "
        "differences alone are amplified by the recurrence (the weights make the LSTM chaotic).",
        "",
        "| weights | max abs W / R | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for label, wmax, rmax, errs in attrib:
        cells = [f"{e.max():.4f} / {e[:, 0].max():.4f}" for e in errs.values()]
        lines.append(f"| {label} | {wmax:.2f} / {rmax:.2f} | " + " | ".join(cells) + " |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds and training steps")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for int8.md")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    args = parser.parse_args(argv)
    args.rounds, args.steps = (60, 60) if args.quick else (300, 300)
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's pre-processing advice
    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    logging.getLogger("tf2onnx_rnn").setLevel(logging.ERROR)

    x_eval, y_eval = toy_data(EVAL_SAMPLES, np.random.default_rng(100))
    calibration, _ = toy_data(256, np.random.default_rng(200))
    rows, accuracy = [], {}
    with tempfile.TemporaryDirectory() as workdir:
        for n, kind in enumerate(args.kinds):
            model = classifier(kind, seed=10 + n)
            rows += measure_model(kind, "init", model, x_eval, calibration, args.rounds, workdir)
            print(f"{kind} init done", file=sys.stderr)
            train(model, args.steps, seed=10 + n)
            accuracy[kind] = float(np.mean(keras_out(model, x_eval).argmax(-1) == y_eval))
            rows += measure_model(kind, "trained", model, x_eval, calibration, args.rounds, workdir)
            print(f"{kind} trained done", file=sys.stderr)
        attrib = attribution(workdir)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "int8.md")
    write_report(path, rows, accuracy, attrib, args)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
