"""A TFLite file as a source: converted through tf2onnx's own TFLite reader.

The file is read (never run) for what the conversion needs beside it: the main graph's inputs and
outputs, its recurrent ``WHILE`` loops (for the report) and the input positions of its fused
recurrent ops, which tf2onnx's reader drops when an optional input is absent. Verification runs the
file in the TFLite interpreter (LiteRT's where it is installed) on the same random inputs.
"""
from __future__ import annotations

import dataclasses
import os

from ..errors import ConversionError, first_line, param
from ..rewriters.description import Approximations
from . import Frozen, Source

_MAGIC = b"TFL3"  # a TFLite flatbuffer's file identifier (bytes 4 to 8)
_LOOPS = ("WHILE",)


class TFLite(Source):
    """A ``.tflite`` file."""

    kind = "tflite"
    options = tuple(field.name for field in dataclasses.fields(Approximations))  # drop_cell_clip, dequantize

    def __init__(self, path: str, drop_cell_clip: bool = False, dequantize: bool = False):
        self.path = path
        self.allowed = Approximations(drop_cell_clip=bool(drop_cell_clip), dequantize=bool(dequantize))

    def check(self) -> None:
        check_tflite_file(self.path)

    def freeze(self, options) -> Frozen:
        if options.large_model:
            raise ConversionError(f"{param('large_model')} applies to TensorFlow graphs, not TFLite files")
        layout = read_layout(self.path)
        return Frozen(None, os.path.basename(self.path), layout.inputs, layout.outputs, {},
                      tflite_path=self.path, loops=layout.loops, fused_ops=layout.fused_ops,
                      allowed=self.allowed)

    def verify(self, model_proto, tolerance: float, values: bool = True):
        from ..verify import verify_tflite

        return verify_tflite(self.path, model_proto, tolerance=tolerance, values=values)


def check_tflite_file(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` is a TFLite flatbuffer."""
    if not os.path.exists(path):
        raise ConversionError(f"no such TFLite file: {path}")
    if os.path.isdir(path):
        raise ConversionError(f"{param('tflite')} needs a .tflite file, got a directory: {path}")
    with open(path, "rb") as stream:
        head = stream.read(8)
    if head[4:8] != _MAGIC:
        raise ConversionError(f"not a TFLite file (no TFL3 identifier): {path}")


class _Layout:
    """What the conversion reads from a TFLite file itself."""

    def __init__(self):
        self.inputs, self.outputs, self.loops, self.fused_ops = [], [], [], {}


def read_layout(path: str) -> _Layout:
    """The main graph's input and output names, its recurrent WHILE loops, and each fused recurrent
    op's input positions (node name -> the positions present), as tf2onnx's reader names them."""
    from tf2onnx.tflite.Model import Model
    from tf2onnx.tflite_utils import lookup_enum

    from ..reconcile import RecurrentLoop
    from ..rewriters.readers.tflite_fused import OPS

    fused_ops = {op[len("TFL_"):] for op in OPS}  # the fused recurrent ops the rewriter reads

    try:
        with open(path, "rb") as stream:
            model = Model.GetRootAsModel(bytearray(stream.read()), 0)
        codes = [_code(model.OperatorCodes(i), lookup_enum) for i in range(model.OperatorCodesLength())]
        layout = _Layout()
        graphs = [model.Subgraphs(i) for i in range(model.SubgraphsLength())]
        main = graphs[0]
        names = _tensor_names(main)
        layout.inputs = [names[main.Inputs(i)] for i in range(main.InputsLength())]
        layout.outputs = [names[main.Outputs(i)] for i in range(main.OutputsLength())]
        for graph in graphs:
            names = _tensor_names(graph)
            ops = [graph.Operators(k) for k in range(graph.OperatorsLength())]
            for k, op in enumerate(ops):
                code = codes[op.OpcodeIndex()]
                node = names[op.Outputs(0)] if op.OutputsLength() else ""
                if code in fused_ops:
                    layout.fused_ops[node] = _fused_layout(graph, ops, k, names, OPS["TFL_" + code])
                elif code in _LOOPS:
                    body = _body_of(op, graphs, lookup_enum)
                    if body is not None and _gathers(body, codes):
                        layout.loops.append(RecurrentLoop(node, body.Name().decode()))
    except Exception as error:  # noqa: BLE001 - a file the flatbuffer reader cannot walk
        raise ConversionError(f"cannot read TFLite file {path}: {first_line(error)}") from error
    return layout


def _fused_layout(graph, ops: list, k: int, names: dict, fused_op):
    """A fused op's input positions, and the other ops reading its state variables (by the name
    tf2onnx's reader gives a node: its first output's) after it runs and before."""
    from ..rewriters.description import FusedLayout

    op = ops[k]
    inputs = [op.Inputs(i) for i in range(op.InputsLength())]
    after, before = [], []
    for position in (p for half in fused_op.halves for p in half.states):
        tensor = inputs[position] if position < len(inputs) else -1
        if tensor < 0 or not graph.Tensors(tensor).IsVariable():
            continue
        readers = [(j, names[other.Outputs(0)]) for j, other in enumerate(ops) if j != k and other.OutputsLength()
                   and tensor in [other.Inputs(i) for i in range(other.InputsLength())]]
        after.append((position, tuple(name for j, name in readers if j > k)))
        before.append((position, tuple(name for j, name in readers if j < k)))
    return FusedLayout(tuple(i for i, tensor in enumerate(inputs) if tensor != -1), tuple(after), tuple(before))


def _code(op_code, lookup_enum) -> str:
    code = lookup_enum(op_code.DeprecatedBuiltinCode(), "BuiltinOperator")
    if code == "PLACEHOLDER_FOR_GREATER_OP_CODES":
        code = lookup_enum(op_code.BuiltinCode(), "BuiltinOperator")
    return code


def _tensor_names(graph) -> dict:
    return {i: graph.Tensors(i).Name().decode() for i in range(graph.TensorsLength())}


def _body_of(op, graphs: list, lookup_enum):
    from tf2onnx.tflite.WhileOptions import WhileOptions

    if lookup_enum(op.BuiltinOptionsType(), "BuiltinOptions") != "WhileOptions":
        return None
    options = WhileOptions()
    options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
    index = options.BodySubgraphIndex()
    return graphs[index] if 0 <= index < len(graphs) else None


def _gathers(graph, codes: list) -> bool:
    """Whether a loop body gathers steps from a sequence (a recurrent layer's loop)."""
    return any(codes[graph.Operators(k).OpcodeIndex()] == "GATHER" for k in range(graph.OperatorsLength()))
