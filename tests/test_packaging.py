"""rewriters/ ships as tf2onnx_rnn.rewriters, never as a top-level ``rewriters`` package."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import importlib.util, tf2onnx_rnn.rewriters as r; "
         "print(r.__name__, r.CELL_MATCHERS[0].__name__, importlib.util.find_spec('rewriters'), r.__file__)")


def _probe(env=None, cwd="/"):
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=cwd,
                            check=True)
    return result.stdout.split()


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
    name, first_matcher, top_level, location = _probe(env)
    assert (name, first_matcher, top_level) == ("tf2onnx_rnn.rewriters", "tf2onnx_rnn.rewriters.lstm", "None")
    assert location.startswith(str(target)), f"imported {location}, not the regular install"
