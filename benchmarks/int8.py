"""int8 quantization of trained recurrent classifiers: ours (``quantize=``) against onnxruntime's and TFLite's.

    python benchmarks/int8.py                      # results in benchmarks/results/int8.md and int8.json
    python benchmarks/int8.py --quick              # few epochs, short timing, into a temporary directory
    python benchmarks/int8.py --kinds LSTM GRU     # some of the models only

Data: the bundled UCI Japanese Vowels set (examples/data; CC BY 4.0): 12 LPC channels, 7 to 29 steps,
zero-padded after each utterance to 29, nine speakers to tell apart; 270 utterances train, 370 test.

Models (Keras 3, seeded, trained on the train split): Input((None, 12)) -> Masking(0.0) -> LSTM(128), GRU(128),
SimpleRNN(128) or Bidirectional(GRU(64)) -> Dense(9) logits; Adam with a cosine-decayed rate, sparse cross-entropy
from the logits, a fixed number of epochs per kind (``RECIPES``). Their float test accuracy is reported beside each
variant's.

Variants of each model, each run on the 370 test utterances and compared with Keras ``model(x, training=False)``
(accuracy, share of rows whose argmax agrees with Keras, largest absolute logit error, that error relative to the
largest |logit|, and the serialized file's size):

- ours float, weights, dynamic and static: ``convert_keras(model)``, and with ``quantize="weights"`` / ``"dynamic"``
  / ``"static"`` and ``calibration=x_train`` (default budget); the report's precision per layer is recorded. The
  ONNX variants run the test set as one batch of 370 rows in onnxruntime (dynamic quantization takes its activation
  ranges from that batch). Static is QDQ: each quantized layer's input goes through a
  QuantizeLinear/DequantizeLinear pair on one uint8 scale calibrated on x_train (fixed, whatever the batch), the
  Dense's MatMul weight is a per-channel int8 DequantizeLinear, a recurrent node's weights int8 dequantized by a
  Cast and a Mul with its gates and state float (a layer whose QDQ form costs past the budget steps down to int8
  weights alone, which the report and the markdown say): the form static quantizers and NPU toolchains read. What
  each runtime computes it with is recorded (the ops of onnxruntime's optimized graph, the layers and their runtime
  precision of OpenVINO's compiled model): a QDQ graph runs as integer kernels only where a runtime fuses it;
- onnxruntime's ``quantize_dynamic(weight_type=QInt8)`` applied to our float model, what users do today;
- the same five in the portable form (``target="portable"``), run in OpenVINO (CPU, f32) as one batch: the form
  the package advises for OpenVINO, whose CPU plugin ignores a computed ``sequence_lens`` under dynamic shapes
  (the default form is wrong there on padded rows), and the models the latency part times in it. Static there
  keeps the recurrent layer float (OpenVINO's CPU plugin computes no recurrent node of computed weights in a
  model holding QDQ; the report says so) and quantizes the Dense alone;
- TFLite, from a batch-1 model of fixed length 29 wrapping the trained one, run row by row in
  ``tf.lite.Interpreter`` (one thread): float (no optimization: the reference of the format), dynamic-range
  int8 (``Optimize.DEFAULT``), and full integer, int8 ops (``TFLITE_BUILTINS_INT8``) and 16x8 activations
  (``EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8``), both calibrated on train rows and keeping
  float input and output. The last two are known to crash the converter on masked recurrent models, so they are
  converted and run in a child process each (this script with ``--tflite-child``), with a timeout: a crash is
  recorded with its signal and whether the converter or the interpreter took it down.

Latency: random normal inputs [B, 100, 12] (T = 100, every step kept), B = 1 and 16, for ours float, weights,
dynamic and static and onnxruntime's quantize_dynamic. onnxruntime (CPUExecutionProvider, 1 intra-op and 1 inter-op
thread) runs the default form's models, OpenVINO (CPU plugin, 1 inference thread, 1 stream, f32 inference
precision) the portable form's, those it loads (a runtime failing on a model is recorded, not fatal). Every runner
is warmed up, then all runners of one model and batch are timed interleaved, round by round (each a block of calls
of about ``--block`` seconds); reported are the median per call, the ratio to ours float of the same layer in the
same runtime as the median of the rounds' ratios (the two ran back to back in each round), and each runner's
largest error against Keras on the timed input. The machine may be shared: its load average at the start and the
end is recorded.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples", "data"))

import japanese_vowels  # noqa: E402
import numpy as np  # noqa: E402

KINDS = ("LSTM", "GRU", "SimpleRNN", "BiGRU")
LABELS = {"LSTM": "LSTM(128)", "GRU": "GRU(128)", "SimpleRNN": "SimpleRNN(128)", "BiGRU": "Bidirectional(GRU(64))"}
# (peak learning rate, epochs) per kind: Adam, the rate decaying to 0 on a cosine over the epochs (the last epochs'
# accuracy then settles), gradients clipped to norm 1, batch 32, seed 0; chosen for a float test accuracy of about
# 0.95 within well under a minute of training on 2 cores
RECIPES = {"LSTM": (0.003, 20), "GRU": (0.003, 25), "SimpleRNN": (0.002, 30), "BiGRU": (0.003, 25)}
SEED, BATCH_SIZE, CLIPNORM = 0, 32, 1.0
TIME, BATCHES = 100, (1, 16)  # latency inputs [B, TIME, 12]

VARIANTS = {  # key -> what the tables call it
    "keras": "Keras float (reference)",
    "ours_float": "ours float",
    "ours_weights": "ours quantize=\"weights\"",
    "ours_dynamic": "ours quantize=\"dynamic\"",
    "ours_static": "ours quantize=\"static\"",
    "ort_dynamic": "onnxruntime quantize_dynamic(QInt8) of ours float",
    "ours_float_portable_ov": "ours float, portable form, in OpenVINO",
    "ours_weights_portable_ov": "ours quantize=\"weights\", portable form, in OpenVINO",
    "ours_dynamic_portable_ov": "ours quantize=\"dynamic\", portable form, in OpenVINO",
    "ours_static_portable_ov": "ours quantize=\"static\", portable form, in OpenVINO",
    "ort_dynamic_portable_ov": "onnxruntime quantize_dynamic(QInt8) of ours portable float, in OpenVINO",
    "tflite_float": "TFLite float",
    "tflite_dynamic": "TFLite dynamic range int8",
    "tflite_int8": "TFLite full integer int8",
    "tflite_16x8": "TFLite 16x8",
}
ONNX_VARIANTS = ("ours_float", "ours_weights", "ours_dynamic", "ours_static", "ort_dynamic")
QUANTIZE_MODES = ("weights", "dynamic", "static")  # ours, each a variant ours_<mode>
CHILD_MODES = ("int8", "16x8")  # the TFLite modes converted and run in a child process
INT8_OPS = ("DynamicQuantizeLSTM", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
            "QLinearMatMul", "QGemm", "DequantizeLinear", "ConvInteger")
STATIC_WORDS = "int8 weights and input (QDQ, calibrated)"  # a static layer's precision in the report
SHORT_PRECISION = {"float": "float", "int8 weights, float compute": "int8 weights",
                   "int8 (integer compute in onnxruntime)": "int8 compute",
                   STATIC_WORDS: "int8 weights + QDQ input"}
# what a runtime computes a static model with: the ops of onnxruntime's optimized graph, the layers (and their
# runtime precision) of OpenVINO's compiled model, of these kinds
ORT_COMPUTE_OPS = frozenset(INT8_OPS + ("LSTM", "GRU", "RNN", "MatMul", "Gemm", "FusedMatMul", "FusedGemm",
                                        "QuantizeLinear", "QLinearMatMul", "MatMulIntegerToFloat", "QGemm"))
OV_COMPUTE_LAYERS = frozenset(("FullyConnected", "MatMul", "RNNSeq", "RNNCell", "FakeQuantize", "Convolution"))
STATIC_KEYS = ("ours_static", "ours_static_portable_ov")


# -- data, models -------------------------------------------------------------------------------------------------
def vowels(split: str) -> tuple:
    x, _, y = japanese_vowels.load(split)
    return x, y


def train(kind: str, quick: bool) -> tuple:
    """(the trained Keras model, seconds of training, epochs)."""
    import keras

    rate, epochs = RECIPES[kind]
    epochs = min(epochs, 3) if quick else epochs
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input((None, japanese_vowels.CHANNELS), name="x")
    hidden = keras.layers.Masking(0.0, name="masking")(inputs)
    if kind == "BiGRU":
        recurrent = keras.layers.Bidirectional(keras.layers.GRU(64), name="recurrent")
    else:
        recurrent = getattr(keras.layers, kind)(128, name="recurrent")
    model = keras.Model(inputs, keras.layers.Dense(japanese_vowels.CLASSES, name="dense")(recurrent(hidden)))
    x, y = vowels("train")
    steps = epochs * -(-len(x) // BATCH_SIZE)
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(rate, steps), clipnorm=CLIPNORM)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.perf_counter()
    model.fit(x, y, epochs=epochs, batch_size=BATCH_SIZE, shuffle=True, verbose=0)
    return model, time.perf_counter() - start, epochs


def scores(logits: np.ndarray, reference: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy, agreement with the reference's argmax and the largest logit error (absolute, and relative to
    the reference's largest |logit|)."""
    logits, reference = np.asarray(logits, np.float64), np.asarray(reference, np.float64)
    error = float(np.max(np.abs(logits - reference)))
    return {"accuracy": float(np.mean(logits.argmax(1) == labels)),
            "agreement": float(np.mean(logits.argmax(1) == reference.argmax(1))),
            "max_abs_error": error, "relative_error": error / float(np.max(np.abs(reference)))}


