"""The ONNX recurrent equations' shared first step, on values: each gate's input and recurrent terms.

The cell modules write their step equation (``CellKind.step``) with it; the unrolled reader uses
that equation to check a first step TensorFlow folded.
"""
from __future__ import annotations

import numpy as np


def gate_terms(x: np.ndarray, h: np.ndarray, weights: dict, gates: int) -> tuple:
    """Per gate, in ONNX order: (``x @ W_g^T + Wb_g``, ``h @ R_g^T + Rb_g``), each [B, H]."""
    W, R, B = weights["W"], weights["R"], weights["B"]
    input_bias, recurrent_bias = np.split(B, 2)
    inputs = np.split(x @ W.T + input_bias, gates, axis=-1)
    recurrents = np.split(h @ R.T + recurrent_bias, gates, axis=-1)
    return list(inputs), list(recurrents)
