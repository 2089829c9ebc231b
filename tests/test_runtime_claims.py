"""Every claim of the report's "runs in" line holds: each runtime the report names computes the model there.

The runtime tests' 22 Keras models (``runtime_models.py``), both flavors, in every form the report vouches
for: the default and portable forms at a fixed shape and with the model's own signature (a dynamic batch),
and each runtime target's form. For each runtime the report says computes the model as ONNX defines it
(``report.runs_in``), the model runs there and must give Keras's outputs within that runtime's tolerance:
onnxruntime, OpenVINO (f32), tract and ONNX's reference evaluator in this environment (test extras), IREE,
TVM, ncnn and rknn where ``TF2ONNX_RNN_<RUNTIME>_PYTHON`` names an interpreter that has them (CI's runtimes
slice), each in a child process of ``runtime_runs``, the way the runtime's own users run a model. onnx2torch
is claimed through recurrent converters the user brings: ``tests/pytorch`` checks those claims.

A runtime named but not installed is a skip naming it, unless ``TF2ONNX_RNN_RUNTIMES_REQUIRED`` is set (CI's
runtimes slice), where it is a failure. A model the report names a runtime for that fails or differs there
is a failure listing every claim that did not hold.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import helpers
import parity
from runtime_models import FORMS, MODELS, TARGETS, converted
from tf2onnx_rnn import ConversionError, report_of
from tf2onnx_rnn.consumers import consumers_of
from tf2onnx_rnn.rewriters.runtimes import BY_KEY
from tf2onnx_rnn.runtime_check import RuntimeSession, python_for

REQUIRED = "TF2ONNX_RNN_RUNTIMES_REQUIRED"
ELSEWHERE = {"onnx2torch"}  # claimed with converters the user brings: tests/pytorch runs them
_RAN: dict = {}  # (the model's structure and input, runtime) -> what running it there found, once per process


def _digest(proto, x: np.ndarray) -> str:
    """The model's structure, whatever its tensors' names (``helpers.structure``: both Keras flavors and several
    forms write the same graph), and its input: what one run in a runtime answers for."""
    copy = type(proto)()
    copy.CopyFrom(proto)
    del copy.metadata_props[:]
    text = "\n".join(helpers.structure(copy)) + x.tobytes().hex()
    return hashlib.sha1(text.encode()).hexdigest()


def _ran(digest: str, key: str, run) -> list:
    """What ``run()`` found, once per model structure and runtime: per process, and across processes in the
    folder ``TF2ONNX_RNN_SHARED_MODELS`` names (CI's main suite runs the runtimes it has, its runtimes slice
    the others)."""
    folder = os.environ.get("TF2ONNX_RNN_SHARED_MODELS")
    path = os.path.join(folder, "claims", f"{digest}-{key}.json") if folder else ""
    if (digest, key) not in _RAN and path and os.path.exists(path):
        with open(path) as handle:
            _RAN[digest, key] = json.load(handle)
    if (digest, key) not in _RAN:
        _RAN[digest, key] = found = run()
        if path and not (found and found[0].startswith("not installed")):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{os.getpid()}.partial"  # each process its own: two may write one model at once
            with open(partial, "w") as handle:
                json.dump(found, handle)
            os.replace(partial, path)
    return _RAN[digest, key]


def _problems(key: str, proto, x: np.ndarray, want: list, work: str, relative: float = 0.0) -> list:
    """What running ``proto`` in ``key``'s runtime found against ``want`` (Keras's outputs) within the runtime's
    tolerance, or ``relative`` of each output's largest magnitude where that is more (empty: it holds)."""
    row = BY_KEY[key]
    if key == "onnxruntime":
        got = helpers.ort_session(proto).run(None, {"x": x})
    else:
        python = python_for(row)
        if python is None:
            return [f"not installed: {row.name} ({row.package})"]
        try:
            got = RuntimeSession(proto, row, python, work).run(None, {"x": x})
        except RuntimeError as error:
            return [f"{row.name} fails: {error}"]
    tolerance = max(1e-4, row.tolerance)
    if len(got) != len(want):
        return [f"{row.name} gives {len(got)} outputs, Keras {len(want)}"]
    found = []
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        allowed = max(tolerance, relative * float(np.max(np.abs(w)))) if w.size else tolerance
        if g.size != w.size:
            found.append(f"{row.name}: output {k} has shape {list(g.shape)}, Keras {list(w.shape)}")
        elif not np.allclose(g.reshape(w.shape), w, rtol=tolerance, atol=allowed):
            error = float(np.nanmax(np.abs(g.reshape(w.shape) - w))) if np.isfinite(g).all() else float("nan")
            found.append(f"{row.name}: output {k} is {error:.3g} off (tolerance {tolerance:g}): silently wrong")
    return found


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("form", FORMS)
def test_every_runtime_the_report_names_computes_the_model_in_its_runtime(form, name, flavor, tmp_path):
    """Each target's form is named for its own runtime (test_runtime_targets checks that): this runs it there."""
    x, want, proto = converted(flavor, name, form)
    if isinstance(proto, ConversionError):
        pytest.skip(f"refused: {proto} (test_runtime_targets checks the refusals)")
    named = [key for key in report_of(proto).runs_in if key not in ELSEWHERE]
    assert "onnxruntime" in named, report_of(proto).consumers
    digest, failures, missing = _digest(proto, x), [], []
    for key in named:
        def run(key=key):
            return _problems(key, proto, x, want, str(tmp_path))

        found = run() if key == "onnxruntime" else _ran(digest, key, run)
        (missing if found and found[0].startswith("not installed") else failures).extend(found)
    assert not failures, f"{form} {name} ({flavor}): the report names {', '.join(named)}:\n- " + "\n- ".join(failures)
    if missing and os.environ.get(REQUIRED):
        pytest.fail("; ".join(missing))
    if missing:
        pytest.skip("; ".join(missing) + " (TF2ONNX_RNN_<RUNTIME>_PYTHON names an interpreter that has it)")


