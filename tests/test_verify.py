"""Verification cannot be fooled: NaN and Inf, shapes, dtypes, output counts, failing runs.

Every case runs through the three doors: ``verify_keras``, ``verify_saved_model`` and the CLI's
``--verify``. The models are tiny (``x`` [batch, time, 4] -> SimpleRNN -> Dense ``head`` with 3
columns), in every Keras flavor of the stack:

- "plain": random finite weights;
- "special": the head's kernel column 0 is NaN and its bias 1 is +Inf, so the reference gives
  NaN in column 0 and +Inf in column 1 of every row, and finite values in column 2.

The bad ONNX models are real conversions of these, edited here: a ``Where`` that overwrites
columns (NaN, Inf, a number), a ``Slice`` (shape), a ``Cast`` (dtype), an extra output, a
``Reshape`` to a fixed batch (onnxruntime fails on the second round). For the CLI, the API's
conversion step is wrapped so that the model the CLI verifies (and would write) is the edited one.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers  # noqa: E402  (tests/ is on sys.path, see conftest.py)
import parity  # noqa: E402  (tests/ is on sys.path, see conftest.py)
import tf2onnx_rnn  # noqa: E402
from tf2onnx_rnn import (
    api,  # noqa: E402
    verify,  # noqa: E402
)
from tf2onnx_rnn import convert as cli  # noqa: E402
from tf2onnx_rnn.errors import VerificationError  # noqa: E402

FEATURES, UNITS, COLUMNS = 4, 5, 3
ROUND_ROWS = sum(batch for batch, _ in verify.ROUNDS)  # rows of one output over the default rounds


# -- models --------------------------------------------------------------------------------------
def build_keras(flavor: str, kind: str):
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    hidden = K.layers.SimpleRNN(UNITS, name="rnn")(x)
    model = K.Model(x, K.layers.Dense(COLUMNS, name="head")(hidden), name=f"verify_{kind}")
    parity.randomize_weights(model, seed=5)
    if kind == "special":
        weights = model.get_weights()
        weights[-2][:, 0] = np.nan  # head kernel: column 0 is NaN whatever the input
        weights[-1][1] = np.inf  # head bias: column 1 is +Inf
        model.set_weights(weights)
    return model


@dataclass
class Built:
    model: object
    keras_proto: onnx.ModelProto  # convert_keras(model)
    saved_model: str  # a SavedModel directory serving {"y": model(x)}
    saved_proto: onnx.ModelProto  # convert_saved_model(saved_model)
    keras_file: Optional[str] = None  # the model saved as a Keras file (the flavor `keras` loads only)


def save_saved_model(model, path: str) -> None:
    import tensorflow as tf

    module = tf.Module()
    module.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, None, FEATURES], tf.float32, name="x")])
    def serve(x):
        return {"y": module.model(x, training=False)}

    tf.saved_model.save(module, path, signatures={"serving_default": serve})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``models(flavor, kind)``: the built model, its SavedModel and both conversions, built once."""
    built: dict = {}
    root = tmp_path_factory.mktemp("verify_models")

    def get(flavor: str, kind: str) -> Built:
        if (flavor, kind) not in built:
            model = build_keras(flavor, kind)
            saved_model = str(root / f"{flavor}_{kind}_saved_model")
            save_saved_model(model, saved_model)
            keras_file = None
            if flavor != "tf_keras":  # the CLI's --keras loads with `keras`
                # Keras 2.15 loops forever loading its own .keras files once tf_keras is imported in
                # the process (as here, both flavors in one process): it gets its .h5 format
                keras_file = str(root / f"{flavor}_{kind}{'.keras' if parity.KERAS3 else '.h5'}")
                with warnings.catch_warnings():  # Keras 2 calls .h5 legacy
                    warnings.simplefilter("ignore", UserWarning)
                    model.save(keras_file)
            built[flavor, kind] = Built(model, tf2onnx_rnn.convert_keras(model), saved_model,
                                        tf2onnx_rnn.convert_saved_model(saved_model), keras_file)
        return built[flavor, kind]

    return get


