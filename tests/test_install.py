"""Installing into a user's environment changes nothing of their TensorFlow stack.

pip's own resolver decides: ``pip install --dry-run --report`` on this checkout, in the
environment the suite runs in (CI runs the suite on the newest stack and this file again on the
oldest, TensorFlow 2.15.1), must plan no new version of TensorFlow, Keras, numpy or protobuf.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what a user's environment already pins down and an install must leave alone
USERS_STACK = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "keras", "tf-keras",
               "numpy", "protobuf")


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def _installed() -> dict:
    return {_normal(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def _planned(targets: list, tmp_path) -> dict:
    """What ``pip install *targets`` would install or replace here: name -> version."""
    report = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                             *targets], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return {_normal(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def _tensorflow_pin(installed: dict) -> str:
    """The user's TensorFlow as a requirement, whichever distribution it is."""
    name = next(n for n in USERS_STACK if n.startswith("tensorflow") and n in installed)
    return f"{name}=={installed[name]}"


@pytest.mark.parametrize("how", ["plain", "tensorflow-extra", "tensorflow-named"])
def test_install_leaves_the_users_stack_alone(how, tmp_path):
    """``pip install tf2onnx-rnn`` into a tf2onnx user's environment; with the [tensorflow] extra;
    and the README's advice for an environment with TensorFlow alone (pip's resolver ignores the
    limits of installed packages it is not asked about): name your TensorFlow in the command."""
    installed = _installed()
    present = [name for name in USERS_STACK if name in installed]
    assert "tensorflow" in present or "tensorflow-cpu" in present, "the suite runs with TensorFlow installed"
    targets = {"plain": [ROOT], "tensorflow-extra": [ROOT + "[tensorflow]"],
               "tensorflow-named": [ROOT, _tensorflow_pin(installed)]}[how]
    planned = _planned(targets, tmp_path)
    assert "tf2onnx-rnn" in planned, planned
    changed = {name: (installed[name], planned[name]) for name in present if name in planned}
    assert not changed, f"pip would replace the user's packages (installed, planned): {changed}"


def test_tensorflow_is_not_a_hard_dependency():
    """tensorflow-cpu, tensorflow-macos... users keep their distribution: TensorFlow is an extra."""
    from setuptools.config.setupcfg import read_configuration

    config = read_configuration(os.path.join(ROOT, "setup.cfg"))
    requires = [_normal(r.split(">")[0].split("<")[0].split("=")[0]) for r in config["options"]["install_requires"]]
    assert not any(name.startswith("tensorflow") or name in ("keras", "tf-keras") for name in requires), requires
    extras = config["options"]["extras_require"]
    assert any(r.startswith("tensorflow>=2.15") for r in extras["tensorflow"]), extras["tensorflow"]


def test_import_without_tensorflow_says_what_to_install():
    """No TensorFlow importable: ``import tf2onnx_rnn`` fails with one line naming what to install,
    and the command line exits 2 with that line and no traceback."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    # -S: no site-packages, so TensorFlow (and everything else installed) is out of reach
    imported = subprocess.run([sys.executable, "-S", "-c", "import tf2onnx_rnn"], capture_output=True, text=True,
                              env=env, timeout=120)
    assert imported.returncode != 0
    last = imported.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tf2onnx-rnn needs TensorFlow") and "pip install tensorflow" in last, last
    command = subprocess.run([sys.executable, "-S", "-m", "tf2onnx_rnn.convert", "--keras", "m.keras", "--output",
                              "m.onnx"], capture_output=True, text=True, env=env, timeout=120)
    assert command.returncode == 2
    assert command.stderr.strip().splitlines() == [
        "error: tf2onnx-rnn needs TensorFlow 2.15 to 2.21: pip install tensorflow (or tensorflow-cpu), "
        "or pip install 'tf2onnx-rnn[tensorflow]'"], command.stderr


def test_an_onnx_that_cannot_import_with_this_ml_dtypes_is_one_line(tmp_path):
    """onnx 1.19+ under TensorFlow 2.15-2.17's ml_dtypes (< 0.5) fails inside ``import onnx`` with an
    AttributeError: the package says so in one line with the fix, the command line exits 2."""
    fake = tmp_path / "onnx"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise AttributeError(\"module 'ml_dtypes' has no attribute 'float4_e2m1fn'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    imported = subprocess.run([sys.executable, "-c", "import tf2onnx_rnn"], capture_output=True, text=True,
                              env=env, timeout=300)
    assert imported.returncode != 0
    last = imported.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the installed onnx ") and "needs ml_dtypes 0.5 or later" in last, last
    assert last.endswith("pip install 'onnx>=1.16,<1.19'"), last
    command = subprocess.run([sys.executable, "-m", "tf2onnx_rnn.convert", "--keras", "m.keras", "--output",
                              "m.onnx"], capture_output=True, text=True, env=env, timeout=300)
    assert command.returncode == 2
    errors = [line for line in command.stderr.strip().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "needs ml_dtypes 0.5 or later" in errors[0], command.stderr
    assert "Traceback" not in command.stderr, command.stderr
