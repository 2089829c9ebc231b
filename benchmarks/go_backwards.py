"""What reversing a go_backwards layer's input with a Slice costs in onnxruntime.

    python benchmarks/go_backwards.py            # every case, results in benchmarks/results/
    python benchmarks/go_backwards.py --smoke    # one case, one short round: checks the script runs

Every form writes an unmasked ``go_backwards`` layer as a forward node over its input reversed by a
``Slice`` of step -1 (a lone ``direction="reverse"`` node runs forward in tract). The floor here is
the same converted model with that Slice removed and the node's direction set to ``reverse``: what
the default form wrote before, which costs no copy. Cases: LSTM and GRU (T=100, F=64, H=128, Keras 3,
returning the last output), batch 1 and 16, onnxruntime on one thread; both checked against Keras,
interleaved call by call, medians reported.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from run import ort_session  # noqa: E402

FEATURES, HIDDEN, TIME = 64, 128, 100


def reverse_node(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its recurrent node reading the unreversed input in the reverse direction."""
    edited = onnx.ModelProto()
    edited.CopyFrom(model_proto)
    producer = {out: node for node in edited.graph.node for out in node.output}
    for node in edited.graph.node:
        if node.op_type not in ("LSTM", "GRU"):
            continue
        before = producer[node.input[0]]
        reader = node if before.op_type == "Slice" else before  # tf2onnx may move the Slice before a Transpose
        reversal = producer[reader.input[0]] if reader is before else before
        if reversal.op_type != "Slice":
            raise RuntimeError(f"{node.name}: its input is not reversed by a Slice")
        reader.input[0] = reversal.input[0]
        for attribute in node.attribute:
            if attribute.name == "direction":
                attribute.s = b"reverse"
    return edited


def time_case(kind: str, batch: int, calls: int) -> dict:
    import keras

    from tf2onnx_rnn import convert_keras

    model = keras.Sequential([keras.Input((None, FEATURES)), getattr(keras.layers, kind)(HIDDEN, go_backwards=True)])
    x = np.random.default_rng(0).standard_normal((batch, TIME, FEATURES)).astype(np.float32)
    ours = convert_keras(model)
    sessions = {"ours": ort_session(ours), "reverse node": ort_session(reverse_node(ours))}
    want = np.asarray(model(x, training=False))
    for name, session in sessions.items():
        got = session.run(None, {session.get_inputs()[0].name: x})[0]
        if float(np.max(np.abs(got - want))) > 1e-4:
            raise RuntimeError(f"{kind} batch {batch}: {name} differs from Keras")
    times = {name: [] for name in sessions}
    for _ in range(calls):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, {session.get_inputs()[0].name: x})
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    return {"case": f"{kind} go_backwards, batch {batch}", "ours": medians["ours"],
            "floor": medians["reverse node"], "ratio": medians["ours"] / medians["reverse node"]}


def table(results: list) -> str:
    lines = ["| case | ours ms (Slice + forward node) | reverse node ms | ours/reverse node |", "|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['ours']:.3f} | {r['floor']:.3f} | {r['ratio']:.2f} |" for r in results]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    cases = [("GRU", 1)] if args.smoke else [(kind, batch) for kind in ("LSTM", "GRU") for batch in (1, 16)]
    results = [time_case(kind, batch, 3 if args.smoke else args.calls) for kind, batch in cases]
    text = table(results)
    print(text)
    if not args.smoke:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "go_backwards.md"), "w") as stream:
            stream.write("# go_backwards: the Slice's cost\n\n" + __doc__.split("\n\n", 2)[2] + "\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