# -- edits of a converted model's first output ---------------------------------------------------
def _edited(model_proto: onnx.ModelProto, append: Callable) -> onnx.ModelProto:
    """A copy whose first output is renamed ``<name>_converted`` inside the graph, and whose
    nodes from ``append(graph, converted, name)`` compute the output again from it."""
    edited = onnx.ModelProto()
    edited.CopyFrom(model_proto)
    graph = edited.graph
    name = graph.output[0].name
    converted = f"{name}_converted"
    for node in graph.node:
        node.output[:] = [converted if o == name else o for o in node.output]
        node.input[:] = [converted if i == name else i for i in node.input]
    append(graph, converted, name)
    return edited


def set_columns(values: dict) -> Callable:
    """Overwrite columns of every row: {column: value}."""

    def edit(model_proto):
        def append(graph, converted, name):
            where = np.zeros(COLUMNS, dtype=bool)
            fill = np.zeros(COLUMNS, dtype=np.float32)
            for column, value in values.items():
                where[column], fill[column] = True, value
            graph.initializer.extend([numpy_helper.from_array(where, "edit_where"),
                                      numpy_helper.from_array(fill, "edit_fill")])
            graph.node.append(helper.make_node("Where", ["edit_where", "edit_fill", converted], [name]))
        return _edited(model_proto, append)

    return edit


def first_columns(count: int) -> Callable:
    """Keep only the first ``count`` columns: the output's shape changes."""

    def edit(model_proto):
        def append(graph, converted, name):
            graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "edit_starts"),
                                      numpy_helper.from_array(np.array([count], np.int64), "edit_ends"),
                                      numpy_helper.from_array(np.array([1], np.int64), "edit_axes")])
            graph.node.append(helper.make_node("Slice", [converted, "edit_starts", "edit_ends", "edit_axes"], [name]))
            graph.output[0].type.tensor_type.ClearField("shape")
        return _edited(model_proto, append)

    return edit


def cast_to_double(model_proto):
    def append(graph, converted, name):
        graph.node.append(helper.make_node("Cast", [converted], [name], to=TensorProto.DOUBLE))
        graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    return _edited(model_proto, append)


def extra_output(model_proto):
    def append(graph, converted, name):
        graph.node.append(helper.make_node("Identity", [converted], [name]))
        graph.node.append(helper.make_node("Identity", [converted], ["extra"]))
        graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    return _edited(model_proto, append)


def fixed_batch(model_proto):
    """Right for the first round's batch only: onnxruntime cannot run the second round."""
    batch = verify.ROUNDS[0][0]

    def append(graph, converted, name):
        graph.initializer.append(numpy_helper.from_array(np.array([batch, COLUMNS], np.int64), "edit_shape"))
        graph.node.append(helper.make_node("Reshape", [converted, "edit_shape"], [name]))
    return _edited(model_proto, append)


# -- the cases -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # which model: "plain" or "special"
    edit: Optional[Callable] = None
    failure: Optional[str] = None  # regex the one-line reason matches ({ref}: Keras or TensorFlow); None: passes
    per_output: bool = True  # the failure is one output's (else the comparison's as a whole)
    error: Optional[str] = None  # "nan", "inf": what the failing output's max abs error must be
    nan: Optional[tuple] = None  # (ONNX, reference) NaN counts over the default rounds


