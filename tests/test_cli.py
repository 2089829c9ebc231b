"""The ``tf2onnx-rnn`` command line: conversions, verification, bad input and exit codes.

A handful of cases run the real command in a child process (``python -m tf2onnx_rnn.convert``):
each pays TensorFlow's import, and only a child process shows what a user sees on stderr.
Everything else calls :func:`tf2onnx_rnn.convert.main` in the test process.
"""
from __future__ import annotations

import collections
import importlib.util
import math
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass

import h5py
import keras
import numpy as np
import onnx
import pytest

import cli_models  # noqa: E402  (tests/ is on sys.path, see conftest.py)
import helpers  # noqa: E402
from tf2onnx_rnn import api, probes  # noqa: E402
from tf2onnx_rnn import convert as cli  # noqa: E402

# TensorFlow's C++ log lines ("I0000 00:00:... port.cc:153] ...") and absl's preamble
TF_NOISE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog", re.MULTILINE)
SUMMARY = re.compile(r"^(\d+ recurrent loop\(s\):.*|no recurrent layer loops found: nothing to fuse)$", re.MULTILINE)


# -- models ------------------------------------------------------------------------------------
@dataclass
class Built:
    path: str
    model: object = None  # the Keras model, where the test process has it


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_models")


@pytest.fixture(scope="session")
def keras3_saved_model(models_dir):
    model = cli_models.keras3_lstm_gru()
    path = str(models_dir / "keras3_saved_model")
    model.export(path, verbose=False)
    return Built(path, model)


@pytest.fixture(scope="session")
def keras3_file(models_dir):
    model = cli_models.keras3_rnn_gru()
    path = str(models_dir / "keras3_rnn_gru.keras")
    model.save(path)
    return Built(path, model)


@pytest.fixture(scope="session")
def keras3_h5_file(models_dir):
    model = cli_models.keras3_rnn_gru()
    path = str(models_dir / "keras3_rnn_gru.h5")
    model.save(path)
    return Built(path, model)


@pytest.fixture(scope="session")
def dense_file(models_dir):
    model = cli_models.keras3_dense()
    path = str(models_dir / "dense.keras")
    model.save(path)
    return Built(path, model)


@pytest.fixture(scope="session")
def tf_keras_files(models_dir):
    """(SavedModel directory, .h5 file) of one tf_keras model."""
    model = cli_models.tf_keras_rnn_lstm()
    saved_model, h5 = str(models_dir / "tf_keras_saved_model"), str(models_dir / "tf_keras_rnn_lstm.h5")
    cli_models.save_tf_keras(model, saved_model, h5)
    return Built(saved_model, model), Built(h5, model)


@pytest.fixture(scope="session")
def broken_inputs(models_dir):
    """Files and directories that are not models."""
    root = models_dir / "broken"
    root.mkdir()
    (root / "corrupt.keras").write_bytes(b"this is not a zip archive\n")
    (root / "corrupt.h5").write_bytes(b"this is not an HDF5 file\n")
    (root / "truncated.h5").write_bytes(b"\x89HDF\r\n\x1a\n and then nothing")  # HDF5's signature only
    (root / "not_a_model.txt").write_text("hello\n")
    with zipfile.ZipFile(root / "empty_archive.keras", "w") as archive:
        archive.writestr("readme.txt", "a zip archive without a Keras model in it")
    with h5py.File(root / "no_model.h5", "w") as h5:
        h5.create_dataset("numbers", data=np.arange(3))
    (root / "plain_dir").mkdir()
    (root / "plain_dir" / "variables").mkdir()
    return root


# -- helpers -----------------------------------------------------------------------------------
def run_cli(*args, cwd) -> subprocess.CompletedProcess:
    """The command as a user runs it, with TensorFlow's log level left to the command."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")}
    return subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def report_rows(stdout: str) -> dict:
    """The report table's rows, keyed by layer: (kind, direction, became)."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:4] == ["layer", "kind", "direction", "became"])
    assert set(lines[header + 1].replace(" ", "")) == {"-"}, stdout
    rows = {}
    for line in lines[header + 2:]:
        if SUMMARY.match(line):
            return rows
        layer, kind, direction, became = line.split()[:4]
        assert layer not in rows, f"layer {layer} reported twice:\n{stdout}"
        rows[layer] = (kind, direction, became)
    raise AssertionError(f"no summary line after the report table:\n{stdout}")