# -- ONNX variants ------------------------------------------------------------------------------------------------
def ort_session(model_bytes: bytes):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def ort_quantize_dynamic(float_bytes: bytes) -> bytes:
    """onnxruntime's own dynamic quantization (int8 weights, QInt8) of a float model, as bytes."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as directory:
        source, target = os.path.join(directory, "float.onnx"), os.path.join(directory, "int8.onnx")
        with open(source, "wb") as stream:
            stream.write(float_bytes)
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        with open(target, "rb") as stream:
            return stream.read()


def int8_ops(model_bytes: bytes) -> dict:
    """The integer (or int8-weight) op types in a model's main graph, counted."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    return dict(sorted(Counter(n.op_type for n in model.graph.node if n.op_type in INT8_OPS).items()))


def onnx_variants(model, x_train: np.ndarray) -> tuple:
    """(variant -> serialized model or the line saying why there is none, variant -> what its report or graph
    says is int8, variant -> the quantization report as a dict). Beside the five variants, the same five in the
    portable form (keys ending ``_portable``), for OpenVINO: its CPU plugin ignores a computed ``sequence_lens``
    under dynamic shapes (docs/downstream.md)."""
    from tf2onnx_rnn import convert_keras, report_of
    from tf2onnx_rnn.errors import ConversionError

    models, int8, reports = {}, {}, {}
    for suffix, target in (("", None), ("_portable", "portable")):
        models["ours_float" + suffix] = convert_keras(model, target=target).SerializeToString()
        for mode in QUANTIZE_MODES:
            key = f"ours_{mode}{suffix}"
            try:
                proto = convert_keras(model, target=target, quantize=mode, calibration=x_train)
            except ConversionError as error:  # over the budget: refused
                models[key] = f"refused: {str(error).splitlines()[0]}"
                continue
            models[key] = proto.SerializeToString()
            report = report_of(proto).quantization
            reports[key] = {"layers": [{"layer": r.layer, "op": r.op, "precision": r.precision, "why": r.why}
                                       for r in report.layers],
                            "errors": [list(e) for e in report.errors], "data": report.data,
                            "max_error": report.max_error, "bytes": report.bytes, "float_bytes": report.float_bytes,
                            "notes": list(getattr(report, "notes", []))}
            int8[key] = ", ".join(f"{r.layer} {r.op}: {SHORT_PRECISION.get(r.precision, r.precision)}"
                                  for r in report.layers)
        models["ort_dynamic" + suffix] = ort_quantize_dynamic(models["ours_float" + suffix])
        ops = int8_ops(models["ort_dynamic" + suffix])
        int8["ort_dynamic" + suffix] = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops.items()) or "nothing"
    return models, int8, reports


