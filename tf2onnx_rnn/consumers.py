"""Where the written model runs: the report's closing lines, read from the table of runtimes.

``rewriters.runtimes`` holds, per runtime a converted model is deployed to, what it computes of the forms
this package writes, each fact measured (docs/downstream.md). The report says it in a few lines: the
runtimes that compute the written model as ONNX defines it; the targets that write a form for the others
(and the runtimes no target serves); and one line for each runtime that would compute the model silently
wrong, always. Why each other runtime does not compute it, one line a runtime, is kept for whoever asks
(``ConversionReport.runtime_notes``, the command line's ``--runtime-notes``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from .rewriters.obstacles import obstacles
from .rewriters.runtimes import RUNTIMES

logger = logging.getLogger("tf2onnx_rnn")

RUNS_IN = "runs in, as ONNX defines it: "


@dataclass(frozen=True)
class Consumers:
    """What the report says of the runtimes: ``lines`` (the few it prints), ``runs_in`` (the keys of the
    runtimes computing the model as written) and ``notes`` (for each other runtime, why not)."""

    lines: tuple
    runs_in: tuple
    notes: tuple


def consumers_of(model_proto: onnx.ModelProto, written_for=None, steps_written: bool = False) -> Consumers:
    """The report's lines about the runtimes of the table for ``model_proto``. A failure to read one
    runtime's row costs that runtime's verdict alone, which says so. ``written_for``: the row of the runtime
    whose target wrote the model, ``steps_written``: whether it wrote a layer out as its steps (where the
    model passes what that runtime compiles in about a minute, a line says so and names the chunked road)."""
    computing, notes, silent, served, unserved = [], [], [], {}, []
    for row in RUNTIMES:
        found, why = _obstacles(model_proto, row, steps_written)
        if why:
            notes.append(f"{row.name}: not known whether it computes this model: {why}")
            unserved.append(row.key)
            continue
        if not found:
            computing.append(row.key)
            continue
        first = found[0]
        target = _target(row, found)
        what = f"{first.why} ({first.node})" + (": silently wrong, no error" if first.silent else "")
        notes.append(f"{row.name}: does not compute this model as written: it {what}; {_advice(target)}")
        if first.silent:
            silent.append(f"warning: {row.name} computes this model silently wrong as written: it {first.why} "
                          f"({first.node}); {_advice(target)}")
        if target:
            served.setdefault(target, []).append(row.key)
        else:
            unserved.append(row.key)
    lines = [RUNS_IN + (", ".join(computing) or "none of the runtimes measured")]
    if served or unserved:
        lines.append(_others(served, unserved))
    if steps_written:
        others = [r for r in RUNTIMES if r.key in computing and (written_for is None or r.key != written_for.key)]
        lines.extend(_long_steps(model_proto, [written_for] + others))
    return Consumers(tuple(lines + silent), tuple(computing), tuple(notes))


def _long_steps(model_proto: onnx.ModelProto, rows: list) -> list:
    """A line where the steps written out make ``model_proto`` larger than the runtimes of ``rows`` (the target's
    first, then the others that compute it) compile in about a minute."""
    nodes = len(model_proto.graph.node)
    slow = [row for row in rows if row is not None and row.nodes_in_a_minute and nodes > row.nodes_in_a_minute]
    if not slow:
        return []
    compile_ = ", ".join(f"{row.name} compiles about {row.nodes_in_a_minute} in a minute" for row in slow)
    return [f"note: {nodes} nodes with the layers' steps written out: {compile_} (measured), more take longer; "
            "for a long or unbounded sequence, convert a stateful model over a fixed chunk and feed it chunk by "
            "chunk (docs/downstream.md, 'Long sequences')"]


def _obstacles(model_proto: onnx.ModelProto, row, steps_written: bool) -> tuple:
    """(``row``'s obstacles, a silent one first; "") or ([], why they are not known)."""
    try:
        return sorted(obstacles(model_proto, row, steps_written), key=lambda o: not o.silent), ""
    except Exception as error:  # noqa: BLE001 - the model is as converted; only this runtime's verdict is unknown
        logger.debug("reading %s's row of the runtimes table raised", row.name, exc_info=True)
        why = f"internal error: {type(error).__name__}: {error}"
        logger.warning("the report does not say whether %s computes the model: %s", row.name, why)
        return [], why


def _target(row, found: list) -> str:
    """The target that writes a form ``row``'s runtime computes ("" where none does)."""
    if row.target and (row.target_removes is None or all(o.kind in row.target_removes for o in found)):
        return row.target
    return ""


def _advice(target: str) -> str:
    return f"convert with --target {target} (target=\"{target}\")" if target else "no target writes a form it computes"


def _others(served: dict, unserved: list) -> str:
    """One line: the target that writes a form each other runtime computes, and the runtimes none serves."""
    parts = [f"{target}" + ("" if keys == [target] else f" ({', '.join(keys)})") for target, keys in served.items()]
    line = "for the others, --target " + ", ".join(parts) if parts else "no target writes a form the others compute"
    if parts and unserved:
        line += f"; none for {', '.join(unserved)}"
    return line + " (why, runtime by runtime: --runtime-notes, report.runtime_notes)"
