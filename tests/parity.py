"""Shared helpers for parity tests: Keras flavors, model building, conversion, output comparison.

The recurrent kinds' constants, onnxruntime sessions and graph walking are in helpers.py.

Both Keras flavors run in one process: Keras 3 (``import keras``) and tf_keras
(``import tf_keras``, Keras 2) coexist with tf2onnx 1.17 (measured: converting in either
order gives the same graphs and results), so no subprocess is needed. ``TF_USE_LEGACY_KERAS``
must stay unset here, or ``import keras`` would still be Keras 3 but ``tf.keras`` would not.

Conversions are cached per process (see :func:`converted`): a case is built and converted
once, then every test of that case reads the cached result. A conversion that raised is
cached too and re-raised in every test of the case.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import os
import re
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import onnx
import pytest

import helpers

# The kinds' constants, sessions and graph walkers live in helpers.py; parity keeps the names it
# always had for the modules that still read them from here (test_fault_injection.py,
# test_parity_fixed_shapes.py).
ONNX_OP, RECURRENT_OPS, LOOP_OPS, STATE_NAMES = helpers.ONNX_OP, helpers.RECURRENT_OPS, helpers.LOOP_OPS, \
    helpers.STATE_NAMES
ort_session, all_nodes, nodes_of_types = helpers.ort_session, helpers.all_nodes, helpers.nodes_of_types
attribute, direction_of = helpers.attribute, helpers.direction_of

# ``import keras`` is Keras 3 from TensorFlow 2.16 on, and Keras 2 in TensorFlow 2.15 (the oldest
# supported stack): the flavor's name says which, so tests of Keras 3 behaviour can tell.
KERAS3 = int(importlib.metadata.version("keras").split(".")[0]) >= 3
FLAVORS = ("keras3" if KERAS3 else "keras2", "tf_keras")
# TF2ONNX_RNN_TEST_FLAVORS (comma-separated) narrows the flavors the parametrized tests run. CI's
# oldest stack runs "keras2" alone: there tf_keras 2.15 is Keras 2.15's own code under another
# package name (its recurrent layers and backend differ in names and docstrings only), so the
# same graphs would be traced twice; tests that load files with tf_keras by name still run it.
_NARROWED = [f.strip() for f in os.environ.get("TF2ONNX_RNN_TEST_FLAVORS", "").split(",") if f.strip()]
if _NARROWED:
    if not set(_NARROWED) <= set(FLAVORS):
        raise ValueError(f"TF2ONNX_RNN_TEST_FLAVORS={','.join(_NARROWED)}: the flavors here are {', '.join(FLAVORS)}")
    FLAVORS = tuple(f for f in FLAVORS if f in _NARROWED)
_FLAVOR_MODULES = {"keras3": "keras", "keras2": "keras", "tf_keras": "tf_keras"}
only_keras3 = pytest.mark.skipif(not KERAS3, reason="Keras 3 behaviour; `keras` here is Keras 2")

FEATURES = 5  # input features F (differs from UNITS so W's transposition shows)
UNITS = 4
# (batch, time) rounds, all on the same converted model: dynamic batch and time length
ROUNDS = ((3, 5), (3, 11), (1, 7))
TOLERANCE = 1e-5


def keras_module(flavor: str):
    """``keras`` for "keras3" (and "keras2" on TensorFlow 2.15), ``tf_keras`` for "tf_keras"."""
    return importlib.import_module(_FLAVOR_MODULES[flavor])


# -- cases --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One one-direction, unmasked recurrent layer configuration."""

    kind: str  # LSTM, GRU, SimpleRNN
    use_bias: bool = True
    activation: str = "tanh"
    recurrent_activation: Optional[str] = None  # LSTM and GRU only
    reset_after: Optional[bool] = None  # GRU only
    go_backwards: bool = False
    return_sequences: bool = False
    return_state: bool = False
    initial_state: bool = False  # initial states fed from model inputs

    @property
    def id(self) -> str:
        parts = [self.kind, "bias" if self.use_bias else "nobias", self.activation]
        if self.recurrent_activation is not None:
            parts.append("r" + self.recurrent_activation)
        if self.reset_after is not None:
            parts.append("reset_after" if self.reset_after else "reset_before")
        parts.append("bwd" if self.go_backwards else "fwd")
        parts.append("seq" if self.return_sequences else "last")
        if self.return_state:
            parts.append("state")
        if self.initial_state:
            parts.append("init")
        return "-".join(parts)

    @property
    def layer_name(self) -> str:
        return "uut_" + helpers.SCOPE_NAME[self.kind]

    @property
    def state_names(self) -> tuple:
        return STATE_NAMES[self.kind]

    def layer_kwargs(self) -> dict:
        kwargs = dict(units=UNITS, name=self.layer_name, use_bias=self.use_bias, activation=self.activation,
                      go_backwards=self.go_backwards, return_sequences=self.return_sequences,
                      return_state=self.return_state)
        if self.recurrent_activation is not None:
            kwargs["recurrent_activation"] = self.recurrent_activation
        if self.reset_after is not None:
            kwargs["reset_after"] = self.reset_after
        return kwargs


