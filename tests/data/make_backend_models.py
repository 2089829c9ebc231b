"""Build tests/data/backends/: small Keras 3 models saved under the JAX, PyTorch and NumPy backends.

    KERAS_BACKEND=jax   python tests/data/make_backend_models.py [OUTPUT_DIR]
    KERAS_BACKEND=torch python tests/data/make_backend_models.py [OUTPUT_DIR]
    KERAS_BACKEND=numpy python tests/data/make_backend_models.py [OUTPUT_DIR]

Run it once per backend, in an environment with Keras 3 and that backend installed
(jax[cpu], a CPU torch, or scipy for NumPy) and no need for TensorFlow. The backend is read
from ``KERAS_BACKEND`` before ``keras`` is imported; only jax, torch and numpy are accepted.

For each backend ``<backend>`` and model ``<name>`` it writes, into OUTPUT_DIR (default: the
``backends`` folder beside this script):

* ``<backend>_<name>.keras`` -- the functional model, saved with ``model.save``;
* ``<backend>_<name>.npz`` -- ``input`` (the fixed test input) and ``output`` (float32, what
  ``model(input, training=False)`` gave on that backend).

Models, all with dynamic batch and time, 5 features, 8 units, and every weight and bias drawn
from a per-model seeded normal distribution times 0.5 (set with ``model.set_weights``):

* ``lstm``: ``Input((None, 5), name="x")`` -> ``LSTM(8, return_sequences=True)``
* ``gru``: ``Input((None, 5), name="x")`` -> ``GRU(8)`` (reset_after=True, the default)
* ``simple_rnn``: ``Input((None, 5), name="x")`` -> ``SimpleRNN(8, return_sequences=True)``
* ``bigru``: ``Input((None, 5), name="x")`` -> ``Bidirectional(GRU(8, return_sequences=True))``
* ``masked_lstm``: ``Input((None, 5), name="x")`` -> ``Masking(0.0)`` ->
  ``LSTM(8, return_sequences=True)``
* ``embedding_bilstm``: ``Input((None,), dtype="int32", name="tokens")`` ->
  ``Embedding(20, 5, mask_zero=True)`` -> ``Bidirectional(LSTM(8))`` -> ``Dense(3)``

Inputs have shape (4, 7, 5) (float32 standard normal) or (4, 7) (int32 tokens in [1, 20)),
from a per-model seed, so they are the same on every backend. The masked models get zeros
(padding) at row 1 steps 5..6 (post-padded), row 2 steps 0..1 (pre-padded) and row 3 step 3
(a hole); row 0 is full.

A model that cannot be built, run or saved on a backend is skipped with a printed reason and
leaves no file. The test suite loads these files on TensorFlow (Keras 3's default backend),
runs them on the stored ``input`` and compares with the stored ``output``.
"""
from __future__ import annotations

import os
import sys
import traceback

BACKENDS = ("jax", "torch", "numpy")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT_DIR = os.path.join(HERE, "backends")
BATCH, TIME, FEATURES, UNITS, VOCAB, CLASSES = 4, 7, 5, 8, 20, 3
# (row, first step, end step) spans set to zero (padding) in the masked models' inputs.
PADDING = ((1, 5, 7), (2, 0, 2), (3, 3, 4))
SEEDS = {
    "lstm": 101,
    "gru": 102,
    "simple_rnn": 103,
    "bigru": 104,
    "masked_lstm": 105,
    "embedding_bilstm": 106,
}


def read_backend() -> str:
    backend = os.environ.get("KERAS_BACKEND", "")
    if backend not in BACKENDS:
        raise SystemExit(
            f"set KERAS_BACKEND to one of {', '.join(BACKENDS)} (got {backend!r}); "
            "see this script's docstring"
        )
    return backend


def build(name, keras):
    layers = keras.layers
    if name == "embedding_bilstm":
        inputs = keras.Input((None,), dtype="int32", name="tokens")
        hidden = layers.Embedding(VOCAB, FEATURES, mask_zero=True, name="embedding")(inputs)
        hidden = layers.Bidirectional(layers.LSTM(UNITS, name="lstm"), name="bilstm")(hidden)
        outputs = layers.Dense(CLASSES, name="dense")(hidden)
        return keras.Model(inputs, outputs, name=name)
    inputs = keras.Input((None, FEATURES), name="x")
    if name == "lstm":
        outputs = layers.LSTM(UNITS, return_sequences=True, name="lstm")(inputs)
    elif name == "gru":
        outputs = layers.GRU(UNITS, name="gru")(inputs)
    elif name == "simple_rnn":
        outputs = layers.SimpleRNN(UNITS, return_sequences=True, name="simple_rnn")(inputs)
    elif name == "bigru":
        outputs = layers.Bidirectional(
            layers.GRU(UNITS, return_sequences=True, name="gru"), name="bigru"
        )(inputs)
    elif name == "masked_lstm":
        hidden = layers.Masking(0.0, name="masking")(inputs)
        outputs = layers.LSTM(UNITS, return_sequences=True, name="lstm")(hidden)
    else:
        raise ValueError(name)
    return keras.Model(inputs, outputs, name=name)


def make_input(name, np):
    rng = np.random.default_rng(SEEDS[name] + 1000)
    if name == "embedding_bilstm":
        x = rng.integers(1, VOCAB, size=(BATCH, TIME)).astype(np.int32)
    else:
        x = rng.standard_normal((BATCH, TIME, FEATURES)).astype(np.float32)
    if name in ("masked_lstm", "embedding_bilstm"):
        for row, start, end in PADDING:
            x[row, start:end] = 0
    return x


def make_one(name, backend, output_dir, keras, np) -> bool:
    stem = os.path.join(output_dir, f"{backend}_{name}")
    paths = (stem + ".keras", stem + ".npz")
    try:
        model = build(name, keras)
        rng = np.random.default_rng(SEEDS[name])
        model.set_weights(
            [(rng.standard_normal(w.shape) * 0.5).astype(w.dtype) for w in model.get_weights()]
        )
        x = make_input(name, np)
        y = np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), dtype=np.float32)
        if not np.all(np.isfinite(y)):
            raise ValueError("output is not finite")
        model.save(paths[0])
        np.savez(paths[1], input=x, output=y)
    except Exception as exc:  # noqa: BLE001 - any failure means this backend can't make it
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
        last = traceback.extract_tb(exc.__traceback__)[-1]
        print(
            f"skipped {backend}_{name}: {type(exc).__name__}: {exc} "
            f"(at {os.path.basename(last.filename)}:{last.lineno})"
        )
        return False
    print(f"wrote {paths[0]} and {os.path.basename(paths[1])} (output {y.shape})")
    return True


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    backend = read_backend()
    output_dir = argv[0] if argv else DEFAULT_OUTPUT_DIR

    import keras  # only now: KERAS_BACKEND is read when keras is first imported
    import numpy as np

    if keras.backend.backend() != backend:
        raise SystemExit(f"keras runs on {keras.backend.backend()!r}, wanted {backend!r}")
    if not keras.__version__.startswith("3."):
        raise SystemExit(f"needs Keras 3, found Keras {keras.__version__}")
    os.makedirs(output_dir, exist_ok=True)
    print(f"keras {keras.__version__} on the {backend} backend -> {output_dir}")
    made = [name for name in SEEDS if make_one(name, backend, output_dir, keras, np)]
    print(f"{backend}: made {len(made)} of {len(SEEDS)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
