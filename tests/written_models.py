"""The written models of a fixed set, as fingerprints: to show that a change of the code's shape leaves
every model it writes the same.

    python tests/written_models.py before.json      # at the commit before the change
    python tests/written_models.py after.json       # after it
    python tests/written_models.py --compare before.json after.json

The set: the runtime targets' Keras models (LSTM, GRU with either reset_after, SimpleRNN, go_backwards,
Bidirectional in every merge mode, states passed and returned, masks, a Scan, StackedRNNCells, ConvLSTM2D)
in every form (the default, portable, onnxruntime, training, and each runtime target with a fixed
signature), the Scan form's cells masked and not, and ConvLSTM's cases, in Keras 3 and tf_keras. A model's
fingerprint is its ops (its subgraphs' included), how many weight values it holds and its outputs in
onnxruntime on seeded random inputs; a refusal's, its message. Not the bytes: the same code converting the
same model in two processes may order a Scan step's nodes, or the blocks of a merged weight, otherwise
(measured on ConvLSTM2D, at this commit and before it), which computes the same.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _fingerprint(make):
    """What a written model is, for comparing: its ops (subgraphs' included) and how many weight values it
    holds, and its outputs on seeded random inputs; a refusal, its message."""
    from collections import Counter

    import numpy as np
    import onnxruntime as ort

    from tf2onnx_rnn import ConversionError
    from tf2onnx_rnn.inputs import random_inputs
    from tf2onnx_rnn.verify import onnx_input_specs

    try:
        proto = make()
    except ConversionError as error:
        return f"refused: {error}"
    ops: Counter = Counter()
    weights = 0

    def walk(graph) -> None:
        nonlocal weights
        weights += sum(int(np.prod(t.dims)) for t in graph.initializer)
        for node in graph.node:
            ops[node.op_type] += 1
            for attribute in node.attribute:
                for sub in ([attribute.g] if attribute.type == 5 else list(attribute.graphs)):  # GRAPH(S)
                    walk(sub)

    walk(proto.graph)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    specs = onnx_input_specs(proto)
    feeds = dict(zip([name for name, _, _ in specs], random_inputs(specs, 7, {0: 2, 1: 5})))
    outputs = [np.asarray(o, np.float64).round(6).tolist() for o in session.run(None, feeds)]
    return {"ops": dict(sorted(ops.items())), "weights": weights, "outputs": outputs}


def _same(before, after) -> bool:
    import numpy as np

    if isinstance(before, str) or isinstance(after, str):
        return before == after
    if before["ops"] != after["ops"] or before["weights"] != after["weights"] or \
            len(before["outputs"]) != len(after["outputs"]):
        return False
    return all(np.allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
               for b, a in zip(before["outputs"], after["outputs"]))


def fingerprints() -> dict:
    import tensorflow as tf

    import parity
    import runtime_models as runtimes
    import scan_cells
    import test_conv_lstm
    from tf2onnx_rnn import convert_keras

    found = {}
    for flavor in parity.FLAVORS:
        K = parity.keras_module(flavor)
        for name in runtimes.MODELS:
            model = runtimes.model(K, name, runtimes.seed(name))
            for form in (None, "portable", "onnxruntime", "training"):
                found[f"{flavor}/{name}/{form or 'default'}"] = _fingerprint(
                    lambda: convert_keras(model, check_shapes=False, **({"target": form} if form else {})))
            signature = [tf.TensorSpec((1,) + runtimes.step_shape(name), tf.float32, name="x")]
            for target in ("iree", "tvm", "ncnn", "rknn"):
                found[f"{flavor}/{name}/{target}"] = _fingerprint(
                    lambda: convert_keras(model, input_signature=signature, target=target, check_shapes=False))
        for design in scan_cells.DESIGNS + (scan_cells.CONSTANTS,):
            if design.constants:
                continue  # its second input needs the design's own harness
            for masked in (False, True):
                x = K.Input((None, scan_cells.FEATURES), name="x")
                inner = K.layers.Masking(0.0)(x) if masked else x
                model = K.Model(x, design.layer(K, return_sequences=True)(inner))
                scan_cells.randomize(model, 5)
                found[f"{flavor}/scan/{design.name}/{'masked' if masked else 'plain'}"] = _fingerprint(
                    lambda: convert_keras(model, opset=17, check_shapes=False))
        for case in test_conv_lstm.CASES:
            try:
                model = test_conv_lstm._build(flavor, case)
            except Exception as error:  # noqa: BLE001 - Keras's own refusal on this machine, recorded
                found[f"{flavor}/conv/{case.name}"] = f"not built: {type(error).__name__}"
                continue
            found[f"{flavor}/conv/{case.name}"] = _fingerprint(lambda: convert_keras(model, check_shapes=False))
    return found


def main(argv: list) -> int:
    if argv[:1] == ["--compare"]:
        before, after = (json.load(open(path)) for path in argv[1:3])
        common = set(before) & set(after)
        changed = sorted(key for key in common if not _same(before[key], after[key]))
        for key in changed:
            print(f"changed: {key}")
        for key in sorted(set(before) ^ set(after)):
            print(f"in one set only ({'before' if key in before else 'after'}): {key}")
        print(f"{len(common)} models in both sets, {len(changed)} written differently")
        return 1 if changed or not common else 0
    warnings.simplefilter("ignore")
    found = fingerprints()
    with open(argv[0], "w") as out:
        json.dump(found, out, indent=1, sort_keys=True)
    print(f"{len(found)} models, {sum(isinstance(v, str) and v.startswith('refused') for v in found.values())} refused")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
