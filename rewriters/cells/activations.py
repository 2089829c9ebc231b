"""Naming the function an activation chain computes, as an ONNX recurrent activation.

A chain is identified by its values, not by its op types: the chain is evaluated on probe
points and compared with each activation ONNX's LSTM/GRU/RNN accept, fitting alpha/beta
where the activation has them. So Keras 3's ``relu6(x + 3) / 6`` and tf_keras's
``clip(0.2 x + 0.5, 0, 1)`` both come out as HardSigmoid, each with its own alpha.

The dense probes cover [-12, 12]; a chain must also agree with the candidate far beyond them
(out to float16's largest value), or ``clip(x, -20, 20)`` and ``min(relu(x), 30)`` would pass
for Affine and Relu, which they are only on the dense range.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..description import Activation, NoMatch
from .evaluate import NotEvaluable

_PROBES = np.concatenate([
    np.linspace(-12.0, 12.0, 2401),
    np.array([-1e-3, 1e-3, -0.5, 0.5, 2.5, -2.5, 3.0, -3.0]),
]).astype(np.float32)
_TOLERANCE = 2e-6
# geometric steps (ratio ~1.03) from the dense range out to 6e4: a kink or clip anywhere there
# shows; float16 chains stay finite (float16's largest value is 65504)
_FAR = np.geomspace(12.5, 6e4, 300)
_FAR_PROBES = np.concatenate([-_FAR[::-1], _FAR]).astype(np.float32)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _candidates(f: Callable[[np.ndarray], np.ndarray]):
    """Yield (Activation, reference function) pairs, parameters fitted from ``f``."""
    yield Activation("Tanh"), np.tanh
    yield Activation("Sigmoid"), _sigmoid
    yield Activation("Relu"), lambda x: np.maximum(x, 0)
    yield Activation("Softsign"), lambda x: x / (1 + np.abs(x))
    yield Activation("Softplus"), lambda x: np.logaddexp(x, 0)

    values = np.asarray(f(_PROBES), dtype=np.float64)
    fm1 = float(f(np.array([-1.0], np.float32))[0])
    f0, f1 = (float(v) for v in f(np.array([0.0, 1.0], np.float32)))

    alpha, beta = _line(_PROBES, values)
    yield Activation("Affine", alpha, beta), lambda x: alpha * x + beta
    # HardSigmoid's linear part, away from its kinks (a float16 chain may saturate just below 1)
    ramp = (values > values.min() + 1e-6) & (values < values.max() - 1e-6)
    if np.count_nonzero(ramp) >= 2:
        slope, offset = _line(_PROBES[ramp], values[ramp])
        if slope > 0:
            yield (Activation("HardSigmoid", slope, offset),
                   lambda x: np.clip(slope * x + offset, 0, 1))
    leak = _round(-fm1)
    yield Activation("LeakyRelu", leak), lambda x: np.where(x >= 0, x, leak * x)
    scale_a = _round(-float(f(np.array([-30.0], np.float32))[0]))
    yield Activation("Elu", scale_a), lambda x: np.where(x >= 0, x, scale_a * np.expm1(x))
    if f1 != 0 and f0 == 0:
        # ScaledTanh: a * tanh(b x); fit a from the saturation, b from f(1)
        a = _round(float(f(np.array([30.0], np.float32))[0]))
        if a != 0 and abs(f1 / a) < 1:
            b = _round(float(np.arctanh(f1 / a)))
            yield Activation("ScaledTanh", a, b), lambda x: a * np.tanh(b * x)


def function_of(activation: Activation) -> Callable[[np.ndarray], np.ndarray]:
    """The numpy function of an ONNX recurrent activation (with its alpha and beta)."""
    alpha, beta = activation.alpha, activation.beta
    functions = {
        "Tanh": np.tanh, "Sigmoid": _sigmoid, "Relu": lambda x: np.maximum(x, 0),
        "Softsign": lambda x: x / (1 + np.abs(x)), "Softplus": lambda x: np.logaddexp(x, 0),
        "Affine": lambda x: alpha * x + beta, "HardSigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "LeakyRelu": lambda x: np.where(x >= 0, x, alpha * x),
        "Elu": lambda x: np.where(x >= 0, x, alpha * np.expm1(x)),
        "ScaledTanh": lambda x: alpha * np.tanh(beta * x),
    }
    return functions[activation.name]


def _line(points: np.ndarray, values: np.ndarray) -> tuple:
    """Least-squares slope and intercept, snapped to short values."""
    slope, intercept = np.polyfit(points.astype(np.float64), values, 1)
    return _round(float(slope)), _round(float(intercept))


def _round(value: float) -> float:
    """Snap a fitted parameter to a short decimal when it is that close (0.2, 1/6, 0.5…)."""
    for denominator in range(1, 13):
        fraction = round(value * denominator) / denominator
        if abs(fraction - value) < 1e-6:
            return fraction
    for digits in range(1, 8):
        rounded = round(value, digits)
        if abs(rounded - value) < 1e-6:
            return rounded
    return value


# how close a chain must come to an activation, by the type the layer computes in: float32 to a few
# units of its last place; a float16 chain's own constants are rounded to float16 (Keras's 1/6 in
# hard_sigmoid is 0.16663, saturating at 0.99976), so it is held to half of float16's unit at 1
_TOLERANCES = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def tolerance_for(element_type: str) -> float:
    """The tolerance of :func:`identify` for a chain computed in ``element_type``."""
    return _TOLERANCES.get(element_type, _TOLERANCE)


def identify(function: Callable[[np.ndarray], np.ndarray], where: str, tolerance: float = _TOLERANCE) -> Activation:
    """The ONNX activation equal to ``function`` on every probe point (within ``tolerance``, relative
    above 1), else :class:`NoMatch`."""
    function = _per_unit(function, where)
    try:
        actual = np.asarray(function(_PROBES), dtype=np.float64)
    except NotEvaluable as error:
        raise NoMatch(f"activation uses {error.reason}", error.node_name) from error
    if actual.shape != _PROBES.shape or not np.all(np.isfinite(actual)):
        raise NoMatch("activation is not an element-wise function", where)
    with np.errstate(all="ignore"):
        far = _far_values(function)
    for activation, reference in _candidates(function):
        expected = reference(_PROBES.astype(np.float64))
        if np.max(np.abs(expected - actual) / np.maximum(1.0, np.abs(expected))) <= tolerance \
                and far is not None and _agrees(reference, far, tolerance):
            return activation
    raise NoMatch("activation has no exact ONNX recurrent equivalent", where)


def _per_unit(function: Callable[[np.ndarray], np.ndarray], where: str) -> Callable[[np.ndarray], np.ndarray]:
    """``function`` on 1-D points, evaluated on them as a column: a constant of the chain with
    one value per unit (``tanh(x) * [0.5, 2]``) then broadcasts to one column per unit, and the
    chain is one activation only when every column is the same (ONNX applies one activation to
    every unit)."""
    def on_points(points: np.ndarray) -> np.ndarray:
        points = np.asarray(points)
        try:
            values = np.asarray(function(points.reshape(-1, 1)))
        except ValueError as error:  # a constant that does not broadcast against a column
            raise NoMatch(f"activation is not an element-wise function ({error})", where) from error
        if values.ndim < 2 or values.shape[-2] != points.size or int(np.prod(values.shape[:-2])) != 1:
            raise NoMatch("activation is not an element-wise function", where)
        values = values.reshape(points.size, -1)
        first = values[:, :1]
        if not np.all((values == first) | (np.isnan(values) & np.isnan(first))):
            raise NoMatch("activation differs between units (a constant with one value per unit)", where)
        return values[:, 0]

    return on_points


def _far_values(function: Callable[[np.ndarray], np.ndarray]):
    """``function`` on the far probes (None when it does not evaluate there element-wise)."""
    try:
        values = np.asarray(function(_FAR_PROBES), dtype=np.float64)
    except (NotEvaluable, NoMatch):
        return None
    return values if values.shape == _FAR_PROBES.shape else None


def _agrees(reference: Callable[[np.ndarray], np.ndarray], actual: np.ndarray, tolerance: float) -> bool:
    """Whether ``reference`` gives ``actual`` on the far probes: within the tolerance, or the
    same infinity (NaN never agrees)."""
    with np.errstate(all="ignore"):
        expected = np.asarray(reference(_FAR_PROBES.astype(np.float64)), dtype=np.float64)
        close = np.abs(expected - actual) <= tolerance * np.maximum(1.0, np.abs(expected))
    return bool(np.all(close | (expected == actual)))
