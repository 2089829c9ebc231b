"""rewriters/ ships as tf2onnx_rnn.rewriters, never as a top-level ``rewriters`` package."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the package's subpackages must be exactly ``handlers``, ``rewriters`` and ``sources``: nothing else of the checkout
# (tests, examples, the package itself again) may become importable under tf2onnx_rnn
LEAKS = ("tf2onnx_rnn.tf2onnx_rnn", "tf2onnx_rnn.tests", "tf2onnx_rnn.examples", "tf2onnx_rnn.benchmarks",
         "tf2onnx_rnn.rewriters.rewriters", "tf2onnx_rnn.parity", "tf2onnx_rnn.setup")
PROBE = ("import importlib.util, json, pkgutil, tf2onnx_rnn, tf2onnx_rnn.rewriters as r; "
         f"leaks = [n for n in {LEAKS!r} if importlib.util.find_spec(n) is not None]; "
         "packages = sorted(m.name for m in pkgutil.iter_modules(tf2onnx_rnn.__path__) if m.ispkg); "
         "print(json.dumps([r.__name__, [m.__name__ for m in r.cell_matchers()], "
         "str(importlib.util.find_spec('rewriters')), r.__file__, leaks, packages]))")

# the cell modules found by the package's own discovery, under the installed name
MATCHERS = [f"tf2onnx_rnn.rewriters.cells.{name}" for name in ("gru", "gru_block", "lstm", "lstm_block", "simple_rnn")]


def _only_rewriters(leaks, packages):
    assert leaks == [], f"importable under tf2onnx_rnn: {leaks}"
    assert packages in (["handlers", "sources"], ["handlers", "rewriters", "sources"]), \
        f"subpackages on tf2onnx_rnn's path: {packages}"


def _probe(env=None, cwd="/", isolated=False):
    """Run PROBE. ``isolated``: without site's .pth files (so no editable-install finder), with
    site-packages on PYTHONPATH after whatever ``env`` puts first."""
    command = [sys.executable, "-c", PROBE]
    if isolated:
        command.insert(1, "-S")
        env = dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"]] + site.getsitepackages()))
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=True)
    return json.loads(result.stdout)


def test_installed_environment_maps_rewriters_into_the_package():
    """The environment the suite runs in (an editable install, by the README's second command)."""
    name, matchers, top_level, _, leaks, packages = _probe()
    assert (name, matchers, top_level) == ("tf2onnx_rnn.rewriters", MATCHERS, "None")
    _only_rewriters(leaks, packages)


def test_regular_install_has_the_same_layout(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), ROOT], check=True, capture_output=True)
    assert (target / "tf2onnx_rnn" / "rewriters" / "cells" / "lstm.py").is_file()
    assert not (target / "rewriters").exists()
    missing = [f"{installed}/{module}" for folder, installed in _package_folders()
               for module in os.listdir(os.path.join(ROOT, folder)) if module.endswith(".py")
               and not (target / installed / module).is_file()]
    assert not missing, f"modules of the checkout the regular install lacks (a subpackage setup.cfg omits?): {missing}"
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONNOUSERSITE="1")
    name, matchers, top_level, location, leaks, packages = _probe(env, isolated=True)
    assert (name, matchers, top_level) == ("tf2onnx_rnn.rewriters", MATCHERS, "None")
    assert location.startswith(str(target)), f"imported {location}, not the regular install"
    _only_rewriters(leaks, packages)


def _package_folders() -> list:
    """(folder of the checkout, its folder in an install) of every package the checkout holds."""
    found = []
    for top, installed in (("tf2onnx_rnn", "tf2onnx_rnn"), ("rewriters", "tf2onnx_rnn/rewriters")):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files and "__pycache__" not in folder:
                relative = os.path.relpath(folder, os.path.join(ROOT, top))
                found.append((os.path.relpath(folder, ROOT), os.path.normpath(os.path.join(installed, relative))))
    return found


def test_regular_install_run_from_the_checkout(tmp_path):
    """`python -m tf2onnx_rnn.convert` run inside the checkout imports the checkout's package,
    which must still find its rewriters (they sit beside it there)."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), ROOT], check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{target}", PYTHONNOUSERSITE="1")
    name, matchers, _, location, leaks, packages = _probe(env, cwd=ROOT, isolated=True)
    assert (name, matchers) == ("tf2onnx_rnn.rewriters", MATCHERS)
    assert os.path.samefile(location, os.path.join(ROOT, "rewriters", "__init__.py"))
    _only_rewriters(leaks, packages)


def test_source_checkout_without_any_install():
    """Only the checkout on the path (dependencies from site-packages, no tf2onnx_rnn installed there)."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONNOUSERSITE="1")
    # (a top-level "rewriters" is importable here only because the checkout itself is on the path)
    name, matchers, _, location, leaks, packages = _probe(env, cwd=ROOT, isolated=True)
    assert (name, matchers) == ("tf2onnx_rnn.rewriters", MATCHERS)
    assert os.path.samefile(location, os.path.join(ROOT, "rewriters", "__init__.py"))
    _only_rewriters(leaks, packages)
