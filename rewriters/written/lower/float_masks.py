"""A written model's bool arithmetic as float 0/1 arithmetic, for runtimes that have no bool ops.

ncnn and rknn's simulator have no ``Equal``, ``Not`` or ``Where`` (and rknn no bool tensor at all); a
Keras mask is bool arithmetic. Every bool tensor of the main graph becomes a float tensor of the same name
holding 1 for true and 0 for false, and every op that makes or reads one is written in float ops:

- ``Equal(a, b)`` is ``1 - Ceil(Min(Abs(a - b), 1))`` (integers: their difference, cast), ``Greater(a, b)``
  is ``Ceil(Min(Relu(a - b), 1))``, ``Less`` / ``GreaterOrEqual`` / ``LessOrEqual`` likewise;
- ``Not(p)`` is ``1 - p``, ``And`` a ``Mul``, ``Or`` a ``Max``, ``Xor`` ``Abs(p - q)``;
- ``Where(c, a, b)`` is ``a * c + b * (1 - c)``; ``Cast`` to bool is ``Ceil(Min(Abs(x), 1))``, from bool a ``Cast``
  of the float (an ``Identity`` to float);
- ops that only move elements (``Reshape``, ``Transpose``, ``Slice``, ``Concat``, ...) keep their op.

Exact wherever the values compared and selected are finite (a difference of two finite floats is zero
only when they are equal; ``a * 1 + b * 0`` is ``a``); an ``Inf`` or ``NaN`` among the values a ``Where``
does not select would come out ``NaN``. What this cannot write raises :class:`.steps.CannotLower`.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..builder import Writer
from ..graph import attribute, set_nodes
from .steps import CannotLower

BOOL, FLOAT = TensorProto.BOOL, TensorProto.FLOAT
_MOVING = frozenset({"Identity", "Squeeze", "Unsqueeze", "Reshape", "Transpose", "Slice", "Gather", "Concat",
                     "Split", "Expand", "Tile", "Flatten", "GatherElements", "GatherND", "ScatterND"})
_REDUCING = frozenset({"ReduceMax", "ReduceMin", "Max", "Min"})  # of 0/1 values: 0/1 values, in float too
_SAFE_READERS = _MOVING | _REDUCING | {"Cast", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not",
                                      "And", "Or", "Xor"}
_INTEGERS = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
             TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}


def bools_as_floats(model_proto: onnx.ModelProto, opset: int) -> int:
    """Rewrite the main graph's bool arithmetic; returns how many nodes were rewritten."""
    graph = model_proto.graph
    types = _types(model_proto)
    if any(types.get(o.name) == BOOL for o in graph.output):
        raise CannotLower("a model output is bool")
    _zero_ones(graph, types)
    w = Writer(graph, opset)
    made, rewritten = [], 0
    for node in graph.node:
        reads = [name for name in node.input if name and types.get(name) == BOOL]
        makes = [name for name in node.output if name and types.get(name) == BOOL]
        if not reads and not makes:
            made.append(node)
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise CannotLower(f"{node.op_type} reads or makes a bool in a subgraph")
        if node.op_type in _MOVING or node.op_type in _REDUCING:
            made.append(node)
            continue
        w.nodes = []
        _float_form(w, node, types)
        made.extend(w.nodes)
        rewritten += 1
    constants = [_float_constant(t) if t.data_type == BOOL else t for t in graph.initializer]
    set_nodes(graph, made)
    del graph.initializer[:]
    graph.initializer.extend(constants + w.initializers)
    kept = [v for v in graph.value_info if types.get(v.name) != BOOL]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return rewritten


