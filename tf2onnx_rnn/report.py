"""The conversion report: for every recurrent loop, what it became and, if it stayed a Loop, why.

The command line prints it, the Python API logs it (INFO, on the ``tf2onnx_rnn`` logger) and
``report_of(model)`` returns it, and it is stored in the ONNX model's ``metadata_props`` under
:data:`METADATA_KEY` as JSON (Netron shows it).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

from .rewriters.outcome import LOOP, REMOVED, SCAN, STEPS, UNROLLED, Outcome

__all__ = ["LOOP", "METADATA_KEY", "REMOVED", "SCAN", "STEPS", "UNROLLED", "ConversionReport", "LayerRow",
           "LoopOutcome", "QuantizationReport"]

METADATA_KEY = "tf2onnx_rnn.report"


@dataclass(frozen=True)
class LoopOutcome(Outcome):
    """What became of one recurrent while-loop (or one unrolled layer): a row of the report."""

    @property
    def fused(self) -> bool:
        """Whether it became a native node (a Scan of its own step is not one)."""
        return self.became not in (LOOP, REMOVED, UNROLLED, STEPS) and not self.own_step

    @property
    def left_as(self) -> str:
        """What a row that is not fused stays as, in words."""
        return "unrolled ops" if self.became == UNROLLED else "a Loop"

    @classmethod
    def of(cls, row: Outcome) -> "LoopOutcome":
        """A row the rewriter recorded, as a report row."""
        return row if isinstance(row, cls) else cls(**asdict(row))


@dataclass(frozen=True)
class LayerRow:
    """One quantizable layer of a quantized model: its precision and why it is not further."""

    layer: str
    op: str
    precision: str  # "float", "int8 weights, float compute" or "int8 (integer compute in onnxruntime)"
    why: str = ""

    @property
    def int8(self) -> bool:
        return self.precision != "float"


@dataclass
class QuantizationReport:
    """What a quantization did (``quantize=``): each layer's precision, each output's error, the sizes."""

    mode: str
    max_error: float  # the budget: each output's largest error relative to its largest magnitude
    data: str  # what the errors were measured on
    layers: list = field(default_factory=list)  # LayerRow
    errors: list = field(default_factory=list)  # (output, largest abs error, relative to its largest magnitude)
    scales: list = field(default_factory=list)  # each output's largest magnitude on that data (float model)
    float_bytes: int = 0
    bytes: int = 0
    notes: list = field(default_factory=list)  # how a runtime the report names computes int8 weights otherwise

    def lines(self) -> list:
        int8 = [row for row in self.layers if row.int8]
        lines = [f"quantized ({self.mode}): {len(int8)} of {len(self.layers)} layer(s) int8, "
                 f"{self.bytes / 1024:.1f} KB (float {self.float_bytes / 1024:.1f} KB); largest error against the "
                 f"float model on {self.data} (budget {self.max_error:.2%} of each output's largest magnitude):"]
        lines += [f"  output {name}: {error:.3g} ({relative:.2%})" for name, error, relative in self.errors]
        lines += [f"  {row.layer} ({row.op}): {row.precision}" + (f" ({row.why})" if row.why else "")
                  for row in self.layers]
        return lines + [f"note: {note}" for note in self.notes]

    @property
    def tolerance(self) -> float:
        """The absolute tolerance of a check against the source: the budget times the smallest of the
        outputs' largest magnitudes."""
        return self.max_error * min([s for s in self.scales if s > 0] or [1.0])

    @classmethod
    def from_dict(cls, stored: dict) -> "QuantizationReport":
        return cls(**{**stored, "layers": [LayerRow(**row) for row in stored["layers"]],
                      "errors": [tuple(e) for e in stored["errors"]]})


