"""The exceptions the package raises to its users, shared by the API, the CLI and verification."""
from __future__ import annotations


class ConversionError(Exception):
    """Bad input to a conversion: a missing or unreadable model, an unknown signature, a bad option."""


class VerificationError(Exception):
    """The ONNX model's outputs differ from the TensorFlow model's beyond the tolerance."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
