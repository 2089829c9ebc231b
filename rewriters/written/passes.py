"""The passes every written model goes through after tf2onnx's conversion, as rules, and the one guarded
driver that runs them.

A :class:`Rule` says what it rewrites, when it applies (a check over the form being written that says why
not), the rewrite, and what stays as written when the rewrite fails. Every rule leaves the model exact
whether it runs or not, so :func:`run` runs each on its own: a failure is logged with what stays, and the
next rule runs. The Scan form, the streamed states' defaults and the portable form's own-step Scans, which
update the report's rows, are driven here too (:func:`after_conversion`).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import onnx

from ..outcome import SCAN, Findings
from ..runtimes import RUNTIMES, Runtime
from .full_reversal import full_reversals_as_slices
from .gathered_reversal import reverse_sequences_as_gathers
from .half_matmuls import swap_half_matmuls
from .if_branches import lean_branches
from .lower.ladder import kernels_as_scans
from .scan import scan_loops, scan_outputs_apart, unnamed_step_dims
from .shared_sequences import batch_major_from_4d
from .transposed_gathers import fold_transposed_gathers

logger = logging.getLogger("tf2onnx_rnn")


@dataclass(frozen=True)
class Form:
    """What the passes need to know of the form being written."""

    portable: bool = False  # the portable form (or a runtime target's, which starts from it)
    streaming: bool = False  # recurrent states in and out of the model
    state_defaults: bool = True  # streamed state inputs keep their defaults (initializers)
    row: Optional[Runtime] = None  # the runtime whose target's form is written (its lowering follows)


@dataclass(frozen=True)
class Rule:
    """A pass over the written model: ``rewrite(model)`` where ``when(form)`` gives no reason against it;
    ``stays`` says what is left as written if it fails."""

    name: str
    rewrite: Callable[[onnx.ModelProto], object]
    stays: str
    when: Callable[[Form], str] = lambda form: ""


def _portable_only(form: Form) -> str:
    return "" if form.portable else "only the portable form gathers its reversals"


# in order: the float16 MatMul pass last, once every Scan is written
RULES = (
    Rule("unnamed step dimensions", unnamed_step_dims, "a Scan's step keeps its dimension names"),
    Rule("scanned outputs apart", scan_outputs_apart,
         "a Scan's output its step also reads stays one tensor (tract refuses it)"),
    Rule("whole reversals as slices", full_reversals_as_slices, "a ReverseSequence of every row's whole length stays"),
    Rule("transposed gathers", fold_transposed_gathers, "the outputs' transposes stay"),
    Rule("batch-major reads from a shared Y's 4-D form", batch_major_from_4d,
         "a Transpose of a squeezed Y another recurrent node reads stays (OpenVINO 2026.4 computes it wrongly)",
         lambda form: "the runtime maps a recurrent node only where its Y alone is read, squeezed"
         if form.row is not None and form.row.y_read_squeezed else ""),
    Rule("lean mask branches", lean_branches, "what only one branch of a mask's If reads stays outside it"),
    Rule("half MatMuls swapped", swap_half_matmuls,
         "a float16 MatMul of a swap of axes 0 and 1 stays (onnxruntime 1.23-1.32 ends the process loading it)"),
    Rule("reversals as gathers", reverse_sequences_as_gathers, "ReverseSequence nodes stay", _portable_only),
)
AFTER_LOWERING = tuple(rule for rule in RULES if rule.rewrite is swap_half_matmuls)  # its Scans project inputs


def run(model_proto: onnx.ModelProto, rules, form: Form = Form()) -> dict:
    """Each of ``rules`` that applies to ``form`` run over ``model_proto`` on its own; a failure is logged and
    leaves what that rule would have changed. Returns rule name -> what its rewrite returned, or why it did
    not run."""
    done = {}
    for rule in rules:
        why_not = rule.when(form)
        if why_not:
            done[rule.name] = why_not
            continue
        try:
            done[rule.name] = rule.rewrite(model_proto)
        except Exception as error:  # noqa: BLE001 - the model stays exact
            logger.warning("%s: internal error: %s: %s", rule.stays, type(error).__name__, error, exc_info=True)
            done[rule.name] = f"internal error: {type(error).__name__}: {error}"
    return done


def after_conversion(model_proto: onnx.ModelProto, findings: Findings, form: Form) -> None:
    """Everything done to the model tf2onnx wrote, in order: the Scan form of the loops no native node
    computes, the streamed states without their defaults where asked, the portable form's own-step Scans, and
    :data:`RULES`."""
    try:
        scan_loops(model_proto, findings, form.streaming)
    except Exception as error:  # noqa: BLE001 - the Loops stay, exact; their rows say they are Loops
        logger.warning("recurrent loops stay Loops: internal error while writing the Scan form: %s: %s",
                       type(error).__name__, error, exc_info=True)
    if not form.state_defaults:  # the Scan form's streamed states too
        drop_state_defaults(model_proto, findings)
    if form.portable and form.row is None:  # before the rules: its Scans' input MatMuls are theirs too
        portable_kernels(model_proto, findings)
    run(model_proto, RULES, form)


def drop_state_defaults(model_proto: onnx.ModelProto, findings: Findings) -> None:
    """Streamed state inputs without their defaults (``state_defaults=False``, and by default for the
    portable target): required, as OpenVINO and tract need them to feed states (both read an input that
    has an initializer as that constant)."""
    states = {name for row in findings.outcomes for name in row.state_inputs if name}
    kept = [tensor for tensor in model_proto.graph.initializer if tensor.name not in states]
    del model_proto.graph.initializer[:]
    model_proto.graph.initializer.extend(kept)


def portable_kernels(model_proto: onnx.ModelProto, findings: Findings) -> None:
    """The portable form: each recurrent node whose activations a runtime it is for (OpenVINO, tract,
    onnx.reference) does not compute in its kernel, as a Scan of its own step (:mod:`.lower`); its row
    says so. A failure leaves the node, and the report says where it does not run."""
    try:
        written = kernels_as_scans(model_proto, [r for r in RUNTIMES if r.target == "portable"])
    except Exception as error:  # noqa: BLE001 - the nodes stay, exact in onnxruntime; the report says the rest
        logger.warning("recurrent nodes stay as written: internal error writing them as Scans: %s: %s",
                       type(error).__name__, error, exc_info=True)
        return

    def scan(o):  # a bidirectional node's backward pass: its second Scan
        scans = written[o.node][0]
        return scans[min(len(scans) - 1, int(o.node_direction == "bidirectional" and o.direction != "forward"))]

    findings.outcomes = [dataclasses.replace(o, became=SCAN, own_step=True, node=scan(o),
                                             form="a Scan of its own step (portable form)", reason=written[o.node][1])
                         if o.node in written else o for o in findings.outcomes]
