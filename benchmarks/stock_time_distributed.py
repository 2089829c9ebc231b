"""What stock tf2onnx and tf2onnx-rnn make of models around ``TimeDistributed``: the measurement behind
the TimeDistributed rows of docs/conversions.md.

Every model of ``tests/test_time_distributed.py`` (both Keras flavors, dynamic and fixed time, every
weight random) is converted by stock tf2onnx (``tf2onnx.convert.from_keras`` with the model's input
signature, opset 17) and by this package (``convert_keras``). For each: the recurrent and loop ops,
the MatMul count, and whether onnxruntime equals ``model(x, training=False)`` at batch 3, time 7
(batch unlike time), or the error.

    python benchmarks/stock_time_distributed.py [--out benchmarks/results/time_distributed.md]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OPS = ("LSTM", "GRU", "RNN", "Loop", "Scan", "MatMul", "Gemm")


def _ops(model_proto) -> str:
    counts = collections.Counter(n.op_type for n in model_proto.graph.node)
    return " ".join(f"{op}x{counts[op]}" if counts[op] > 1 else op for op in OPS if counts[op]) or "-"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:100] if lines else ''}"


def _outcome(model_proto, model, x) -> str:
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
        actual = session.run(None, {session.get_inputs()[0].name: x})[0]
    except Exception as error:  # noqa: BLE001 - what onnxruntime says is the measurement
        return f"onnxruntime: {_first_line(error)}"
    expected = np.asarray(model(x, training=False))
    if actual.shape != expected.shape:
        return f"wrong shape {actual.shape}, Keras {expected.shape}"
    return f"max error {float(np.max(np.abs(actual - expected))):.1e}"


def _stock(model) -> object:
    import tensorflow as tf
    import tf2onnx

    signature = [tf.TensorSpec([None] + list(t.shape[1:]), t.dtype, name=t.name.split(":")[0])
                 for t in model.inputs]
    return tf2onnx.convert.from_keras(model, input_signature=signature, opset=17)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "time_distributed.md"))
    args = parser.parse_args()
    import parity
    import test_time_distributed as cases
    from tf2onnx_rnn import convert_keras

    rows = ["| model | flavor | time | stock tf2onnx: ops | stock: result | tf2onnx-rnn: ops | tf2onnx-rnn: result |",
            "|---|---|---|---|---|---|---|"]
    for flavor in parity.FLAVORS:
        for model_case in cases.MODELS:
            if model_case.only not in (None, flavor):
                continue
            for fixed in (False, True):
                case = cases.Case(model_case, fixed)
                model = cases.build(flavor, case)
                x = cases.inputs_for(model_case, cases.shape_of(case, 3, 7), seed=1)
                results = []
                for convert in (_stock, convert_keras):
                    try:
                        proto = convert(model)
                        results += [_ops(proto), _outcome(proto, model, x)]
                    except Exception as error:  # noqa: BLE001 - the failure is the measurement
                        results += ["-", _first_line(error)]
                rows.append(f"| {model_case.name} | {flavor} | {'fixed' if fixed else 'dynamic'} | "
                            + " | ".join(results) + " |")
                print(rows[-1], flush=True)
    with open(args.out, "w") as stream:
        stream.write("# TimeDistributed: stock tf2onnx and tf2onnx-rnn\n\n"
                     "Written by `benchmarks/stock_time_distributed.py`; batch 3, time 7 (or the model's fixed "
                     "time), every weight random.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
