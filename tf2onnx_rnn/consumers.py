"""What a known consumer of the written model computes otherwise than ONNX, as closing notes of the report.

The default form writes what ONNX defines and onnxruntime runs exactly; two of its nodes are read otherwise
by OpenVINO (docs/downstream.md, measured): an ``LSTM`` node with peepholes (its ``P`` input), whose result
OpenVINO's CPU plugin computes 0.06 off, and a ``sequence_lens`` the graph computes, which its fused
sequence kernel ignores when the input's shape is dynamic. The portable form has neither (a peephole cell
is a Scan of its step, a mask is compacted), so a user who serves with OpenVINO is told so once.
"""
from __future__ import annotations

import onnx

_RECURRENT = ("LSTM", "GRU", "RNN")
_SEQUENCE_LENS, _PEEPHOLES = 4, 7


def consumer_notes(model_proto: onnx.ModelProto, portable: bool) -> tuple:
    """One line per consumer that computes something of ``model_proto`` otherwise than ONNX (none in the
    portable form)."""
    if portable:
        return ()
    constants = {t.name for t in model_proto.graph.initializer}
    constants |= {out for n in model_proto.graph.node if n.op_type == "Constant" for out in n.output}
    nodes = [n for n in model_proto.graph.node if n.op_type in _RECURRENT and n.domain in ("", "ai.onnx")]
    found = []
    if any(n.op_type == "LSTM" and len(n.input) > _PEEPHOLES and n.input[_PEEPHOLES] for n in nodes):
        found.append("an LSTM node with peepholes, which OpenVINO computes otherwise than ONNX")
    if any(len(n.input) > _SEQUENCE_LENS and n.input[_SEQUENCE_LENS] and n.input[_SEQUENCE_LENS] not in constants
           for n in nodes):
        found.append("a sequence_lens computed from the mask, which OpenVINO ignores under dynamic shapes")
    if not found:
        return ()
    return (f"note: for OpenVINO, convert with --target portable (target=\"portable\"): this model holds "
            f"{' and '.join(found)}; onnxruntime runs it exactly",)
