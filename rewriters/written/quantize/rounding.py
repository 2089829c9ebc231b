"""int8 weights with one scale per output channel, rounded to the nearest step or, given the second moments of
what the weight multiplies, with each column's rounding error carried into the columns not yet rounded.

Carrying the error (as GPTQ does, with ``H = sum x x^T`` of the calibration data's inputs) keeps the product
``x W`` close to the float one on that data rather than each weight close to its own value: on the bundled
Japanese Vowels models it brings the largest logit error of an int8 LSTM, GRU or SimpleRNN to between a quarter
and two thirds of rounding to the nearest step's. Scales are symmetric (zero point 0), ``max |w| / 127`` per
channel; a weight on such a grid already (read from a quantized file) keeps its values and scales.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

LIMIT = 127  # symmetric int8: -127..127, so that negating a weight keeps its step
DAMPING = 0.01  # of the mean diagonal, added to H: columns the data never moves still get an inverse


@dataclass(frozen=True)
class Rounded:
    """A weight in int8: ``values`` (the weight's shape) and ``scales`` (one per channel, shaped to broadcast
    against it: 1 on every other axis)."""

    values: np.ndarray
    scales: np.ndarray

    def dequantized(self) -> np.ndarray:
        return self.values.astype(np.float32) * self.scales


def rounded(weight: np.ndarray, channel_axes: tuple, contracted_axis: Optional[int],
            moments: Optional[list] = None) -> Rounded:
    """``weight`` in int8 with one scale per index of ``channel_axes``. ``moments``: for each index of the
    first channel axis where it is a direction (recurrent weights), else one, ``H`` over ``contracted_axis``;
    None (or a Conv's weight) rounds to the nearest step."""
    weight = np.asarray(weight, np.float32)
    others = tuple(a for a in range(weight.ndim) if a not in channel_axes)
    scales = np.max(np.abs(weight), axis=others, keepdims=True) / LIMIT
    scales = np.where(scales > 0, scales, 1.0).astype(np.float32)
    kept = on_grid(weight, scales)
    if kept is not None:  # quantized already (a quantized TFLite file's weights): its own values, exactly
        return Rounded(np.rint(weight / kept).astype(np.int8), kept)
    if moments is None or contracted_axis is None:
        values = np.clip(np.rint(weight / scales), -LIMIT, LIMIT)
        return Rounded(values.astype(np.int8), scales)
    values = np.empty(weight.shape, np.int8)
    if len(moments) == 1:  # one H for the whole weight: rows are the channels
        rows = np.moveaxis(weight, contracted_axis, -1).reshape(-1, weight.shape[contracted_axis])
        steps = np.broadcast_to(scales, weight.shape)
        steps = np.moveaxis(steps, contracted_axis, -1).reshape(rows.shape)[:, 0]
        carried = carry_errors(rows, steps, moments[0])
        moved = list(np.moveaxis(weight, contracted_axis, -1).shape)
        values[...] = np.moveaxis(carried.reshape(moved), -1, contracted_axis)
        return Rounded(values, scales)
    for direction, hessian in enumerate(moments):  # [directions, rows, inputs]: contracted last
        values[direction] = carry_errors(weight[direction], scales[direction, :, 0], hessian)
    return Rounded(values, scales)


def on_grid(weight: np.ndarray, scales: np.ndarray) -> Optional[np.ndarray]:
    """The scales (shaped as ``scales``: one per channel) of a symmetric int8 grid ``weight`` lies on already, or
    None. A weight read from a quantized file keeps its values: a channel's largest value is ``m`` steps of the
    file's scale, ``m`` 127 where the file scaled that channel alone, fewer where its scale served several (a
    TFLite LSTM's gate: one scale per gate's tensor)."""
    largest = scales * LIMIT
    axes = tuple(a for a in range(weight.ndim) if scales.shape[a] == 1)
    found = np.zeros(scales.shape, np.float32)
    for steps in range(LIMIT, LIMIT // 2, -1):
        trial = largest / steps
        q = weight / trial
        fits = np.all(np.abs(q - np.rint(q)) <= 1e-3, axis=axes, keepdims=True) & (found == 0)
        found = np.where(fits, trial, found)
        if np.all(found > 0):
            return found.astype(np.float32)
    return None


def carry_errors(rows: np.ndarray, steps: np.ndarray, hessian: np.ndarray) -> np.ndarray:
    """``rows`` [channels, k] rounded column by column to multiples of ``steps`` [channels], each column's error
    spread over the columns after it as ``hessian`` [k, k] (the inputs' second moments) weighs them."""
    work = rows.astype(np.float64).copy()
    h = np.array(hessian, np.float64)
    dead = np.diag(h) <= 0  # columns the data never moves: rounded to the nearest step, carrying nothing
    h[dead, dead] = 1.0
    h += DAMPING * max(float(np.mean(np.diag(h))), 1e-12) * np.eye(len(h))
    try:
        upper = np.linalg.cholesky(np.linalg.inv(h)).T
    except np.linalg.LinAlgError:  # not positive definite even damped: round to the nearest step
        return np.clip(np.rint(rows / steps[:, None]), -LIMIT, LIMIT).astype(np.int8)
    out = np.empty(rows.shape, np.int8)
    steps = steps.astype(np.float64)
    for column in range(work.shape[1]):
        q = np.clip(np.rint(work[:, column] / steps), -LIMIT, LIMIT)
        out[:, column] = q
        error = (work[:, column] - q * steps) / upper[column, column]
        work[:, column + 1:] -= np.outer(error, upper[column, column + 1:])
    return out