def run_onnx(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    session = ort_session(model_bytes)
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def ort_computes(model_bytes: bytes) -> str:
    """The compute, quantize and integer ops of onnxruntime's optimized graph of the model (all optimizations, as
    the benchmark's sessions run it), counted: whether its QDQ pairs became integer kernels."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as directory:
        options = ort.SessionOptions()
        options.optimized_model_filepath = os.path.join(directory, "optimized.onnx")
        options.log_severity_level = 3  # not the notice that the optimized model is the machine's
        ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath)
    ops = Counter(n.op_type for n in model.graph.node if n.op_type in ORT_COMPUTE_OPS)
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(ops.items())) or "nothing"


def failure(runtime: str, error: Exception) -> str:
    """The line recording that ``runtime`` fails on a model: the first non-empty line of its error."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"fails in {runtime}: {(lines or [type(error).__name__])[0][:160]}"


# -- TFLite variants ----------------------------------------------------------------------------------------------
def tflite_convert(model, mode: str, x_train: np.ndarray) -> bytes:
    """A TFLite flatbuffer of ``model`` at batch 1 and the data's fixed length, in ``mode``: "float", "dynamic"
    (dynamic-range int8), "int8" (full integer, int8 ops) or "16x8" (int16 activations, int8 weights)."""
    import keras
    import tensorflow as tf

    inputs = keras.Input((japanese_vowels.STEPS, japanese_vowels.CHANNELS), batch_size=1)
    fixed = keras.Model(inputs, model(inputs))
    converter = tf.lite.TFLiteConverter.from_keras_model(fixed)
    if mode != "float":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode in CHILD_MODES:
        converter.representative_dataset = lambda: ([x_train[k:k + 1]] for k in range(len(x_train)))
        ops = tf.lite.OpsSet
        int16 = ops.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
        converter.target_spec.supported_ops = [ops.TFLITE_BUILTINS_INT8 if mode == "int8" else int16]
    return converter.convert()


def run_tflite(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    """The logits of every row of ``x``, one row per invocation (the model's batch is 1)."""
    import warnings

    import tensorflow as tf

    with warnings.catch_warnings():  # tf.lite.Interpreter's notice that it moves to LiteRT
        warnings.simplefilter("ignore")
        interpreter = tf.lite.Interpreter(model_content=flatbuffer, num_threads=1)
    interpreter.allocate_tensors()
    source, sink = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    rows = []
    for row in range(len(x)):
        interpreter.set_tensor(source["index"], x[row:row + 1])
        interpreter.invoke()
        rows.append(np.array(interpreter.get_tensor(sink["index"])[0]))
    return np.stack(rows)


CONVERTED = "tflite-child: converted"


def tflite_child(mode: str, keras_path: str, logits_path: str, calibration_rows: int) -> int:
    """The child's work: load the saved model, convert it in ``mode`` (announcing on stdout when the converter is
    through, so that a crash after it is the interpreter's), run the test rows, save their logits."""
    import keras

    model = keras.saving.load_model(keras_path)
    flatbuffer = tflite_convert(model, mode, vowels("train")[0][:calibration_rows])
    print(f"{CONVERTED} {len(flatbuffer)}", flush=True)
    np.save(logits_path, run_tflite(flatbuffer, vowels("test")[0]))
    return 0


def tflite_in_child(model, mode: str, calibration_rows: int, timeout: float) -> tuple:
    """(logits or None, bytes or None, what happened) of a TFLite ``mode`` converted and run in a child."""
    with tempfile.TemporaryDirectory() as directory:
        keras_path, logits_path = os.path.join(directory, "model.keras"), os.path.join(directory, "logits.npy")
        model.save(keras_path)
        command = [sys.executable, os.path.abspath(__file__), "--tflite-child", mode, keras_path, logits_path,
                   str(calibration_rows)]
        try:
            child = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, None, f"timed out after {timeout:.0f} s"
        converted = [line for line in child.stdout.splitlines() if line.startswith(CONVERTED)]
        size = int(converted[0].split()[-1]) if converted else None
        stage = "the interpreter" if converted else "the converter"
        if child.returncode < 0:
            return None, size, f"crashes (signal {-child.returncode} in {stage})"
        if child.returncode != 0:
            lines = [line.strip() for line in child.stderr.splitlines() if line.strip()]
            return None, size, f"fails in {stage}: {lines[-1][:160] if lines else f'exit {child.returncode}'}"
        return np.load(logits_path), size, "ran"


# -- accuracy, error, size ----------------------------------------------------------------------------------------
def measure_model(kind: str, args) -> tuple:
    """(the model's row of results, its ONNX variants as bytes for the latency part, the Keras model)."""
    print(f"{kind}: training ...", file=sys.stderr, flush=True)
    model, seconds, epochs = train(kind, args.quick)
    x_train, _ = vowels("train")
    x_test, y_test = vowels("test")
    reference = np.asarray(model(x_test, training=False))
    row = {"kind": kind, "layer": LABELS[kind], "epochs": epochs, "train_seconds": seconds,
           "recipe": {"peak_learning_rate": RECIPES[kind][0], "schedule": "cosine decay to 0", "clipnorm": CLIPNORM,
                      "batch_size": BATCH_SIZE}, "variants": {}}
    row["variants"]["keras"] = {**scores(reference, reference, y_test), "bytes": None, "int8": "", "status": "ran"}
    print(f"{kind}: float accuracy {row['variants']['keras']['accuracy']:.3f} after {epochs} epochs "
          f"({seconds:.0f} s); converting ...", file=sys.stderr, flush=True)
    models, int8, reports = onnx_variants(model, x_train)
    row["reports"] = reports
    for key in ONNX_VARIANTS:
        if isinstance(models[key], str):
            row["variants"][key] = {"status": models[key], "bytes": None, "int8": ""}
            continue
        try:
            logits = run_onnx(models[key], x_test)
        except Exception as error:  # noqa: BLE001 - onnxruntime failing on a model is a result
            row["variants"][key] = {"status": failure("onnxruntime", error), "bytes": len(models[key]),
                                    "int8": int8.get(key, "")}
            continue
        row["variants"][key] = {**scores(logits, reference, y_test), "bytes": len(models[key]),
                                "int8": int8.get(key, ""), "status": "ran"}
        if key in STATIC_KEYS:
            row["variants"][key]["computed_as"] = ort_computes(models[key])
    for key in ONNX_VARIANTS if openvino_available() else ():  # the portable form, where OpenVINO is exact
        source = models[key + "_portable"]
        run = source if isinstance(source, str) else openvino_runner(source, x_test)
        measured = {}
        try:
            measured = scores(run(), reference, y_test) if callable(run) else {}
        except RuntimeError as error:  # OpenVINO loads the model but fails to infer it
            run = failure("OpenVINO", error)
        row["variants"][key + "_portable_ov"] = {
            **measured, "bytes": None if isinstance(source, str) else len(source),
            "int8": int8.get(key + "_portable", ""), "status": "ran" if callable(run) else run}
        if key + "_portable_ov" in STATIC_KEYS and callable(run):
            row["variants"][key + "_portable_ov"]["computed_as"] = run.computes
    for mode in ("float", "dynamic"):
        print(f"{kind}: TFLite {mode} ...", file=sys.stderr, flush=True)
        try:
            flatbuffer = tflite_convert(model, mode, x_train)
        except Exception as error:  # noqa: BLE001 - a converter's refusal is a result
            row["variants"][f"tflite_{mode}"] = {"status": f"fails: {str(error).splitlines()[0][:160]}",
                                                 "bytes": None, "int8": ""}
            continue
        logits = run_tflite(flatbuffer, x_test)
        row["variants"][f"tflite_{mode}"] = {**scores(logits, reference, y_test), "bytes": len(flatbuffer),
                                             "int8": "", "status": "ran"}
    rows = args.calibration_rows
    for mode in CHILD_MODES:
        print(f"{kind}: TFLite {mode} in a child process ...", file=sys.stderr, flush=True)
        logits, size, status = tflite_in_child(model, mode, rows, args.child_timeout)
        measured = scores(logits, reference, y_test) if logits is not None else {}
        row["variants"][f"tflite_{mode}"] = {**measured, "bytes": size, "int8": "", "status": status,
                                             "calibration_rows": rows}
    return row, models, model


# -- latency ------------------------------------------------------------------------------------------------------
def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def openvino_runner(model_bytes: bytes, x: np.ndarray):
    """A callable running the model on ``x`` in OpenVINO's CPU plugin (1 thread, 1 stream, f32), or the line
    saying why OpenVINO does not load it."""
    import openvino

    core = openvino.Core()
    try:
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "model.onnx")
            with open(path, "wb") as stream:
                stream.write(model_bytes)
            compiled = core.compile_model(core.read_model(path), "CPU", {
                "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"})
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        named = [line for line in lines if "Conversion is failed for" in line or "unsupported" in line.lower()]
        return (named or lines or ["does not load"])[0][:160]
    request = compiled.create_infer_request()

    def run():
        request.infer({0: x})
        return np.array(request.get_output_tensor(0).data)

    layers = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if kind in OV_COMPUTE_LAYERS:
            layers[f"{kind} {info['runtimePrecision'].astype(str) if 'runtimePrecision' in info else '?'}"] += 1
    run.computes = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(layers.items())) or "nothing"
    return run


