"""Build the bundled example: a small Keras 3 model with an LSTM and a GRU layer, as a SavedModel.

    python examples/make_example_model.py [OUTPUT_DIR]

The weights come from a fixed seed, so running this again gives an equivalent model
(tests/test_examples.py checks that). The default output is examples/lstm_gru_savedmodel.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(HERE, "lstm_gru_savedmodel")
FEATURES, UNITS, CLASSES, SEED = 8, 16, 3, 1234


def build_model():
    """A sequence classifier: LSTM (all steps) -> GRU (last step) -> Dense softmax."""
    import keras
    import numpy as np

    inputs = keras.Input((None, FEATURES), name="sequence")
    hidden = keras.layers.LSTM(UNITS, return_sequences=True, name="encoder_lstm")(inputs)
    hidden = keras.layers.GRU(UNITS, name="summary_gru")(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="classes")(hidden)
    model = keras.Model(inputs, outputs, name="lstm_gru_classifier")
    rng = np.random.default_rng(SEED)
    model.set_weights([(rng.standard_normal(w.shape) * 0.4).astype(w.dtype) for w in model.get_weights()])
    return model


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    output = argv[0] if argv else DEFAULT_OUTPUT
    model = build_model()
    model.export(output, verbose=False)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
