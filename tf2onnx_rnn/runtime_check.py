"""Verification in the runtime a target writes for: the written model run there, against its source.

``--verify`` with a runtime's target (``iree``, ``tvm``, ``rknn``) first verifies in onnxruntime, as
always, then once more in that runtime, where its Python package is installed: each round runs in a
child process of :mod:`.runtime_runs`, kept for the next round (each runtime takes seconds to import), so
a runtime that crashes takes only that process down, and is reported in one line; the next round starts
another. The interpreter is this one, or the one the environment variable
``TF2ONNX_RNN_<RUNTIME>_PYTHON`` names (each of these runtimes pins its own onnx, numpy and torch, so it
often lives in an environment of its own). Where neither has the runtime, the report says so and the
model stays verified in onnxruntime only. The runtime's own arithmetic sets the tolerance where it is
coarser than the one asked (rknn's simulator computes in float16).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import namedtuple
from typing import Optional

import numpy as np
import onnx

from . import runtime_runs
from .rewriters.runtimes import Runtime

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
        failure = _child(self.row, self.python).run([self.path, feeds_path, outputs_path])
        if failure:
            raise RuntimeError(failure)
        stored = np.load(outputs_path)
        return [stored[f"out{k}"] for k in range(len(stored.files))]


class _Child:
    """A child process of :mod:`.runtime_runs` serving one runtime's runs, one after another."""

    def __init__(self, row: Runtime, python: str):
        self.row = row
        self.lock = threading.Lock()  # one run at a time: the answers come back in the order asked
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")  # its pnnx, its iree tools
        self.process = subprocess.Popen([python, runtime_runs.__file__, "--serve", row.key], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    def run(self, job: list) -> str:
        """"" when the run is done, else the line saying why not; a crash or a run over ``TIMEOUT`` seconds
        ends the process (the next run starts another)."""
        with self.lock:
            return self._run(job)

    def _run(self, job: list) -> str:
        answer: list = []
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
        except OSError:  # the process ended before it was asked
            pass
        reader = threading.Thread(target=lambda: answer.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(TIMEOUT)
        if reader.is_alive():
            self.close()
            return f"{self.row.name} took over {TIMEOUT} s"
        if not answer[0]:  # its output closed: it is ending
            self.close(grace=10)
            return f"{self.row.name} crashed (exit {self.process.returncode}) on the model"
        return json.loads(answer[0])

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, grace: float = 0) -> None:
        """End the process, killed if it has not ended within ``grace`` seconds."""
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


_CHILDREN: dict = {}  # (runtime key, interpreter) -> its _Child, while alive
_LOCK = threading.Lock()


def _child(row: Runtime, python: str) -> _Child:
    """The kept child process serving ``row``'s runtime in ``python``: started on first use and after a crash."""
    with _LOCK:
        child = _CHILDREN.get((row.key, python))
        if child is None or not child.alive():
            child = _CHILDREN[row.key, python] = _Child(row, python)
        return child


@atexit.register
def _close_children() -> None:
    for child in _CHILDREN.values():
        child.close()


class _Runner:
    def __init__(self, row: Runtime, python: str, work: str):
        self.row, self.python, self.work, self.name = row, python, work, row.name

    def session(self, model_proto: onnx.ModelProto) -> RuntimeSession:
        return RuntimeSession(model_proto, self.row, self.python, self.work)


def verify_in_runtime(checked, model_proto: onnx.ModelProto, row: Runtime, tolerance: float) -> tuple:
    """(the verification of ``model_proto`` in the runtime of ``row`` (its row of the runtimes' table) against
    ``checked``'s source, or None, one line saying what ran it or why it did not run)."""
    from .comparison import RUNNER

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
