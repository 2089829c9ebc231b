"""rknn-toolkit2's own int8 quantizer on the trained recurrent classifiers of ``benchmarks/int8.py``.

    python benchmarks/rknn_int8.py                          # every model and variant
    python benchmarks/rknn_int8.py --kinds SimpleRNN --variants float w8a8_normal

rknn-toolkit2 builds no QDQ model of a recurrent layer in reasonable time (docs/quantization.md), so ``static``
is refused with ``--target rknn``; rknn quantizes the float model itself. This measures how well. Each model of
``benchmarks/int8.py`` (Masking -> LSTM(128), GRU(128), SimpleRNN(128) or Bidirectional(GRU(64)) -> Dense(9), trained
on the bundled Japanese Vowels set) is converted with ``target="rknn"`` at [1, 29, 12] and built by rknn-toolkit2
for rk3588 in its simulator, one child process per build (the interpreter ``TF2ONNX_RNN_RKNN_PYTHON`` names, a
timeout each), in these variants:

- ``float``: ``build(do_quantization=False)`` (float16);
- ``w8a8_<algorithm>``: ``build(do_quantization=True, dataset=...)`` with ``quantized_algorithm`` normal, mmse or
  kl_divergence, calibrated on the 270 training utterances (one per file);
- ``hybrid``: rknn's hybrid quantization, every layer of its graph ahead of the Dense float16 and the Dense int8
  (``hybrid_quantization_step1``, its layer list edited, then ``step2``).

Each build runs the 370 test utterances one by one; reported against Keras ``model(x, training=False)``: accuracy,
agreement of the predictions, the largest absolute logit error and that relative to the largest |Keras logit|,
and the build's seconds. Results: ``benchmarks/results/rknn_int8.md`` and ``.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("float", "w8a8_normal", "w8a8_mmse", "w8a8_kl_divergence", "hybrid")
SHAPE = [1, 29, 12]
TIMEOUT = 600  # seconds a build and its run may take


def _child(kind: str, variant: str, work: str) -> dict:
    """One build and run, in rknn-toolkit2's interpreter: the logits of the test utterances, or why not."""
    from rknn.api import RKNN

    os.chdir(work)
    rknn = RKNN(verbose=False)
    algorithm = variant[len("w8a8_"):] if variant.startswith("w8a8_") else "normal"
    rknn.config(target_platform="rk3588", quantized_dtype="w8a8", quantized_algorithm=algorithm)
    if rknn.load_onnx(model=f"{kind}.onnx", inputs=["x"], input_size_list=[SHAPE]) != 0:
        return {"error": "load_onnx failed"}
    start = time.perf_counter()
    if variant == "float":
        built = rknn.build(do_quantization=False)
    elif variant.startswith("w8a8_"):
        built = rknn.build(do_quantization=True, dataset="dataset.txt")
    else:
        built, rknn = _hybrid(rknn, kind)
    if built != 0:
        return {"error": f"build returned {built}"}
    seconds = time.perf_counter() - start
    if rknn.init_runtime() != 0:
        return {"error": "init_runtime failed"}
    x = np.load("x_test.npy")
    logits = [np.asarray(rknn.inference(inputs=[x[i:i + 1]], data_format=["nchw"])[0]).reshape(-1)
              for i in range(len(x))]
    rknn.release()
    np.save(f"{kind}_{variant}_logits.npy", np.stack(logits))
    return {"build_seconds": round(seconds, 1)}


def _hybrid(rknn, kind: str) -> tuple:
    """rknn's hybrid quantization with every layer ahead of the Dense float16: (step 2's status, the RKNN)."""
    import onnx
    from rknn.api import RKNN

    if rknn.hybrid_quantization_step1(dataset="dataset.txt", proposal=False) != 0:
        return -1, rknn
    graph = onnx.load(f"{kind}.model", load_external_data=False).graph
    dense = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")][-1]
    after, reached = {dense.name}, set(dense.output)
    for node in graph.node:  # rknn's graph is in order: what the Dense's output reaches stays int8
        if node.name not in after and reached.intersection(node.input):
            after.add(node.name)
            reached.update(node.output)
    ahead = [n.output[0] for n in graph.node if n.name not in after]
    config = f"{kind}.quantization.cfg"
    text = open(config).read()
    with open(config, "w") as handle:
        handle.write("custom_quantize_layers:\n" + "".join(f"    {t}: float16\n" for t in ahead)
                     + text[text.find("quantize_parameters:"):])
    rknn.release()
    rknn = RKNN(verbose=False)
    return rknn.hybrid_quantization_step2(model_input=f"{kind}.model", data_input=f"{kind}.data",
                                          model_quantization_cfg=config), rknn