def assert_report(stdout: str, expected: dict, traced: bool = False) -> None:
    """Every expected layer has one row saying it became the expected op, and nothing else is there.

    ``traced``: a SavedModel only knows its layers from graph scopes, where tracing may have
    added a ``_<n>`` suffix to the layer name.
    """
    rows = report_rows(stdout)
    assert len(rows) == len(expected), stdout
    for layer, op in expected.items():
        pattern = re.escape(layer) + (r"(_\d+)?" if traced else "")
        found = [row for name, row in rows.items() if re.fullmatch(pattern, name)]
        assert len(found) == 1, f"layer {layer} not reported:\n{stdout}"
        assert found[0][2] == op, f"layer {layer} became {found[0][2]}, not {op}:\n{stdout}"
    summary = SUMMARY.search(stdout).group(0)
    assert summary.startswith(f"{len(expected)} recurrent loop(s): {len(expected)} fused"), summary
    assert summary.endswith("0 left as Loop"), summary


def assert_native_model(path: str, expected: dict) -> onnx.ModelProto:
    """The file holds exactly the expected native nodes and no Loop/Scan anywhere, and passes the
    full ONNX checker."""
    model_proto = onnx.load(path)
    onnx.checker.check_model(model_proto, full_check=True)
    ops = helpers.op_types(model_proto)
    assert not set(ops) & helpers.LOOP_OPS, ops
    native = collections.Counter(op for op in ops if op in helpers.RECURRENT_OPS)
    assert native == collections.Counter(expected.values()), ops
    return model_proto


def run_onnx(path: str, batch: int = 2, steps: int = 7):
    """Load the file in onnxruntime and run it on seeded random input; (input, outputs)."""
    session = helpers.ort_session(path)
    (feed,) = session.get_inputs()
    shape = [batch, steps, cli_models.FEATURES] if len(feed.shape) == 3 else [batch, cli_models.FEATURES]
    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    return x, session.run(None, {feed.name: x})


def assert_matches_keras(path: str, model) -> None:
    x, outputs = run_onnx(path)
    np.testing.assert_allclose(outputs[0], np.asarray(model(x, training=False)), rtol=0, atol=1e-4)


