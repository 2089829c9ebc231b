"""What the installed onnx and onnxruntime take: opsets, IR versions, and whether a model loads.

The opsets offered are those both tf2onnx's onnx and the installed onnxruntime run; the IR
version written is one the installed onnxruntime loads. A converted model is loaded before it
is returned or written: one that onnxruntime refuses, or that still holds TensorFlow ops tf2onnx
could not convert, is a :class:`ConversionError` (or a warning when the user asked to go on).
"""
from __future__ import annotations

import functools
import logging
from typing import Optional

import onnx

from .errors import ConversionError, first_line, param

logger = logging.getLogger("tf2onnx_rnn")

FIRST_OPSET = 14  # the first opset whose LSTM/GRU/RNN take the layout attribute
_PROTOBUF_LIMIT = 2**31 - 1


def supported_opsets() -> range:
    """Opsets this package converts to: 14 (the first with LSTM's layout attribute) up to the
    newest that both tf2onnx's onnx and the installed onnxruntime support."""
    from tf2onnx import constants

    newest = min(max(constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version(), _ort_max_opset())
    return range(FIRST_OPSET, newest + 1)


def default_opset(opset: Optional[int]) -> int:
    """``opset``, or tf2onnx's preferred opset capped at what the installed onnxruntime runs."""
    if opset is not None:
        return opset
    from tf2onnx import constants

    supported = supported_opsets()
    return max(supported.start, min(constants.PREFERRED_OPSET, supported.stop - 1))


def check_opset(opset: Optional[int]) -> None:
    """Raise :class:`ConversionError` for an opset outside :func:`supported_opsets`."""
    if opset is None:
        return
    supported = supported_opsets()
    if opset not in supported:
        raise ConversionError(f"{param('opset')} {opset} is not supported; use {supported.start} to "
                              f"{supported.stop - 1}")


@functools.lru_cache(maxsize=None)
def _ort_max_ir() -> int:
    """The newest IR version the installed onnxruntime loads."""
    for ir_version in range(onnx.IR_VERSION, 6, -1):
        if _ort_loads(_identity_model(ir_version, 13)):
            return ir_version
    return 7


@functools.lru_cache(maxsize=None)
def _ort_max_opset() -> int:
    for opset in range(onnx.defs.onnx_opset_version(), FIRST_OPSET - 1, -1):
        ir_version = min(_ort_max_ir(), onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)]))
        if _ort_loads(_identity_model(ir_version, opset)):
            return opset
    return FIRST_OPSET


def _ort_loads(model: onnx.ModelProto) -> bool:
    try:
        session(model)
        return True
    except Exception:  # noqa: BLE001 - too new for this onnxruntime
        return False


def session(model: onnx.ModelProto):
    """An onnxruntime CPU session on a model held in memory (onnxruntime's warnings are not the user's
    here: say, that a state input with a default "appears in graph inputs", as it is meant to)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _identity_model(ir_version: int, opset: int) -> onnx.ModelProto:
    helper = onnx.helper
    value = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def stamp_ir_version(model_proto: onnx.ModelProto) -> None:
    """Give the model the newest IR version the installed onnxruntime loads that its opsets allow."""
    needed = onnx.helper.find_min_ir_version_for(list(model_proto.opset_import), ignore_unknown=True)
    model_proto.ir_version = max(needed, min(model_proto.ir_version, _ort_max_ir()))


def graph_nodes(graph: onnx.GraphProto):
    """Every node of ``graph`` and its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graph_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from graph_nodes(sub)


def unconverted_ops(model_proto: onnx.ModelProto) -> list:
    """Op types in the graph (subgraphs included) that no ONNX domain the model imports defines:
    what tf2onnx left unconverted."""
    domains = {o.domain for o in model_proto.opset_import}
    missing = set()
    for node in graph_nodes(model_proto.graph):
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
            missing.add(node.op_type)
        elif node.domain not in domains and node.domain not in ("", "ai.onnx"):
            missing.add(f"{node.domain}.{node.op_type}")
    return sorted(missing)


def fits_in_protobuf(model_proto: onnx.ModelProto) -> bool:
    """Whether the whole model serializes as one protobuf message (under 2 GB)."""
    try:
        return model_proto.ByteSize() < _PROTOBUF_LIMIT
    except Exception:  # noqa: BLE001 - some protobuf builds refuse to size a message that large
        return False


def check_loadable(model_proto: onnx.ModelProto, continue_on_error: bool = False) -> None:
    """Load the model in onnxruntime; a model it refuses is a :class:`ConversionError` (naming the
    ops tf2onnx could not convert), or a warning with ``continue_on_error``."""
    left = unconverted_ops(model_proto)
    problem = None
    if left:
        problem = f"tf2onnx could not convert these TensorFlow ops: {', '.join(left)}"
    elif fits_in_protobuf(model_proto):  # a larger model is loaded from its written files (output.save_model)
        try:
            session(model_proto)
        except Exception as error:  # noqa: BLE001 - onnxruntime raises its own kinds
            problem = f"onnxruntime cannot load the converted model: {first_line(error)}"
    if problem is None:
        return
    if not continue_on_error:
        raise ConversionError(problem + f" ({param('continue_on_error')} writes it anyway)")
    logger.warning("%s; written anyway (continue_on_error)", problem)
