"""rewriters/ ships as tf2onnx_rnn.rewriters, never as a top-level ``rewriters`` package."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import importlib.util, json, tf2onnx_rnn.rewriters as r; "
         "print(json.dumps([r.__name__, r.CELL_MATCHERS[0].__name__, "
         "str(importlib.util.find_spec('rewriters')), r.__file__]))")


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
    name, first_matcher, top_level, _ = _probe()
    assert (name, first_matcher, top_level) == ("tf2onnx_rnn.rewriters", "tf2onnx_rnn.rewriters.lstm", "None")


def test_regular_install_has_the_same_layout(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), ROOT], check=True, capture_output=True)
    assert (target / "tf2onnx_rnn" / "rewriters" / "lstm.py").is_file()
    assert not (target / "rewriters").exists()
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONNOUSERSITE="1")
    name, first_matcher, top_level, location = _probe(env, isolated=True)
    assert (name, first_matcher, top_level) == ("tf2onnx_rnn.rewriters", "tf2onnx_rnn.rewriters.lstm", "None")
    assert location.startswith(str(target)), f"imported {location}, not the regular install"


def test_regular_install_run_from_the_checkout(tmp_path):
    """`python -m tf2onnx_rnn.convert` run inside the checkout imports the checkout's package,
    which must still find its rewriters (they sit beside it there)."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), ROOT], check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{target}", PYTHONNOUSERSITE="1")
    name, first_matcher, _, location = _probe(env, cwd=ROOT, isolated=True)
    assert (name, first_matcher) == ("tf2onnx_rnn.rewriters", "tf2onnx_rnn.rewriters.lstm")
    assert os.path.samefile(location, os.path.join(ROOT, "rewriters", "__init__.py"))