def assert_clean_stderr(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert not re.search(r"^error:", stderr, re.MULTILINE), stderr
    assert not TF_NOISE.search(stderr), stderr


assert_one_error_line = helpers.assert_one_error_line


def assert_verified(stdout: str) -> None:
    table = stdout[stdout.index("verification (tolerance"):]
    checks = re.findall(r"^  \S+: max abs error (\S+) (ok|FAILED)$", table, re.MULTILINE)
    assert checks, stdout
    assert all(status == "ok" and float(error) <= 1e-4 for error, status in checks), stdout


# -- conversions, in a child process -----------------------------------------------------------
def test_keras3_saved_model_converts_and_verifies(keras3_saved_model, tmp_path):
    output = tmp_path / "keras3.onnx"
    result = run_cli("--saved-model", keras3_saved_model.path, "--output", output, "--opset", 17, "--verify",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_clean_stderr(result.stderr)
    assert_report(result.stdout, cli_models.KERAS3_SAVED_MODEL_LAYERS, traced=True)
    assert_verified(result.stdout)
    model_proto = assert_native_model(str(output), cli_models.KERAS3_SAVED_MODEL_LAYERS)
    assert model_proto.opset_import[0].version == 17
    assert_matches_keras(str(output), keras3_saved_model.model)


def test_tf_keras_saved_model_with_underscore_and_hyphen_flags(tf_keras_files, tmp_path):
    saved_model, _ = tf_keras_files
    output = tmp_path / "tf_keras.onnx"
    result = run_cli("--saved_model", saved_model.path, "--output", output, "--signature-def", "serving_default",
                     "--tag", "serve", "--verify", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_clean_stderr(result.stderr)
    assert_report(result.stdout, cli_models.TF_KERAS_LAYERS, traced=True)
    assert_verified(result.stdout)
    assert_native_model(str(output), cli_models.TF_KERAS_LAYERS)
    x, (y,) = run_onnx(str(output))
    np.testing.assert_allclose(y, saved_model.model(x, training=False).numpy(), rtol=0, atol=1e-4)


def test_keras_file_converts_and_verifies(keras3_file, tmp_path):
    output = tmp_path / "keras3_file.onnx"
    result = run_cli("--keras", keras3_file.path, "--output", output, "--verify", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_clean_stderr(result.stderr)
    assert_report(result.stdout, cli_models.KERAS3_FILE_LAYERS)
    assert_verified(result.stdout)
    assert_native_model(str(output), cli_models.KERAS3_FILE_LAYERS)
    assert_matches_keras(str(output), keras3_file.model)


def test_tf_keras_h5_falls_back_to_tf_keras(tf_keras_files, tmp_path):
    _, h5 = tf_keras_files
    with pytest.raises(Exception):  # the premise: Keras 3 cannot read this file
        keras.models.load_model(h5.path, compile=False)
    output = tmp_path / "tf_keras_h5.onnx"
    result = run_cli("--keras", h5.path, "--output", output, "--verify", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_clean_stderr(result.stderr)
    assert_report(result.stdout, cli_models.TF_KERAS_LAYERS)
    assert_verified(result.stdout)
    assert_native_model(str(output), cli_models.TF_KERAS_LAYERS)
    x, (y,) = run_onnx(str(output))
    np.testing.assert_allclose(y, h5.model(x, training=False).numpy(), rtol=0, atol=1e-4)


# -- conversions, in process -------------------------------------------------------------------
def test_keras3_h5_file_converts(keras3_h5_file, tmp_path, capfd):
    output = tmp_path / "keras3_h5.onnx"
    assert cli.main(["--keras", keras3_h5_file.path, "--output", str(output)]) == 0
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "error:" not in err, err
    assert_report(out, cli_models.KERAS3_FILE_LAYERS)
    assert "verification" not in out  # only with --verify
    assert_native_model(str(output), cli_models.KERAS3_FILE_LAYERS)
    assert_matches_keras(str(output), keras3_h5_file.model)


def test_model_without_recurrent_layer_converts(dense_file, tmp_path, capfd):
    output = tmp_path / "dense.onnx"
    assert cli.main(["--keras", dense_file.path, "--output", str(output), "--verify"]) == 0
    out, err = capfd.readouterr()
    assert "error:" not in err, err
    assert "nothing to fuse" in SUMMARY.search(out).group(0), out
    assert report_rows(out) == {}
    assert_verified(out)
    assert_native_model(str(output), {})
    assert_matches_keras(str(output), dense_file.model)


def test_saved_model_with_explicit_signature_and_tag(keras3_saved_model, tmp_path, capfd):
    output = tmp_path / "serve.onnx"
    argv = ["--saved-model", keras3_saved_model.path, "--output", str(output), "--signature_def", "serve",
            "--tag", "serve"]
    assert cli.main(argv) == 0, capfd.readouterr().err
    out, _ = capfd.readouterr()
    assert_report(out, cli_models.KERAS3_SAVED_MODEL_LAYERS, traced=True)
    assert_native_model(str(output), cli_models.KERAS3_SAVED_MODEL_LAYERS)


def test_existing_output_is_replaced_on_success(keras3_file, tmp_path, capfd):
    output = tmp_path / "model.onnx"
    output.write_bytes(b"old contents")
    assert cli.main(["--keras", keras3_file.path, "--output", str(output)]) == 0
    capfd.readouterr()
    assert_native_model(str(output), cli_models.KERAS3_FILE_LAYERS)
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]  # no temporary file left behind


# -- verification failure ----------------------------------------------------------------------
@pytest.mark.parametrize("existing", [False, True], ids=["absent", "existing"])
def test_failed_verification_exits_1_and_writes_nothing(keras3_file, tmp_path, capfd, existing):
    output = tmp_path / "model.onnx"
    if existing:
        output.write_bytes(b"previous model")
    # float32 LSTM/GRU arithmetic in TensorFlow and onnxruntime is never bit-identical
    code = cli.main(["--keras", keras3_file.path, "--output", str(output), "--verify", "--tolerance", "0"])
    out, err = capfd.readouterr()
    assert code == cli.EXIT_VERIFICATION_FAILED == 1
    assert "verification failed" in assert_one_error_line(err)
    assert "FAILED" in out
    assert_report(out, cli_models.KERAS3_FILE_LAYERS)  # the report is printed all the same
    if existing:
        assert output.read_bytes() == b"previous model"
    else:
        assert not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["model.onnx"] if existing else [])


def test_failed_verification_in_a_child_process_exits_1_and_keeps_the_old_output(keras3_saved_model, tmp_path):
    output = tmp_path / "model.onnx"
    output.write_bytes(b"previous model")
    result = run_cli("--saved-model", keras3_saved_model.path, "--output", output, "--verify",
                     "--tolerance", "1e-12", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "verification failed" in assert_one_error_line(result.stderr)
    assert "FAILED" in result.stdout
    assert output.read_bytes() == b"previous model"


# -- bad input ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BadInput:
    """A command line with bad input; {placeholders} name fixtures' paths, {output} the output."""

    id: str
    argv: tuple
    message: str  # a regular expression the error line must match
    output_dir_ok: bool = True  # False: the output's directory is itself the bad input


def _out_of_range_opsets():
    supported = probes.supported_opsets()
    return supported.start - 1, supported.stop


BAD_INPUTS = [
    BadInput("missing-saved-model", ("--saved-model", "{missing}", "--output", "{output}"),
             "no such SavedModel directory"),
    BadInput("missing-keras-file", ("--keras", "{missing}.keras", "--output", "{output}"), "no such Keras file"),
    BadInput("dir-not-a-saved-model", ("--saved-model", "{broken}/plain_dir", "--output", "{output}"),
             "not a SavedModel directory"),
    BadInput("saved-model-is-a-file", ("--saved-model", "{keras3_file}", "--output", "{output}"),
             "needs a directory.*use --keras"),
    BadInput("keras-is-a-directory", ("--keras", "{keras3_saved_model}", "--output", "{output}"),
             "needs a .keras or .h5 file.*use --saved-model"),
    BadInput("keras-wrong-extension", ("--keras", "{broken}/not_a_model.txt", "--output", "{output}"),
             r"needs a \.keras or \.h5 file"),
    BadInput("corrupt-keras-file", ("--keras", "{broken}/corrupt.keras", "--output", "{output}"),
             "not a .keras model archive"),
    BadInput("keras-archive-without-model", ("--keras", "{broken}/empty_archive.keras", "--output", "{output}"),
             "cannot load Keras model"),
    BadInput("corrupt-h5-file", ("--keras", "{broken}/corrupt.h5", "--output", "{output}"), "not an HDF5 file"),
    BadInput("truncated-h5-file", ("--keras", "{broken}/truncated.h5", "--output", "{output}"),
             r"cannot load Keras model.*Keras [\d.]+: .*tf_keras: "),
    BadInput("h5-without-model", ("--keras", "{broken}/no_model.h5", "--output", "{output}"),
             r"cannot load Keras model.*Keras [\d.]+: .*tf_keras: "),
    BadInput("unknown-signature-def", ("--saved-model", "{keras3_saved_model}", "--signature_def", "nope",
                                       "--output", "{output}"), "unknown signature_def 'nope'.*serve"),
    BadInput("unknown-tag", ("--saved-model", "{keras3_saved_model}", "--tag", "nope", "--output", "{output}"),
             "unknown tag 'nope'.*serve"),
    BadInput("opset-too-low", ("--keras", "{keras3_file}", "--opset", "{opset_low}", "--output", "{output}"),
             "opset .* is not supported"),
    BadInput("opset-too-high", ("--saved-model", "{keras3_saved_model}", "--opset", "{opset_high}",
                                "--output", "{output}"), "opset .* is not supported"),
    BadInput("opset-not-a-number", ("--keras", "{keras3_file}", "--opset", "seventeen", "--output", "{output}"),
             "argument --opset: invalid int value"),
    BadInput("negative-tolerance", ("--keras", "{keras3_file}", "--verify", "--tolerance", "-1",
                                    "--output", "{output}"), "argument --tolerance"),
    BadInput("nan-tolerance", ("--keras", "{keras3_file}", "--verify", "--tolerance", "nan",
                               "--output", "{output}"), "argument --tolerance"),
    BadInput("signature-def-with-keras", ("--keras", "{keras3_file}", "--signature-def", "serve",
                                          "--output", "{output}"), "--signature_def applies to --saved-model only"),
    BadInput("both-sources", ("--saved-model", "{keras3_saved_model}", "--keras", "{keras3_file}",
                              "--output", "{output}"), "not allowed with"),
    BadInput("neither-source", ("--output", "{output}"), "one of the arguments .* is required"),
    BadInput("no-output", ("--keras", "{keras3_file}"), "required: --output"),
    BadInput("unknown-flag", ("--keras", "{keras3_file}", "--output", "{output}", "--frobnicate"),
             "unrecognized arguments: --frobnicate"),
    BadInput("tflite-missing", ("--tflite", "{missing}", "--output", "{output}"), "no such TFLite file"),
    BadInput("tflite-is-a-directory", ("--tflite", "{broken}", "--output", "{output}"),
             "--tflite needs a .tflite file, got a directory"),
    BadInput("tflite-wrong-format", ("--tflite", "{broken}/not_a_model.txt", "--output", "{output}"),
             "not a TFLite file"),
    BadInput("tflite-given-a-keras-file", ("--tflite", "{keras3_file}", "--output", "{output}"), "not a TFLite file"),
    BadInput("graphdef-missing", ("--graphdef", "{missing}", "--inputs", "x:0", "--outputs", "y:0",
                                  "--output", "{output}"), "no such file for --graphdef"),
    BadInput("graphdef-wrong-format", ("--graphdef", "{broken}/corrupt.h5", "--inputs", "x:0", "--outputs", "y:0",
                                       "--output", "{output}"), "not a TensorFlow GraphDef"),
    BadInput("graphdef-without-outputs", ("--graphdef", "{broken}/not_a_model.txt", "--inputs", "x:0",
                                          "--output", "{output}"), "a frozen graph needs --outputs"),
    BadInput("graphdef-without-inputs", ("--graphdef", "{broken}/not_a_model.txt", "--outputs", "y:0",
                                         "--output", "{output}"), "a frozen graph needs --inputs"),
    BadInput("checkpoint-not-a-meta-graph", ("--checkpoint", "{broken}/not_a_model.txt", "--inputs", "x:0",
                                             "--outputs", "y:0", "--output", "{output}"),
             r"--checkpoint takes a checkpoint's \.meta file"),
    BadInput("outputs-with-keras", ("--keras", "{keras3_file}", "--outputs", "y:0", "--output", "{output}"),
             "--outputs applies to --graphdef and --checkpoint only"),
    BadInput("drop-cell-clip-with-saved-model", ("--saved-model", "{keras3_saved_model}", "--drop-cell-clip",
                                                 "--output", "{output}"), "--drop-cell-clip applies to --tflite only"),
    BadInput("training-artifacts-without-the-training-build",
             ("--saved-model", "{keras3_saved_model}", "--training-artifacts", "{outdir}/artifacts", "--output",
              "{output}"), "training artifacts need onnxruntime's training build"),
    BadInput("output-is-a-directory", ("--keras", "{keras3_file}", "--output", "{outdir}"),
             "--output is a directory", output_dir_ok=False),
    BadInput("output-dir-missing", ("--keras", "{keras3_file}", "--output", "{outdir}/missing/model.onnx"),
             "output directory does not exist", output_dir_ok=False),
    BadInput("output-dir-not-writable", ("--keras", "{keras3_file}", "--output", "{readonly}/model.onnx"),
             "output directory is not writable", output_dir_ok=False),
]


@pytest.fixture
def paths(request, tmp_path, broken_inputs):
    """Placeholder values for BadInput.argv; fixtures are built only when a case names them."""
    low, high = _out_of_range_opsets()
    values = {"missing": str(tmp_path / "does_not_exist"), "broken": str(broken_inputs),
              "output": str(tmp_path / "out" / "model.onnx"), "outdir": str(tmp_path / "out"),
              "opset_low": str(low), "opset_high": str(high), "readonly": _readonly_dir(tmp_path)}
    (tmp_path / "out").mkdir()
    for name in ("keras3_file", "keras3_saved_model"):
        case = request.node.callspec.params.get("case")
        if case is not None and "{" + name + "}" in " ".join(case.argv):
            values[name] = request.getfixturevalue(name).path
    return values


def _readonly_dir(tmp_path) -> str:
    """A directory this process cannot create files in (root ignores mode bits: use /sys then)."""
    if os.geteuid() == 0:
        return "/sys"
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o555)
    return str(readonly)


def _snapshot(directory) -> dict:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


# each case with no output file, and (where the output's directory can hold one) with an old one
def _applies(case: BadInput) -> bool:
    """Every case applies, but the one for a missing training build where it is installed."""
    return case.id != "training-artifacts-without-the-training-build" or \
        importlib.util.find_spec("onnxruntime.training") is None


BAD_INPUT_PARAMS = [pytest.param(case, existing, id=f"{case.id}-{'existing' if existing else 'absent'}")
                    for case in BAD_INPUTS if _applies(case)
                    for existing in (False, True) if case.output_dir_ok or not existing]


@pytest.mark.parametrize("case, existing", BAD_INPUT_PARAMS)
def test_bad_input_exits_2_with_one_error_line(case, existing, paths, tmp_path, capfd):
    output = tmp_path / "out" / "model.onnx"
    if existing:
        output.write_bytes(b"previous model")
    before = _snapshot(tmp_path / "out")
    code = cli.main([arg.format(**paths) for arg in case.argv])
    out, err = capfd.readouterr()
    assert code == cli.EXIT_BAD_INPUT == 2, err
    line = assert_one_error_line(err)
    assert re.search(case.message, line), line
    assert "verification" not in out and "recurrent loop" not in out
    assert _snapshot(tmp_path / "out") == before  # not created, or byte-identical


def test_bad_input_with_debug_shows_the_traceback(tmp_path, capfd):
    code = cli.main(["--saved-model", str(tmp_path / "missing"), "--output", str(tmp_path / "m.onnx"), "--debug"])
    err = capfd.readouterr().err
    assert code == 2
    assert "Traceback" in err and "ConversionError" in err
    assert err.strip().splitlines()[-1].startswith("error: no such SavedModel directory")
    assert not (tmp_path / "m.onnx").exists()


def test_internal_error_exits_3_with_traceback(keras3_file, tmp_path, capfd, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "convert", broken)
    output = tmp_path / "model.onnx"
    output.write_bytes(b"previous model")
    code = cli.main(["--keras", keras3_file.path, "--output", str(output)])
    err = capfd.readouterr().err
    assert code == cli.EXIT_INTERNAL_ERROR == 3
    assert "Traceback" in err
    assert err.strip().splitlines()[-1] == "error: internal error: RuntimeError: boom"
    assert output.read_bytes() == b"previous model"


@pytest.mark.parametrize("argv, message, existing", [
    (("--saved-model", "{missing}", "--output", "{output}"), "no such SavedModel directory", False),
    (("--keras", "{broken}/empty_archive.keras", "--output", "{output}"), "cannot load Keras model", False),
    (("--saved-model", "{saved_model}", "--signature_def", "nope", "--output", "{output}"), "unknown signature_def",
     True),
    (("--saved-model", "{saved_model}", "--opset", "{opset_high}", "--output", "{output}"), "is not supported",
     True),
    (("--output", "{output}"), "one of the arguments", True),
], ids=["missing-path", "archive-without-model", "unknown-signature", "opset", "usage"])
def test_bad_input_in_a_child_process(argv, message, existing, keras3_saved_model, broken_inputs, tmp_path):
    """What a user sees: one error line, no traceback and no TensorFlow log, exit status 2."""
    output = tmp_path / "model.onnx"
    if existing:
        output.write_bytes(b"previous model")
    values = {"missing": tmp_path / "missing", "broken": broken_inputs, "output": output,
              "saved_model": keras3_saved_model.path, "opset_high": _out_of_range_opsets()[1]}
    result = run_cli(*[arg.format(**values) for arg in argv], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in assert_one_error_line(result.stderr)
    assert result.stdout == ""
    if existing:
        assert output.read_bytes() == b"previous model"
    else:
        assert not output.exists()


# -- the parser ----------------------------------------------------------------------------------
def test_parser_accepts_both_spellings_and_sets_the_defaults():
    parser = cli.build_parser()
    hyphen = parser.parse_args(["--saved-model", "d", "--signature-def", "s", "--output", "o"])
    underscore = parser.parse_args(["--saved_model", "d", "--signature_def", "s", "--output", "o"])
    assert vars(hyphen) == vars(underscore)
    assert (hyphen.saved_model, hyphen.signature_def, hyphen.tolerance) == ("d", "s", 1e-4)
    assert not hyphen.verify and not hyphen.debug and hyphen.opset is None and hyphen.tag is None


@pytest.mark.parametrize("text, ok", [("0", True), ("1e-3", True), ("-1e-9", False), ("inf", False),
                                      ("nan", False), ("x", False)])
def test_tolerance_must_be_a_finite_non_negative_number(text, ok):
    parser = cli.build_parser()
    argv = ["--keras", "m.keras", "--output", "o", "--tolerance", text]
    if ok:
        assert math.isclose(parser.parse_args(argv).tolerance, float(text))
    else:
        with pytest.raises(cli.UsageError, match="--tolerance"):
            parser.parse_args(argv)
