"""A step's states carried in the layout its work wants, so that no step transposes them.

tf2onnx computes a channels-last convolution (Keras's default) as a channels-first ``Conv`` between two
``Transpose`` nodes, and leaves the step's elementwise work in whichever layout its transposes met it:
a convolutional LSTM's step swaps its hidden state in and its outputs out at every step, and its cell
state back and forth around one product. A state ``s`` carried as ``s' = Transpose(s, P)`` instead (its
initial value transposed once before the Scan, its final one back once after) reads, in the step, as
``Transpose(s', P⁻¹)``, and the step's new value is written as ``Transpose(new, P)``. Then:

- two transposes in a row are one (``Transpose(Transpose(x, A), B)`` is ``x`` read by ``[A[b] for b in B]``),
  none where that is the identity;
- an elementwise op of operands transposed alike is the op of the untransposed operands, transposed after
  (each element is computed from the elements at its own index; a scalar operand, a constant transposed
  here, one whose transpose only moves axes of size one, or a ``Tile`` of such a tensor, reads the same);
- a transpose moves past an ``Unsqueeze`` or ``Squeeze`` of constant axes (tf2onnx's one-dimensional
  convolutions), and one that only places the axes an ``Unsqueeze`` adds is that ``Unsqueeze``;

applied until nothing changes, the transposes meet and vanish. A per-step output still written through a
transpose is stacked untransposed and the whole sequence transposed once after the Scan. Each state in
turn tries the perms its step's transposes apply, in rounds, keeping one only where the step then holds
fewer ``Transpose`` nodes; where none does, the step stays as it was.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper

from ..graph import attribute, reads, subgraphs
from ..scope import TypeTable, fresh
from .constants import Constants
from .siblings import once

_ELEMENTWISE = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor",
    "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal",
    "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
    "ThresholdedRelu", "Cast", "Celu", "Gelu", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Clip"})


@dataclass
class Layouts:
    """The step with its states in their layouts: its nodes; each state's body input -> (the input carried
    instead, the perm it is carried in); each body output -> (the output written instead, the perm that
    gives the original from it: a state's inverse, a per-step output's)."""

    nodes: list
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)


def carry_in_layouts(body: list, states: list, step_outputs: list, types: TypeTable, constants: Constants) -> Layouts:
    """``body``'s states (``states``: (body input, body output) pairs) carried in the layout their step's
    transposes want, and its per-step outputs (``step_outputs``) stacked untransposed, where that leaves the
    step fewer Transpose nodes (see the module); else ``body`` as it is. Each state in turn takes the
    layout, among those the step's transposes apply, that leaves the fewest, in rounds until none does."""
    before = _transposes(body)
    if not before:
        return Layouts(list(body))
    value, const = constants.value, constants.const
    chosen: dict = {}
    best = _laid(body, states, step_outputs, chosen, types, value, const)
    for _ in range(len(states) + 1):  # until no state's layout leaves fewer (one state's may wait on another's)
        better = False
        for state_input, state_output in states:
            for perm in _candidates(body, state_input, state_output, types.rank(state_input)):
                if chosen.get(state_input) == perm:
                    continue
                trial = _laid(body, states, step_outputs, {**chosen, state_input: perm}, types, value, const)
                if _transposes(trial.nodes) < _transposes(best.nodes):
                    best, better = trial, True
                    chosen[state_input] = perm
        if not better:
            break
    if _transposes(best.nodes) >= before:
        return Layouts(list(body))
    return best


def _laid(body: list, states: list, step_outputs: list, chosen: dict, types: TypeTable, value: Callable,
          const: Callable) -> Layouts:
    """The step with each state in ``chosen`` (body input -> perm) carried transposed by its perm."""
    nodes, layouts = list(body), Layouts([])
    for state_input, state_output in states:
        perm = chosen.get(state_input)
        if perm is None:
            continue
        carried, written = fresh(state_input), fresh(state_output)
        nodes.insert(0, _transpose(carried, state_input, _inverse(perm)))
        nodes.append(_transpose(state_output, written, perm))
        _typed(types, carried, state_input, perm)
        _typed(types, written, state_output, perm)
        layouts.inputs[state_input] = (carried, perm)
        layouts.outputs[state_output] = (written, _inverse(perm))
    outputs = [output for _, output in states] + list(step_outputs)
    kept = {layouts.outputs[o][0] if o in layouts.outputs else o for o in outputs}
    nodes = _simplified(nodes, kept, types, value, const)
    for output in step_outputs:
        producer = next((node for node in nodes if output in node.output), None)
        if producer is None or producer.op_type != "Transpose":
            continue
        perm = list(attribute(producer, "perm"))
        written = fresh(output)
        nodes.append(helper.make_node("Identity", [producer.input[0]], [written], name=fresh("layout_output")))
        _typed(types, written, output, _inverse(perm))
        layouts.outputs[output] = (written, perm)
    kept = {layouts.outputs[o][0] if o in layouts.outputs else o for o in outputs}
    nodes = once(_without_identities(nodes, kept), value, lambda name: name in kept)  # a mask tiled once
    layouts.nodes = _live(_outputs_made_in_place(nodes, kept), kept)
    return layouts