def _prepared(kinds: list, work: str) -> dict:
    """Train and convert each model (this interpreter): Keras's test logits per kind."""
    import tensorflow as tf

    import tf2onnx_rnn

    sys.path.insert(0, HERE)
    import int8

    x_train, _ = int8.vowels("train")
    x_test, y_test = int8.vowels("test")
    np.save(os.path.join(work, "x_test.npy"), x_test)
    with open(os.path.join(work, "dataset.txt"), "w") as listing:
        for i, row in enumerate(x_train):
            path = os.path.join(work, f"train_{i:03d}.npy")
            np.save(path, row[None].astype(np.float32))
            listing.write(path + "\n")
    keras_logits = {}
    for kind in kinds:
        model, _, _ = int8.train(kind, quick=False)
        keras_logits[kind] = np.concatenate([np.asarray(model(x_test[i:i + 1], training=False))
                                             for i in range(len(x_test))])
        proto = tf2onnx_rnn.convert_keras(model, target="rknn",
                                          input_signature=[tf.TensorSpec(SHAPE, tf.float32, name="x")])
        with open(os.path.join(work, f"{kind}.onnx"), "wb") as handle:
            handle.write(proto.SerializeToString())
    return {"keras": keras_logits, "labels": y_test}


def _measured(kind: str, variant: str, work: str, python: str, prepared: dict) -> dict:
    row = {"model": kind, "variant": variant}
    try:
        done = subprocess.run([python, os.path.abspath(__file__), "--child", kind, variant, work],
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"over {TIMEOUT} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {**row, "error": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"}
    found = json.loads(lines[-1])
    if "error" in found:
        return {**row, **found}
    got, want = np.load(os.path.join(work, f"{kind}_{variant}_logits.npy")), prepared["keras"][kind]
    error = float(np.max(np.abs(got - want)))
    return {**row, **found, "accuracy": float(np.mean(got.argmax(1) == prepared["labels"])),
            "keras_accuracy": float(np.mean(want.argmax(1) == prepared["labels"])),
            "agreement": float(np.mean(got.argmax(1) == want.argmax(1))), "max_abs_error": error,
            "relative": error / float(np.max(np.abs(want)))}


def _markdown(rows: list) -> str:
    lines = ["| model | variant | accuracy (Keras) | agreement | largest logit error | relative | build s |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['variant']} | {row['error']} | | | | |")
        else:
            lines.append(f"| {row['model']} | {row['variant']} | {row['accuracy']:.3f} ({row['keras_accuracy']:.3f}) "
                         f"| {row['agreement']:.3f} | {row['max_abs_error']:.3g} | {row['relative']:.2%} "
                         f"| {row['build_seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv: list) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(_child(*argv[1:4])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["LSTM", "GRU", "SimpleRNN", "BiGRU"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args(argv)
    python = os.environ.get("TF2ONNX_RNN_RKNN_PYTHON")
    if not python:
        print("set TF2ONNX_RNN_RKNN_PYTHON to an interpreter with rknn-toolkit2", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="rknn_int8_")
    prepared = _prepared(args.kinds, work)
    rows = []
    for kind in args.kinds:
        for variant in args.variants:
            rows.append(_measured(kind, variant, work, python, prepared))
            print(json.dumps(rows[-1]), flush=True)
    results = os.path.join(HERE, "results")
    with open(os.path.join(results, "rknn_int8.json"), "w") as handle:
        json.dump(rows, handle, indent=1)
    with open(os.path.join(results, "rknn_int8.md"), "w") as handle:
        handle.write("rknn-toolkit2's int8 quantizer on the trained classifiers (`python benchmarks/rknn_int8.py`; "
                     "test utterances against Keras)\n\n" + _markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
