"""Rebuild japanese_vowels.npz from the UCR/UEA archive's text files of the UCI Japanese Vowels set.

    python examples/data/make_japanese_vowels.py JapaneseVowels_TRAIN.ts JapaneseVowels_TEST.ts

The ``.ts`` files are those of timeseriesclassification.com (sktime's wheel carries them under
``sktime/datasets/data/JapaneseVowels``). Each line holds 12 channels of one utterance, channels
separated by ``:``, steps by ``,``, the speaker (1-9) last. The arrays keep every step as given
(float32), utterances end to end: ``values`` [steps, 12], ``lengths`` [N], ``labels`` [N] (0-8),
``train`` [N] (True for the 270 training utterances).
"""
from __future__ import annotations

import os
import sys

import numpy as np


def read_ts(path: str) -> tuple:
    series, labels = [], []
    with open(path) as stream:
        in_data = False
        for line in stream:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                in_data = line.lower() == "@data"
                continue
            *channels, label = line.split(":")
            steps = np.array([[float(v) for v in channel.split(",")] for channel in channels], np.float32).T
            series.append(steps)
            labels.append(int(label) - 1)
    return series, labels


def main(train_path: str, test_path: str) -> None:
    train, train_labels = read_ts(train_path)
    test, test_labels = read_ts(test_path)
    series = train + test
    np.savez_compressed(os.path.join(os.path.dirname(os.path.abspath(__file__)), "japanese_vowels.npz"),
                        values=np.concatenate(series), lengths=np.array([len(s) for s in series], np.int32),
                        labels=np.array(train_labels + test_labels, np.int32),
                        train=np.array([True] * len(train) + [False] * len(test)))


if __name__ == "__main__":
    main(*sys.argv[1:3])
