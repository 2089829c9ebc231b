"""Setup for the PyTorch tests (converted models run in PyTorch through onnx2torch).

- ``tests/`` and this directory are put on ``sys.path``: the tests import ``downstream_models``,
  ``helpers`` and ``parity`` from the suite, and ``recurrent_converters`` from here.
- torchvision: onnx2torch imports it only in its NonMaxSuppression and RoiAlign converters, but
  imports those with the package. Where ``import torchvision`` fails (not installed, or a build
  that does not load beside this torch, such as a CUDA build next to a CPU torch), a stand-in
  module takes its place before onnx2torch is imported: those two converters then raise when a
  model uses them, and every other converter works.
- torch computes on one thread: pytest-xdist runs a process per core.

Where torch or onnx2torch is not installed (the main environment), ``test_onnx2torch.py`` skips
itself (a skip raised here, in a conftest pytest loads before collecting, would stop the run
instead); CI runs it in its training environment (``.ci/training-requirements.txt`` plus
onnx2torch).
"""
from __future__ import annotations

import os
import sys
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), _HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def _unavailable(name: str):
    def function(*args, **kwargs):
        raise RuntimeError(f"torchvision.ops.{name}: torchvision is not available here (a stand-in module "
                           f"lets onnx2torch import; its NonMaxSuppression and RoiAlign converters cannot run)")

    function.__name__ = name
    return function


def _torchvision_stand_in() -> None:
    """Put a module named ``torchvision`` (with the ``ops`` onnx2torch reads) in ``sys.modules``."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]  # what a failed import left behind
    ops = types.ModuleType("torchvision.ops", "Stand-in: torchvision is not available here.")
    for name in ("nms", "roi_align", "box_convert"):
        setattr(ops, name, _unavailable(name))
    package = types.ModuleType("torchvision", "Stand-in: torchvision is not available here.")
    package.__path__ = []  # a package, so that `from torchvision.ops import ...` resolves
    package.ops = ops
    package.__version__ = "0+stand-in"
    sys.modules["torchvision"] = package
    sys.modules["torchvision.ops"] = ops


try:
    import torch
except ImportError:  # test_onnx2torch.py skips itself
    torch = None

if torch is not None:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or a build that does not load (ImportError, RuntimeError...)
        _torchvision_stand_in()
    torch.set_num_threads(1)
