"""Latency of converted Keras recurrent models in onnxruntime and OpenVINO: ours vs stock tf2onnx
vs the floor.

    python benchmarks/run.py                 # every case, results in benchmarks/results/
    python benchmarks/run.py --quick         # a small slice (what the notebook runs)
    python benchmarks/run.py --cases gru-uni-plain-b1 lstm-bi-masked-b16 --out /tmp/bench
    python benchmarks/run.py --smoke         # two cases, one short round: checks the script runs

For each case one Keras 3 model is converted by this package and by stock tf2onnx
(``from_keras``, opset 17), and a minimal ONNX graph is built by hand (Transpose -> the one
native node -> Transpose, lengths fed directly when masked). The runners (ours, stock, minimal,
TensorFlow's ``tf.function``; for masked cases also the ``assume_post_padded`` opt-in and the
portable target; for SimpleRNN also the onnxruntime target's form, input MatMul + Scan, against
a hand-built floor of that form; and, when OpenVINO is installed, ours, minimal and stock in OpenVINO's CPU
plugin) are timed in one process, interleaved round by round, onnxruntime, OpenVINO and
TensorFlow each on one thread. Reported: medians, and the ratios ours/minimal and stock/ours as the
median of each round's ratio (the two ran back to back in it).
Conversion time and peak memory are measured in child processes, one conversion each; so is conversion
time against depth (stacks of 1, 8 and 32 SimpleRNN layers, native nodes and Scan forms;
``--conversion-only`` runs just these, into conversion.json and conversion_depth.md).

OpenVINO compiles with f32 inference precision (its CPU plugin would compute in bf16 on CPUs
with AMX / AVX512-BF16) and the models' dynamic shapes. There a masked case runs the portable
form: the default form's computed sequence_lens is ignored by OpenVINO's fused sequence kernel
under dynamic shapes (the minimal graph's lengths too: its OpenVINO time is the kernel's, not
an exact floor). Stock tf2onnx's Loops do not load in OpenVINO; its native LSTMs do.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

FEATURES, HIDDEN, TIME = 64, 128, 100
KINDS = {"lstm": "LSTM", "gru": "GRU", "rnn": "SimpleRNN"}
ONNX_OPS = {"LSTM": "LSTM", "GRU": "GRU", "SimpleRNN": "RNN"}


@dataclass(frozen=True)
class Case:
    kind: str  # Keras layer class name
    bidirectional: bool
    masked: bool
    batch: int
    time: int = TIME
    hidden: int = HIDDEN
    depth: int = 1
    mask_input: bool = False  # masked: the mask is a model input (layer(x, mask=m)), not a Masking layer
    padding: str = "post"  # masked: "post" (every row's kept steps first) or "mixed" (pre-padded, full,
    # post-padded, holed and empty rows in turn, the first pre-padded): compaction is needed
    activation: str = "tanh"  # gelu: no native node computes the layer, it becomes a Scan of its own step

    @property
    def name(self) -> str:
        masking = ("maskinput" if self.mask_input else "masked") if self.masked else "plain"
        parts = [self.kind.lower().replace("simplernn", "rnn"), "bi" if self.bidirectional else "uni",
                 masking, f"b{self.batch}"]
        if self.time != TIME:
            parts.append(f"t{self.time}")
        if self.depth > 1:
            parts.append(f"depth{self.depth}")
        if self.hidden != HIDDEN:
            parts.append(f"h{self.hidden}")
        if self.padding != "post":
            parts.append(self.padding)
        if self.activation != "tanh":
            parts.append(self.activation)
        return "-".join(parts)


def all_cases() -> list:
    cases = [Case(kind, bi, masked, batch) for kind in KINDS.values() for bi in (False, True)
             for masked in (False, True) for batch in (1, 16)]
    cases += [Case("SimpleRNN", bi, masked, 64) for bi in (False, True) for masked in (False, True)]
    cases += [Case(kind, False, True, batch, mask_input=True) for kind in ("LSTM", "GRU") for batch in (1, 16)]
    cases += [Case("LSTM", False, True, batch, padding="mixed") for batch in (1, 16)]
    cases += [Case("GRU", True, True, batch, padding="mixed") for batch in (1, 16)]
    cases += [Case("LSTM", False, False, 1, time=1000), Case("GRU", False, True, 1, time=1000),
              Case("LSTM", False, False, 1, depth=4), Case("LSTM", False, False, 16, depth=4)]
    return cases


# conversion time against depth: stacks of small SimpleRNN layers, each a native node (tanh) or, with an
# activation no native node computes (gelu), a Scan of its own step
DEPTHS = (1, 8, 32)


def depth_cases() -> list:
    return [Case("SimpleRNN", False, False, 1, hidden=16, depth=depth, activation=activation)
            for depth in DEPTHS for activation in ("tanh", "gelu")]


QUICK = ("gru-uni-plain-b1", "lstm-uni-masked-b1", "gru-bi-plain-b1", "rnn-uni-plain-b16")
SMOKE = ("lstm-uni-masked-b1", "gru-bi-masked-b1")


def build_model(case: Case, seed: int = 0):
    import keras

    inputs = [keras.Input((None, FEATURES), name="x")]
    hidden, call = inputs[0], {}
    if case.masked and case.mask_input:
        inputs.append(keras.Input((None,), dtype="bool", name="mask"))
        call = {"mask": inputs[1]}
    elif case.masked:
        hidden = keras.layers.Masking()(hidden)
    for _ in range(case.depth):
        layer = getattr(keras.layers, case.kind)(case.hidden, activation=case.activation, return_sequences=True)
        layer = keras.layers.Bidirectional(layer) if case.bidirectional else layer
        hidden = layer(hidden, **call)
    model = keras.Model(inputs if len(inputs) > 1 else inputs[0], hidden)
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model


def make_inputs(case: Case, seed: int = 1):
    """x [B, T, F] and lengths (kept steps per row); masked cases get mixed lengths (first row full),
    padded with zeros after; with ``padding="mixed"`` the rows are in turn pre-padded, full,
    post-padded, holed (a run of steps in the middle masked) and empty. Returns (feeds for the
    converted models, Keras's inputs, lengths)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((case.batch, case.time, FEATURES)).astype(np.float32)
    lengths = np.full(case.batch, case.time, np.int32)
    mask = np.ones((case.batch, case.time), bool)
    if case.masked:
        lengths = rng.integers(case.time // 2, case.time + 1, case.batch).astype(np.int32)
        lengths[0] = case.time
        steps = np.arange(case.time)
        for row, length in enumerate(lengths):
            mask[row] = steps < length
            if case.padding == "mixed":
                shape = ("pre", "full", "post", "holed", "empty")[row % 5]
                mask[row] = {"pre": steps >= case.time - length, "full": True, "post": steps < length,
                             "holed": (steps < case.time // 4) | (steps >= case.time // 2), "empty": False}[shape]
            x[row, ~mask[row]] = 0.0
        lengths = mask.sum(axis=1).astype(np.int32)
    if case.masked and case.mask_input:
        return {"x": x, "mask": mask}, [x, mask], lengths
    return {"x": x}, x, lengths


def minimal_model(case: Case, model, lengths_fed: bool = False):
    """The floor: Transpose -> the native node -> Transpose. Masked: its sequence_lens computed in the
    graph from x as Keras's Masking computes its mask (from the mask input for a mask-input case),
    or, with ``lengths_fed``, fed as an input."""
    from minimal import build, onnx_weights

    if case.depth != 1:
        return None
    op = ONNX_OPS[case.kind]
    layers = [layer for layer in model.layers if layer.weights]
    cells = []
    for layer in layers:
        cells += [layer.forward_layer, layer.backward_layer] if case.bidirectional else [layer]
    directions = [onnx_weights(op, *[np.asarray(w) for w in cell.get_weights()]) for cell in cells]
    lengths_from = "" if lengths_fed else "mask" if case.mask_input else "x"
    return build(op, directions, FEATURES, case.hidden, case.masked, lengths_from=lengths_from)


def minimal_scan_model(case: Case, model):
    """SimpleRNN's floor in the form of the onnxruntime target (None for other kinds)."""
    from minimal import build_scan, onnx_weights

    if case.kind != "SimpleRNN" or case.depth != 1:
        return None
    layer = [layer for layer in model.layers if layer.weights][0]
    cells = [layer.forward_layer, layer.backward_layer] if case.bidirectional else [layer]
    directions = [onnx_weights("RNN", *[np.asarray(w) for w in cell.get_weights()]) for cell in cells]
    return build_scan(directions, FEATURES, case.hidden, case.masked)


def ort_session(model_proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def stock_convert(model):
    import tensorflow as tf
    import tf2onnx

    from tf2onnx_rnn.probes import stamp_ir_version

    spec = [tf.TensorSpec((None, None, FEATURES), tf.float32, name="x")]
    if len(model.inputs) > 1:
        spec.append(tf.TensorSpec((None, None), tf.bool, name="mask"))
    model_proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    stamp_ir_version(model_proto)  # an IR version the installed onnxruntime loads
    return model_proto


def ours_convert(model, assume_post_padded: bool = False, portable: bool = False, onnxruntime: bool = False):
    from tf2onnx_rnn import convert_keras

    targets = (["portable"] if portable else []) + (["onnxruntime"] if onnxruntime else [])
    return convert_keras(model, opset=17, assume_post_padded=assume_post_padded, target=targets or None)


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def openvino_runner(model_proto, feeds: dict):
    """A callable running ``model_proto`` in OpenVINO's CPU plugin (one thread, f32), or the first
    line of why OpenVINO cannot load it."""
    import tempfile

    import openvino

    core = openvino.Core()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.onnx")
        with open(path, "wb") as stream:
            stream.write(model_proto.SerializeToString())
        try:
            compiled = core.compile_model(core.read_model(path), "CPU", {
                "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"})
        except RuntimeError as error:
            reason = [line for line in str(error).splitlines() if line.strip()]
            return next((line.strip() for line in reason if "Conversion is failed for" in line), reason[-1])
    request = compiled.create_infer_request()
    # an input's tensor may carry several names (a Cast OpenVINO folds away gives it its output's)
    names = [next(name for name in port.get_names() if name in feeds) for port in compiled.inputs]

    def run():
        request.infer({index: feeds[name] for index, name in enumerate(names)})
        return [np.asarray(request.get_output_tensor(0).data)]

    return run


def count_ops(model_proto) -> dict:
    ops = [n.op_type for n in model_proto.graph.node]
    return {"nodes": len(ops), "native": sum(op in ("LSTM", "GRU", "RNN") for op in ops),
            "loops": sum(op in ("Loop", "Scan") for op in ops)}


def _time_block(run, target_seconds: float) -> float:
    """Seconds per call, over as many calls as fit in about ``target_seconds``."""
    run()
    start = time.perf_counter()
    calls = 0
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= target_seconds and calls >= 3:
            return elapsed / calls


def time_case(case: Case, rounds: int, block: float) -> dict:
    import onnx
    import tensorflow as tf

    model = build_model(case)
    feeds, keras_inputs, lengths = make_inputs(case)
    x = feeds["x"]
    ours, stock, minimal = ours_convert(model), stock_convert(model), minimal_model(case, model)
    onnx.checker.check_model(ours, full_check=True)
    runners = {}
    ours_session, stock_session = ort_session(ours), ort_session(stock)
    runners["ours"] = lambda: ours_session.run(None, feeds)
    runners["stock"] = lambda: stock_session.run(None, feeds)
    portable = ours
    if case.masked and case.padding == "post":  # the opt-in: exact only where every row is post-padded
        post_session = ort_session(ours_convert(model, assume_post_padded=True))
        runners["ours_post"] = lambda: post_session.run(None, feeds)
    if case.masked:
        portable = ours_convert(model, portable=True)
        portable_session = ort_session(portable)
        runners["portable"] = lambda: portable_session.run(None, feeds)
    minimal_feeds = feeds  # masked: the floor computes its lengths from x (or the mask input)
    lengths_feeds = {"x": x, "lengths": lengths}
    if minimal is not None:
        minimal_session = ort_session(minimal)
        runners["minimal"] = lambda: minimal_session.run(None, minimal_feeds)
    if minimal is not None and case.masked:  # the floor handed the lengths: no mask computed
        lengths_session = ort_session(minimal_model(case, model, lengths_fed=True))
        runners["minimal_lengths"] = lambda: lengths_session.run(None, lengths_feeds)
    if case.kind == "SimpleRNN":  # the onnxruntime target's form, and its own floor
        ort_form_session = ort_session(ours_convert(model, onnxruntime=True))
        runners["ours_ort"] = lambda: ort_form_session.run(None, feeds)
        scan_floor = minimal_scan_model(case, model)
        if scan_floor is not None:
            scan_floor_session = ort_session(scan_floor)
            runners["minimal_scan"] = lambda: scan_floor_session.run(None, lengths_feeds if case.masked else feeds)
    openvino_failures = {}
    if openvino_available():
        # masked: the portable form, exact in OpenVINO (see the module's docstring)
        for name, model_proto, model_feeds in (("ours_ov", portable, feeds), ("minimal_ov", minimal, minimal_feeds),
                                               ("stock_ov", stock, feeds)):
            if model_proto is None:
                continue
            runner = openvino_runner(model_proto, model_feeds)
            if callable(runner):
                runners[name] = runner
            else:
                openvino_failures[name] = runner
    serve = tf.function(lambda t: model(t, training=False))
    tensors = [tf.constant(a) for a in keras_inputs] if isinstance(keras_inputs, list) else tf.constant(x)
    runners["tensorflow"] = lambda: serve(tensors).numpy()

    expected = np.asarray(model(keras_inputs, training=False))
    errors = {name: float(np.max(np.abs(runners[name]()[0] - expected)))
              for name in ("ours", "ours_post", "portable", "ours_ort", "stock", "ours_ov", "stock_ov")
              if name in runners}
    if "minimal_scan" in runners and not case.masked:  # a floor that is wrong would measure nothing
        errors["minimal_scan"] = float(np.max(np.abs(runners["minimal_scan"]()[0] - expected)))
    samples = {name: [] for name in runners}
    for _ in range(rounds):  # interleaved: every runner once per round
        for name, run in runners.items():
            samples[name].append(_time_block(run, block))
    medians = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    return {"case": case.name, **asdict(case), "ms": medians,
            "rounds_ms": {name: [value * 1e3 for value in values] for name, values in samples.items()},
            "ours_ops": count_ops(ours),
            "stock_ops": count_ops(stock), "portable_ops": count_ops(portable), "max_abs_error": errors,
            "openvino_failures": openvino_failures}


CHILD = """
import json, os, resource, sys, time
sys.path.insert(0, {here!r})
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from run import Case, build_model, ours_convert, stock_convert
case = Case(**json.loads({case!r}))
model = build_model(case)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
{converter}_convert(model)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": seconds, "peak_mb": peak / 1024, "growth_mb": (peak - before) / 1024}}))
"""


def conversion_cost(case: Case, converter: str) -> dict:
    """Seconds and peak resident memory (MB) of one conversion, in a fresh process."""
    code = CHILD.format(here=HERE, case=json.dumps(asdict(case)), converter=converter)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@dataclass
class Results:
    machine: dict
    cases: list = field(default_factory=list)
    conversions: list = field(default_factory=list)
    depths: list = field(default_factory=list)  # conversion cost of depth_cases()


def machine_info() -> dict:
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as stream:
            cpu = next(line.split(":", 1)[1].strip() for line in stream if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__,
            "threads": "onnxruntime and TensorFlow: 1 intra-op thread; OpenVINO: 1 inference thread, 1 stream"}
    if openvino_available():
        import openvino

        info["openvino"] = openvino.__version__
    return info


def ratio(row: dict, a: str, b: str) -> Optional[float]:
    """Runner ``a``'s time over ``b``'s in a case: the median of the per-round ratios (the two ran
    back to back in each round, so a slow spell of the machine weighs on both), or, for results
    without rounds, the ratio of the medians."""
    rounds = row.get("rounds_ms", {})
    if a in rounds and b in rounds:
        return statistics.median(x / y for x, y in zip(rounds[a], rounds[b]))
    ms = row["ms"]
    return None if a not in ms or b not in ms else ms[a] / ms[b]


def table(results: Results) -> str:
    lines = ["| case | ours ms | minimal ms | stock ms | TF ms | ours/minimal | ours/lengths-fed floor "
             "| post-padded opt-in/minimal | portable/minimal | stock/ours | nodes ours/stock |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in results.cases:
        ms = row["ms"]
        cells = [row["case"]] + [f"{ms[k]:.3f}" if k in ms else "-" for k in ("ours", "minimal", "stock",
                                                                                  "tensorflow")]
        for key, floor in (("ours", "minimal"), ("ours", "minimal_lengths"), ("ours_post", "minimal"),
                           ("portable", "minimal")):
            over_minimal = ratio(row, key, floor)
            cells.append(f"{over_minimal:.2f}" if over_minimal else "-")
        cells.append(f"{ratio(row, 'stock', 'ours'):.2f}")
        stock_kind = "Loop" if row["stock_ops"]["loops"] else "native"
        cells.append(f"{row['ours_ops']['nodes']}/{row['stock_ops']['nodes']} ({stock_kind})")
        lines.append("| " + " | ".join(cells) + " |")
    if any("ours_ort" in row["ms"] for row in results.cases):
        lines += ["", "SimpleRNN per form in onnxruntime: the native RNN node (the default) and the onnxruntime "
                  "target's input MatMul + Scan, each against its hand-built floor and stock tf2onnx:", "",
                  "| case | native ms | onnxruntime form ms | stock ms | native/node floor | "
                  "onnxruntime form/Scan floor | stock/native | stock/onnxruntime form |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in results.cases:
            ms = row["ms"]
            if "ours_ort" not in ms:
                continue
            ratios = (ratio(row, "ours", "minimal"), ratio(row, "ours_ort", "minimal_scan"),
                      ratio(row, "stock", "ours"), ratio(row, "stock", "ours_ort"))
            lines.append("| " + " | ".join([row["case"], f"{ms['ours']:.3f}", f"{ms['ours_ort']:.3f}",
                                             f"{ms['stock']:.3f}"] + [f"{r:.2f}" if r else "-" for r in ratios]) + " |")
    if any("ours_ov" in row["ms"] for row in results.cases):
        lines += ["", "OpenVINO CPU (1 thread, f32; masked cases: the portable form):", "",
                  "| case | ours ms | minimal ms | stock ms | ours/minimal | stock/ours | ours max abs error |",
                  "|---|---|---|---|---|---|---|"]
        for row in results.cases:
            ms, failed = row["ms"], row.get("openvino_failures", {})
            stock = f"{ms['stock_ov']:.3f}" if "stock_ov" in ms else ("does not load" if "stock_ov" in failed else "-")
            over_minimal, stock_over = ratio(row, "ours_ov", "minimal_ov"), ratio(row, "stock_ov", "ours_ov")
            error = row["max_abs_error"].get("ours_ov")
            lines.append("| " + " | ".join([
                row["case"], f"{ms['ours_ov']:.3f}" if "ours_ov" in ms else failed.get("ours_ov", "-"),
                f"{ms['minimal_ov']:.3f}" if "minimal_ov" in ms else "-", stock,
                f"{over_minimal:.2f}" if over_minimal else "-", f"{stock_over:.2f}" if stock_over else "-",
                f"{error:.1e}" if error is not None else "-"]) + " |")
    if results.conversions:
        lines += ["", "| conversion | ours s | stock s | ours peak MB | stock peak MB |", "|---|---|---|---|---|"]
        for row in results.conversions:
            lines.append(f"| {row['case']} | {row['ours']['seconds']:.2f} | {row['stock']['seconds']:.2f} | "
                         f"{row['ours']['peak_mb']:.0f} | {row['stock']['peak_mb']:.0f} |")
    if results.depths:
        lines += ["", depth_table(results.depths)]
    return "\n".join(lines)


def depth_table(depths: list) -> str:
    """Conversion seconds of SimpleRNN(16) stacks per depth: native nodes (tanh) and Scan forms (gelu),
    ours and stock, with the Scan form over the native and each depth over the one before."""
    seconds = {(row["depth"], row["activation"], converter): row[converter]["seconds"]
               for row in depths for converter in ("ours", "stock")}
    lines = ["Conversion time against depth, SimpleRNN(16) stacks (seconds, one conversion in a fresh process):", "",
             "| layers | ours native | ours Scan form | Scan form/native | ours Scan form/previous depth "
             "| stock (tanh) | stock (gelu) |", "|---|---|---|---|---|---|---|"]
    previous = None
    for depth in DEPTHS:
        if (depth, "gelu", "ours") not in seconds:
            continue
        native, scan = seconds[(depth, "tanh", "ours")], seconds[(depth, "gelu", "ours")]
        growth = f"{scan / seconds[(previous, 'gelu', 'ours')]:.2f} ({depth // previous}x layers)" if previous else "-"
        lines.append(f"| {depth} | {native:.2f} | {scan:.2f} | {scan / native:.2f} | {growth} | "
                     f"{seconds[(depth, 'tanh', 'stock')]:.2f} | {seconds[(depth, 'gelu', 'stock')]:.2f} |")
        previous = depth
    return "\n".join(lines)


def plot(results: Results, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["case"] for row in results.cases]
    positions = np.arange(len(names))
    width = 0.27
    fig, axis = plt.subplots(figsize=(max(8, len(names) * 0.55), 4.8))
    for offset, (key, label) in zip((-width, 0, width), (("ours", "tf2onnx-rnn"), ("minimal", "hand-built minimal"),
                                                          ("stock", "stock tf2onnx"))):
        values = [row["ms"].get(key, np.nan) for row in results.cases]
        axis.bar(positions + offset, values, width, label=label)
    axis.set_yscale("log")
    axis.set_ylabel("median latency, ms (log scale)")
    axis.set_xticks(positions, names, rotation=60, ha="right", fontsize=8)
    axis.set_title("onnxruntime latency, 1 intra-op thread")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: Results, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "benchmark.json"), "w") as stream:
        json.dump(asdict(results), stream, indent=1)
    with open(os.path.join(out, "benchmark.csv"), "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["case", "ours_ms", "ours_post_padded_ms", "portable_ms", "minimal_ms", "stock_ms",
                         "tensorflow_ms", "ours_over_minimal", "stock_over_ours", "ours_nodes", "stock_nodes",
                         "stock_loops", "openvino_ours_ms", "openvino_minimal_ms", "openvino_stock_ms",
                         "onnxruntime_form_ms", "minimal_scan_ms", "minimal_lengths_fed_ms"])
        for row in results.cases:
            ms = row["ms"]
            writer.writerow([row["case"], ms["ours"], ms.get("ours_post", ""), ms.get("portable", ""),
                             ms.get("minimal", ""), ms["stock"], ms["tensorflow"],
                             ratio(row, "ours", "minimal") or "", ratio(row, "stock", "ours"),
                             row["ours_ops"]["nodes"], row["stock_ops"]["nodes"], row["stock_ops"]["loops"],
                             ms.get("ours_ov", ""), ms.get("minimal_ov", ""), ms.get("stock_ov", ""),
                             ms.get("ours_ort", ""), ms.get("minimal_scan", ""), ms.get("minimal_lengths", "")])
    with open(os.path.join(out, "benchmark.md"), "w") as stream:
        stream.write(table(results) + "\n")
    plot(results, os.path.join(out, "benchmark.png"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--smoke", action="store_true",
                        help=f"only {', '.join(SMOKE)}, one short round, no conversion cost: checks the script runs")
    parser.add_argument("--cases", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--block", type=float, default=0.05, help="seconds per timing block (default 0.05)")
    parser.add_argument("--no-conversion-cost", action="store_true", help="skip conversion time/memory")
    parser.add_argument("--conversion-only", action="store_true",
                        help="only conversion time/memory (the depth table included), no latency")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.block, args.no_conversion_cost = 1, 0.01, True
        if args.out == os.path.join(HERE, "results"):  # never over the measured results
            import tempfile

            args.out = tempfile.mkdtemp(prefix="tf2onnx-rnn-benchmark-smoke-")

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cases = all_cases()
    wanted = SMOKE if args.smoke else QUICK if args.quick else args.cases
    if wanted:
        cases = [c for c in cases if c.name in wanted]
    results = Results(machine=machine_info())
    for case in [] if args.conversion_only else cases:
        print(f"timing {case.name} ...", file=sys.stderr, flush=True)
        results.cases.append(time_case(case, args.rounds, args.block))
    if not args.no_conversion_cost:
        scale = Case("LSTM", False, False, 1, time=1000, hidden=512, depth=4)
        for case in ([cases[0]] if args.quick else [Case("GRU", True, True, 16), scale]):
            print(f"conversion cost {case.name} ...", file=sys.stderr, flush=True)
            results.conversions.append({"case": case.name, "ours": conversion_cost(case, "ours"),
                                        "stock": conversion_cost(case, "stock")})
        for case in [] if args.quick else depth_cases():
            print(f"conversion cost {case.name} ...", file=sys.stderr, flush=True)
            results.depths.append({"case": case.name, "depth": case.depth, "activation": case.activation,
                                   "ours": conversion_cost(case, "ours"), "stock": conversion_cost(case, "stock")})
    if args.conversion_only:  # the latency results stay as they are
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "conversion.json"), "w") as stream:
            json.dump({"machine": results.machine, "conversions": results.conversions, "depths": results.depths},
                      stream, indent=1)
    else:
        write(results, args.out)
    if results.depths:
        with open(os.path.join(args.out, "conversion_depth.md"), "w") as stream:
            stream.write(depth_table(results.depths) + "\n")
    print(table(results))
    print(f"\nmachine: {results.machine}\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
