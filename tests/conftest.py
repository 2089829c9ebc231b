"""Test setup shared by the suite.

- TensorFlow's C++ logging is quietened and its thread pools are kept small: the suite runs
  under pytest-xdist on a small machine, and every worker is its own process.
- ``tests/`` is put on ``sys.path`` so test modules can ``import parity`` (shared helpers).
- Keras 3 (``import keras``) and tf_keras (``import tf_keras``) are both used in one process;
  each test picks its flavor (see ``parity.py``).
"""
from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session", autouse=True)
def _small_tensorflow_thread_pools():
    """One intra-op thread per worker; set before TensorFlow's runtime starts, if it has not."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(2)
    except RuntimeError:  # the runtime already started: keep its settings
        pass
    yield


@pytest.fixture(scope="session", autouse=True)
def _every_conversion_passes_the_onnx_checker():
    """Every model the suite converts in-process goes through the full ONNX checker and ONNX
    shape inference (with errors raised) before the test sees it. Conversions the CLI tests run
    in subprocesses are checked on the written file there."""
    import onnx

    from tf2onnx_rnn import api

    finish = api._finish

    def checked_finish(model_proto, report):
        model_proto = finish(model_proto, report)
        onnx.checker.check_model(model_proto, full_check=True)
        onnx.shape_inference.infer_shapes(model_proto, check_type=True, strict_mode=True)
        return model_proto

    api._finish = checked_finish
    yield
    api._finish = finish