def time_block(run, seconds: float) -> float:
    """Seconds per call over as many calls (at least 3) as fill about ``seconds``."""
    calls, start = 0, time.perf_counter()
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if calls >= 3 and elapsed >= seconds:
            return elapsed / calls


def median_ratio(rounds: dict, a: str, b: str):
    """``a``'s time over ``b``'s: the median of the rounds' ratios (the two ran back to back in each round)."""
    if a not in rounds or b not in rounds:
        return None
    return statistics.median(x / y for x, y in zip(rounds[a], rounds[b]))


# the models each runtime runs per variant: onnxruntime the default form, OpenVINO the portable one
RUNTIME_MODELS = {"ort": {key: key for key in ONNX_VARIANTS}, "ov": {key: key + "_portable" for key in ONNX_VARIANTS}}


def time_model(kind: str, model, models: dict, batch: int, args) -> dict:
    x = np.random.default_rng(SEED + batch).standard_normal((batch, TIME, japanese_vowels.CHANNELS))
    x = x.astype(np.float32)
    expected = np.asarray(model(x, training=False))
    runners, failures = {}, {}
    for runtime, chosen in RUNTIME_MODELS.items():
        if runtime == "ov" and not openvino_available():
            continue
        for key, source in chosen.items():
            name = f"{key}@{runtime}"
            if isinstance(models[source], str):
                failures[name] = models[source]
            elif runtime == "ort":
                try:
                    session = ort_session(models[source])
                except Exception as error:  # noqa: BLE001 - onnxruntime failing on a model is a result
                    failures[name] = failure("onnxruntime", error)
                    continue
                feeds = {session.get_inputs()[0].name: x}
                runners[name] = (lambda s, f: lambda: s.run(None, f)[0])(session, feeds)
            else:
                runner = openvino_runner(models[source], x)
                runners[name] = runner if callable(runner) else None
                if not callable(runner):
                    failures[name] = f"does not load: {runner}"
    runners = {name: run for name, run in runners.items() if run is not None}
    errors = {}
    for name, run in list(runners.items()):
        try:
            errors[name] = float(np.max(np.abs(run() - expected)))
        except Exception as error:  # noqa: BLE001 - a runtime failing on the timed input is a result
            failures[name] = failure("onnxruntime" if name.endswith("@ort") else "OpenVINO", error)
            del runners[name]
    for run in runners.values():  # warm-up
        time_block(run, args.warmup)
    rounds = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            rounds[name].append(time_block(run, args.block))
    ms = {name: statistics.median(values) * 1e3 for name, values in rounds.items()}
    ratios = {name: median_ratio(rounds, name, "ours_float@" + name.split("@")[1]) for name in runners}
    return {"kind": kind, "batch": batch, "time": TIME, "ms": ms, "ratio_to_float": ratios,
            "rounds_ms": {name: [v * 1e3 for v in values] for name, values in rounds.items()},
            "max_abs_error": errors, "failures": failures,
            "models": {f"{key}@{runtime}": source for runtime, chosen in RUNTIME_MODELS.items()
                       for key, source in chosen.items()}}


