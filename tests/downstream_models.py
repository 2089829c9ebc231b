"""The downstream matrix: small Keras 3 models, each converted once per process in the forms a
consumer reads, with the batch they are run on and Keras's outputs for it.

Shared by the runtimes that take a converted model further: ``test_downstream.py`` (OpenVINO,
tract, onnxslim, float16 conversion) and ``pytorch/test_onnx2torch.py`` (PyTorch through
onnx2torch). Only Keras, numpy and this package are imported here, so either can run where the
other's runtimes are not installed.

The base cases: LSTM, GRU and SimpleRNN, one direction (a forward layer returning sequences
beside a go_backwards one returning its last output, both over the input) and Bidirectional,
masked (a ``Masking`` layer; rows full, post-padded, pre-padded, holed and empty) and unmasked.
The variants beside them: a GRU with ``reset_after=False``, a stack of the three kinds, and
layers returning their states (an LSTM unmasked, a GRU masked). Masked models are converted
with ``target="portable"``, unmasked ones both by default and with the target.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import onnx

import helpers
import parity
import tf2onnx_rnn
from test_parity_masking import mask_batch

FEATURES, UNITS = 3, 4
ROWS = ("full", "post", "pre", "holed", "empty")
TIME = 7
FLAVOR = parity.FLAVORS[0]  # Keras 3 (the ONNX models are what is tested; tests/pytorch adds tf_keras's)

RESET_BEFORE, STACK, STATES = "reset_before", "stack", "states"


@dataclass(frozen=True)
class Case:
    kind: str  # LSTM, GRU, SimpleRNN (the first layer's, for a stack)
    bidirectional: bool
    masked: bool
    variant: str = ""  # "", RESET_BEFORE, STACK, STATES

    @property
    def id(self) -> str:
        parts = [self.kind, "bi" if self.bidirectional else "uni", "masked" if self.masked else "plain"]
        return "-".join(parts + ([self.variant] if self.variant else []))


CASES = tuple(Case(k, b, m) for k in helpers.KINDS for b in (False, True) for m in (True, False))
# (a masked LSTM returning its final cell state keeps sequence_lens in the portable form: the node gives c
# only after its last step; docs/downstream.md)
VARIANTS = (Case("GRU", False, True, RESET_BEFORE), Case("GRU", False, False, RESET_BEFORE),
            Case("LSTM", False, True, STACK), Case("LSTM", False, False, STACK),
            Case("LSTM", False, False, STATES), Case("GRU", False, True, STATES))
PORTABLE, DEFAULT = "portable", "default"
FORMS = {PORTABLE: {"target": "portable"}, DEFAULT: {}}
MATRIX = [(case, form) for case in CASES + VARIANTS
          for form in ((PORTABLE,) if case.masked else (DEFAULT, PORTABLE))]


def _outputs(K, case: Case, h) -> list:
    layer = getattr(K.layers, case.kind)
    if case.bidirectional:
        return [K.layers.Bidirectional(layer(UNITS, return_sequences=True), name="bi")(h)]
    if case.variant == STACK:
        h = K.layers.LSTM(UNITS, return_sequences=True, name="lstm")(h)
        h = K.layers.GRU(UNITS, return_sequences=True, name="gru")(h)
        return [K.layers.SimpleRNN(UNITS, go_backwards=True, name="rnn")(h)]
    if case.variant == STATES:  # the sequence and every final state
        return list(layer(UNITS, return_sequences=True, return_state=True, name="states")(h))
    options = {"reset_after": False} if case.variant == RESET_BEFORE else {}
    # of different sizes, or the two would pair into one bidirectional node
    return [layer(UNITS, return_sequences=True, name="forward", **options)(h),
            layer(UNITS + 1, go_backwards=True, name="backward", **options)(h)]


def build(flavor: str, case: Case):
    """x [batch, time, F] -> (Masking) -> the case's layers. No output is read inside the graph
    (see ``test_downstream.test_float16_breaks_on_an_output_read_inside_the_graph``)."""
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    h = K.layers.Masking(0.0, name="masking")(x) if case.masked else x
    model = K.Model(x, _outputs(K, case, h), name="downstream")
    parity.randomize_weights(model, zlib.crc32(f"downstream/{flavor}/{case.id}".encode()))
    return model


def batch(masked: bool) -> np.ndarray:
    """One row per kind of ``ROWS`` (masked steps all-zero), ``TIME`` steps."""
    x = np.random.default_rng(17).standard_normal((len(ROWS), TIME, FEATURES)).astype(np.float32)
    return x * mask_batch(ROWS, TIME)[:, :, None] if masked else x


@dataclass
class Converted:
    model: object
    proto: onnx.ModelProto
    path: str  # the model written, for the runtimes that load files
    x: np.ndarray
    expected: list  # Keras's outputs on x


_MODELS: dict = {}
_CONVERTED: dict = {}


def converted(case: Case, form: str, directory, flavor: str = FLAVOR) -> Converted:
    """The case built in ``flavor``, converted in ``form`` (portable or default) and written into
    ``directory``, once per process."""
    key = (case, form, flavor)
    if key not in _CONVERTED:
        if (case, flavor) not in _MODELS:
            _MODELS[case, flavor] = build(flavor, case)
        model = _MODELS[case, flavor]
        proto = tf2onnx_rnn.convert_keras(model, **FORMS[form])
        path = str(directory / f"{case.id}-{form}{'' if flavor == FLAVOR else '-' + flavor}.onnx")
        onnx.save(proto, path)
        x = batch(case.masked)
        _CONVERTED[key] = Converted(model, proto, path, x, parity.keras_outputs(model, [x]))
    return _CONVERTED[key]


def has_sequence_lens(node) -> bool:
    return len(node.input) > 4 and bool(node.input[4])


def consumer_problems(proto: onnx.ModelProto) -> list:
    """What a consumer lacks or reads otherwise than ONNX: a ``ReverseSequence`` (onnx2torch and tract
    have none), a ``CumSum`` without its ``reverse`` and ``exclusive`` written out (onnx2torch 1.5.15
    takes an absent ``reverse`` as 1)."""
    problems = [f"{n.op_type} {n.name}" for n in helpers.nodes_of_types(proto, {"ReverseSequence"})]
    problems += [f"CumSum {n.name} without explicit {attr}" for n in helpers.nodes_of_types(proto, {"CumSum"})
                 for attr in ("reverse", "exclusive") if helpers.attribute(n, attr) is None]
    return problems


def structure_problems(case: Case, form: str, proto: onnx.ModelProto) -> list:
    """What the form promises of the graph: fused, no ``sequence_lens`` (the matrix's forms have
    none: masked models are portable), one-direction nodes running forward (tract runs a
    ``direction="reverse"`` node forward) and nothing a consumer lacks or reads otherwise than ONNX
    in every form, every initial state given in the portable form (tract builds absent ones wrongly)."""
    nodes = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    problems = []
    if helpers.nodes_of_types(proto, helpers.LOOP_OPS) or not nodes:
        problems.append(f"not fused: {helpers.op_counts(proto)}")
    if any(has_sequence_lens(n) for n in nodes):
        problems.append("a native node has a sequence_lens input")
    if any(helpers.direction_of(n) != "forward" for n in nodes if not case.bidirectional):
        problems.append(f"a one-direction node does not run forward ({form} form)")
    problems += consumer_problems(proto)
    if form == PORTABLE:
        for node in nodes:
            states = list(node.input[5:7 if node.op_type == "LSTM" else 6])
            if len(states) != (2 if node.op_type == "LSTM" else 1) or not all(states):
                problems.append(f"a portable node does not take every initial state: {list(node.input)}")
    return problems