def _outputs_made_in_place(nodes: list, kept: set) -> list:
    """Each ``Identity`` giving a step output (``kept``) of a tensor the step makes, read nowhere else and no
    output itself, left out: the node making the tensor makes the output under its name."""
    producer = {out: node for node in nodes for out in node.output}
    readers: dict = {}
    for node in nodes:
        for name in reads(node):
            readers[name] = readers.get(name, 0) + 1
    renamed = {}
    for node in nodes:
        if node.op_type != "Identity" or node.output[0] not in kept or node.input[0] in kept:
            continue
        source = producer.get(node.input[0])
        if source is None or readers.get(node.input[0]) != 1 or source.op_type == "Identity" or subgraphs(source):
            continue
        renamed[node.input[0]] = node.output[0]
    if not renamed:
        return nodes
    result = []
    for node in nodes:
        if node.op_type == "Identity" and node.input[0] in renamed and node.output[0] == renamed[node.input[0]]:
            continue
        if any(out in renamed for out in node.output):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.output[:] = [renamed.get(out, out) for out in node.output]
            node = copy
        result.append(node)
    return result


def _transposes(nodes: list) -> int:
    return sum(node.op_type == "Transpose" for node in nodes)


def _candidates(nodes: list, state_input: str, state_output: str, rank: Optional[int]) -> list:
    """The perms worth trying for a state of ``rank`` axes (None: unknown): the one :func:`_wanted` names
    first, then every perm (and its inverse) of the step's transposes of as many axes, at most eight."""
    wanted = _wanted(nodes, state_input, state_output)
    if wanted and rank is not None and len(wanted) != rank:
        wanted = None
    found = [wanted] if wanted else []
    rank = len(wanted) if wanted else rank
    if rank is None:
        return found
    for node in nodes:
        perm = list(attribute(node, "perm") or ()) if node.op_type == "Transpose" else []
        if not perm or (rank is not None and len(perm) != rank) or perm == list(range(len(perm))):
            continue
        for candidate in (perm, _inverse(perm)):
            if candidate not in found:
                found.append(candidate)
    return found[:8]


def outside(sequence: bool, perm: list) -> list:
    """The perm that transposes a state (``sequence`` False) or a stacked per-step output outside the step."""
    return [0] + [p + 1 for p in perm] if sequence else list(perm)


def _wanted(nodes: list, state_input: str, state_output: str) -> Optional[list]:
    """The perm a state is best carried in: the one every transpose reading it applies, else the inverse of
    the one its new value is written through."""
    readers = [node for node in nodes if state_input in node.input]
    perms = {tuple(attribute(node, "perm") or ()) for node in readers if node.op_type == "Transpose"}
    if len(perms) == 1 and all(node.op_type == "Transpose" for node in readers):
        perm = list(perms.pop())
        return perm if perm else None
    producer = {out: node for node in nodes for out in node.output}
    name = state_output
    while name in producer and producer[name].op_type == "Identity":
        name = producer[name].input[0]
    node = producer.get(name)
    if node is not None and node.op_type == "Transpose" and attribute(node, "perm"):
        return _inverse(list(attribute(node, "perm")))
    return None


def _simplified(nodes: list, kept: set, types: TypeTable, value: Callable, const: Callable) -> list:
    """``nodes`` with transposes composed and moved past elementwise ops until nothing changes."""
    for _ in range(4 * len(nodes) + 16):  # each round moves a transpose down or merges two
        producer = {out: node for node in nodes for out in node.output}
        changed = False
        for position, node in enumerate(nodes):
            made = _composed(node, producer) or _sunk(node, producer, types, value, const) or \
                _axes_moved(node, producer, value, const)
            if made is not None:
                nodes = nodes[:position] + made + nodes[position + 1:]
                changed = True
                break
        if not changed:
            return _live(nodes, kept)
        nodes = _live(nodes, kept)
    return _live(nodes, kept)


def _composed(node: onnx.NodeProto, producer: dict) -> Optional[list]:
    """A Transpose of a Transpose as one (an Identity where the two cancel)."""
    if node.op_type != "Transpose":
        return None
    inner = producer.get(node.input[0])
    if inner is None or inner.op_type != "Transpose" or not attribute(node, "perm") or not attribute(inner, "perm"):
        return None
    perm = composed(list(attribute(inner, "perm")), list(attribute(node, "perm")))
    if perm == list(range(len(perm))):
        return [helper.make_node("Identity", [inner.input[0]], list(node.output), name=node.name)]
    return [_transpose(inner.input[0], node.output[0], perm, node.name)]