# -- the report ---------------------------------------------------------------------------------------------------
def machine_info() -> dict:
    import keras
    import onnx
    import onnxruntime
    import tensorflow as tf

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/cpuinfo") as stream:
            cpu = next(line.split(":", 1)[1].strip() for line in stream if line.startswith("model name"))
    info = {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if openvino_available():
        import openvino

        info["openvino"] = openvino.__version__
    with contextlib.suppress(OSError):
        info["load_average_start"] = [round(v, 2) for v in os.getloadavg()]
    return info


def _number(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def accuracy_table(results: dict) -> str:
    lines = ["| model | variant | int8 (report / graph) | accuracy | agrees with Keras | max abs logit error "
             "| relative | size KB | size / float of its format |", "|---|---|---|---|---|---|---|---|---|"]
    for row in results["models"]:
        variants = row["variants"]
        for key, label in VARIANTS.items():
            if key not in variants:
                continue
            v = variants[key]
            float_key = ("tflite_float" if key.startswith("tflite") else "ours_float_portable_ov" if key.endswith("_ov")
                         else "ours_float")
            base = variants.get(float_key, {}).get("bytes")
            if v["status"] != "ran":
                size = _number(v["bytes"] / 1024, ".1f") + " (converted)" if v.get("bytes") else "-"
                lines.append(f"| {row['layer']} | {label} | - | {v['status']} | - | - | - | {size} | - |")
                continue
            size_ratio = v["bytes"] / base if v["bytes"] and base else None
            lines.append("| " + " | ".join([
                row["layer"], label, v["int8"] or "-", f"{v['accuracy']:.3f}", f"{v['agreement']:.3f}",
                f"{v['max_abs_error']:.2g}" if key != "keras" else "0", f"{v['relative_error']:.2%}",
                _number(v["bytes"] / 1024 if v["bytes"] else None, ".1f"), _number(size_ratio, ".2f")]) + " |")
    return "\n".join(lines)


def latency_table(results: dict) -> str:
    lines = ["| model | B | runtime | ours float | ours weights | ours dynamic | ours static | ort quantize_dynamic "
             "| max abs error vs Keras (float / weights / dynamic / static / ort) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in results["latency"]:
        for runtime, label in (("ort", "onnxruntime"), ("ov", "OpenVINO (portable form)")):
            names = [f"{key}@{runtime}" for key in ONNX_VARIANTS]
            if not any(name in row["ms"] or name in row["failures"] for name in names):
                continue
            cells = [LABELS[row["kind"]], str(row["batch"]), label]
            for name in names:
                if name in row["ms"]:
                    ratio = row["ratio_to_float"][name]
                    cells.append(f"{row['ms'][name]:.3f} ms" + ("" if name.startswith("ours_float@") or ratio is None
                                                                 else f" ({ratio:.2f}x)"))
                else:
                    cells.append(row["failures"].get(name, "-"))
            cells.append(" / ".join(_number(row["max_abs_error"].get(name), ".1g") for name in names))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def static_layers(results: dict, report: str, recurrent: bool) -> list:
    """(model, layer row) of the static reports' layers, recurrent ones or the others."""
    return [(row["layer"], layer) for row in results["models"] for layer in row["reports"].get(report, {})
            .get("layers", []) if (layer["op"] not in ("MatMul", "Gemm", "Conv")) == recurrent]


def static_notes(results: dict) -> list:
    """The lines saying what ours static is, which layers its reports leave short of QDQ and why (their words),
    and what each runtime computed it with (measured)."""
    stepped = [f"{model} {layer['layer']}: {SHORT_PRECISION.get(layer['precision'], layer['precision'])} "
               f"({layer['why']})" for model, layer in static_layers(results, "ours_static", True)
               if layer["precision"] != STATIC_WORDS and layer["why"]]
    kept = [layer["why"] for _, layer in static_layers(results, "ours_static_portable", True)
            if layer["precision"] == "float" and layer["why"]]
    text = ("Ours `quantize=\"static\"` is QDQ: the input of each layer the report gives as QDQ passes a "
            "QuantizeLinear and a DequantizeLinear to uint8 on one scale calibrated on the train rows (fixed at "
            "conversion: the same for every step, direction and batch); the Dense's weight is then a per-channel int8 "
            "DequantizeLinear, a recurrent layer's weights int8 dequantized by a Cast and a Mul, its gates and state "
            "float. A layer whose QDQ form costs past the budget steps down to int8 weights alone (no QDQ), as in "
            "`weights`. It is the form static quantizers and NPU toolchains read; whether a runtime computes it with "
            "integer kernels or as float ops around the QDQ pairs is its own, listed below.")
    if stepped:
        text += " In the default form the reports step down: " + "; ".join(stepped) + "."
    if kept:
        text += (f" In the portable form the recurrent layers stay float (the report: \"{kept[0]}\"), so at most "
                 "the Dense is int8 there and the model keeps about its float size.")
    lines = [text, "", "What ours static was computed with: in onnxruntime, the compute, quantize and integer ops of "
             "its optimized graph; in OpenVINO (portable form), its compiled model's layers of those kinds and their "
             "runtime precision.", ""]
    for row in results["models"]:
        cells = [f"{where} `{row['variants'][key]['computed_as']}`" for key, where in
                 zip(STATIC_KEYS, ("onnxruntime", "OpenVINO")) if "computed_as" in row["variants"].get(key, {})]
        cells += [f"{where} {row['variants'][key]['status']}" for key, where in
                  zip(STATIC_KEYS, ("onnxruntime", "OpenVINO")) if row["variants"].get(key, {}).get("status", "ran")
                  != "ran"]
        if cells:
            lines.append(f"- {row['layer']}: " + "; ".join(cells))
    return lines


def static_noise_note(results: dict) -> str:
    """What ours static's fixed scales do to the timed noise, from which layers the reports give as QDQ."""
    span = results["settings"].get("calibration_range")
    span = f" (the utterances span [{span[0]:.2f}, {span[1]:.2f}])" if span else ""
    qdq_input = [f"{model} {layer['layer']}" for report in ("ours_static", "ours_static_portable")
                 for model, layer in static_layers(results, report, True) if layer["precision"] == STATIC_WORDS]
    if qdq_input:
        return ("Ours static's scales are fixed to the ranges calibrated on the utterances" + span + ": where a "
                "recurrent layer's input is QDQ (" + ", ".join(qdq_input) + "), the noise's values past them clip, "
                "so its error there can be larger than the others' and says nothing of its accuracy.")
    return ("Ours static's scales are fixed to the ranges calibrated on the utterances" + span + ", but no static "
            "model here quantizes a recurrent layer's input (the reports step them down or keep them float): the "
            "noise is not clipped at the input, only the recurrent state where it leaves the range calibrated for "
            "the Dense.")


def markdown(results: dict) -> str:
    m, s = results["machine"], results["settings"]
    openvino = f", OpenVINO {m['openvino']}" if "openvino" in m else ", OpenVINO not installed"
    load = f"; load average {m.get('load_average_start')} at the start, {m.get('load_average_end')} at the end"
    floats = ", ".join(f"{row['layer']} {row['variants']['keras']['accuracy']:.3f} ({row['epochs']} epochs, "
                       f"{row['train_seconds']:.0f} s)" for row in results["models"])
    budgets = sorted({r["max_error"] for row in results["models"] for r in row["reports"].values()})
    budget = f" (`max_error` {', '.join(f'{v:g}' for v in budgets)})" if budgets else ""
    lines = [
        "# int8 quantization: ours against onnxruntime's and TFLite's", "",
        f"Written by `python benchmarks/int8.py{' --quick' if s['quick'] else ''}` on {m['date']}. Data: the UCI "
        "Japanese Vowels set (bundled in examples/data, CC BY 4.0), 270 train and 370 test utterances of 12 "
        "channels, zero-padded to 29 steps, 9 classes.", "",
        f"Machine: {m['platform']}, {m['cpu']}, {m['cores']} CPUs{load}. TensorFlow {m['tensorflow']}, Keras "
        f"{m['keras']}, onnxruntime {m['onnxruntime']}{openvino}, onnx {m['onnx']}, Python {m['python']}.", "",
        "Models: Input((None, 12)) -> Masking(0.0) -> layer -> Dense(9) logits, Keras 3, seeded, trained on the "
        "train split (Adam, cosine-decayed rate, batch 32). Float test accuracy (Keras): " + floats + ".", "",
        "## Accuracy, error and size", "",
        "On the 370 test utterances. Error: the largest absolute logit error against Keras `model(x, "
        "training=False)`, and relative to Keras's largest |logit|. ONNX variants run in onnxruntime, the test "
        "set as one batch, but for the portable form's (`target=\"portable\"`), run in OpenVINO (CPU, f32, one "
        "batch), which the latency table times there; TFLite variants are a batch-1 model of fixed length 29 run "
        "row by row in "
        f"`tf.lite.Interpreter`. Full integer and 16x8 TFLite are calibrated on {s['calibration_rows']} train rows "
        f"and converted and run in a child process. Ours quantize with the default budget{budget}, calibrated on "
        "the 270 train rows. `int8`: the precision per layer our report gives, or the "
        "integer ops onnxruntime's quantize_dynamic wrote. Size: the serialized model; the ratio is to the float "
        "model of its form (ONNX) or TFLite float (TFLite).", "",
        *static_notes(results), "",
        accuracy_table(results), "",
        "## Latency", "",
        f"Random normal inputs [B, {TIME}, 12] (every step kept). onnxruntime: CPUExecutionProvider, 1 intra-op "
        "thread, the models of the table above. OpenVINO: CPU, 1 inference thread, 1 stream, f32 precision, its "
        "other settings default (`DYNAMIC_QUANTIZATION_GROUP_SIZE` unset); the "
        "portable form (`target=\"portable\"`, which the package advises for OpenVINO with dynamic shapes) of ours "
        "float, weights, dynamic (its com.microsoft ops included) and static (the recurrent layers float, as "
        "above), and quantize_dynamic of that float model. "
        "Median ms per call over "
        f"{s['rounds']} interleaved rounds of about {s['block']} s each, after warm-up; in brackets the median of "
        "the rounds' ratios to ours float in the same runtime (on a shared machine it can differ from the ratio "
        "of the medians). The last column: the largest absolute error against Keras on the timed input, which is "
        "unlike the data (100 steps of N(0, 1) noise, where the utterances have at most 29): it checks that each "
        "runner computes the model, the first table measures accuracy. " + static_noise_note(results), "",
        latency_table(results)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 epochs per model, 16 calibration rows for TFLite, 2 short timing rounds")
    parser.add_argument("--kinds", nargs="*", choices=KINDS, default=list(KINDS), help="models (default: all)")
    parser.add_argument("--rounds", type=int, default=25, help="interleaved timing rounds (default 25)")
    parser.add_argument("--block", type=float, default=0.06, help="seconds per timing block (default 0.06)")
    parser.add_argument("--warmup", type=float, default=0.2, help="seconds of warm-up per runner (default 0.2)")
    parser.add_argument("--calibration-rows", type=int, default=270,
                        help="train rows of TFLite's representative dataset (default 270, all)")
    parser.add_argument("--child-timeout", type=float, default=300, help="seconds per TFLite child (default 300)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    parser.add_argument("--tflite-child", nargs=4, metavar=("MODE", "KERAS", "LOGITS", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tflite_child:
        mode, keras_path, logits_path, rows = args.tflite_child
        return tflite_child(mode, keras_path, logits_path, int(rows))
    if args.quick:
        args.rounds, args.block, args.warmup, args.calibration_rows = 2, 0.02, 0.05, 16
        if args.out == os.path.join(HERE, "results"):  # never over the measured results
            args.out = tempfile.mkdtemp(prefix="int8-quick-")
    logging.getLogger("tf2onnx_rnn").setLevel(logging.WARNING)
    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    tf.config.experimental.enable_op_determinism()
    results = {"machine": machine_info(), "settings": {
        "quick": args.quick, "rounds": args.rounds, "block": args.block, "warmup": args.warmup,
        "calibration_rows": args.calibration_rows, "seed": SEED, "latency_shape": ["B", TIME, 12],
        "calibration_range": [float(np.min(vowels("train")[0])), float(np.max(vowels("train")[0]))]},
        "models": [], "latency": []}
    trained = []
    for kind in args.kinds:
        row, models, model = measure_model(kind, args)
        results["models"].append(row)
        trained.append((kind, model, models))
    for kind, model, models in trained:
        for batch in BATCHES:
            print(f"timing {kind} B={batch} ...", file=sys.stderr, flush=True)
            results["latency"].append(time_model(kind, model, models, batch, args))
    with contextlib.suppress(OSError):
        results["machine"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "int8.json"), "w") as stream:
        json.dump(results, stream, indent=1)
    text = markdown(results)
    with open(os.path.join(args.out, "int8.md"), "w") as stream:
        stream.write(text)
    print(accuracy_table(results) + "\n\n" + latency_table(results))
    print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
