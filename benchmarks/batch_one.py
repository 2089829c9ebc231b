"""Conversion time at a fixed batch of 1 against a fixed batch of 3, model by model.

    python benchmarks/batch_one.py                 # the runtime tests' 21 models and two text models, Keras 3
    python benchmarks/batch_one.py --rounds 1      # one conversion of each (default 3, the median kept)

At a fixed batch of 1 the transposes around a fused node move only an axis of size 1, and tf2onnx's
optimizers write such a transpose as a Reshape: a conversion there must take about the time it takes at
batch 3 (a skip-concatenated LSTM stack once ran for more than 15 minutes at batch 1). Each model is
converted with its input's batch fixed at 1 and at 3, in this one process, alternating, after one warm-up
conversion; the table gives the medians and their ratio, and the largest ratio closes it.
Results: benchmarks/results/batch_one.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def text_models(keras) -> dict:
    """Two text models of the kind users convert: an embedding and two LSTMs concatenated with their input
    (a skip connection), one pooled by attention."""
    layers = keras.layers

    def skip(attention: bool):
        x = keras.Input((30,), dtype="int32", name="x")
        e = layers.Embedding(500, 16)(x)
        r1 = layers.LSTM(32, return_sequences=True)(e)
        r2 = layers.LSTM(32, return_sequences=True)(r1)
        seq = layers.concatenate([e, r1, r2])
        if attention:
            weights = layers.Softmax(axis=1)(layers.Dense(1, activation="tanh")(seq))
            pooled = layers.Dot(axes=1)([weights, seq])
            y = layers.Dense(10, activation="softmax")(layers.Flatten()(pooled))
        else:
            y = layers.GlobalAveragePooling1D()(seq)
        return keras.Model(x, y)

    return {"text_skip_concat": skip(False), "text_attention": skip(True)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    import keras
    import tensorflow as tf

    import parity
    import runtime_models
    from tf2onnx_rnn import convert_keras

    models = {name: runtime_models.model(keras, name, runtime_models.seed(name)) for name in runtime_models.MODELS}
    models.update(text_models(keras))
    rows = []
    for name, model in models.items():
        shape = tuple(model.inputs[0].shape[1:])
        dtype = model.inputs[0].dtype

        def convert(batch):
            spec = tf.TensorSpec((batch,) + shape, dtype, name="x")
            start = time.perf_counter()
            convert_keras(model, input_signature=[spec], check_shapes=False)
            return time.perf_counter() - start

        convert(3)  # warm-up: the trace's caches
        times = {1: [], 3: []}
        for _ in range(args.rounds):
            for batch in (1, 3):
                times[batch].append(convert(batch))
        one, three = statistics.median(times[1]), statistics.median(times[3])
        rows.append((name, one, three, one / three))
        print(f"{name}: batch 1 {one:.2f} s, batch 3 {three:.2f} s, ratio {one / three:.2f}", flush=True)
    lines = ["| model | batch 1 s | batch 3 s | batch 1 / batch 3 |", "|---|---|---|---|"]
    lines += [f"| {n} | {a:.2f} | {b:.2f} | {r:.2f} |" for n, a, b, r in rows]
    lines.append(f"\nlargest ratio: {max(r for *_, r in rows):.2f} ({len(rows)} models, {parity.FLAVORS[0]}, "
                 f"medians of {args.rounds})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batch_one.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