def _axes_moved(node: onnx.NodeProto, producer: dict, value: Callable, const: Callable) -> Optional[list]:
    """A transpose moved past an ``Unsqueeze`` or ``Squeeze`` of constant axes, or a transpose that only
    places the axes an ``Unsqueeze`` adds taken into it (tf2onnx writes a one-dimensional convolution as
    one of two dimensions: ``Unsqueeze``, ``Transpose``, ``Conv``, ``Squeeze``):

    - ``Unsqueeze(Transpose(x, P), A)`` is ``Transpose(Unsqueeze(x, [r, ..]), Q)``: the new axes appended,
      then moved where ``A`` puts them, ``x``'s axes where ``P`` does;
    - ``Squeeze(Transpose(x, P), A)`` is ``Transpose(Squeeze(x, P[A]), P')``, ``P'`` the rest of ``P``;
    - ``Transpose(Unsqueeze(x, A), Q)``, ``Q`` keeping ``x``'s axes in their order, is ``Unsqueeze(x, A')``.
    """
    inner = producer.get(node.input[0]) if node.input else None
    if inner is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("Unsqueeze", "Squeeze") and inner.op_type == "Transpose" and attribute(inner, "perm"):
        perm = list(attribute(inner, "perm"))
        axes = _axes(node, value)
        if axes is None:
            return None
        rank = len(perm)
        if node.op_type == "Unsqueeze":
            total = rank + len(axes)
            axes = sorted(a % total for a in axes)
            rest = iter(perm)
            order = [rank + axes.index(j) if j in axes else next(rest) for j in range(total)]
            made = _with_axes(node, inner.input[0], fresh(node.output[0]), list(range(rank, total)), const)
        else:
            axes = sorted({a % rank for a in axes})
            gone = sorted(perm[a] for a in axes)
            left = [p for j, p in enumerate(perm) if j not in axes]
            order = [sorted(left).index(p) for p in left]
            made = _with_axes(node, inner.input[0], fresh(node.output[0]), gone, const)
        if order == list(range(len(order))):
            made.output[0] = node.output[0]
            return [made]
        return [made, _transpose(made.output[0], node.output[0], order, node.name)]
    if node.op_type == "Transpose" and inner.op_type == "Unsqueeze" and attribute(node, "perm"):
        perm = list(attribute(node, "perm"))
        axes = _axes(inner, value)
        if axes is None:
            return None
        added = {a % len(perm) for a in axes}
        kept = [p for p in perm if p not in added]
        if kept != sorted(kept):
            return None
        made = _with_axes(inner, inner.input[0], node.output[0], [j for j, p in enumerate(perm) if p in added], const)
        made.name = node.name or made.name
        return [made]
    return None


def _axes(node: onnx.NodeProto, value: Callable) -> Optional[list]:
    """An Unsqueeze's or Squeeze's axes (its attribute, or its constant second input); None where unknown."""
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        found = value(node.input[1])
        axes = None if found is None else [int(a) for a in np.asarray(found).reshape(-1)]
    return list(axes) if axes is not None and len(axes) else None


def _with_axes(like: onnx.NodeProto, source: str, target: str, axes: list, const: Callable) -> onnx.NodeProto:
    """``like``'s op (Unsqueeze or Squeeze) of ``source`` by ``axes``, in the form ``like`` takes them."""
    if attribute(like, "axes") is not None:
        return helper.make_node(like.op_type, [source], [target], name=fresh(like.name or like.op_type), axes=axes)
    return helper.make_node(like.op_type, [source, const(np.array(axes, np.int64), "axes")], [target],
                            name=fresh(like.name or like.op_type))


def _sunk(node: onnx.NodeProto, producer: dict, types: TypeTable, value: Callable, const: Callable) -> Optional[list]:
    """An elementwise op of operands transposed alike, as the op of the untransposed ones, transposed after."""
    if node.op_type not in _ELEMENTWISE or node.domain not in ("", "ai.onnx") or len(node.output) != 1 \
            or subgraphs(node):
        return None
    transposed = [producer.get(name) for name in node.input]
    perms = {tuple(attribute(t, "perm") or ()) for t in transposed if t is not None and t.op_type == "Transpose"}
    if len(perms) != 1:
        return None
    perm = list(perms.pop())
    if not perm:
        return None
    inputs, made = [], []
    for name, made_by in zip(node.input, transposed):
        if not name:
            inputs.append(name)
        elif made_by is not None and made_by.op_type == "Transpose":
            inputs.append(made_by.input[0])
        else:
            same = _untransposed(name, perm, types, value, const) or _tiled(made_by, perm, types, value, const, made)
            if same is None:
                return None
            inputs.append(same)
    untransposed = fresh(node.output[0])
    moved = helper.make_node(node.op_type, inputs, [untransposed], name=fresh(node.name or node.op_type),
                             domain=node.domain)
    moved.attribute.extend(node.attribute)
    _typed(types, untransposed, node.output[0], perm, inverse=True)
    return made + [moved, _transpose(untransposed, node.output[0], perm)]