QUANTIZED_FORMS = ("default", "portable") + TARGETS
BUDGET = 0.05  # these models' random weights are 1-2% off in int8 on random inputs: every layer within it

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("form", QUANTIZED_FORMS)
def test_the_weights_form_computes_in_its_runtime_wherever_the_float_form_does(form, name, tmp_path):
    """``quantize="weights"`` keeps every runtime the float form runs in (its int8 weights are dequantized by
    ops every runtime computes): the report names them all again, and each computes the quantized model within
    its own tolerance of onnxruntime's run of it, which is within the budget of Keras. The quantization is the
    API's (``quantization.quantize`` on the float form, as ``convert_keras(..., quantize="weights")`` runs it).
    A runtime with a target of its own (IREE, TVM, ncnn, rknn) runs the weights form of its target's model; the
    default and portable forms, which every target's starts from, run in the others (their float forms' claims
    for those runtimes are run by the test above)."""
    _check_quantized(form, name, "weights", str(tmp_path))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("form", QUANTIZED_FORMS)
def test_the_static_form_computes_in_every_runtime_its_report_names(form, name, tmp_path):
    """``quantize="static"`` (QDQ, each layer's input on a scale calibrated on the model's input) is computed
    within the budget of Keras by every runtime its report names; it names no runtime the float form does not,
    and onnxruntime always. The form of a target is written for that target's runtimes (the portable form's
    recurrent layers stay float for OpenVINO)."""
    _check_quantized(form, name, "static", str(tmp_path))


def _check_quantized(form: str, name: str, mode: str, work: str) -> None:
    from tf2onnx_rnn.options import PORTABLE
    from tf2onnx_rnn.quantization import check_mode, quantize
    from tf2onnx_rnn.rewriters.runtimes import RUNTIMES

    x, want, proto = converted(parity.FLAVORS[0], name, form)
    if isinstance(proto, ConversionError):
        pytest.skip(f"refused: {proto} (test_runtime_targets checks the refusals)")
    report = report_of(proto)
    row = BY_KEY.get(form)
    if row is not None and mode == "static" and "QuantizeLinear" in row.lacks:  # refused before converting
        with pytest.raises(ConversionError) as refused:
            check_mode(mode, None, row)
        assert "\n" not in str(refused.value) and row.name in str(refused.value), refused.value
        return
    rows = (row,) if row else tuple(r for r in RUNTIMES if r.target == PORTABLE) if form == PORTABLE else ()
    model, quantization = quantize(proto, mode, BUDGET, x if mode == "static" else None, {}, rows)
    steps = any(o.became == "steps" for o in report.outcomes)
    named = [key for key in consumers_of(model, row, steps).runs_in if key not in ELSEWHERE]
    float_named = [key for key in report.runs_in if key not in ELSEWHERE]
    if mode == "weights":
        assert named == float_named, (named, float_named)
    else:
        assert "onnxruntime" in named and set(named) <= set(float_named), (named, float_named)
    int8 = [r for r in quantization.layers if r.int8]
    assert int8, quantization.lines()
    if mode == "static":  # one scale per layer's input: every step written out and both directions share it
        qdq = [r for r in quantization.layers if r.precision.endswith("(QDQ, calibrated)")]
        scales = {n.input[1] for n in helpers.all_nodes(model) if n.op_type == "QuantizeLinear"}
        assert len(scales) == len(qdq), (sorted(scales), quantization.lines())
    quantized = helpers.ort_session(model).run(None, {"x": x})
    within = _problems("onnxruntime", model, x, want, work, relative=2 * BUDGET)
    assert not within, f"{form} {name}: onnxruntime's run of the {mode} form against Keras: {within}"
    # int8 weights compute alike everywhere; QDQ's int8 arithmetic is each runtime's own: against Keras then
    reference, relative = ([np.asarray(q) for q in quantized], 0.0) if mode == "weights" else (want, 2 * BUDGET)
    digest, failures, missing = _digest(model, x), [], []
    own_targets = {key for key in named if BY_KEY[key].target == key}
    for key in named:
        if key == "onnxruntime" or (key in own_targets and key != form):
            continue

        def run(key=key):
            return _problems(key, model, x, reference, work, relative)

        found = _ran(digest, key, run)
        (missing if found and found[0].startswith("not installed") else failures).extend(found)
    assert not failures, f"{form} {name}, {mode} int8: the report names {', '.join(named)}:\n- " + \
        "\n- ".join(failures)
    if missing and os.environ.get(REQUIRED):
        pytest.fail("; ".join(missing))
    if missing:
        pytest.skip("; ".join(missing) + " (TF2ONNX_RNN_<RUNTIME>_PYTHON names an interpreter that has it)")
