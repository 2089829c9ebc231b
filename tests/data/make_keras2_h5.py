"""Build tests/data/keras2_lstm_dense.h5: a small model saved as .h5 by TensorFlow 2.15's Keras 2.

    /work/venv-old/bin/python tests/data/make_keras2_h5.py [OUTPUT]

Run it with a TensorFlow 2.15 environment, where ``import keras`` is Keras 2.15 (this script
refuses anything else). The model is an LSTM (last step) into a Dense head; every weight,
biases included, comes from a fixed seed. tests/test_cli_flags.py converts the file with
``--keras`` and compares onnxruntime with the same file loaded back in Keras.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUTPUT = os.path.join(HERE, "keras2_lstm_dense.h5")
FEATURES, UNITS, OUTPUTS, SEED = 4, 5, 2, 2015


def build_model():
    import keras
    import numpy as np

    if not keras.__version__.startswith("2."):
        raise SystemExit(f"needs Keras 2 (TensorFlow 2.15's keras), found Keras {keras.__version__}")
    inputs = keras.Input((None, FEATURES), name="sequence")
    hidden = keras.layers.LSTM(UNITS, name="keras2_lstm")(inputs)
    outputs = keras.layers.Dense(OUTPUTS, name="keras2_head")(hidden)
    model = keras.Model(inputs, outputs, name="keras2_lstm_dense")
    rng = np.random.default_rng(SEED)
    model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(w.dtype) for w in model.get_weights()])
    return model


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    output = argv[0] if argv else DEFAULT_OUTPUT
    build_model().save(output, save_format="h5")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
