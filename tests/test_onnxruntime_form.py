"""The onnxruntime target (``target="onnxruntime"``, CLI ``--target onnxruntime``): SimpleRNN layers
computed as an input MatMul and a ``Scan`` (onnxruntime's RNN kernel is slower than that, and than
stock tf2onnx's Loop, from batch 16 on; docs/performance.md), every other layer as without it.

Keras is the oracle, on the suite's own SimpleRNN cases: the unmasked pairwise design of
``parity.FACTORS`` (bias or none, tanh or relu, go_backwards, sequences, states, initial states),
the masked covering design of test_parity_masking (every direction and mask source, rows full,
post-padded, pre-padded, holed and empty, at two time lengths and T=1) and its stacks that mix
SimpleRNN with LSTM and GRU, plus an unmasked Bidirectional; Keras 3 and tf_keras, every weight
randomized. Per case:

- onnxruntime matches ``model(inputs, training=False)`` within 1e-5 on every output;
- no Loop and no ``RNN`` node: one Scan per SimpleRNN direction the default conversion gives
  (a bidirectional ``RNN`` node is two), the LSTM and GRU nodes those of the default conversion;
- each SimpleRNN row of the report became ``Scan``, names a Scan of the graph (each direction its own),
  and says the form.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import helpers
import parity
import test_parity_masking as masking
import tf2onnx_rnn
from test_parity_masking import MaskCase, StackCase
from tf2onnx_rnn import ConversionError, options, report_of

TARGET = "onnxruntime"
FORM = "onnxruntime form: input MatMul + Scan"


class UnmaskedCase(parity.Case):
    """A parity case (one direction, unmasked) with the masking cases' interface."""

    @property
    def input_names(self) -> list:
        return parity.input_names(self)

    @property
    def output_count(self) -> int:
        return parity.expected_output_count(self)

    def feeds(self, mask: np.ndarray, seed: int) -> list:
        batch, time = mask.shape
        return parity.make_inputs(self, max(batch, 1), time, seed)


def _unmasked(case: parity.Case) -> UnmaskedCase:
    return UnmaskedCase(**{name: getattr(case, name) for name in parity.Case.__dataclass_fields__})


CASES = tuple(_unmasked(c) for c in parity.cases() if c.kind == "SimpleRNN") \
    + tuple(c for c in masking.CASES if c.kind == "SimpleRNN") \
    + (StackCase("input-rnn_back-lstm"), StackCase("masking-lstm-birnn-gru_back"))


def _build(flavor: str, case):
    return parity.build_model(flavor, case) if isinstance(case, UnmaskedCase) else masking.build(flavor, case)


_CONVERTED: dict = {}


def converted(flavor: str, case, **extra):
    """(Keras model, the default conversion, the target's conversion), once per process."""
    key = (flavor, case, tuple(sorted(extra.items())))
    if key not in _CONVERTED:
        default = parity.converted_with(flavor, case, _build)
        _CONVERTED[key] = (default.model, default.proto,
                           tf2onnx_rnn.convert_keras(default.model, target=TARGET, **extra))
    return _CONVERTED[key]


def directions(node) -> int:
    return 2 if helpers.direction_of(node) == "bidirectional" else 1


def structure_problems(default, proto) -> list:
    problems = []
    ops = Counter(n.op_type for n in helpers.all_nodes(proto))
    before = helpers.nodes_of_types(default, helpers.RECURRENT_OPS)
    if ops["Loop"] or ops["RNN"]:
        problems.append(f"{ops['Loop']} Loop and {ops['RNN']} RNN node(s) left")
    scans = sum(directions(n) for n in before if n.op_type == "RNN")
    if ops["Scan"] != scans:
        problems.append(f"{ops['Scan']} Scan nodes for {scans} SimpleRNN direction(s)")
    for op in ("LSTM", "GRU"):
        native = sorted(helpers.direction_of(n) for n in helpers.nodes_of_types(proto, (op,)))
        if native != sorted(helpers.direction_of(n) for n in before if n.op_type == op):
            problems.append(f"{op} nodes {native} differ from the default conversion's")
    return problems


def report_problems(proto) -> list:
    problems = []
    scans = {n.name for n in helpers.all_nodes(proto) if n.op_type == "Scan"}
    for row in report_of(proto).outcomes:
        if row.kind != "SimpleRNN":
            if row.form:
                problems.append(f"{row.layer} ({row.kind}) says {row.form!r}")
            continue
        if row.became != "Scan" or row.node not in scans or FORM not in row.form:
            problems.append(f"{row.layer} ({row.direction}): became {row.became!r}, node {row.node!r}, "
                            f"form {row.form!r}")
    named = {row.node for row in report_of(proto).outcomes if row.kind == "SimpleRNN"}
    if named != scans:  # each direction's row names its own Scan
        problems.append(f"the rows name the Scans {sorted(named)}, the graph has {sorted(scans)}")
    if FORM not in report_of(proto).table():
        problems.append("the table does not say the form")
    return problems


def rounds(case) -> list:
    if isinstance(case, UnmaskedCase):
        return [(f"batch {b}, time {t}", np.ones((b, t), bool)) for b, t in parity.ROUNDS]
    return masking.rounds()