# The option values each kind is tested with. Every value of every option appears, and every
# pair of values of two options appears together in at least one case of that kind.
STRUCTURE = dict(go_backwards=(False, True), return_sequences=(False, True), return_state=(False, True),
                 initial_state=(False, True))
FACTORS = {
    "LSTM": dict(use_bias=(True, False), activation=("tanh", "relu", "sigmoid"),
                 recurrent_activation=("sigmoid", "hard_sigmoid"), **STRUCTURE),
    "GRU": dict(reset_after=(True, False), use_bias=(True, False), activation=("tanh", "relu"),
                recurrent_activation=("sigmoid", "hard_sigmoid"), **STRUCTURE),
    "SimpleRNN": dict(use_bias=(True, False), activation=("tanh", "relu"), **STRUCTURE),
}


def value_pairs(factors: dict) -> set:
    """Every pair of (option, value) of two different options."""
    names = list(factors)
    return {((a, va), (b, vb)) for i, a in enumerate(names) for b in names[i + 1:]
            for va in factors[a] for vb in factors[b]}


def pairs_of(row: dict, names: Sequence[str]) -> set:
    return {((a, row[a]), (b, row[b])) for i, a in enumerate(names) for b in names[i + 1:]}


def pairwise(factors: dict) -> list:
    """A small, deterministic set of rows covering every pair of values (greedy)."""
    names = list(factors)
    uncovered = value_pairs(factors)
    candidates = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
    rows = []
    while uncovered:
        best = max(candidates, key=lambda row: len(pairs_of(row, names) & uncovered))
        rows.append(best)
        uncovered -= pairs_of(best, names)
    return rows


def cases() -> list:
    return [Case(kind=kind, **row) for kind, factors in FACTORS.items() for row in pairwise(factors)]


# -- models -------------------------------------------------------------------------------

def case_seed(flavor: str, case: Case) -> int:
    return zlib.crc32(f"{flavor}/{case.id}".encode())


def randomize_weights(model, seed: int, scale: float = 0.5) -> None:
    """Every weight, biases included, seeded normal * ``scale``."""
    rng = np.random.default_rng(seed)
    weights = model.get_weights()
    assert weights, "the model has no weights to randomize"
    model.set_weights([(rng.standard_normal(w.shape) * scale).astype(w.dtype) for w in weights])


def build_model(flavor: str, case: Case):
    """A Keras model: input ``x`` [batch, time, F] (both dynamic), plus one [batch, UNITS]
    input ``init_<state>`` per state when the case feeds initial states."""
    K = keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    layer = getattr(K.layers, case.kind)(**case.layer_kwargs())
    inputs = [x]
    if case.initial_state:
        states = [K.Input((UNITS,), name=f"init_{s}") for s in case.state_names]
        inputs += states
        output = layer(x, initial_state=states)
    else:
        output = layer(x)
    outputs = list(output) if case.return_state else output
    model = K.Model(inputs if len(inputs) > 1 else x, outputs, name=f"parity_{case.kind.lower()}")
    randomize_weights(model, case_seed(flavor, case))
    return model


def input_names(case: Case) -> list:
    return ["x"] + ([f"init_{s}" for s in case.state_names] if case.initial_state else [])


def expected_output_count(case: Case) -> int:
    return 1 + (len(case.state_names) if case.return_state else 0)


def make_inputs(case: Case, batch: int, time: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((batch, time, FEATURES)).astype(np.float32)]
    if case.initial_state:
        arrays += [rng.standard_normal((batch, UNITS)).astype(np.float32) for _ in case.state_names]
    return arrays


