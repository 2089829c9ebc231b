"""TFLite's fused recurrent ops that no Keras export makes, in files written by hand
(``tflite_files.py``): ``UNIDIRECTIONAL_SEQUENCE_RNN`` (batch- and time-major, tanh and relu),
``BIDIRECTIONAL_SEQUENCE_RNN`` and ``BIDIRECTIONAL_SEQUENCE_LSTM`` (outputs merged or not, batch-
and time-major), and a time-major ``UNIDIRECTIONAL_SEQUENCE_LSTM``, with random weights and biases,
batch 1 and 3: each converts with no Loop or Scan, every row fused, and onnxruntime equals the
TFLite interpreter (1e-5). What ONNX cannot compute is refused naming the option: peepholes, a
projection, layer normalisation, a coupled input gate, an auxiliary input, an activation ONNX's
nodes lack, a cell clip that can act (converted with ``drop_cell_clip``).
"""
from __future__ import annotations

import os
import tempfile
import zlib

import numpy as np
import pytest
from tf2onnx.tflite import BidirectionalSequenceLSTMOptions as BiLSTMOptions
from tf2onnx.tflite import BidirectionalSequenceRNNOptions as BiRNNOptions
from tf2onnx.tflite import SequenceRNNOptions
from tf2onnx.tflite import UnidirectionalSequenceLSTMOptions as LSTMOptions
from tf2onnx.tflite.ActivationFunctionType import ActivationFunctionType

import helpers
from test_tflite import run_tflite
from tf2onnx_rnn import ConversionError, convert_tflite, report_of
from tflite_files import ABSENT, OneOp, write

FEATURES, UNITS, TIME = 3, 4, 5
_DIR = tempfile.mkdtemp(prefix="tflite_fused_")


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _weights(op: OneOp, rng, prefix: str, count: int, shape) -> list:
    return [op.constant(f"{prefix}{k}", rng.normal(0, 0.5, shape).astype(np.float32)) for k in range(count)]


def _x(op: OneOp, batch: int, time_major: bool) -> int:
    return op.tensor("x", (TIME, batch, FEATURES) if time_major else (batch, TIME, FEATURES))


def _sequence(batch: int, time_major: bool) -> tuple:
    return (TIME, batch, UNITS) if time_major else (batch, TIME, UNITS)


def rnn(batch: int, time_major: bool = False, activation: str = "TANH", bidirectional: bool = False,
        merge: bool = False, aux: bool = False) -> OneOp:
    """A (bidirectional) sequence RNN: inputs x, then per direction W, R, b and its state variable
    (bidirectional: then the auxiliary input and its weights per direction)."""
    rng = _rng("rnn", batch, time_major, activation, bidirectional, merge, aux)
    code = getattr(ActivationFunctionType, activation)
    if bidirectional:
        def options(builder):
            BiRNNOptions.BidirectionalSequenceRNNOptionsStart(builder)
            BiRNNOptions.BidirectionalSequenceRNNOptionsAddTimeMajor(builder, time_major)
            BiRNNOptions.BidirectionalSequenceRNNOptionsAddFusedActivationFunction(builder, code)
            BiRNNOptions.BidirectionalSequenceRNNOptionsAddMergeOutputs(builder, merge)
            return BiRNNOptions.BidirectionalSequenceRNNOptionsEnd(builder)
        op = OneOp("BIDIRECTIONAL_SEQUENCE_RNN", "BidirectionalSequenceRNNOptions", options)
    else:
        def options(builder):
            SequenceRNNOptions.SequenceRNNOptionsStart(builder)
            SequenceRNNOptions.SequenceRNNOptionsAddTimeMajor(builder, time_major)
            SequenceRNNOptions.SequenceRNNOptionsAddFusedActivationFunction(builder, code)
            return SequenceRNNOptions.SequenceRNNOptionsEnd(builder)
        op = OneOp("UNIDIRECTIONAL_SEQUENCE_RNN", "SequenceRNNOptions", options)
    op.inputs.append(_x(op, batch, time_major))
    for direction in ("fw", "bw")[:2 if bidirectional else 1]:
        op.inputs += _weights(op, rng, f"{direction}_W", 1, (UNITS, FEATURES))
        op.inputs += _weights(op, rng, f"{direction}_R", 1, (UNITS, UNITS))
        op.inputs += _weights(op, rng, f"{direction}_b", 1, (UNITS,))
        op.inputs.append(op.tensor(f"{direction}_h", (batch, UNITS), variable=True))
    if bidirectional:
        op.inputs += [op.tensor("aux", (batch, TIME, FEATURES))] if aux else [ABSENT]
        op.inputs += _weights(op, rng, "aux_W", 2, (UNITS, FEATURES)) if aux else [ABSENT, ABSENT]
    _outputs(op, batch, time_major, bidirectional, merge)
    return op


