"""Test setup shared by the suite.

- TensorFlow's C++ logging is quietened and its thread pools are kept small: the suite runs
  under pytest-xdist on a small machine, and every worker is its own process.
- ``tests/`` is put on ``sys.path`` so test modules can ``import helpers`` (kinds, sessions, graph
  walking) and ``import parity`` (parity-test models and conversions).
- The command line (``convert.main``) sets levels on TensorFlow's, tf2onnx's and this package's
  loggers: every test gets them back as they were.
- Keras 3 (``import keras``) and tf_keras (``import tf_keras``) are both used in one process;
  each test picks its flavor (see ``parity.py``).
- ``TF2ONNX_RNN_TEST_SAMPLE=N`` runs one in N of each parametrized test's cases, the same ones every
  run, and every test with no parameters (CI's slice on the oldest stack).
"""
from __future__ import annotations

import logging
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


SAMPLE = "TF2ONNX_RNN_TEST_SAMPLE"  # N: one in N of each parametrized test's cases (CI's oldest-stack slice)


def pytest_report_header(config):
    """Which Keras flavors the parametrized tests run (``TF2ONNX_RNN_TEST_FLAVORS`` narrows them), and
    the sample of their cases (``TF2ONNX_RNN_TEST_SAMPLE``)."""
    import parity

    narrowed = " (narrowed by TF2ONNX_RNN_TEST_FLAVORS)" if os.environ.get("TF2ONNX_RNN_TEST_FLAVORS") else ""
    every = os.environ.get(SAMPLE, "").strip()
    sampled = f"; one in {every} of each parametrized test's cases ({SAMPLE})" if every else ""
    return f"Keras flavors: {', '.join(parity.FLAVORS)}{narrowed}{sampled}"


def _sampled(items: list, every: int) -> tuple:
    """(kept, dropped): of each test function's parametrized cases, those whose id hashes to 0 modulo
    ``every`` (the same cases every run, and the same case of every function given it, so tests sharing
    a conversion stay together), and at least one per function; every test with no parameters."""
    import zlib

    def drawn(item) -> int:
        return zlib.crc32(item.callspec.id.encode())

    by_function: dict = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        key = (item.module.__name__, item.originalname) if callspec is not None else item.nodeid
        by_function.setdefault(key, []).append(item)
    kept = set()
    for cases in by_function.values():
        if getattr(cases[0], "callspec", None) is None:
            kept.update(map(id, cases))
            continue
        chosen = [item for item in cases if drawn(item) % every == 0]
        kept.update(map(id, chosen or [min(cases, key=drawn)]))
    return [item for item in items if id(item) in kept], [item for item in items if id(item) not in kept]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """With ``TF2ONNX_RNN_TEST_SAMPLE=N`` (CI's slice on the oldest stack), one in N of each parametrized
    test's cases runs (:func:`_sampled`); the rest are deselected, saying how many.

    Tests of one module given the same parameters run in one xdist worker (``--dist loadgroup``,
    pyproject.toml): they share the conversion cached per process (``parity.converted``), which two
    workers would each make. First among the hooks: xdist's reads the groups to name each test's
    (its node id gets ``@<group>``); run after it, the marks were ignored."""
    every = os.environ.get(SAMPLE, "").strip()
    if every:
        if not every.isdigit() or int(every) < 1:
            raise pytest.UsageError(f"{SAMPLE}={every}: a whole number of 1 or more")
        items[:], dropped = _sampled(items, int(every))
        if dropped:
            config.hook.pytest_deselected(items=dropped)
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            # no "]" in the name: xdist takes what follows the last "@" for the group only when no "]" does
            group = f"{item.module.__name__}:{callspec.id}".replace("[", "(").replace("]", ")")
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _restore_logger_levels():
    """The command line sets levels on TensorFlow's, tf2onnx's and our loggers: undo that after each test."""
    names = ("tensorflow", "tf2onnx", "absl", "tf2onnx_rnn")
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


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
def _lean_tf_keras_construction():
    """Building a tf_keras (or Keras 2) model, each layer is called once on placeholders in a throwaway
    graph, to learn its outputs' shapes (``Layer._infer_output_signature``). There an LSTM or GRU also
    registers its cuDNN variant and that variant's gradients (``gru_lstm_utils.function_register``), about
    0.7 s per layer, for a graph nobody runs: the suite builds its models without it. The layers, their
    weights and every call of a built model (eager, traced, saved: a SavedModel still holds the variant)
    are as tf_keras makes them."""
    import importlib

    import parity
    from tf2onnx_rnn.keras_kernels import cpu_kernels  # which, tracing, does not register the variant

    def lean(infer):
        def infer_without_registering(self, *args, **kwargs):
            with cpu_kernels():
                return infer(self, *args, **kwargs)

        return infer_without_registering

    patched = []
    # the flavors the tests build with, and no other: importing tf_keras 2.15 beside Keras 2.15 makes Keras 2's
    # LSTM and GRU take their plain loop from then on (measured: ``_could_use_gpu_kernel`` turns False)
    for flavor in {parity.keras_module(f).__name__ for f in parity.FLAVORS if f != "keras3"}:
        try:
            layer = importlib.import_module(f"{flavor}.src.engine.base_layer").Layer
        except ImportError:  # another layout: built as tf_keras builds them
            continue
        infer = layer.__dict__["_infer_output_signature"]
        layer._infer_output_signature = lean(infer)
        patched.append((layer, infer))
    yield
    for layer, infer in patched:
        layer._infer_output_signature = infer


@pytest.fixture(scope="session", autouse=True)
def _every_conversion_is_checked_and_runs():
    """Every model the suite converts in-process goes through the full ONNX checker and ONNX
    shape inference (with errors raised), and is loaded and run once in onnxruntime on random
    inputs, before the test sees it. Conversions the CLI tests run in subprocesses are checked
    on the written file there."""
    import onnx

    from tf2onnx_rnn import api, probes
    from tf2onnx_rnn.inputs import random_inputs
    from tf2onnx_rnn.verify import onnx_input_specs

    convert = api.convert

    def checked_convert(source, options):
        conversion = convert(source, options)
        model_proto = conversion.model_proto
        if not options.continue_on_error:
            onnx.checker.check_model(model_proto, full_check=True)
            onnx.shape_inference.infer_shapes(model_proto, check_type=True, strict_mode=True)
            session = probes.session(model_proto)
            specs = onnx_input_specs(model_proto)
            session.run(None, {name: array for (name, _, _), array in zip(specs, random_inputs(specs, seed=1))})
        return conversion

    api.convert = checked_convert
    yield
    api.convert = convert
