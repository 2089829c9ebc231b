"""TFLite files holding one fused recurrent op, written from numpy arrays, for the ops no Keras export
makes (``UNIDIRECTIONAL_SEQUENCE_RNN``, ``BIDIRECTIONAL_SEQUENCE_RNN``, ``BIDIRECTIONAL_SEQUENCE_LSTM``, a
time-major ``UNIDIRECTIONAL_SEQUENCE_LSTM``). Written with the flatbuffer schema bindings tf2onnx ships;
the TFLite interpreter, which runs every file the tests use, is the oracle.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import flatbuffers
import numpy as np
from tf2onnx.tflite import Buffer, Model, Operator, OperatorCode, SubGraph, Tensor
from tf2onnx.tflite.BuiltinOperator import BuiltinOperator
from tf2onnx.tflite.BuiltinOptions import BuiltinOptions
from tf2onnx.tflite.TensorType import TensorType

ABSENT = -1  # an optional input left out


@dataclass
class OneOp:
    """A subgraph with one op: its tensors in order (name, shape, value or None, is it a state
    variable), the op's inputs and outputs as tensor indices, and its options."""

    op: str  # a BuiltinOperator name, e.g. "UNIDIRECTIONAL_SEQUENCE_RNN"
    options: str  # a BuiltinOptions name, e.g. "SequenceRNNOptions"
    write_options: Callable  # builder -> the options table's offset
    tensors: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)

    def tensor(self, name: str, shape, value: Optional[np.ndarray] = None, variable: bool = False) -> int:
        self.tensors.append((name, [int(d) for d in shape], value, variable))
        return len(self.tensors) - 1

    def constant(self, name: str, value: np.ndarray) -> int:
        return self.tensor(name, value.shape, np.ascontiguousarray(value, np.float32))


def _vector(builder, start, values, prepend) -> int:
    start(builder, len(values))
    for value in reversed(values):
        prepend(value)
    return builder.EndVector()


def _offsets(builder, start, offsets) -> int:
    return _vector(builder, start, offsets, builder.PrependUOffsetTRelative)


def write(graph: OneOp, path: str, model_inputs: list) -> str:
    """Write ``graph`` as a TFLite file at ``path``; ``model_inputs``: its input tensors' indices."""
    builder = flatbuffers.Builder(4096)
    buffers = [None] + [value for _, _, value, _ in graph.tensors if value is not None]
    buffer_offsets = []
    for value in buffers:
        data = None
        if value is not None:
            data = _vector(builder, Buffer.StartDataVector, list(value.tobytes()), builder.PrependUint8)
        Buffer.BufferStart(builder)
        if data is not None:
            Buffer.BufferAddData(builder, data)
        buffer_offsets.append(Buffer.BufferEnd(builder))
    tensor_offsets, next_buffer = [], 1
    for name, shape, value, variable in graph.tensors:
        name_offset = builder.CreateString(name)
        shape_offset = _vector(builder, Tensor.StartShapeVector, shape, builder.PrependInt32)
        Tensor.TensorStart(builder)
        Tensor.TensorAddShape(builder, shape_offset)
        Tensor.TensorAddType(builder, TensorType.FLOAT32)
        Tensor.TensorAddName(builder, name_offset)
        Tensor.TensorAddIsVariable(builder, variable)
        if value is not None:
            Tensor.TensorAddBuffer(builder, next_buffer)
            next_buffer += 1
        tensor_offsets.append(Tensor.TensorEnd(builder))
    options = graph.write_options(builder)
    op_inputs = _vector(builder, Operator.StartInputsVector, graph.inputs, builder.PrependInt32)
    op_outputs = _vector(builder, Operator.StartOutputsVector, graph.outputs, builder.PrependInt32)
    Operator.OperatorStart(builder)
    Operator.OperatorAddOpcodeIndex(builder, 0)
    Operator.OperatorAddInputs(builder, op_inputs)
    Operator.OperatorAddOutputs(builder, op_outputs)
    Operator.OperatorAddBuiltinOptionsType(builder, getattr(BuiltinOptions, graph.options))
    Operator.OperatorAddBuiltinOptions(builder, options)
    operator = Operator.OperatorEnd(builder)
    tensors = _offsets(builder, SubGraph.StartTensorsVector, tensor_offsets)
    sub_inputs = _vector(builder, SubGraph.StartInputsVector, model_inputs, builder.PrependInt32)
    sub_outputs = _vector(builder, SubGraph.StartOutputsVector, graph.outputs, builder.PrependInt32)
    operators = _offsets(builder, SubGraph.StartOperatorsVector, [operator])
    SubGraph.SubGraphStart(builder)
    SubGraph.SubGraphAddTensors(builder, tensors)
    SubGraph.SubGraphAddInputs(builder, sub_inputs)
    SubGraph.SubGraphAddOutputs(builder, sub_outputs)
    SubGraph.SubGraphAddOperators(builder, operators)
    subgraph = SubGraph.SubGraphEnd(builder)
    code = getattr(BuiltinOperator, graph.op)
    OperatorCode.OperatorCodeStart(builder)
    OperatorCode.OperatorCodeAddDeprecatedBuiltinCode(builder, min(code, 127))
    OperatorCode.OperatorCodeAddBuiltinCode(builder, code)
    OperatorCode.OperatorCodeAddVersion(builder, 1)
    opcode = OperatorCode.OperatorCodeEnd(builder)
    codes = _offsets(builder, Model.StartOperatorCodesVector, [opcode])
    subgraphs = _offsets(builder, Model.StartSubgraphsVector, [subgraph])
    all_buffers = _offsets(builder, Model.StartBuffersVector, buffer_offsets)
    Model.ModelStart(builder)
    Model.ModelAddVersion(builder, 3)
    Model.ModelAddOperatorCodes(builder, codes)
    Model.ModelAddSubgraphs(builder, subgraphs)
    Model.ModelAddBuffers(builder, all_buffers)
    builder.Finish(Model.ModelEnd(builder), file_identifier=b"TFL3")
    with open(path, "wb") as stream:
        stream.write(builder.Output())
    return path
