"""What fixed input shapes decide, computed once: the first step of every lowering for a static runtime.

With every input's shape fixed, a ``Shape`` of a tensor whose shape ONNX's inference knows is a constant,
and so is every node all of whose inputs are constants (the zero states the portable form builds from
the input's shape, the mask's index arithmetic on sizes): each is evaluated once, by ONNX's reference
evaluator, and becomes an initializer. Compilers that take static shapes (TVM's Relax frontend has no
lowering of a ``ConstantOfShape`` whose shape is computed) then see constants. Only the main graph is
folded, only deterministic ops, and only results of moderate size.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                         "Bernoulli", "Loop", "Scan", "If", "LSTM", "GRU", "RNN"})
_LARGEST = 1 << 20  # elements a folded constant may hold


def fold_static(model_proto: onnx.ModelProto, shapes: dict) -> int:
    """Fold ``model_proto``'s main graph given ``shapes`` (name -> dims, None where not static); returns how
    many nodes became constants."""
    from onnx.reference import ReferenceEvaluator

    graph = model_proto.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    declared = {i.name for i in graph.input} - set(values)
    kept, made, folded = [], [], 0  # the graph changes only once every fold is made
    for node in graph.node:
        result = None
        if node.domain in ("", "ai.onnx") and node.op_type not in _NOT_FOLDED:
            if node.op_type == "Shape" and _static(shapes.get(node.input[0])) and len(node.attribute) == 0:
                result = [np.array(shapes[node.input[0]], np.int64)]
            elif node.op_type == "Constant" or (node.input and all(not n or (n in values and n not in declared)
                                                                     for n in node.input)):
                result = _evaluate(ReferenceEvaluator, node, values)
        if result is None or any(r is None or np.asarray(r).size > _LARGEST for r in result):
            kept.append(node)
            continue
        for name, value in zip(node.output, result):
            if name:
                values[name] = np.asarray(value)
                made.append(numpy_helper.from_array(np.asarray(value), name))
        folded += 1
    graph.initializer.extend(made)
    del graph.node[:]
    graph.node.extend(kept)
    drop_unread(graph)
    return folded


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def _evaluate(evaluator, node: onnx.NodeProto, values: dict):
    try:
        return evaluator(node).run(None, {name: values[name] for name in node.input if name})
    except Exception:  # noqa: BLE001 - a node the reference evaluator cannot run stays a node
        return None


def drop_unread(graph: onnx.GraphProto) -> None:
    """Initializers nothing reads any more (the folded nodes' inputs), subgraphs included."""
    read = {o.name for o in graph.output}
    stack = [graph]
    while stack:
        current = stack.pop()
        for node in current.node:
            read.update(node.input)
            for a in node.attribute:
                stack.extend([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))
        read.update(o.name for o in current.output)
    inputs = {i.name for i in graph.input}
    kept = [t for t in graph.initializer if t.name in read or t.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(kept)
