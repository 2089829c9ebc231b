"""Verification in the runtime a target writes for: the written model run there, against its source.

``--verify`` with a runtime's target (``iree``, ``tvm``, ``rknn``) first verifies in onnxruntime, as
always, then once more in that runtime, where its Python package is installed: each round runs
:mod:`.runtime_runs` in a child process (a runtime that crashes takes only that process down, and is
reported in one line). The interpreter is this one, or the one the environment variable
``TF2ONNX_RNN_<RUNTIME>_PYTHON`` names (each of these runtimes pins its own onnx, numpy and torch, so it
often lives in an environment of its own). Where neither has the runtime, the report says so and the
model stays verified in onnxruntime only. The runtime's own arithmetic sets the tolerance where it is
coarser than the one asked (rknn's simulator computes in float16).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections import namedtuple
from typing import Optional

import numpy as np
import onnx

from . import runtime_runs
from .rewriters.runtimes import BY_KEY, Runtime

_Output = namedtuple("_Output", "name")
TIMEOUT = 1800  # seconds a runtime may take to compile and run one round


def python_for(row: Runtime) -> Optional[str]:
    """The interpreter that has ``row``'s runtime: named by ``TF2ONNX_RNN_<KEY>_PYTHON``, or this one if it
    has the package; else None."""
    named = os.environ.get(f"TF2ONNX_RNN_{row.key.upper()}_PYTHON")
    if named:
        return named
    try:
        found = importlib.util.find_spec(row.package.split(".")[0]) is not None
    except (ImportError, ValueError):
        found = False
    return sys.executable if found else None


class RuntimeSession:
    """An onnxruntime-like session whose ``run`` computes the model in another runtime, in a child process."""

    def __init__(self, model_proto: onnx.ModelProto, row: Runtime, python: str, work: str):
        self.row, self.python, self.work = row, python, work
        self.path = os.path.join(work, "model.onnx")
        onnx.save(model_proto, self.path)
        self.names = [o.name for o in model_proto.graph.output]

    def get_outputs(self) -> list:
        return [_Output(name) for name in self.names]

    def run(self, _, feeds: dict) -> list:
        feeds_path, outputs_path = os.path.join(self.work, "feeds.npz"), os.path.join(self.work, "outputs.npz")
        np.savez(feeds_path, **feeds)
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(self.python) + os.pathsep + env.get("PATH", "")  # its pnnx, its iree tools
        try:
            done = subprocess.run([self.python, runtime_runs.__file__, self.row.key, self.path, feeds_path,
                                   outputs_path], capture_output=True, text=True, timeout=TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self.row.name} took over {TIMEOUT} s") from None
        if done.returncode < 0 or done.returncode not in (0, 2):
            raise RuntimeError(f"{self.row.name} crashed (exit {done.returncode}) on the model")
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(lines[-1] if lines else f"{self.row.name} failed")
        stored = np.load(outputs_path)
        return [stored[f"out{k}"] for k in range(len(stored.files))]


class _Runner:
    def __init__(self, row: Runtime, python: str, work: str):
        self.row, self.python, self.work, self.name = row, python, work, row.name

    def session(self, model_proto: onnx.ModelProto) -> RuntimeSession:
        return RuntimeSession(model_proto, self.row, self.python, self.work)


def verify_in_runtime(checked, model_proto: onnx.ModelProto, target: str, tolerance: float) -> tuple:
    """(the verification of ``model_proto`` in ``target``'s runtime against ``checked``'s source, or None,
    one line saying what ran it or why it did not run)."""
    from .comparison import RUNNER

    row = BY_KEY[target]
    python = python_for(row)
    if python is None:
        return None, (f"{row.name} is not installed here ({row.package}; see docs/downstream.md): "
                      "verified in onnxruntime only")
    with tempfile.TemporaryDirectory() as work, _running(RUNNER, _Runner(row, python, work)):
        result = checked.verify(model_proto, max(tolerance, row.tolerance))
    return result, f"verified in {row.name} too"


@contextlib.contextmanager
def _running(variable, runner):
    token = variable.set(runner)
    try:
        yield
    finally:
        variable.reset(token)