def lstm(batch: int, time_major: bool = False, bidirectional: bool = False, merge: bool = False,
         cell_clip: float = 0.0, peepholes: bool = False, projection: bool = False, layer_norm: bool = False,
         coupled: bool = False, aux: bool = False) -> OneOp:
    """A (bidirectional) sequence LSTM, inputs in TFLite's order: x; per direction 4 input and 4
    recurrent weights (gates i, f, c, o), 3 peepholes, 4 biases, projection weights and bias; the state
    variables; (unidirectional) 4 layer norm weights, or (bidirectional) the auxiliary input and its
    weights per direction."""
    rng = _rng("lstm", batch, time_major, bidirectional, merge, cell_clip, peepholes, projection, layer_norm,
               coupled, aux)
    if bidirectional:
        def options(builder):
            BiLSTMOptions.BidirectionalSequenceLSTMOptionsStart(builder)
            BiLSTMOptions.BidirectionalSequenceLSTMOptionsAddFusedActivationFunction(builder,
                                                                                     ActivationFunctionType.TANH)
            BiLSTMOptions.BidirectionalSequenceLSTMOptionsAddCellClip(builder, cell_clip)
            BiLSTMOptions.BidirectionalSequenceLSTMOptionsAddMergeOutputs(builder, merge)
            BiLSTMOptions.BidirectionalSequenceLSTMOptionsAddTimeMajor(builder, time_major)
            return BiLSTMOptions.BidirectionalSequenceLSTMOptionsEnd(builder)
        op = OneOp("BIDIRECTIONAL_SEQUENCE_LSTM", "BidirectionalSequenceLSTMOptions", options)
    else:
        def options(builder):
            LSTMOptions.UnidirectionalSequenceLSTMOptionsStart(builder)
            LSTMOptions.UnidirectionalSequenceLSTMOptionsAddFusedActivationFunction(builder,
                                                                                   ActivationFunctionType.TANH)
            LSTMOptions.UnidirectionalSequenceLSTMOptionsAddCellClip(builder, cell_clip)
            LSTMOptions.UnidirectionalSequenceLSTMOptionsAddTimeMajor(builder, time_major)
            return LSTMOptions.UnidirectionalSequenceLSTMOptionsEnd(builder)
        op = OneOp("UNIDIRECTIONAL_SEQUENCE_LSTM", "UnidirectionalSequenceLSTMOptions", options)
    op.inputs.append(_x(op, batch, time_major))
    directions = ("fw", "bw")[:2 if bidirectional else 1]
    for direction in directions:
        input_weights = _weights(op, rng, f"{direction}_W", 4, (UNITS, FEATURES))
        op.inputs += ([ABSENT] + input_weights[1:]) if coupled else input_weights
        recurrent = _weights(op, rng, f"{direction}_R", 4, (UNITS, UNITS))
        op.inputs += ([ABSENT] + recurrent[1:]) if coupled else recurrent
        op.inputs += _weights(op, rng, f"{direction}_P", 3, (UNITS,)) if peepholes else [ABSENT] * 3
        biases = _weights(op, rng, f"{direction}_b", 4, (UNITS,))
        op.inputs += ([ABSENT] + biases[1:]) if coupled else biases
        op.inputs += (_weights(op, rng, f"{direction}_proj", 1, (UNITS, UNITS)) + [ABSENT]) if projection \
            else [ABSENT, ABSENT]
    for direction in directions:
        op.inputs += [op.tensor(f"{direction}_{state}", (batch, UNITS), variable=True) for state in ("h", "c")]
    if bidirectional:
        op.inputs += [op.tensor("aux", (batch, TIME, FEATURES))] if aux else [ABSENT]
        op.inputs += _weights(op, rng, "aux_W", 8, (UNITS, FEATURES)) if aux else [ABSENT] * 8
    else:
        op.inputs += _weights(op, rng, "norm", 4, (UNITS,)) if layer_norm else [ABSENT] * 4
    _outputs(op, batch, time_major, bidirectional, merge)
    return op


def _outputs(op: OneOp, batch: int, time_major: bool, bidirectional: bool, merge: bool) -> None:
    shape = _sequence(batch, time_major)
    if bidirectional and merge:
        op.outputs.append(op.tensor("y", shape[:-1] + (2 * UNITS,)))
    else:
        op.outputs += [op.tensor(f"y{k}", shape) for k in range(2 if bidirectional else 1)]


def built(name: str, op: OneOp) -> str:
    inputs = [k for k, (tensor, _, value, variable) in enumerate(op.tensors)
              if value is None and not variable and tensor in ("x", "aux")]
    return write(op, os.path.join(_DIR, name + ".tflite"), inputs)


