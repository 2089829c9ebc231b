"""Comparing a converted model's outputs with its source's, output by output, over the rounds of
inputs :mod:`.feeds` makes.

An output passes only when:

- its shape and its dtype are those of the reference (the Keras model, SavedModel, TFLite interpreter or
  TensorFlow graph);
- it is NaN exactly where the reference is NaN, and +Inf / -Inf exactly where the reference
  has the same infinity (matching NaNs and infinities count as equal);
- everywhere else the absolute difference is within the tolerance.

What the two models do differently as a whole (the number of outputs, the runtime or the reference
failing on an input) fails the result too: comparing never raises because the models differ.
:meth:`VerificationResult.reason` says in one line what failed first; the table lists every output with
its max abs error and its NaN counts, ONNX vs the reference.
"""
from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import onnx

from .errors import first_line
from .feeds import feed_rounds, feeds_of, nchw, nhwc, streamed_states, transposed


@dataclass
class OutputCheck:
    """One output, over every round.

    ``max_abs_error`` is the largest ``|ONNX - reference|`` where both are finite; it is NaN
    when a NaN faces anything but a NaN, Inf when an infinity faces anything but the same
    infinity or when the shapes differ (nothing could be compared). ``reason`` says why the
    output failed, in the first round it failed ("" when it passed).
    """

    name: str
    max_abs_error: float
    passed: bool
    onnx_nan: int = 0  # NaN values in the ONNX output, summed over the rounds
    reference_nan: int = 0  # NaN values in the reference's output, summed over the rounds
    reason: str = ""


@dataclass
class VerificationResult:
    """Every output's check, and ``problem``: a failure of the comparison as a whole."""

    tolerance: float
    checks: list = field(default_factory=list)
    problem: str = ""
    reference: str = "TensorFlow"  # what the ONNX model was compared with, as the messages name it
    rounds: int = 1
    values: bool = True  # False: only the outputs' shapes and dtypes were compared
    onnx_loaded: bool = True  # onnxruntime loaded the ONNX model
    reference_failed: bool = False  # the reference, not onnxruntime, failed on an input: nothing was learnt
    input_shapes: list = field(default_factory=list)  # each round's input shapes
    # each round both models ran: ({ONNX input: shape fed}, {ONNX output: shape onnxruntime gave}), which
    # the converted model's dimension names are derived from (dim_names)
    measured: list = field(default_factory=list)
    runtime: str = "onnxruntime"  # what ran the ONNX model

    @property
    def passed(self) -> bool:
        return not self.problem and bool(self.checks) and all(c.passed for c in self.checks)

    def reason(self) -> str:
        """What failed first, in one line ("" when verification passed)."""
        for check in self.checks:
            if not check.passed:
                return f"output {check.name!r}: {check.reason}"
        if self.problem:
            return self.problem
        if not self.checks:
            return "no output was compared"
        return ""

    def table(self) -> str:
        rounds = f"{self.rounds} round{'s' if self.rounds != 1 else ''} of inputs"
        onnx_side = "ONNX" if self.runtime == "onnxruntime" else f"ONNX in {self.runtime}"
        lines = [f"verification (tolerance {self.tolerance:g}; {onnx_side} vs {self.reference}; {rounds}):"
                 if self.values else f"output shapes and dtypes (ONNX vs {self.reference}; {rounds}):"]
        for check in self.checks:
            compared = f"max abs error {check.max_abs_error:.3g}" if self.values else "shape and dtype"
            lines.append(f"  {check.name}: {compared} {'ok' if check.passed else 'FAILED'}")
            detail = f"    NaN: ONNX {check.onnx_nan}, {self.reference} {check.reference_nan}"
            lines.append(detail + (f"; {check.reason}" if check.reason else ""))
        if self.problem:
            lines.append(f"  FAILED: {self.problem}")
        elif not self.checks:
            lines.append("  FAILED: no output was compared")
        return "\n".join(lines)


# the runtime a comparison runs the ONNX model in, where not onnxruntime (runtime_check.verify_in_runtime)
RUNNER: contextvars.ContextVar = contextvars.ContextVar("tf2onnx_rnn_runner", default=None)