def keras_outputs(model, arrays: list) -> list:
    """``model(x, training=False)`` as a list of arrays, in Keras's output order."""
    result = model(arrays if len(arrays) > 1 else arrays[0], training=False)
    if isinstance(result, dict):
        raise AssertionError("dict outputs are not expected from these models")
    if not isinstance(result, (list, tuple)):
        result = [result]
    return [np.asarray(r) for r in result]


@dataclass
class Converted:
    flavor: str
    case: Case
    model: object = None  # the Keras model
    proto: Optional[onnx.ModelProto] = None
    error: Optional[BaseException] = None

    def get(self) -> "Converted":
        """Self, or re-raise the conversion error."""
        if self.error is not None:
            raise AssertionError(f"building or converting {self.flavor} {self.case.id} failed: "
                                 f"{type(self.error).__name__}: {self.error}") from self.error
        return self


_CACHE: dict = {}


def converted(flavor: str, case: Case) -> Converted:
    """The case's model and its conversion, built once per process."""
    return converted_with(flavor, case, build_model)


def converted_with(flavor: str, case, build) -> Converted:
    """:func:`converted` for any hashable case that has an ``id``, built by ``build(flavor, case)``
    (which returns a Keras model with its weights already set). Cached per process like
    :func:`converted`, a conversion error included."""
    key = (flavor, case, build)
    if key not in _CACHE:
        from tf2onnx_rnn import convert_keras

        entry = Converted(flavor, case)
        try:
            entry.model = build(flavor, case)
            entry.proto = convert_keras(entry.model)
        except Exception as error:  # noqa: BLE001 - reported by every test of the case
            entry.error = error
        _CACHE[key] = entry
    return _CACHE[key].get()


# -- onnxruntime --------------------------------------------------------------------------

def run_onnx(session, names: Sequence[str], arrays: Sequence[np.ndarray]) -> list:
    return session.run(None, dict(zip(names, arrays)))


# -- comparing outputs -------------------------------------------------------------------

def output_problems(label: str, output_names, expected, actual, tolerance: float, relative: float = 0.0) -> tuple:
    """Compare Keras's outputs with onnxruntime's: (problems, max abs error over them).

    A problem is a differing count, shape or dtype, a Keras output that is not finite, or an
    error above ``tolerance`` (NaN counts as above), with the batch rows where it occurs. With
    ``relative`` (numpy's ``rtol``), an error may exceed ``tolerance`` by that fraction of Keras's
    value: a layer whose values grow large (relu, to 1e9) differs there by its type's rounding."""
    if len(actual) != len(expected):
        return [f"{label}: Keras gives {len(expected)} outputs, ONNX {len(actual)}"], float("nan")
    problems, worst = [], 0.0
    for out, (want, got) in enumerate(zip(expected, actual)):
        where = f"{label}, output {out} ({output_names[out]})"
        if not np.all(np.isfinite(want)):
            problems.append(f"{where}: Keras output is not finite")
            continue
        if got.shape != want.shape:
            problems.append(f"{where}: ONNX shape {got.shape}, Keras {want.shape}")
            continue
        if got.dtype != want.dtype:
            problems.append(f"{where}: ONNX dtype {got.dtype}, Keras {want.dtype}")
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        if relative:
            diff = np.maximum(diff - relative * np.abs(want.astype(np.float64)), 0.0)
        error = float(np.max(diff)) if diff.size else 0.0
        worst = max(worst, error) if error == error else float("nan")
        if not error <= tolerance:  # NaN fails too
            rows = sorted({int(i) for i in np.argwhere(~(diff <= tolerance))[:, 0]})
            kind = f"abs error beyond {relative:g} x |Keras|" if relative else "abs error"
            problems.append(f"{where}: max {kind} {error:.3g} in batch rows {rows}")
    return problems, worst


def report_table(model_proto: onnx.ModelProto) -> str:
    """The stored conversion report as text, for failure messages."""
    from tf2onnx_rnn import report_of

    report = report_of(model_proto)
    return report.table() if report is not None else "(no conversion report in the model)"


def layer_matches(report_layer: str, keras_layer: str) -> bool:
    """The report's layer (from TF name scopes) names the Keras layer; Keras 3 scopes may
    carry a ``_<n>`` suffix (``uut_lstm_1`` for layer ``uut_lstm``)."""
    return re.fullmatch(re.escape(keras_layer) + r"(_\d+)?", report_layer) is not None