def _float_form(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    """The nodes computing ``node``'s outputs, each bool as float 0/1, under the same names."""
    op, inputs, out, base = node.op_type, list(node.input), node.output[0], node.name or node.output[0]
    one = w.const(np.float32(1.0), "one")
    if op in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"):
        a, b = (inputs if op in ("Equal", "Greater", "LessOrEqual") else inputs[::-1])
        difference = _difference(w, a, b, types, base)
        if op == "Equal":
            w.op("Sub", [one, _ones_where_positive(w, _abs(w, difference, base), one, base)], base,
                 output_names=[out])
        elif op in ("Greater", "Less"):
            _ones_where_positive(w, w.op("Relu", [difference], base), one, base, out)
        else:  # a <= b is not (a > b); a >= b is not (b > a)
            w.op("Sub", [one, _ones_where_positive(w, w.op("Relu", [difference], base), one, base)], base,
                 output_names=[out])
    elif op == "Constant":
        value = numpy_helper.to_array(node.attribute[0].t).astype(np.float32)
        w.op("Constant", [], base, output_names=[out], value=numpy_helper.from_array(value))
    elif op == "Not":
        w.op("Sub", [one, inputs[0]], base, output_names=[out])
    elif op in ("And", "Or"):
        w.op("Mul" if op == "And" else "Max", inputs, base, output_names=[out])
    elif op == "Xor":
        w.op("Abs", [w.op("Sub", inputs, base)], base, output_names=[out])
    elif op == "Where":
        _where(w, node, types, one, base)
    elif op == "Cast":
        to = attribute(node, "to")
        source = types.get(inputs[0])
        if source == BOOL and types.get(out) == BOOL:  # 0/1 to 0/1 (a cast _zero_ones took as a bool's)
            w.op("Identity", inputs, base, output_names=[out])
        elif to == BOOL:
            value = inputs[0] if source == FLOAT else w.op("Cast", [inputs[0]], base, to=FLOAT)
            _ones_where_positive(w, _abs(w, value, base), one, base, out)
        elif source == BOOL:
            w.op("Identity" if to == FLOAT else "Cast", inputs, base, output_names=[out],
                 **({} if to == FLOAT else {"to": to}))
        else:
            raise CannotLower("a Cast reads no bool and makes none")
    else:
        raise CannotLower(f"{op} of a bool has no float form here")


def _ones_where_positive(w: Writer, x: str, one: str, base: str, out: str = "") -> str:
    """Ceil(Min(x, 1)) of an ``x`` >= 0: 1 where it is positive, however small, 0 where it is zero, in any
    precision (a scale to 1 would overflow float16, rknn's arithmetic)."""
    return w.op("Ceil", [w.op("Min", [x, one], base)], base, **({"output_names": [out]} if out else {}))


def _abs(w: Writer, x: str, base: str) -> str:
    return w.op("Abs", [x], base)


def _difference(w: Writer, a: str, b: str, types: dict, base: str) -> str:
    """a - b as float32, its zeros exactly where a equals b (integers subtracted before the cast)."""
    kind = types.get(a)
    if kind == BOOL or types.get(b) == BOOL:  # a bool's 0/1 against a number: both as float
        a, b = (v if types.get(v) in (BOOL, FLOAT) else w.op("Cast", [v], base, to=FLOAT) for v in (a, b))
        return w.op("Sub", [a, b], base)
    difference = w.op("Sub", [a, b], base)
    return difference if kind == FLOAT else w.op("Cast", [difference], base, to=FLOAT)


def _where(w: Writer, node: onnx.NodeProto, types: dict, one: str, base: str) -> None:
    """Where(c, a, b) as a * c + b * (1 - c), in a's type (c cast to it where a is not float32)."""
    condition, a, b = node.input
    kind = types.get(a) if types.get(a) != BOOL else FLOAT
    if kind not in (FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE) and kind not in _INTEGERS:
        raise CannotLower("a Where of this element type has no float form here")
    select = condition if kind == FLOAT else w.op("Cast", [condition], base, to=kind)
    other = w.op("Sub", [one if kind == FLOAT else w.op("Cast", [one], base, to=kind), select], base)
    w.op("Add", [w.op("Mul", [a, select], base), w.op("Mul", [b, other], base)], base,
         output_names=[node.output[0]])


def _zero_ones(graph: onnx.GraphProto, types: dict) -> None:
    """Take as bools (0/1 values) the casts of a bool to a number that only reductions, casts, moves and
    comparisons read (Keras's any over a mask: a bool cast to integers, ReduceMax, back to bool), and the
    reductions and moves of those: in float they are the same 0/1 values, and no integer is left."""
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    for node in graph.node:
        data = [name for name in node.input[:1] if name]
        if not data or types.get(data[0]) != BOOL or any(types.get(o) == BOOL for o in node.output):
            continue
        if node.op_type == "Cast" and all(op in _SAFE_READERS for op in readers.get(node.output[0], ["output"])):
            types[node.output[0]] = BOOL
        elif node.op_type in _REDUCING or (node.op_type in _MOVING and node.op_type != "ScatterND"):
            data = node.input if node.op_type in ("Max", "Min") else node.input[:1]
            if all(types.get(name) == BOOL for name in data):
                for name in node.output:
                    types[name] = BOOL


def _float_constant(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _types(model_proto: onnx.ModelProto) -> dict:
    """name -> element type, by ONNX's shape inference (and the graph's declarations)."""
    inferred = onnx.shape_inference.infer_shapes(model_proto)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info)
             + list(graph.output) if v.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            types[node.output[0]] = node.attribute[0].t.data_type
    return types