def _tiled(node: Optional[onnx.NodeProto], perm: list, types: TypeTable, value: Callable, const: Callable,
           made: list) -> Optional[str]:
    """A ``Tile(x, reps)`` operand (a mask Keras tiles to the state's shape), as read beside tensors
    untransposed: ``x`` tiled by ``reps`` in the untransposed order, where the transpose moves only axes of
    size one of ``x`` (so ``x`` reads the same either way); the new Tile goes to ``made``. Else None."""
    if node is None or node.op_type != "Tile" or len(node.input) != 2:
        return None
    reps, shape = value(node.input[1]), types.shape(node.input[0])
    if reps is None or shape is None or len(shape) != len(perm) or reps.size != len(perm):
        return None
    inverse = _inverse(perm)
    if any(shape[axis] != 1 for axis, p in enumerate(inverse) if p != axis):
        return None
    reps = [int(r) for r in np.asarray(reps).reshape(-1)]
    tiled = fresh(node.output[0])
    times = const(np.array([reps[q] for q in inverse], np.int64), node.input[1])
    made.append(helper.make_node("Tile", [node.input[0], times], [tiled], name=fresh(node.name or "Tile")))
    _typed(types, tiled, node.output[0], inverse)
    return tiled


def _untransposed(name: str, perm: list, types: TypeTable, value: Callable, const: Callable) -> Optional[str]:
    """An operand read beside tensors transposed by ``perm``, as read beside the untransposed ones: itself
    where the transpose changes nothing it broadcasts (a scalar; one that moves only axes of size one), a
    constant transposed here; else None."""
    shape = types.shape(name)
    constant = value(name)
    if constant is not None and constant.ndim == len(perm):
        return const(np.ascontiguousarray(np.transpose(constant, _inverse(perm))), name)
    if constant is not None and constant.size == 1 and constant.ndim <= len(perm):
        return name
    if shape is None:
        return None
    if len(shape) == 0:
        return name
    if len(shape) == len(perm) and all(shape[axis] == 1 for axis, p in enumerate(perm) if p != axis):
        return name
    return None


def _without_identities(nodes: list, kept: set) -> list:
    """``nodes`` with each Identity whose output is no body output read through (what reads its output
    reads its input), as the cancelled transposes leave them."""
    renames = {}
    for node in nodes:
        if node.op_type == "Identity" and node.output[0] not in kept:
            source = node.input[0]
            renames[node.output[0]] = renames.get(source, source)
    if not renames:
        return nodes
    kept_nodes = []
    for node in nodes:
        if node.op_type == "Identity" and node.output[0] in renames:
            continue
        if any(name in renames for name in node.input):
            node = _with_inputs(node, [renames.get(name, name) for name in node.input])
        kept_nodes.append(node)
    return kept_nodes


def _with_inputs(node: onnx.NodeProto, inputs: list) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[:] = inputs
    return copy


def _live(nodes: list, kept: set) -> list:
    """``nodes`` less those whose outputs nothing reads and no output is, until none is left."""
    while True:
        read = set(kept) | {name for node in nodes for name in reads(node)}
        live = [node for node in nodes if any(out in read for out in node.output if out)]
        if len(live) == len(nodes):
            return nodes
        nodes = live


def _transpose(source: str, target: str, perm: list, name: Optional[str] = None) -> onnx.NodeProto:
    return helper.make_node("Transpose", [source], [target], name=name or fresh("layout"), perm=list(perm))


def composed(first: list, second: list) -> list:
    """The perm of ``Transpose(Transpose(x, first), second)`` as one transpose of ``x``."""
    return [first[axis] for axis in second]


def _inverse(perm: list) -> list:
    inverse = [0] * len(perm)
    for axis, p in enumerate(perm):
        inverse[p] = axis
    return inverse


def _typed(types: TypeTable, name: str, like: str, perm: list, inverse: bool = False) -> None:
    """Record ``name``'s type: ``like``'s element type, its shape transposed by ``perm`` (by its inverse:
    ``name`` is the untransposed one)."""
    elem = types.elem_type(like)
    if not elem:
        return
    shape = types.shape(like)
    if shape is not None and len(shape) == len(perm):
        order = _inverse(perm) if inverse else perm
        shape = [shape[axis] for axis in order]
    types.types[name] = helper.make_tensor_type_proto(elem, shape)