def one_thread_session(model_proto: onnx.ModelProto):
    """An onnxruntime CPU session of a model on one thread, a failing run reported by its caller, not logged."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # a failing run is reported in the result, not logged to stderr
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


# -- comparing one output ------------------------------------------------------------------------
_FINITE, _NAN, _POS_INF, _NEG_INF = range(4)
_KIND_NAMES = {_FINITE: "a finite value", _NAN: "NaN", _POS_INF: "+Inf", _NEG_INF: "-Inf"}


@dataclass
class _Outcome:
    """One output in one round."""

    error: float
    onnx_nan: int
    reference_nan: int
    reason: str = ""


def _numeric(array: np.ndarray) -> bool:
    return array.dtype.kind in "biufc"


def _nan_count(array: np.ndarray) -> int:
    return int(np.count_nonzero(np.isnan(array))) if array.dtype.kind in "fc" else 0


def _kinds(array: np.ndarray) -> np.ndarray:
    """Per element: finite, NaN, +Inf or -Inf."""
    kinds = np.full(array.shape, _FINITE, dtype=np.int8)
    if array.dtype.kind in "fc":
        kinds[np.isnan(array)] = _NAN
        infinite = np.isinf(array)
        positive = np.real(array) > 0
        kinds[infinite & positive] = _POS_INF
        kinds[infinite & ~positive] = _NEG_INF
    return kinds


def _index(flat: int, shape: tuple) -> str:
    return str([int(i) for i in np.unravel_index(flat, shape)]) if shape else "[]"


# (ONNX dtype, source dtype) that differ by design: tf2onnx writes bfloat16 (Keras 3's mixed_bfloat16) as float16
_WRITTEN_AS = {("float16", "bfloat16")}


def _compare_output(actual, expected, tolerance: float, reference: str, values: bool = True) -> _Outcome:
    actual, expected = np.asarray(actual), np.asarray(expected)
    onnx_nan, reference_nan = _nan_count(actual), _nan_count(expected)
    differences = []
    if actual.dtype != expected.dtype and (values or (actual.dtype.name, expected.dtype.name) not in _WRITTEN_AS):
        differences.append(f"dtype {actual.dtype} vs {reference} {expected.dtype}")
    if actual.shape != expected.shape:
        differences.insert(0, f"shape {actual.shape} vs {reference} {expected.shape}")
        return _Outcome(math.inf, onnx_nan, reference_nan, ", ".join(differences))
    if not values:
        return _Outcome(0.0, onnx_nan, reference_nan, ", ".join(differences))
    error, reason = _compare_values(actual, expected, tolerance, reference)
    if reason:
        differences.append(reason)
    return _Outcome(error, onnx_nan, reference_nan, ", ".join(differences))


def _compare_values(actual: np.ndarray, expected: np.ndarray, tolerance: float, reference: str) -> tuple:
    """(max abs error, why the values fail or "") of two arrays of one shape."""
    if not (_numeric(actual) and _numeric(expected)):
        unequal = np.flatnonzero(actual != expected)
        if unequal.size:
            return math.inf, (f"values differ from {reference}'s at {unequal.size} position(s), "
                              f"first at {_index(unequal[0], actual.shape)}")
        return 0.0, ""
    wide = np.complex128 if "c" in (actual.dtype.kind, expected.dtype.kind) else np.float64
    onnx_values, reference_values = actual.astype(wide).ravel(), expected.astype(wide).ravel()
    onnx_kinds, reference_kinds = _kinds(onnx_values), _kinds(reference_values)
    both_finite = (onnx_kinds == _FINITE) & (reference_kinds == _FINITE)
    error, worst = 0.0, None
    if both_finite.any():
        differences = np.abs(onnx_values[both_finite] - reference_values[both_finite])
        worst = int(np.flatnonzero(both_finite)[np.argmax(differences)])
        error = float(np.max(differences))
    mismatched = np.flatnonzero(onnx_kinds != reference_kinds)
    if mismatched.size:
        first = mismatched[0]
        pair = (onnx_kinds[first], reference_kinds[first])
        same_pair = int(np.count_nonzero((onnx_kinds[mismatched] == pair[0])
                                         & (reference_kinds[mismatched] == pair[1])))
        reason = (f"ONNX gives {_KIND_NAMES[pair[0]]} where {reference} gives {_KIND_NAMES[pair[1]]} "
                  f"at {same_pair} position(s), first at {_index(first, actual.shape)}")
        if same_pair < mismatched.size:
            reason += f"; {mismatched.size - same_pair} other NaN/Inf mismatch(es)"
        involves_nan = ((onnx_kinds[mismatched] == _NAN) | (reference_kinds[mismatched] == _NAN)).any()
        return (math.nan if involves_nan else math.inf), reason
    if not error <= tolerance:
        return error, f"max abs error {error:.3g} at {_index(worst, actual.shape)} exceeds the tolerance {tolerance:g}"
    return error, ""


def _worse(a: float, b: float) -> float:
    """The larger error, NaN above everything."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def _check(name: str, outcomes: list, tolerance: float, rounds: int) -> OutputCheck:
    error, reason = 0.0, ""
    for number, outcome in enumerate(outcomes, 1):
        error = _worse(error, outcome.error)
        if outcome.reason and not reason:
            reason = outcome.reason + (f" (round {number} of {rounds})" if rounds > 1 else "")
    return OutputCheck(name, error, not reason, sum(o.onnx_nan for o in outcomes),
                       sum(o.reference_nan for o in outcomes), reason)