def check_exact(path: str, batch: int, time_major: bool, **options) -> None:
    proto = convert_tflite(path, **options)
    assert not helpers.nodes_of_types(proto, helpers.LOOP_OPS), helpers.op_counts(proto)
    assert helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    report = report_of(proto)
    assert report.outcomes and all(o.fused for o in report.outcomes), report.table()
    session = helpers.ort_session(proto)
    for seed in range(2):
        shape = (TIME, batch, FEATURES) if time_major else (batch, TIME, FEATURES)
        x = np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)
        expected = run_tflite(path, x)
        outputs = session.run(None, {session.get_inputs()[0].name: x})
        actual = dict(zip([o.name for o in session.get_outputs()], outputs))
        assert set(actual) == set(expected), (list(actual), list(expected))
        for name, value in expected.items():
            np.testing.assert_allclose(actual[name], value, atol=1e-5, rtol=0, err_msg=name)


CASES = [
    ("rnn", dict()), ("rnn_time_major", dict(time_major=True)), ("rnn_relu", dict(activation="RELU")),
    ("birnn", dict(bidirectional=True)), ("birnn_merged", dict(bidirectional=True, merge=True)),
    ("birnn_time_major", dict(bidirectional=True, time_major=True)),
    ("lstm_time_major", dict(time_major=True)), ("bilstm", dict(bidirectional=True)),
    ("bilstm_merged", dict(bidirectional=True, merge=True)),
    ("bilstm_time_major_merged", dict(bidirectional=True, time_major=True, merge=True)),
]


# (a merged batch-major bidirectional LSTM at batch 3 is refused: see the last test)
@pytest.mark.parametrize("name, kwargs, batch", [pytest.param(n, k, b, id=f"{n}-{b}") for n, k in CASES for b in (1, 3)
                                                 if (n, b) != ("bilstm_merged", 3)])
def test_fused_op_is_exact(name, kwargs, batch):
    make = lstm if "lstm" in name else rnn
    path = built(f"{name}_{batch}", make(batch, **kwargs))
    check_exact(path, batch, kwargs.get("time_major", False))


REFUSED = [
    ("peepholes", lstm, dict(peepholes=True), "peepholes"),
    ("projection", lstm, dict(projection=True), "a projection"),
    ("layer_norm", lstm, dict(layer_norm=True), "layer normalisation"),
    ("coupled", lstm, dict(coupled=True), "couples its input gate"),
    ("bilstm_aux", lstm, dict(bidirectional=True, aux=True), "auxiliary input"),
    ("birnn_aux", rnn, dict(bidirectional=True, aux=True), "auxiliary input"),
    ("rnn_relu6", rnn, dict(activation="RELU6"), "no ONNX recurrent equivalent"),
    ("lstm_clip", lstm, dict(cell_clip=0.5), "cell_clip"),
]


@pytest.mark.parametrize("name, make, kwargs, message", REFUSED, ids=[c[0] for c in REFUSED])
def test_what_onnx_cannot_compute_is_refused(name, make, kwargs, message):
    path = built(f"refused_{name}", make(1, **kwargs))
    if "aux" not in name:  # a valid file: the interpreter runs it (run_tflite feeds one input)
        run_tflite(path, np.zeros((1, TIME, FEATURES), np.float32))
    with pytest.raises(ConversionError, match=message) as refused:
        convert_tflite(path)
    assert "\n" not in str(refused.value)


def test_a_clip_that_can_act_converts_when_dropped():
    """With drop_cell_clip, the clipping LSTM converts; it equals the interpreter where the clip does
    not act (small inputs), as the README says."""
    path = built("clip_dropped", lstm(2, cell_clip=3.0))
    proto = convert_tflite(path, drop_cell_clip=True)
    session = helpers.ort_session(proto)
    x = np.random.default_rng(0).normal(0, 0.1, (2, TIME, FEATURES)).astype(np.float32)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    (expected,) = run_tflite(path, x).values()
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)


def test_a_merged_batch_major_bidirectional_lstm_is_refused_past_batch_1():
    """TFLite's kernel gives a batch-major, merged bidirectional LSTM's rows after the second other
    values than its two directions joined (the same op unmerged, and the ONNX node, agree): such a file
    is refused rather than converted to a model that differs from it."""
    def same_weights(merge):
        global _rng
        saved, _rng = _rng, lambda *key: np.random.default_rng(7)
        try:
            return built(f"bilstm_{'merged' if merge else 'halves'}_4", lstm(4, bidirectional=True, merge=merge))
        finally:
            _rng = saved
    merged, halves = same_weights(True), same_weights(False)
    x = np.random.default_rng(0).normal(0, 1, (4, TIME, FEATURES)).astype(np.float32)
    (joined,) = run_tflite(merged, x).values()
    forward, backward = run_tflite(halves, x).values()
    rows = np.abs(joined - np.concatenate([forward, backward], -1)).max(axis=(1, 2))
    assert rows[0] == rows[1] == 0 and rows[2:].min() > 1e-3, rows  # the kernel's fault, as measured
    with pytest.raises(ConversionError, match="merges its outputs batch-major over a batch other than 1"):
        convert_tflite(merged)
    check_exact(halves, 4, False)
