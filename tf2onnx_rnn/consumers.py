"""Where the written model runs: the report's closing lines, read from the table of runtimes.

``rewriters.runtimes`` holds, per runtime a converted model is deployed to, what it computes of the forms
this package writes, each fact measured (docs/downstream.md). The report ends with the runtimes that
compute the written model as ONNX defines it, and for each other one why not (a silently wrong result
first) and the target that writes a form it computes, where one does.
"""
from __future__ import annotations

import logging

import onnx

from .rewriters.runtimes import RUNTIMES, obstacles

logger = logging.getLogger("tf2onnx_rnn")


def consumer_notes(model_proto: onnx.ModelProto) -> tuple:
    """The report's lines: the runtimes computing ``model_proto``, then one line per runtime that does not.
    A failure to read one runtime's row costs that runtime's line alone, which says so."""
    computing, lines = [], []
    for row in RUNTIMES:
        line = _line(model_proto, row)
        if line is None:
            computing.append(row.key)
        else:
            lines.append(line)
    return (f"runs in, as ONNX defines it: {', '.join(computing) or 'none of the runtimes measured'}",) + tuple(lines)


def _line(model_proto: onnx.ModelProto, row) -> "str | None":
    """``row``'s runtime's line (None: it computes the model as written)."""
    try:
        found = sorted(obstacles(model_proto, row), key=lambda o: not o.silent)
    except Exception as error:  # noqa: BLE001 - the model is as converted; only this runtime's line is unknown
        logger.debug("reading %s's row of the runtimes table raised", row.name, exc_info=True)
        why = f"internal error: {type(error).__name__}: {error}"
        logger.warning("the report does not say whether %s computes the model: %s", row.name, why)
        return f"note: whether {row.name} computes this model is not known: {why}"
    if not found:
        return None
    first = found[0]
    what = f"{first.why} ({first.node})" + (": silently wrong, no error" if first.silent else "")
    return f"note: {row.name} does not compute this model as written: it {what}; {_advice(row, found)}"


def _advice(row, found: list) -> str:
    """The target that writes a form ``row``'s runtime computes, or that none does."""
    if row.target and (row.target_removes is None or all(o.kind in row.target_removes for o in found)):
        return f"convert with --target {row.target} (target=\"{row.target}\")"
    return "no target writes a form it computes"