def check(flavor: str, case, masks, **extra) -> None:
    model, default, proto = converted(flavor, case, **extra)
    seed = masking.seed_of(flavor, case)
    problems = structure_problems(default, proto) + report_problems(proto)
    problems += masking.parity_problems(proto, model, case, seed, masks)
    masking.fail_with(problems, proto, flavor, case)


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in CASES])
def test_simple_rnn_as_a_scan_equals_keras(flavor: str, case):
    check(flavor, case, rounds(case))


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_with_post_padding_assumed(flavor: str):
    case = MaskCase("SimpleRNN", "backward", "input", return_sequences=True, return_state=True, initial_state=True)
    check(flavor, case, masking.post_padded_rounds(), assume_post_padded=True)


def _bidirectional(flavor: str, case):
    K = parity.keras_module(flavor)
    x = K.Input((None, parity.FEATURES), name="x")
    layer = K.layers.SimpleRNN(parity.UNITS, activation="relu", return_sequences=True, return_state=True)
    outputs = K.layers.Bidirectional(layer, merge_mode="concat")(x)
    model = K.Model(x, list(outputs))
    parity.randomize_weights(model, parity.case_seed(flavor, case))
    return model


class BidirectionalCase(UnmaskedCase):
    @property
    def output_count(self) -> int:
        return 3


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_unmasked_bidirectional(flavor: str):
    case = BidirectionalCase("SimpleRNN", activation="relu", return_sequences=True, return_state=True)
    default = parity.converted_with(flavor, case, _bidirectional)
    proto = tf2onnx_rnn.convert_keras(default.model, target=TARGET)
    problems = structure_problems(default.proto, proto) + report_problems(proto)
    problems += masking.parity_problems(proto, default.model, case, 7, rounds(case))
    masking.fail_with(problems, proto, flavor, case)


def test_the_target_is_known_and_excludes_training():
    assert TARGET in options.known_targets()
    assert options.Options.of(target=[TARGET, "portable"]).onnxruntime
    assert not options.Options.of(target=["portable"]).onnxruntime
    with pytest.raises(ConversionError, match="exclude each other"):
        options.Options.of(target=[TARGET, "training"])


def test_the_default_reports_point_simple_rnn_users_to_the_target():
    """The default form's table says, once, that onnxruntime runs SimpleRNN faster with the target;
    neither the target's table nor a model without SimpleRNN says it."""
    flavor = parity.FLAVORS[0]
    _, default, proto = converted(flavor, CASES[0])
    hint = "--target onnxruntime"
    assert report_of(default).table().count(hint) == 1, report_of(default).table()
    assert hint not in report_of(proto).table()
    lstm = next(c for c in parity.cases() if c.kind == "LSTM")
    assert hint not in report_of(parity.converted(flavor, lstm).proto).table()


def test_command_line_target_onnxruntime(tmp_path, capfd):
    """``--target onnxruntime`` on the command line: the written model computes its masked SimpleRNN as a
    Scan, the printed report says so, and it matches Keras on pre-padded, holed and empty rows."""
    from tf2onnx_rnn import convert as cli

    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 3), name="x")
    model = K.Model(x, K.layers.SimpleRNN(4, go_backwards=True)(K.layers.Masking(0.0)(x)))
    parity.randomize_weights(model, 17)
    source, output = tmp_path / "rnn.keras", tmp_path / "rnn.onnx"
    model.save(str(source))
    assert cli.main(["--keras", str(source), "--output", str(output), "--target", TARGET]) == 0
    out, err = capfd.readouterr()
    assert FORM in out and not [line for line in err.splitlines() if line.startswith("error:")], err
    proto = onnx.load(str(output))
    assert Counter(helpers.op_types(proto))["Scan"] == 1 and not helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    batch = np.random.default_rng(5).standard_normal((4, 7, 3)).astype(np.float32)
    batch *= masking.mask_batch(["pre", "holed", "empty", "full"], 7)[:, :, None]
    (got,) = helpers.ort_session(proto).run(None, {"x": batch})
    np.testing.assert_allclose(got, np.asarray(model(batch, training=False)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_float16_simple_rnn_loads_and_equals_keras(flavor: str):
    """A ``mixed_float16`` SimpleRNN, one direction and Bidirectional: its input projection reads the
    time-major input, a float16 shape onnxruntime 1.23-1.32 ends the process loading (test_half_matmuls);
    the written model has the product first, loads, and equals Keras within its float16 rounding."""
    K = parity.keras_module(flavor)
    K.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = K.Input((None, 2), name="x")
        forward = K.layers.SimpleRNN(5, activation="relu", return_sequences=True)(x)
        both = K.layers.Bidirectional(K.layers.SimpleRNN(3, return_sequences=True))(forward)
        model = K.Model(x, both)
    finally:
        K.mixed_precision.set_global_policy("float32")
    parity.randomize_weights(model, 31)
    proto = tf2onnx_rnn.convert_keras(model, target=TARGET)
    assert Counter(helpers.op_types(proto))["Scan"] == 3 and not helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    assert not report_problems(proto), report_problems(proto)
    xv = np.random.default_rng(32).standard_normal((3, 6, 2)).astype(np.float32)
    (got,) = helpers.ort_session(proto).run(None, {"x": xv})
    np.testing.assert_allclose(got.astype(np.float32), np.asarray(model(xv, training=False)).astype(np.float32),
                               rtol=0, atol=3e-2)
