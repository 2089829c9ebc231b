"""What fixed input shapes decide, computed once: the first step of every lowering for a static runtime.

With every input's shape fixed, a ``Shape`` of a tensor whose shape ONNX's inference knows is a constant,
and so is every node all of whose inputs are constants (the zero states the portable form builds from
the input's shape, the mask's index arithmetic on sizes): each is evaluated once, by ONNX's reference
evaluator, and becomes an initializer. Compilers that take static shapes (TVM's Relax frontend has no
lowering of a ``ConstantOfShape`` whose shape is computed) then see constants. An ``If`` whose condition
is then a constant becomes the branch it takes (a model's ``tf.cond`` on sizes, such as MinGRU's parallel
scan: IREE and TVM fail on those ``If`` nodes, measured, and compute the branch). Only the main graph is
folded, only deterministic ops, and only results of moderate size.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import set_nodes, sweep

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
    set_nodes(graph, kept)
    folded += _taken_branches(graph, values)
    sweep(graph)
    return folded


def _taken_branches(graph: onnx.GraphProto, values: dict) -> int:
    """Each ``If`` of ``graph`` whose condition is a constant in ``values`` replaced by the nodes of the
    branch it takes, the branch's outputs passed on to the If's by ``Identity`` nodes; its own names given
    a prefix where the graph has them already. Returns how many were."""
    taken, nodes = 0, []
    names = {n for node in graph.node for n in list(node.input) + list(node.output)} | set(values) \
        | {i.name for i in graph.input}
    for node in graph.node:
        condition = values.get(node.input[0]) if node.op_type == "If" else None
        if condition is None or np.asarray(condition).size != 1:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if bool(np.ravel(condition)[0])
                                                                  else "else_branch"))
        own = {t.name for t in branch.initializer} | {o for n in branch.node for o in n.output if o}
        renamed = {name: f"{node.name or node.output[0]}/{name}" if name in names else name for name in own}
        for tensor in branch.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = renamed[tensor.name]
            graph.initializer.append(copy)
        for inner in branch.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(inner)
            copy.input[:] = [renamed.get(n, n) for n in inner.input]
            copy.output[:] = [renamed.get(n, n) for n in inner.output]
            nodes.append(copy)
        for result, output in zip(branch.output, node.output):
            nodes.append(onnx.helper.make_node("Identity", [renamed.get(result.name, result.name)], [output],
                                               name=f"{node.name or output}/taken"))
        names.update(renamed.values())
        taken += 1
    if taken:
        set_nodes(graph, nodes)
    return taken


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def _evaluate(evaluator, node: onnx.NodeProto, values: dict):
    try:
        return evaluator(node).run(None, {name: values[name] for name in node.input if name})
    except Exception:  # noqa: BLE001 - a node the reference evaluator cannot run stays a node
        return None
