"""The exceptions the package raises to its users, shared by the API, the CLI and verification.

A message that names one of the API's parameters marks the name with :func:`param`: Python callers
read the parameter's name (``rename_inputs``), and the command line shows its own flag
(``--rename-inputs``) through :meth:`ConversionError.spelled`.
"""
from __future__ import annotations

from typing import Callable

_MARK = "\x1f"  # around a parameter's name in a message (the ASCII unit separator: never in a name)


def param(name: str) -> str:
    """An API parameter's name, marked in a message so that each front door can spell it its way."""
    return f"{_MARK}{name}{_MARK}"


def _spelled(text: str, spell: Callable[[str], str]) -> str:
    parts = text.split(_MARK)
    return "".join(spell(part) if index % 2 else part for index, part in enumerate(parts))


class ConversionError(Exception):
    """Bad input to a conversion: a missing or unreadable model, an unknown signature, a bad option."""

    def __init__(self, message: str):
        self.marked = message
        super().__init__(_spelled(message, str))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message with each parameter's name as ``spell(name)`` gives it (a command-line flag)."""
        return _spelled(self.marked, spell)


class VerificationError(Exception):
    """The ONNX model's outputs differ from the TensorFlow model's beyond the tolerance."""


def first_line(error) -> str:
    """The first line of an exception's message (its type name when the message is empty), or of a text."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ("" if isinstance(error, str) else type(error).__name__)


# the libraries a conversion runs the model through: what they raise on a model is about the model
_LIBRARIES = ("tensorflow", "tf2onnx", "keras", "tf_keras", "google")


def raised_by_library(error: BaseException) -> bool:
    """Whether ``error`` was raised inside TensorFlow, Keras, tf2onnx or protobuf (its innermost frame
    is theirs), as opposed to this package's own code."""
    import os
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return False
    parts = os.path.normpath(frames[-1].filename).split(os.sep)
    installed = [index for index, part in enumerate(parts[:-1]) if part in ("site-packages", "dist-packages")]
    return bool(installed) and parts[installed[-1] + 1] in _LIBRARIES