R = ROUND_ROWS
CASES = [
    Case("correct", "plain", nan=(0, 0)),
    Case("same-nan-and-inf", "special", nan=(R, R)),
    Case("nan-where-finite", "plain", set_columns({1: np.nan}), error="nan", nan=(R, 0),
         failure=rf"ONNX gives NaN where {{ref}} gives a finite value at {verify.ROUNDS[0][0]} position\(s\), "
                 r"first at \[0, 1\]"),
    Case("inf-where-finite", "plain", set_columns({2: np.inf}), error="inf", nan=(0, 0),
         failure=r"ONNX gives \+Inf where {ref} gives a finite value at \d+ position\(s\), first at \[0, 2\]"),
    Case("nan-moved", "special", set_columns({0: 0.5, 2: np.nan}), error="nan", nan=(R, R),
         failure=r"ONNX gives a finite value where {ref} gives NaN at \d+ position\(s\), first at \[0, 0\]"
                 r"; \d+ other NaN/Inf mismatch\(es\) \(round 1 of 2\)"),
    Case("nan-missing", "special", set_columns({0: 1.0}), error="nan", nan=(0, R),
         failure=r"ONNX gives a finite value where {ref} gives NaN"),
    Case("inf-sign", "special", set_columns({1: -np.inf}), error="inf", nan=(R, R),
         failure=r"ONNX gives -Inf where {ref} gives \+Inf"),
    Case("shape", "plain", first_columns(2), error="inf",
         failure=rf"shape \({verify.ROUNDS[0][0]}, 2\) vs {{ref}} \({verify.ROUNDS[0][0]}, 3\)"),
    Case("dtype", "plain", cast_to_double, failure=r"dtype float64 vs {ref} float32"),
    Case("output-count", "plain", extra_output, per_output=False,
         failure=r"the ONNX model has 2 output\(s\) \(\S+, extra\), {ref} 1"),
    Case("onnxruntime-fails", "plain", fixed_batch, per_output=False,
         failure=rf"onnxruntime failed on the inputs \(round 2 of 2, input shapes \({verify.ROUNDS[1][0]}, \d+, 4\)\)"),
]
CASE_PARAMS = [pytest.param(case, id=case.id) for case in CASES]


def edited(case: Case, model_proto: onnx.ModelProto) -> onnx.ModelProto:
    return case.edit(model_proto) if case.edit else model_proto


def assert_result(result: verify.VerificationResult, case: Case, reference: str) -> None:
    table = result.table()
    assert table.startswith(f"verification (tolerance {result.tolerance:g}; ONNX vs {reference}; 2 rounds")
    if case.failure is None:
        assert result.passed, table
        assert result.reason() == ""
        assert [c.passed for c in result.checks] == [True], table
        assert result.checks[0].max_abs_error <= result.tolerance
    else:
        assert not result.passed, table
        reason = result.reason()
        assert "\n" not in reason
        assert re.search(case.failure.format(ref=reference), reason), reason
        if case.per_output:
            check = result.checks[0]
            assert not check.passed and reason == f"output {check.name!r}: {check.reason}"
            assert f"  {check.name}: max abs error {check.max_abs_error:.3g} FAILED" in table
            if case.error == "nan":
                assert math.isnan(check.max_abs_error), table
            elif case.error == "inf":
                assert check.max_abs_error == math.inf, table
        else:
            assert result.problem == reason and f"  FAILED: {reason}" in table
        failure = api.VerificationFailed(result, None)  # what the API raises
        assert isinstance(failure, VerificationError)
        assert str(failure).splitlines()[0] == f"verification failed: {reason}"
    if case.nan is not None:
        onnx_nan, reference_nan = case.nan
        check = result.checks[0]
        assert (check.onnx_nan, check.reference_nan) == (onnx_nan, reference_nan), table
        assert f"    NaN: ONNX {onnx_nan}, {reference} {reference_nan}" in table


# -- verify_keras and verify_saved_model ---------------------------------------------------------
@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_verify_keras(case, flavor, models):
    built = models(flavor, case.kind)
    assert_result(verify.verify_keras(built.model, edited(case, built.keras_proto)), case, "Keras")


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_verify_saved_model(case, flavor, models):
    built = models(flavor, case.kind)
    assert [o.name for o in built.saved_proto.graph.output] == ["y"]
    assert_result(verify.verify_saved_model(built.saved_model, edited(case, built.saved_proto)), case, "TensorFlow")


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_special_model_really_gives_nan_and_inf(flavor, models):
    """The "special" conversions run to NaN in column 0 and +Inf in column 1 in onnxruntime, and
    the reference does the same, so the cases built on them test what they claim."""
    built = models(flavor, "special")
    x = np.random.default_rng(0).standard_normal((2, 6, FEATURES)).astype(np.float32)
    for model_proto in (built.keras_proto, built.saved_proto):
        (got,) = parity.run_onnx(helpers.ort_session(model_proto), ["x"], [x])
        for values in (got, np.asarray(built.model(x, training=False))):
            assert np.isnan(values[:, 0]).all() and (values[:, 1] == np.inf).all()
            assert np.isfinite(values[:, 2]).all()


