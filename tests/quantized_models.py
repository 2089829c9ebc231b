"""Small recurrent classifiers trained in the suite on the bundled Japanese Vowels set (examples/data), for the
quantization tests: real, variable-length, post-padded data behind a ``Masking`` layer, with trained weights.

One model per (flavor, kind), trained once per process (seeded) and kept; the float accuracy on the held-out
test utterances is kept beside it.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import numpy as np

import parity

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "data"))
import japanese_vowels  # noqa: E402

KINDS = ("LSTM", "GRU", "SimpleRNN", "Bidirectional", "gelu")  # gelu: a SimpleRNN no native node computes (a Scan)
UNITS, EPOCHS = 32, 20


@dataclass
class Trained:
    model: object
    accuracy: float  # on the test utterances, float


def data(split: str, pad: str = "post") -> tuple:
    return japanese_vowels.load(split, pad)


@functools.lru_cache(maxsize=None)
def trained(flavor: str, kind: str) -> Trained:
    K = parity.keras_module(flavor)
    K.utils.set_random_seed(1)
    inputs = K.Input((None, japanese_vowels.CHANNELS), name="x")
    masked = K.layers.Masking(0.0)(inputs)
    if kind == "Bidirectional":
        hidden = K.layers.Bidirectional(K.layers.LSTM(UNITS // 2))(masked)
    elif kind == "gelu":
        hidden = K.layers.SimpleRNN(UNITS, activation="gelu")(masked)
    else:
        hidden = getattr(K.layers, kind)(UNITS)(masked)
    model = K.Model(inputs, K.layers.Dense(japanese_vowels.CLASSES)(hidden))
    model.compile(optimizer=K.optimizers.Adam(0.003),
                  loss=K.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, _, y = data("train")
    model.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0)
    test_x, _, test_y = data("test")
    logits = np.asarray(model(test_x, training=False))
    return Trained(model, float(np.mean(logits.argmax(1) == test_y)))