# -- comparing models --------------------------------------------------------------------------
def _shapes(arrays: Sequence[np.ndarray]) -> str:
    return ", ".join(str(tuple(np.shape(a))) for a in arrays)

def compare(reference: Callable[[list], Sequence[np.ndarray]], model_proto: onnx.ModelProto,
            tolerance: float = 1e-4, seed: int = 0, inputs: Optional[list] = None,
            reference_name: str = "TensorFlow", values: bool = True) -> VerificationResult:
    """Compare ``reference(arrays)`` (outputs in ONNX output order) with onnxruntime.

    Without ``inputs``, one round per :data:`ROUNDS` entry on seeded random inputs; with
    ``inputs`` (arrays in ONNX input order), one round on those. A streamed model's state inputs
    are fed zeros (the model's usual start), defaults or not, and are not the reference's; its state
    outputs are not compared (the reference has none). ``values=False`` compares each output's shape and
    dtype only.
    """
    state_inputs, state_outputs = streamed_states(model_proto)
    nchw_inputs, nchw_outputs = transposed(model_proto)
    specs, rounds = feed_rounds(model_proto, seed, inputs)
    result = VerificationResult(tolerance, reference=reference_name, rounds=len(rounds), values=values)
    runner = RUNNER.get()
    result.runtime = runner.name if runner else "onnxruntime"
    try:
        session = runner.session(model_proto) if runner else one_thread_session(model_proto)
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own kinds
        result.problem = f"{result.runtime} cannot load the ONNX model: {first_line(error)}"
        result.onnx_loaded = False
        return result
    every_output = [o.name for o in session.get_outputs()]
    names = [name for name in every_output if name not in state_outputs]
    outcomes: dict = {name: [] for name in names}
    for number, arrays in enumerate(rounds, 1):
        result.input_shapes.append(_shapes(arrays))
        where = f"round {number} of {len(rounds)}, input shapes {_shapes(arrays)}"
        try:
            expected = list(reference([nhwc(a) if spec[0] in nchw_inputs else a for spec, a in zip(specs, arrays)]))
            expected = [nchw(value) if index < len(names) and names[index] in nchw_outputs else value
                        for index, value in enumerate(expected)]
        except Exception as error:  # noqa: BLE001 - whatever the model raises, verification failed
            result.problem = f"{reference_name} failed on the inputs ({where}): {type(error).__name__}: " \
                             f"{first_line(error)}"
            result.reference_failed = True
            break
        try:
            feeds = feeds_of(model_proto, specs, arrays)
            given = session.run(None, feeds)
            actual = [value for name, value in zip(every_output, given) if name not in state_outputs]
        except Exception as error:  # noqa: BLE001 - onnxruntime raises its own kinds
            result.problem = f"{result.runtime} failed on the inputs ({where}): {first_line(error)}"
            break
        if len(actual) != len(expected):
            result.problem = (f"the ONNX model has {len(actual)} output(s) ({', '.join(names)}), "
                              f"{reference_name} {len(expected)}")
            break
        for name, got, want in zip(names, actual, expected):
            outcomes[name].append(_compare_output(got, want, tolerance, reference_name, values))
        result.measured.append(({name: tuple(np.shape(a)) for name, a in feeds.items()},
                                {name: tuple(np.shape(a)) for name, a in zip(every_output, given)}))
    result.checks = [_check(name, outcomes[name], tolerance, len(rounds)) for name in names if outcomes[name]]
    return result