def test_given_inputs_make_one_round(models):
    """``inputs=`` replaces the random rounds; the shapes named are those of the given batch."""
    built = models(parity.FLAVORS[0], "plain")
    x = np.random.default_rng(3).standard_normal((4, 7, FEATURES)).astype(np.float32)
    result = verify.verify_keras(built.model, first_columns(1)(built.keras_proto), inputs=[x])
    assert not result.passed and result.rounds == 1
    assert result.reason().endswith("shape (4, 1) vs Keras (4, 3)"), result.reason()
    assert verify.verify_keras(built.model, built.keras_proto, inputs=[x]).passed


def test_a_reference_that_raises_fails_the_result():
    """Whatever the reference model raises is a failed verification, not an exception."""
    value = helper.make_tensor_value_info("v", TensorProto.FLOAT, [None, 2])
    graph = helper.make_graph([helper.make_node("Identity", ["v"], ["w"])], "identity", [value],
                              [helper.make_tensor_value_info("w", TensorProto.FLOAT, [None, 2])])
    model_proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model_proto.ir_version = 8

    def reference(arrays):
        raise ValueError("the reference cannot run this")

    result = verify.compare(reference, model_proto, reference_name="Keras")
    assert not result.passed and result.checks == []
    assert result.reason() == ("Keras failed on the inputs (round 1 of 2, input shapes (2, 2)): "
                               "ValueError: the reference cannot run this")

    def halved(arrays):  # values off by far more than the tolerance, NaN nowhere
        return [arrays[0] / 2]

    result = verify.compare(halved, model_proto, reference_name="Keras")
    assert re.fullmatch(r"output 'w': max abs error \S+ at \[\d, \d\] exceeds the tolerance 0.0001 \(round 1 of 2\)",
                        result.reason()), result.reason()
    assert 0 < result.checks[0].max_abs_error < math.inf


# -- the CLI's --verify --------------------------------------------------------------------------
def converting_to(monkeypatch, edit) -> list:
    """Make the API's conversion step return ``edit`` of what it converted; the names of the
    edited models' first outputs are appended to the returned list, one per conversion."""
    convert = api.convert
    edited_outputs = []

    def edited_convert(*args, **kwargs):
        conversion = convert(*args, **kwargs)
        conversion.model_proto.CopyFrom(edit(conversion.model_proto))
        edited_outputs.append(conversion.model_proto.graph.output[0].name)
        return conversion

    monkeypatch.setattr(api, "convert", edited_convert)
    return edited_outputs


# each flavor through one CLI door: `keras` through --keras (a Keras file), tf_keras through --saved-model
CLI_SOURCES = [(parity.FLAVORS[0], "--keras"), ("tf_keras", "--saved-model")]


@pytest.mark.parametrize("flavor, source", CLI_SOURCES, ids=[f"{f}{s}" for f, s in CLI_SOURCES])
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_cli_verify(case, flavor, source, models, monkeypatch, tmp_path, capfd):
    built = models(flavor, case.kind)
    path, reference = (built.keras_file, "Keras") if source == "--keras" else (built.saved_model, "TensorFlow")
    edited_outputs = converting_to(monkeypatch, case.edit) if case.edit else None
    output = tmp_path / "model.onnx"
    code = cli.main([source, path, "--output", str(output), "--verify"])
    out, err = capfd.readouterr()
    assert "Traceback" not in err, err
    if case.failure is None:
        assert code == cli.EXIT_OK, err
        assert output.exists()
        assert "FAILED" not in out and "error:" not in err, out + err
        onnx_nan, reference_nan = case.nan
        assert f"    NaN: ONNX {onnx_nan}, {reference} {reference_nan}" in out, out
        return
    assert edited_outputs, "the conversion step was not wrapped: the CLI no longer calls api.convert"
    assert code == cli.EXIT_VERIFICATION_FAILED == 1, err
    assert not output.exists() and list(tmp_path.iterdir()) == []
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: verification failed: "), err
    reason = lines[0][len("error: verification failed: "):]
    assert re.search(case.failure.format(ref=reference), reason), reason
    if case.per_output:
        assert reason.startswith(f"output {edited_outputs[0]!r}: "), reason
    assert "FAILED" in out and f"{output} was not written" in out, out
    if case.nan is not None:
        assert f"    NaN: ONNX {case.nan[0]}, {reference} {case.nan[1]}" in out, out
