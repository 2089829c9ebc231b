"""Work over several steps at once written once per step, for a runtime computing one batch row at a time.

pnnx (ncnn) takes axis 0 of what a ``Conv`` reads and writes for the batch axis ncnn's blobs lack, so a
``Conv`` over several images at once does not load there: the Scan form's input convolution of a ConvLSTM2D
runs over every step at once, the steps merged into that axis. :func:`convolution_per_step` writes such a
``Conv``, and the ops between it and the steps that read its result (the ``Split`` of a time-major tensor
into its steps, as a Scan written out reads its input), once per step: each step's input is sliced from the
batch-major tensor the time-major one was made of (a ``Reshape`` moving only axes of size 1), and each step
reads its own result. With a Scan's outputs stacked beside the batch axis of 1 (:mod:`.scan_steps`),
:func:`merged_transposes` folds chains of ``Transpose`` and ``Reshape`` that only move axes of size 1 into
one ``Transpose``, so that axis 0 stays the batch axis of 1 from the input to the output. The same values.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..builder import Writer
from ..graph import attribute, producers_of, readers_of, set_nodes
from .steps import CannotLower

_ELEMENTWISE = frozenset({"Identity", "Relu", "Sigmoid", "Tanh", "HardSigmoid", "LeakyRelu", "Elu", "Softsign",
                          "Softplus", "Neg", "Abs", "Exp", "Log", "Sqrt", "Clip"})


def convolution_per_step(graph: onnx.GraphProto, conv: onnx.NodeProto, shapes: dict, constants: dict,
                         w: Writer):
    """``conv`` (its input's axis 0 of ``steps`` > 1 positions) and the ops it shares that axis with, written per
    step; "" (nothing changed) while a Scan still reads the result: its steps come first."""
    steps = shapes[conv.input[0]][0]
    region, splits, root = _region(graph, conv, steps, shapes, constants)
    if splits is None:
        return ""
    source = root.input[0]
    axis = next(k for k, d in enumerate(shapes[source]) if d != 1)
    nodes = [n for n in graph.node if id(n) in {id(r) for r in region}]
    base = (conv.name or conv.output[0]).replace("/", "_")
    readers, squeezes = readers_of(graph), []
    for t in range(steps):
        piece = w.slice(source, t, t + 1, axis, f"{base}_s{t}_input")
        mapping = {root.output[0]: w.op("Reshape", [piece, w.ints([1] + shapes[root.output[0]][1:],
                                                                   f"{base}_step_shape")], f"{base}_s{t}_step")}
        for node in nodes:
            _replay(node, mapping, constants, w, f"{base}_s{t}")
        for split in splits:
            squeezes += _read_step(split.output[t], mapping[split.input[0]], readers, constants, shapes, w)
    kept = any(r is None or all(r is not n for n in nodes) for r in readers.get(root.output[0], []))
    w.replace(([] if kept else [root]) + nodes + splits + squeezes)
    return True


def _read_step(name: str, step: str, readers: dict, constants: dict, shapes: dict, w: Writer) -> list:
    """``name`` (a step [1, 1, ...] of a Split into steps) made ``step``: where only Squeezes of axis 0 read it,
    they squeeze axis 1 of ``step`` instead, the same values with its axis 0 left, where pnnx looks for the
    batch axis (returns the Squeezes replaced)."""
    found = readers.get(name, [])
    squeezes = [r for r in found if r is not None and r.op_type == "Squeeze" and _axes(r, constants) == [0]]
    if not found or len(squeezes) != len(found) or (shapes.get(name) or [0, 0])[:2] != [1, 1]:
        w.op("Identity", [step], f"{name}_read", output_names=[name])
        return []
    for squeeze in squeezes:
        squeezed = w.squeeze(step, [1], f"{name}_squeezed")
        w.nodes[-1].output[0] = squeeze.output[0]
        w.taken.discard(squeezed)
    return squeezes


def _axes(node: onnx.NodeProto, constants: dict):
    """A Squeeze's axes (an attribute or a constant input), or None."""
    axes = attribute(node, "axes", constants.get(node.input[1]) if len(node.input) > 1 else None)
    return None if axes is None else [int(a) for a in np.ravel(axes)]


def _region(graph, conv, steps: int, shapes: dict, constants: dict) -> tuple:
    """(the nodes sharing ``conv``'s axis 0 of ``steps`` positions, the Splits into steps reading them or None
    while a Scan reads them, the Reshape that made the time-major tensor from a batch-major one)."""
    producer = producers_of(graph)
    readers = readers_of(graph)
    region, splits, roots, pending, seen = [], [], [], [conv], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        region.append(node)
        for name in (n for n in node.input if n and n not in constants):
            source = producer.get(name)
            if source is None:
                raise CannotLower("a Conv over several steps at once reads a model input along its steps")
            if _moves_ones(source, shapes) and (shapes.get(source.input[0]) or [0])[0] == 1:
                roots.append(source)
            elif _per_position(source, steps, shapes, constants):
                pending.append(source)
            else:
                raise CannotLower(f"a Conv over several steps at once reads a {source.op_type} across its steps")
        for name in node.output:
            for reader in readers.get(name, []):
                if reader is None:
                    raise CannotLower("a Conv over several steps at once makes a model output")
                if reader.op_type == "Scan":
                    return region, None, None
                if _into_steps(reader, steps, shapes, constants):
                    splits.append(reader) if all(reader is not s for s in splits) else None
                elif _per_position(reader, steps, shapes, constants):
                    pending.append(reader)
                else:
                    raise CannotLower(f"a Conv over several steps at once is read across its steps by a "
                                      f"{reader.op_type}")
    if len({id(r) for r in roots}) != 1 or not splits:
        raise CannotLower("a Conv over several steps at once is made of no one batch-major tensor")
    return [n for n in region if n is not roots[0]], splits, roots[0]


def _per_position(node, steps: int, shapes: dict, constants: dict) -> bool:
    """Whether ``node`` computes each position of axis 0 (of ``steps``) from the same position alone."""
    data = [n for n in node.input if n and n not in constants]
    if len(data) != 1 or any((shapes.get(o) or [0])[0] != steps for o in list(data) + list(node.output)):
        return False
    if node.op_type == "Reshape":
        shape = constants.get(node.input[1])
        return shape is not None and int(np.ravel(shape)[0]) in (steps, 0, -1)  # its axis 0 made the input's
    if node.op_type == "Transpose":
        return list(attribute(node, "perm", [0]))[0] == 0
    if node.op_type == "Split":
        return int(attribute(node, "axis", 0)) % len(shapes[data[0]]) != 0
    if node.op_type in ("Add", "Mul", "Sub", "Div"):
        other = next(constants[n] for n in node.input if n in constants)
        rank = len(shapes[node.output[0]])
        return np.ndim(other) < rank or np.shape(other)[0] == 1
    return node.op_type in _ELEMENTWISE or node.op_type == "Conv"


def _into_steps(node, steps: int, shapes: dict, constants: dict) -> bool:
    """A Split along axis 0 into its ``steps`` positions, one each."""
    if node.op_type != "Split" or int(attribute(node, "axis", 0)) != 0 or len(node.output) != steps:
        return False
    return all((shapes.get(o) or [0])[0] == 1 for o in node.output)


def _moves_ones(node, shapes: dict) -> bool:
    """A Reshape that only moves, adds or drops axes of size 1."""
    if node is None or node.op_type != "Reshape":
        return False
    before, after = shapes.get(node.input[0]), shapes.get(node.output[0])
    return bool(before) and bool(after) and all(before) and all(after) and \
        [d for d in before if d != 1] == [d for d in after if d != 1]


def _replay(node, mapping: dict, constants: dict, w: Writer, prefix: str) -> None:
    """``node`` for one step: its data input read through ``mapping``, a Reshape's axis 0 of 1."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.input[:]
    for name in node.input:
        copy.input.append(mapping.get(name, name))
    if node.op_type == "Reshape":
        shape = np.array(constants[node.input[1]], np.int64).ravel().copy()
        shape[0] = 1
        copy.input[1] = w.ints(shape.tolist(), f"{prefix}_shape")
    del copy.output[:]
    for name in node.output:
        mapping[name] = w.name(f"{prefix}_{name}") if name else ""
        copy.output.append(mapping[name])
    copy.name = w.name(f"{prefix}_{node.name or node.op_type}")
    w.nodes.append(copy)


def merged_transposes(graph: onnx.GraphProto, shapes: dict) -> int:
    """Chains of ``Transpose`` nodes, and of ``Reshape`` nodes of one rank that only move axes of size 1 beside
    one, as one ``Transpose`` (none where it keeps every axis in place); returns how many nodes went."""
    outputs = {o.name for o in graph.output}
    nodes = list(graph.node)  # held: a node's id is its wrapper's, kept while the wrapper lives
    perms = {id(n): _as_perm(n, shapes) for n in nodes}
    readers = readers_of(graph)
    producer = {o: n for n in nodes for o in n.output}
    gone, merged = set(), 0
    for node in nodes:
        if perms[id(node)] is None or id(node) in gone:
            continue
        source = producer.get(node.input[0])
        chain = [node]
        while source is not None and perms[id(source)] is not None and id(source) not in gone \
                and len(readers.get(source.output[0], [])) == 1 and source.output[0] not in outputs:
            chain.insert(0, source)
            source = producer.get(source.input[0])
        if len(chain) < 2 or not any(n.op_type == "Transpose" for n in chain):
            continue
        perm = list(range(len(perms[id(chain[0])])))
        for link in chain:
            perm = [perm[k] for k in perms[id(link)]]
        del node.input[:]
        node.input.append(chain[0].input[0])
        node.op_type = "Transpose"
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("perm", perm))
        perms[id(node)] = perm
        gone.update(id(n) for n in chain[:-1])
        merged += len(chain) - 1
        if perm == sorted(perm) and node.output[0] not in outputs:  # every axis in place: read its input
            gone.add(id(node))
            for reader in readers.get(node.output[0], []):
                for k, name in enumerate(reader.input):
                    reader.input[k] = node.input[0] if name == node.output[0] else name
    kept = [n for n in nodes if id(n) not in gone]
    set_nodes(graph, kept)
    return merged


def _as_perm(node: onnx.NodeProto, shapes: dict):
    """The permutation ``node`` makes of its input's axes: a Transpose's, or a Reshape's that only moves axes of
    size 1 within one rank; else None."""
    if node.op_type == "Transpose":
        perm = attribute(node, "perm")
        rank = len(shapes.get(node.input[0]) or [])
        return list(perm) if perm is not None else (list(range(rank))[::-1] if rank else None)
    if not _moves_ones(node, shapes) or len(shapes[node.input[0]]) != len(shapes[node.output[0]]):
        return None
    before, after = shapes[node.input[0]], shapes[node.output[0]]
    ones = iter([k for k, d in enumerate(before) if d == 1])
    others = iter([k for k, d in enumerate(before) if d != 1])
    return [next(ones) if d == 1 else next(others) for d in after]
