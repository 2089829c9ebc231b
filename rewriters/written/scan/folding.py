"""Outer values a step reads, made what every consumer of a ``Scan`` takes.

onnxruntime lets a Scan's body read any tensor of the graph around it; OpenVINO's ONNX frontend
takes only constants that way (a computed tensor read from outside fails its check of the Scan's
inputs). So the values a step reads from outside become constants where they are (work on
initializers only, folded here with ONNX's reference evaluator), and otherwise states of the Scan
that the step passes on unchanged.
"""
from __future__ import annotations

from typing import Optional

import onnx
from onnx import helper, numpy_helper

from ..graph import outer_reads
from ..scope import Scope
from .constants import Constants


def fold(nodes: list, constants: Constants, opset: int) -> list:
    """``nodes`` (moved out of a step, in order), those computed from constants alone replaced by
    constants of their outputs' values (``constants``: the rewrite's); the nodes left."""
    left = []
    for node in nodes:
        values = [constants.value(name) for name in node.input if name]
        foldable = all(v is not None for v in values) and not _holds_graph(node)
        outputs = evaluate(node, values, opset) if foldable else None
        if outputs is None:
            left.append(node)
            continue
        for name, value in zip(node.output, outputs):
            if name:
                constants.named(name, value)
    return left


def _holds_graph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def evaluate(node: onnx.NodeProto, values: list, opset: int) -> Optional[list]:
    """``node``'s outputs on constant ``values``, or None where the reference evaluator cannot say."""
    try:
        from onnx.reference import ReferenceEvaluator

        names = [name for name in node.input if name]
        inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                  for name, v in zip(names, values)]
        outputs = [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
                   for name in node.output if name]
        graph = helper.make_graph([node], "fold", inputs, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return [numpy_helper.to_array(numpy_helper.from_array(v)) for v in
                ReferenceEvaluator(model).run(None, dict(zip(names, values)))]
    except Exception:  # noqa: BLE001 - not folded: the node stays a node
        return None


def computed_reads(body: onnx.GraphProto, scope: Scope, constants: set) -> list:
    """The tensors ``body`` reads from outside that are not constants: computed in the graph around."""
    return sorted(name for name in outer_reads(body) if name not in constants and scope.constant(name) is None)

