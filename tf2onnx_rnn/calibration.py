"""Calibration data: the user's inputs as rounds a converted model is fed, and what its weights meet on them.

``calibration`` is an array (the model's one input), a dict of input name -> array, or a list of such dicts
(one round each); arrays are in the source's layout. They are cut into rounds the model takes (a fixed batch:
rounds of that batch) and cast to the inputs' types. :func:`observed` runs the float model on them once: its
outputs, and for each weight of a quantizable unit the sum of ``x^T x`` of what the weight multiplies (the
inputs of a recurrent node at the steps each row keeps, its own output of the step before, a MatMul's first
input), and each unit's input range where a mode calibrates one.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import onnx

from .comparison import one_thread_session
from .errors import ConversionError, param
from .feeds import fed_specs, feeds_of, nchw, transposed

ROWS_PER_ROUND = 128  # rows of a dynamic batch fed at once


def calibration_rounds(model_proto: onnx.ModelProto, calibration) -> list:
    """The rounds (arrays in the order of the inputs a check feeds) of ``calibration``; a
    :class:`ConversionError` in one line for data the model cannot take."""
    specs = fed_specs(model_proto)
    nchw_inputs, _ = transposed(model_proto)
    given = calibration if isinstance(calibration, (list, tuple)) else [calibration]
    if not given:
        raise ConversionError(f"{param('calibration')} holds no data")
    rounds = []
    for entry in given:
        arrays = [_array(entry, name, len(specs)) for name, _, _ in specs]
        arrays = [nchw(a) if name in nchw_inputs else a for (name, _, _), a in zip(specs, arrays)]
        rows = {len(a) for a in arrays}
        if len(rows) != 1 or 0 in rows:
            raise ConversionError(f"{param('calibration')}: every input needs the same number of rows, at least one; "
                                  f"got {sorted(rows)}")
        for (name, shape, dtype), array in zip(specs, arrays):
            _check_shape(name, shape, array)
        rounds.extend(_cut([a.astype(dtype, copy=False) for a, (_, _, dtype) in zip(arrays, specs)],
                           specs[0][1][0] if specs and specs[0][1] else None))
    return rounds


def _array(entry, name: str, inputs: int) -> np.ndarray:
    if isinstance(entry, dict):
        for key in (name, name.split(":")[0], name + ":0"):
            if key in entry:
                return np.asarray(entry[key])
        raise ConversionError(f"{param('calibration')} gives no data for the input {name!r}; it gives "
                              f"{', '.join(map(str, entry)) or 'nothing'}")
    if inputs != 1:
        raise ConversionError(f"{param('calibration')}: the model has {inputs} inputs: give a dict of input name -> "
                              "array (or a list of them)")
    array = np.asarray(entry)
    if array.dtype == object:
        raise ConversionError(f"{param('calibration')} is not an array of numbers")
    return array


def _check_shape(name: str, shape: list, array: np.ndarray) -> None:
    if array.ndim != len(shape) or any(d is not None and d != a for d, a in zip(shape[1:], array.shape[1:])):
        raise ConversionError(f"{param('calibration')} input {name!r} has shape {list(array.shape)}; the model takes "
                              f"{['?' if d is None else d for d in shape]}")


def _cut(arrays: list, batch: Optional[int]) -> list:
    """Rounds of a fixed ``batch`` (the rows past the last whole one dropped, at least one round), or of at most
    :data:`ROWS_PER_ROUND` rows."""
    rows = len(arrays[0])
    size = batch or ROWS_PER_ROUND
    if batch and rows < batch:
        raise ConversionError(f"{param('calibration')} has {rows} rows; the model takes a fixed batch of {batch}")
    stops = range(0, rows - (rows % size if batch else 0), size)
    return [[a[start:start + size] for a in arrays] for start in stops]


def outputs(model_proto: onnx.ModelProto, rounds: list) -> list:
    """Every output of the model over all rounds: one array each, the rounds' rows end to end where the
    output has a batch axis (else the rounds' arrays stacked)."""
    runner, specs = one_thread_session(model_proto), fed_specs(model_proto)
    return _joined([runner.run(None, feeds_of(model_proto, specs, arrays)) for arrays in rounds])


def _joined(results: list) -> list:
    return [np.concatenate([np.reshape(r[k], (-1,)) for r in results]) for k in range(len(results[0]))]


def observed(model_proto: onnx.ModelProto, units: list, rounds: list, spans: bool = False) -> tuple:
    """One run of the float model over ``rounds``: its outputs (as :func:`outputs` gives them), weight name ->
    ``[H, ...]`` (one per direction of a recurrent weight) the second moments of what the weight multiplies
    (none for a weight whose input is not in the main graph) and, with ``spans``, unit name -> (lowest, highest)
    of what its weights multiply (all its ``activations``, one range for them all: every step and direction
    shares it). A recurrent node's moments and range count the steps its rows keep only."""
    taps = [name for unit in units for name in [w.meets for w in unit.weights] + [unit.lengths] if name]
    if spans:
        taps += [name for unit in units for name in unit.activations]
    names = [o.name for o in model_proto.graph.output]
    results, sums, found = [], {}, {}
    for values in _tapped(model_proto, taps, rounds):
        results.append([values[name] for name in names])
        _add_moments(sums, units, values)
        if spans:
            _widen(found, units, values)
    return _joined(results), sums, found


def _tapped(model_proto: onnx.ModelProto, taps: list, rounds: list):
    """Each round's values (name -> array) of the model's outputs and of ``taps`` (tensors of the main graph)."""
    tapped = onnx.ModelProto()
    tapped.CopyFrom(model_proto)
    known = {o.name for o in tapped.graph.output}
    tapped.graph.output.extend([onnx.helper.make_empty_tensor_value_info(name) for name in dict.fromkeys(taps)
                                if name not in known])
    runner, specs = one_thread_session(tapped), fed_specs(model_proto)
    names = [o.name for o in runner.get_outputs()]
    for arrays in rounds:
        yield dict(zip(names, runner.run(None, feeds_of(model_proto, specs, arrays))))


def _widen(found: dict, units: list, values: dict) -> None:
    for unit in (u for u in units if u.activations):
        for name in unit.activations:
            met = np.asarray(values[name], np.float64)
            if unit.hidden:  # X [T, B, I]: the steps each row keeps
                met = met[_kept(values.get(unit.lengths) if unit.lengths else None, met.shape[0], met.shape[1])]
            if met.size:
                low, high = found.get(unit.name, (0.0, 0.0))
                found[unit.name] = (min(low, float(met.min())), max(high, float(met.max())))


def _kept(lengths, steps: int, batch: int) -> np.ndarray:
    """[T, B]: whether row b keeps step t (every step where no lengths are given)."""
    kept = np.arange(steps)[:, None] < (np.asarray(lengths)[None, :] if lengths is not None else steps)
    return np.broadcast_to(kept, (steps, batch))


def _add_moments(sums: dict, units: list, values: dict) -> None:
    for unit in units:
        for weight in unit.weights:
            if weight.meets in values:
                found = _unit_moments(unit, weight, values)
                sums[weight.name] = found if weight.name not in sums else \
                    [a + b for a, b in zip(sums[weight.name], found)]


def _unit_moments(unit, weight, values: dict) -> list:
    met = np.asarray(values[weight.meets], np.float64)
    if not unit.hidden:  # a MatMul's first input: every row of its last axis
        rows = met.reshape(-1, met.shape[-1])
        return [rows.T @ rows]
    kept = _kept(values.get(unit.lengths) if unit.lengths else None, met.shape[0],
                 met.shape[1] if not weight.recurrent else met.shape[2])
    if not weight.recurrent:  # X [T, B, I], the same for every direction
        rows = met[kept]
        return [rows.T @ rows] * (2 if unit.direction == "bidirectional" else 1)
    found = []
    for d in range(met.shape[1]):  # Y [T, D, B, H]: the state a step starts from, at the steps each row keeps
        y = met[:, d]
        backward = d == 1 or unit.direction == "reverse"
        before = np.concatenate([y[1:], np.zeros_like(y[:1])]) if backward else \
            np.concatenate([np.zeros_like(y[:1]), y[:-1]])
        rows = before[kept]
        found.append(rows.T @ rows)
    return found

