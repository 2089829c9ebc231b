"""A ``Scan`` as its steps written out for a fixed number of them: its body, once per step.

For a runtime without ``Scan`` (TVM, ncnn, rknn's simulator, in which one builds too slowly to use) or
whose ``Scan`` is wrong where a step holds some op (IREE's ``Squeeze``). Each scanned input is split
along its axis into its steps; the body's nodes are copied once per step, its states threaded from one
copy to the next and its per-step outputs stacked along their axes, each in its direction. Whatever the
body reads from outside stays read from outside; its own constants are added once. What the step
computes is the body's own nodes, unchanged.
"""
from __future__ import annotations

import onnx

from ..builder import Writer
from ..graph import attribute
from .steps import CannotLower


def scan_as_steps(graph: onnx.GraphProto, node: onnx.NodeProto, steps: int, w: Writer,
                  beside_batch: bool = False) -> None:
    """Write ``node`` (a ``Scan`` in ``graph``) as ``steps`` copies of its body; ``beside_batch``: a per-step
    output stacked along axis 0 is stacked along axis 1, after its step's axis 0 (the batch axis), and moved
    to axis 0 by a ``Transpose`` (the same values; pnnx takes axis 0 for the batch axis ncnn lacks)."""
    body = next(a.g for a in node.attribute if a.name == "body")
    scanned = int(attribute(node, "num_scan_inputs"))
    carried = len(node.input) - scanned
    in_axes = list(attribute(node, "scan_input_axes", [0] * scanned))
    in_backward = list(attribute(node, "scan_input_directions", [0] * scanned))
    outputs = len(body.output) - carried
    out_axes = list(attribute(node, "scan_output_axes", [0] * outputs))
    out_backward = list(attribute(node, "scan_output_directions", [0] * outputs))
    base = (node.name or node.output[0]).replace("/", "_")
    if any(axis < 0 for axis in in_axes):
        raise CannotLower("a Scan input along a negative axis has no steps form here")
    pieces = []
    for k, name in enumerate(node.input[carried:]):
        axis = in_axes[k]
        split = w.split(name, [1] * steps, axis, f"{base}_in{k}")
        rows = [w.squeeze(piece, [axis], f"{base}_in{k}_s{t}") for t, piece in enumerate(split)]
        pieces.append(rows[::-1] if in_backward[k] else rows)
    constants = {t.name: w.const_like(t, f"{base}_{t.name}") for t in body.initializer}
    states = list(node.input[:carried])
    stacked = [[] for _ in range(outputs)]
    for t in range(steps):
        mapping = dict(constants)
        mapping.update({v.name: states[k] for k, v in enumerate(body.input[:carried])})
        mapping.update({v.name: pieces[k][t] for k, v in enumerate(body.input[carried:])})
        _copy_body(body, mapping, w, f"{base}_s{t}")
        results = [mapping.get(v.name, v.name) for v in body.output]
        states = results[:carried]
        for k, value in enumerate(results[carried:]):
            stacked[k].append(value)
    for k, name in enumerate(node.output[:carried]):
        if name:
            w.op("Identity", [states[k]], f"{base}_final{k}", output_names=[name])
    for k, name in enumerate(node.output[carried:]):
        if not name:
            continue
        values = stacked[k][::-1] if out_backward[k] else stacked[k]
        axis = out_axes[k]
        if axis < 0:
            raise CannotLower("a Scan output along a negative axis has no steps form here")
        rank = _rank(body.output[carried + k])
        if beside_batch and axis == 0 and rank:
            rows = [w.unsqueeze(v, [1], f"{base}_out{k}_s{t}") for t, v in enumerate(values)]
            stacked = w.op("Concat", rows, f"{base}_out{k}_beside", axis=1)
            w.op("Transpose", [stacked], f"{base}_out{k}", output_names=[name], perm=[1, 0] + list(range(2, rank + 1)))
            continue
        rows = [w.unsqueeze(v, [axis], f"{base}_out{k}_s{t}") for t, v in enumerate(values)]
        w.op("Concat", rows, f"{base}_out{k}", output_names=[name], axis=axis)
    w.replace([node])


def _rank(value: onnx.ValueInfoProto) -> int:
    """The rank ``value`` declares (0 where it declares none)."""
    kind = value.type.tensor_type
    return len(kind.shape.dim) if kind.HasField("shape") else 0


def _copy_body(body: onnx.GraphProto, mapping: dict, w: Writer, prefix: str) -> None:
    """The body's nodes, their outputs renamed apart for this step (``mapping`` gains them), their inputs
    read through ``mapping`` (names the body does not make are the outer graph's, read as they are)."""
    for node in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(mapping.get(name, name) if name else "" for name in node.input)
        del copy.output[:]
        for name in node.output:
            if name:
                mapping[name] = w.name(f"{prefix}_{name}")
            copy.output.append(mapping[name] if name else "")
        copy.name = w.name(f"{prefix}_{node.name or node.op_type}")
        for a in copy.attribute:  # a subgraph reads the body's names through the mapping too
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _rename_reads(sub, mapping)
        w.nodes.append(copy)


def _rename_reads(graph: onnx.GraphProto, mapping: dict) -> None:
    """A subgraph's reads of names it does not make itself, through ``mapping``."""
    own = {t.name for t in graph.initializer} | {v.name for v in graph.input}
    own |= {o for n in graph.node for o in n.output}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name and name not in own and name in mapping:
                node.input[k] = mapping[name]
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _rename_reads(sub, {k: v for k, v in mapping.items() if k not in own})
    for output in graph.output:
        if output.name not in own and output.name in mapping:
            raise CannotLower("a subgraph of a Scan's step returns an outer value by name")
