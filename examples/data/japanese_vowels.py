"""The Japanese Vowels set (UCI), bundled: 640 utterances of 12 LPC cepstrum channels, 7 to 29 steps.

Nine speakers said /ae/; the task is to tell the speaker. 270 utterances train, 370 test. Source:
M. Kudo, J. Toyama, M. Shimbo, "Multidimensional curve classification using passing-through
regions", Pattern Recognition Letters 20 (11-13), 1999; the UCI Machine Learning Repository,
licensed CC BY 4.0. ``make_japanese_vowels.py`` rebuilds the file from the archive's text files.
"""
from __future__ import annotations

import os

import numpy as np

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "japanese_vowels.npz")
STEPS, CHANNELS, CLASSES = 29, 12, 9


def load(split: str = "train", pad: str = "post") -> tuple:
    """(x float32 [N, 29, 12] zero-padded after (``pad="post"``) or before (``"pre"``) each utterance,
    lengths int32 [N], labels int32 [N]) of ``split``: "train" or "test"."""
    if split not in ("train", "test") or pad not in ("post", "pre"):
        raise ValueError(f"split is 'train' or 'test' and pad 'post' or 'pre', got {split!r}, {pad!r}")
    with np.load(PATH) as data:
        values, lengths, labels, train = (data[key] for key in ("values", "lengths", "labels", "train"))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    chosen = np.flatnonzero(train if split == "train" else ~train)
    x = np.zeros((len(chosen), STEPS, CHANNELS), np.float32)
    for row, index in enumerate(chosen):
        steps = values[starts[index]:starts[index] + lengths[index]]
        if pad == "post":
            x[row, :len(steps)] = steps
        else:
            x[row, STEPS - len(steps):] = steps
    return x, lengths[chosen].astype(np.int32), labels[chosen].astype(np.int32)