@dataclass
class ConversionReport:
    """Every recurrent loop's row, reconciled with the written model (printed by the command line,
    logged by the API, stored in the model)."""

    outcomes: list = field(default_factory=list)  # LoopOutcome rows
    checked: str = ""  # what the converted model was checked against its source for, in one line
    nchw_inputs: tuple = ()  # inputs the model takes NCHW where its source takes NHWC
    nchw_outputs: tuple = ()  # outputs the model gives NCHW where its source gives NHWC
    dimensions: str = ""  # the inputs' and outputs' named dynamic dimensions, in one line (dim_names)
    consumers: tuple = ()  # closing lines: where it runs, the targets for the others, silent errors (consumers.py)
    runs_in: tuple = ()  # the keys of the runtimes of the table that compute the model as written
    runtime_notes: tuple = ()  # for each other runtime, why it does not compute the model as written (on request)
    quantization: Optional[QuantizationReport] = None  # what quantize= did

    @property
    def fused(self) -> list:
        return [o for o in self.outcomes if o.fused]

    @property
    def loops(self) -> list:
        return [o for o in self.outcomes if o.became == LOOP]

    @property
    def scans(self) -> list:
        """Loops no native node computes, written as a Scan of their own step."""
        return [o for o in self.outcomes if o.own_step]

    @property
    def unrolled(self) -> list:
        """Unrolled layers left as their steps' ops."""
        return [o for o in self.outcomes if o.became == UNROLLED]

    def summary(self) -> str:
        if not self.outcomes:
            return "no recurrent layer loops found: nothing to fuse"
        written = sum(1 for o in self.outcomes if o.became == STEPS)
        removed = len(self.outcomes) - len(self.fused) - len(self.loops) - len(self.unrolled) - len(self.scans) \
            - written
        scans = sum(1 for o in self.fused if o.form.startswith("onnxruntime form"))
        return (f"{len(self.outcomes)} recurrent loop(s): {len(self.fused)} fused into native nodes"
                + (f" ({scans} of them in onnxruntime's form, a Scan)" if scans else "") + ", "
                + (f"{len(self.scans)} written as a Scan of their own step, " if self.scans else "")
                + (f"{written} written out as their steps, " if written else "")
                + f"{len(self.loops)} left as Loop"
                + (f", {len(self.unrolled)} unrolled layer(s) left as ops" if self.unrolled else "")
                + (f", {removed} removed as unused" if removed else ""))

    def table(self, runtime_notes: bool = False) -> str:
        """A plain-text table, one row per loop, then the summary line, what was checked, the named
        dynamic dimensions and the closing lines (with ``runtime_notes``, each runtime's reason too)."""
        rows = [("layer", "kind", "direction", "became", "details")]
        for o in self.outcomes:
            if o.fused:
                paired = o.node_direction == "bidirectional" and not o.form
                details = o.activations + ("; one bidirectional node" if paired else "")
                details += f"; mask: {o.mask}" if o.mask else ""
                details += "; stateful" if o.stateful else ""
                details += f"; {o.form}" if o.form else ""
                details += f"; unrolled, {o.unrolled} steps" if o.unrolled else ""
                if o.state_outputs:
                    details += f"; states in: {', '.join(i or '(the model gives it)' for i in o.state_inputs)}"
                    details += f", out: {', '.join(o.state_outputs)}"
            elif o.became == STEPS:
                details = o.form + (f"; {o.reason}" if o.reason else "") + (f"; mask: {o.mask}" if o.mask else "")
            elif o.own_step:
                details = f"{o.form}; no native node: {o.reason}"
                details += f"; mask: {o.mask}" if o.mask else ""
                if o.state_outputs:
                    details += f"; states in: {', '.join(i or '(the model gives it)' for i in o.state_inputs)}"
                    details += f", out: {', '.join(o.state_outputs)}"
            else:
                details = o.reason + (f" (at {o.where})" if o.where else "")
            rows.append((o.layer, o.kind, o.direction or "-", o.became, details))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4]
                 for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 7)
        quantized = self.quantization.lines() if self.quantization else []
        return "\n".join(lines + [self.summary()] + quantized + ([self.checked] if self.checked else [])
                         + ([f"dimensions: {self.dimensions}"] if self.dimensions else []) + self.notes()
                         + ([f"note: {line}" for line in self.runtime_notes] if runtime_notes else []))

    def notes(self) -> list:
        """What the user may want to know about the form chosen: one line each."""
        notes = list(self.consumers)
        if any(o.became == "RNN" for o in self.outcomes):
            notes.append("note: served in onnxruntime at batch 16 or more, SimpleRNN runs 2-3.5x faster with "
                         "--target onnxruntime (a Scan; the RNN node is what other runtimes and training want)")
        return notes

    def to_json(self) -> str:
        return json.dumps({"loops": [_stored(o) for o in self.outcomes], "summary": self.summary(),
                           "checked": self.checked, "nchw_inputs": list(self.nchw_inputs),
                           "nchw_outputs": list(self.nchw_outputs), "dimensions": self.dimensions,
                           "consumers": list(self.consumers), "runs_in": list(self.runs_in),
                           "runtime_notes": list(self.runtime_notes),
                           "quantization": asdict(self.quantization) if self.quantization else None})

    @classmethod
    def from_json(cls, text: str) -> "ConversionReport":
        lists = ("state_inputs", "state_outputs", "cell_nodes")
        stored = json.loads(text)
        return cls([LoopOutcome(**{k: tuple(v) if k in lists else v for k, v in item.items()})
                    for item in stored["loops"]], stored.get("checked", ""), tuple(stored.get("nchw_inputs", ())),
                   tuple(stored.get("nchw_outputs", ())), stored.get("dimensions", ""),
                   tuple(stored.get("consumers", ())), tuple(stored.get("runs_in", ())),
                   tuple(stored.get("runtime_notes", ())),
                   QuantizationReport.from_dict(stored["quantization"]) if stored.get("quantization") else None)

    def attach(self, model_proto) -> None:
        """Store the report in ``model_proto.metadata_props`` (replacing an earlier one)."""
        for index in reversed(range(len(model_proto.metadata_props))):
            if model_proto.metadata_props[index].key == METADATA_KEY:
                del model_proto.metadata_props[index]
        entry = model_proto.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, self.to_json()

    @classmethod
    def of_model(cls, model_proto) -> Optional["ConversionReport"]:
        """The report stored in a model converted by this package, or None."""
        for prop in model_proto.metadata_props:
            if prop.key == METADATA_KEY:
                return cls.from_json(prop.value)
        return None


def _stored(outcome: Outcome) -> dict:
    """A row as the model's report stores it: its fields, but the conversion's own flag (``masked_own_step``)."""
    stored = asdict(outcome)
    del stored["masked_own_step"]
    return stored
