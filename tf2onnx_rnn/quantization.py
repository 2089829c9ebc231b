"""Quantizing a converted model within an error budget (``quantize=``): the driver.

The units of the written model (``rewriters.written.quantize.units``) each go as far as the mode allows
(``weights``: int8 weights, float compute; ``dynamic``: onnxruntime's integer kernels where it has them, int8
weights elsewhere), rounded with the calibration data's second moments where given. The model is then measured
against the float conversion on that data (or, without it, on the verification's seeded random rounds): each
output's largest error relative to its largest magnitude must stay within ``max_error``. Past it, the unit
whose own quantization costs most steps down one precision (integer -> weights -> float), and the model is
measured again, until it fits. The report names every unit's precision, checked against the written ops.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import onnx

from .calibration import calibration_rounds, observed, outputs
from .errors import ConversionError, first_line, param
from .feeds import feed_rounds
from .keras_layers import weight_key
from .report import LayerRow, QuantizationReport

logger = logging.getLogger("tf2onnx_rnn")

MODES = ("weights", "dynamic", "static")
# the largest output error a quantization may cost, relative to the output's largest magnitude on the data: TFLite's
# dynamic-range int8 of the benchmark's Japanese Vowels models is 0.96-2.68% off; within 1% on the calibration data
# ours stay below it on the held-out data (benchmarks/int8.py, docs/quantization.md)
MAX_ERROR = 0.01
# onnxruntime's DynamicQuantizeLSTM against its float LSTM (128 units, 100 steps): 1.10x the time at batch 1, 1.08x
# at 4, 0.85x at 16 (docs/performance.md#int8): a model of a fixed batch of 1 keeps its LSTMs' compute float
SLOWER_AT_BATCH_ONE = frozenset({"LSTM"})


class OverBudget(ConversionError):
    """No layer can be quantized within the budget: the quantization asked for is refused."""

    exit_code = 1  # the command line's status for a failed check, not bad input


def check_mode(quantize: Optional[str], max_error=None, row=None, training: bool = False) -> None:
    """Refuse, in one line, a mode or budget (None: not given) that cannot be, or a mode the target's runtime does
    not compute."""
    if quantize is None:
        if max_error is not None:
            raise ConversionError(f"{param('max_error')} is a quantization's budget: give {param('quantize')} too")
        return
    max_error = MAX_ERROR if max_error is None else max_error
    if quantize not in MODES:
        raise ConversionError(f"unknown {param('quantize')} {quantize!r}; known: {', '.join(MODES)}")
    if isinstance(max_error, bool) or not isinstance(max_error, (int, float)) or not 0 < max_error < float("inf"):
        raise ConversionError(f"{param('max_error')} must be a number > 0, got {max_error!r}")
    if training:
        raise ConversionError(f"{param('quantize')} and the training target exclude each other (training updates "
                              "float weights)")
    if quantize == "static" and row is not None and "QuantizeLinear" in row.lacks:
        raise ConversionError(f"{param('quantize')} 'static' writes QDQ, which {row.name} does not compute from "
                              f"ONNX (measured): quantize 'weights' for it" +
                              (f"; {row.own_quantizer}" if row.own_quantizer else ""))
    if quantize == "dynamic" and row is not None and "com.microsoft" not in row.domains:
        raise ConversionError(f"{param('quantize')} 'dynamic' writes onnxruntime's integer kernels, which {row.name} "
                              f"does not compute: quantize 'weights' for it")


def quantize(model_proto: onnx.ModelProto, mode: str, max_error: float, calibration, layer_names: dict,
             runtimes: tuple = (), owners: Optional[dict] = None) -> tuple:
    """(the quantized model, its :class:`QuantizationReport`). ``layer_names``: a recurrent node's name -> its
    layer's. ``runtimes``: the rows of the runtimes the model's form is written for (a target's), whose facts
    bound the form. ``owners``: a source weight's ``keras_layers.weight_key`` -> its layer's name (the other units'
    names)."""
    from .rewriters.written.quantize import forms
    from .rewriters.written.quantize.forms import Precision
    from .rewriters.written.quantize.rounding import rounded
    from .rewriters.written.quantize.units import SMALLEST, hoisted, units_of

    model_proto = hoisted(model_proto)  # a step's weights are the main graph's: stored once
    units = units_of(model_proto)
    if not units:
        raise ConversionError(f"{param('quantize')}: the model holds no weight to quantize (no recurrent node, "
                              f"MatMul, Gemm or Conv reads a float constant of {SMALLEST} values or more)")
    if calibration is not None:
        rounds, data = calibration_rounds(model_proto, calibration), "the calibration data"
        reference, second, spans = observed(model_proto, units, rounds, spans=mode == "static")
    else:
        _, rounds = feed_rounds(model_proto, 0, None)  # the verification's seeded random rounds
        data, second, spans = "seeded random inputs (no calibration data given)", {}, {}
        reference = outputs(model_proto, rounds)
    rows = sum(len(r[0]) for r in rounds)
    data += f" ({rows} row{'s' * (rows != 1)})"
    stored = {w.name: rounded(_value(model_proto, w.name), (0, w.channel_axis) if w.per_direction
                              else (w.channel_axis,), w.contracted_axis, second.get(w.name))
              for unit in units for w in unit.weights}
    slower = SLOWER_AT_BATCH_ONE if _batch_of_one(model_proto) else frozenset()
    top = {u.name: Precision.INTEGER if mode == "dynamic" and u.integer and u.op not in slower else
           Precision.STATIC if mode == "static" and u.name in spans else Precision.WEIGHTS for u in units}
    kept = _kept_float(units, mode, runtimes)
    # with no QDQ anywhere in the model its runtimes compute int8 weights: those units store them so
    held = Precision.WEIGHTS if all(top[u.name] != Precision.STATIC for u in units if u.name not in kept) \
        else Precision.FLOAT
    top.update({name: held for name in kept})

    def measured(chosen: dict) -> tuple:
        model = forms.written(model_proto, units, chosen, stored, spans)
        try:
            got = outputs(model, rounds)
        except Exception as error:  # noqa: BLE001 - onnxruntime refuses a form: past every budget, and said so
            failed.update({name: first_line(error) for name, p in chosen.items() if p >= Precision.INTEGER})
            return model, [(float("inf"), float("inf"))] * len(reference)
        return model, [_relative(g, r) for g, r in zip(got, reference)]

    failed: dict = {}  # units whose integer form onnxruntime refused -> why
    chosen = dict(top)
    model, errors = measured(chosen)
    alone: dict = {}
    while max(e for _, e in errors) > max_error and any(p > Precision.FLOAT for p in chosen.values()):
        if not alone:  # each unit's own cost: the model with it alone at its top precision
            alone = {u.name: max(e for _, e in measured({u.name: top[u.name]})[1]) for u in units
                     if top[u.name] > Precision.FLOAT}
        worst = max((name for name, p in chosen.items() if p > Precision.FLOAT), key=lambda n: (alone[n], chosen[n]))
        chosen[worst] = chosen[worst].below
        model, errors = measured(chosen)
    if all(p == Precision.FLOAT for p in chosen.values()) and not alone:  # no unit the form's runtimes compute
        raise ConversionError(f"{param('quantize')} {mode!r}: " + "; ".join(dict.fromkeys(kept.values())))
    if all(p == Precision.FLOAT for p in chosen.values()):
        raise OverBudget(f"{param('quantize')}: no layer stays within {param('max_error')} {max_error:g} in int8 "
                              f"(alone, the least costly is {min(alone.values()):.2%} off on {data}): the model "
                              "stays float; raise the budget to quantize it")
    for unit in units:  # the report's claims, read back from the written ops
        why = forms.int8_held(model, unit, chosen[unit.name]) if chosen[unit.name] > Precision.FLOAT else ""
        if why:
            raise RuntimeError(f"{unit.name} would be reported {chosen[unit.name].words}, but {why}")
    report = QuantizationReport(mode, max_error, data, float_bytes=model_proto.ByteSize(), bytes=model.ByteSize(),
                                scales=[float(np.max(np.abs(r))) if np.size(r) else 0.0 for r in reference])
    names = [o.name for o in model.graph.output]
    report.errors = [(names[k], abs_error, relative) for k, (abs_error, relative) in enumerate(errors)]
    named = _named(model_proto, units, layer_names, owners or {})
    report.layers = [LayerRow(named[unit.name], unit.op, chosen[unit.name].words,
                              _why(unit, chosen[unit.name], top[unit.name], mode, alone, failed, slower, kept,
                                   max_error))
                     for unit in units]
    logger.info("tf2onnx_rnn: %s", "; ".join(report.lines()))
    return model, report


def _why(unit, precision, top, mode: str, alone: dict, failed: dict, slower: frozenset, kept: dict,
         max_error: float) -> str:
    """Why ``unit`` is at ``precision`` and not further ("" where it is at the most its mode gives)."""
    from .rewriters.written.quantize.forms import Precision

    if unit.name in kept and precision == top:
        return kept[unit.name]
    if precision != top:
        if unit.name in failed and alone.get(unit.name) == float("inf"):
            return f"onnxruntime fails on its {'QDQ' if mode == 'static' else 'integer'} form: {failed[unit.name]}"
        cost = alone.get(unit.name, 0)
        return f"{cost:.2%} off alone at {top.words}: " + \
            ("past the budget" if cost > max_error else "past the budget with the others")
    if precision != Precision.WEIGHTS or mode == "weights":
        return ""
    if mode == "static":
        return "what it multiplies is computed in a Scan's step: no tensor of the graph to calibrate"
    return _why_float_compute(unit, slower)


def _why_float_compute(unit, slower: frozenset) -> str:
    """Why ``dynamic`` leaves a unit's compute float."""
    if unit.op in slower:
        return "at batch 1 onnxruntime's integer kernel is slower than its float one"
    if unit.op == "MatMul":
        return "its weight is read in a Scan's step or by several nodes: no one integer kernel computes them all"
    return "onnxruntime has no integer kernel for it"


def _kept_float(units: list, mode: str, runtimes: tuple) -> dict:
    """Unit name -> why a runtime the form is for computes it in no QDQ form (``static``: a recurrent node in
    OpenVINO, whose weights must be constants in a model holding QDQ)."""
    refusing = [row for row in runtimes if not row.qdq_computed_recurrent_weights]
    if mode != "static" or not refusing:
        return {}
    return {u.name: f"{refusing[0].name} computes no {u.op} of dequantized weights in a QDQ model (they must be "
                    "constants)" for u in units if u.hidden}


def _batch_of_one(model_proto: onnx.ModelProto) -> bool:
    """Whether every input the model is fed has a fixed batch of 1."""
    given = {t.name for t in model_proto.graph.initializer}
    dims = [i.type.tensor_type.shape.dim for i in model_proto.graph.input if i.name not in given]
    return bool(dims) and all(d and d[0].HasField("dim_value") and d[0].dim_value == 1 for d in dims)


def _value(model_proto: onnx.ModelProto, name: str) -> np.ndarray:
    return onnx.numpy_helper.to_array(next(t for t in model_proto.graph.initializer if t.name == name))


def _relative(got: np.ndarray, want: np.ndarray) -> tuple:
    """(largest abs error, relative to the largest magnitude); NaN or Inf where the float model has none is
    past every budget."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or np.any(~np.isfinite(got) & np.isfinite(want)):
        return float("inf"), float("inf")
    error = float(np.max(np.abs(got - want))) if got.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    return error, error / scale if scale > 0 else (0.0 if error == 0 else float("inf"))


def _named(model_proto: onnx.ModelProto, units: list, layer_names: dict, owners: dict) -> dict:
    """Unit name -> the report's name of its layer: a recurrent node's layer, the source layer holding its weight,
    or else the scope its node is in."""
    named = {}
    for unit in units:
        if unit.name in layer_names:  # a recurrent node: its layer, its weights not read
            named[unit.name] = layer_names[unit.name]
            continue
        owner = next((owners[key] for key in (weight_key(_value(model_proto, w.name)) for w in unit.weights)
                      if key in owners), None) if owners else None
        parts = [p for p in unit.name.split("/") if p]
        named[unit.name] = owner or (parts[-2] if len(parts) > 2 else unit.name)
    return named
