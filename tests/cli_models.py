"""Small models for the CLI tests.

Keras 3 (``import keras``) and tf_keras (``import tf_keras``) models are built in the same
process: the two coexist (see ``parity.py``), as long as ``TF_USE_LEGACY_KERAS`` stays unset.

Every weight is random, biases included, so a mis-mapped gate or bias shows up in verification.
"""
from __future__ import annotations

import numpy as np

FEATURES = 4

# the layers each model holds, with the ONNX op each must become
KERAS3_SAVED_MODEL_LAYERS = {"enc_lstm": "LSTM", "dec_gru": "GRU"}
KERAS3_FILE_LAYERS = {"seq_rnn": "RNN", "seq_gru": "GRU"}
TF_KERAS_LAYERS = {"legacy_rnn": "RNN", "legacy_lstm": "LSTM"}


def randomize(model, seed: int) -> None:
    """Seeded normal * 0.5 for every weight, biases included."""
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(w.dtype) for w in model.get_weights()])


def keras3_lstm_gru():
    """Keras 3: LSTM (full sequence) into GRU (last step), dynamic time axis."""
    import keras

    inputs = keras.Input((None, FEATURES), name="x")
    hidden = keras.layers.LSTM(5, return_sequences=True, name="enc_lstm")(inputs)
    outputs = keras.layers.GRU(3, name="dec_gru")(hidden)
    model = keras.Model(inputs, outputs, name="keras3_lstm_gru")
    randomize(model, 1)
    return model


def keras3_rnn_gru():
    """Keras 3: SimpleRNN (full sequence) into GRU (full sequence) and a Dense head."""
    import keras

    inputs = keras.Input((None, FEATURES), name="x")
    hidden = keras.layers.SimpleRNN(6, return_sequences=True, name="seq_rnn")(inputs)
    hidden = keras.layers.GRU(4, return_sequences=True, name="seq_gru")(hidden)
    outputs = keras.layers.Dense(2, name="head")(hidden)
    model = keras.Model(inputs, outputs, name="keras3_rnn_gru")
    randomize(model, 2)
    return model


def keras3_dense():
    """Keras 3: no recurrent layer at all."""
    import keras

    inputs = keras.Input((FEATURES,), name="x")
    outputs = keras.layers.Dense(3, activation="tanh", name="head")(keras.layers.Dense(5, name="body")(inputs))
    model = keras.Model(inputs, outputs, name="keras3_dense")
    randomize(model, 3)
    return model


def tf_keras_rnn_lstm():
    """tf_keras (Keras 2): SimpleRNN (full sequence) into LSTM (last step)."""
    import tf_keras

    inputs = tf_keras.Input((None, FEATURES), name="x")
    hidden = tf_keras.layers.SimpleRNN(4, return_sequences=True, name="legacy_rnn")(inputs)
    outputs = tf_keras.layers.LSTM(3, name="legacy_lstm")(hidden)
    model = tf_keras.Model(inputs, outputs, name="tf_keras_rnn_lstm")
    randomize(model, 4)
    return model


def save_tf_keras(model, saved_model_dir: str, h5_path: str) -> None:
    """A tf_keras model as a SavedModel directory and as a legacy .h5 file."""
    model.save(saved_model_dir, save_format="tf")
    model.save(h5_path, save_format="h5")
