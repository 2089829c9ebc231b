"""Test setup shared by the suite.

- TensorFlow's C++ logging is quietened and its thread pools kept small (the suite runs
  under pytest-xdist on a small machine; every worker is its own process).
- Keras 3 and tf_keras are both used in-process: ``TF_USE_LEGACY_KERAS`` must not be set,
  or ``tf.keras`` would be tf_keras while ``import keras`` stays Keras 3.
"""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `import parity` from any test module

def pytest_configure(config):
    if os.environ.get("TF_USE_LEGACY_KERAS", "") not in ("", "0", "false", "False"):
        raise pytest.UsageError("unset TF_USE_LEGACY_KERAS: the tests import keras (3) and tf_keras "
                                "side by side and pick the flavor per test")
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(2)
    except RuntimeError:  # TensorFlow's runtime already started: keep its settings
        pass

