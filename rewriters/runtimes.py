"""What each runtime a converted model is deployed to computes of the forms this package writes: one table.

A :class:`Runtime` is a row: which recurrent ops it computes and in which directions, which of their
inputs, outputs and attributes it reads as ONNX defines them, whether it takes ``Scan``, ``If`` and
``Loop``, which other ops of the written forms it lacks, what it does with a ``Slice`` of step -1 and
whether it compiles static shapes only. Every fact was measured against the runtime by single-op
probes and by running converted models (docs/downstream.md gives versions and how); ``silent`` marks
a fact where the runtime gives a wrong result without an error.

Two readers use the table and nothing else decides by a runtime's name: :func:`obstacles` says why a
written model is not computed as ONNX defines it by a runtime (the report's "runs in" section), and
the lowering (:mod:`.lower`) asks a row which rung each layer must stand on (native node, forward
nodes with a reversal, a Scan, or its steps written out for a fixed time length). A new runtime is a
row here and its tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
FORWARD, REVERSE, BIDIRECTIONAL = "forward", "reverse", "bidirectional"
ALL_DIRECTIONS = frozenset({FORWARD, REVERSE, BIDIRECTIONAL})
# ONNX input and output slots of LSTM/GRU/RNN, named once
SEQUENCE_LENS, INITIAL_H, INITIAL_C, PEEPHOLES = 4, 5, 6, 7
Y, Y_H, Y_C = 0, 1, 2


@dataclass(frozen=True)
class Runtime:
    """One runtime's row: what it computes of the ops and attributes this package's forms write."""

    key: str  # its name in targets and reports
    name: str  # as a user knows it, with the version measured
    target: Optional[str]  # the target whose form it computes (None: every form)
    recurrent: dict = field(default_factory=lambda: {op: ALL_DIRECTIONS for op in RECURRENT_OPS})
    gru_linear_before_reset_0: bool = True  # Keras's reset_after=False
    # the activation functions it computes in a recurrent node as ONNX defines them (None: every one); others it
    # computes otherwise, silently
    activations: Optional[frozenset] = None
    reads_y_h: frozenset = frozenset(RECURRENT_OPS)  # ops whose Y_h output may be read
    reads_y_c: bool = True
    initial_states_needed: frozenset = frozenset()  # ops that must be given initial_h (and c)
    all_states_need_initial: frozenset = frozenset()  # ops that must be given them where Y, Y_h and Y_c are read
    sequence_lens: str = "computed"  # "computed", "constant" (refused unless constant), "ignored" (silently)
    peepholes: str = "exact"  # "exact", "wrong" (silently), "none"
    scan: str = "dynamic"  # "dynamic", "static" (dynamic shapes give silently wrong ones), "none"
    scan_squeeze: bool = True  # a Squeeze inside a Scan's step compiles
    # a Squeeze of a tensor whose dimensions ONNX's shape inference leaves unknown, in a model of fixed shapes,
    # compiles
    squeezes_unknown: bool = True
    lacks: frozenset = frozenset()  # op types it has no lowering or layer for
    negative_step_slice: str = "exact"  # "exact", "dropped" (silently)
    static_shapes: bool = False  # compiles for fixed shapes only
    steps: bool = True  # computes a layer's steps written out (MatMul, Add, activations, Split, Concat)
    given_states: bool = True  # maps a recurrent node whose initial states are given
    shared_weights: bool = True  # maps a MatMul whose constant weight other MatMuls read too
    batch_one: bool = False  # computes one batch row at a time (its tensors have no batch axis): a fixed batch of 1
    computed_gemm_bias: bool = True  # computes a Gemm whose C input is not a constant
    unsized_split: bool = True  # computes a Split whose sizes are not given (equal parts)
    batched_conv: bool = True  # computes a Conv over several images at once (its input's axis 0 over 1)
    empty_concat: bool = True  # computes a Concat one of whose inputs is an empty constant
    max_input_rank: int = 0  # the highest rank of an input it takes (0: any)
    masks: str = ""  # why it computes no masked layer in any form this package writes ("": it computes them)
    # how a recurrent node's Y must be read to be mapped, else "": "squeezed" (ncnn): a forward node's by one Squeeze
    # of axis 1, a bidirectional node's by one Transpose(0, 2, 1, 3) and one Reshape to [T, B, 2H]
    recurrent_read_as: str = ""
    tolerance: float = 1e-4  # relative error its arithmetic allows against the source (float16: more)
    package: str = ""  # the Python package that runs it (verification in the runtime)
    # the obstacles' kinds its target's form removes (None: every one it can, refusing the rest in one line)
    target_removes: Optional[frozenset] = None
    measured: str = ""  # the evidence, for the report and docs


def _row(key, name, target, **facts) -> Runtime:
    return Runtime(key, name, target, **facts)


_LOOPING = frozenset({"Loop"})
# what the portable form writes otherwise: masks compacted, zero states given, peephole cells as a Scan, reversals
# of computed lengths gathered
_PORTABLE_REMOVES = frozenset({"sequence_lens", "initial_states", "peepholes", "reversal"})
_MASK_BOOLS = frozenset({"Equal", "Not", "Where", "And", "Or", "Less", "Greater", "GreaterOrEqual", "LessOrEqual"})

RUNTIMES = (
    _row("onnxruntime", "onnxruntime (CPU, node, web)", None, package="onnxruntime",
         measured="every form, Loop, Scan and If included, exact"),
    _row("openvino", "OpenVINO 2026.4", "portable", target_removes=_PORTABLE_REMOVES, sequence_lens="ignored",
         peepholes="wrong",
         package="openvino", measured="ignores a computed sequence_lens under dynamic shapes; reads LSTM's P "
                                      "otherwise than ONNX (0.05 off)"),
    _row("tract", "tract 0.23", "portable", target_removes=_PORTABLE_REMOVES,
         sequence_lens="constant", all_states_need_initial=frozenset({"LSTM"}),
         lacks=_LOOPING | {"ReverseSequence"}, package="tract",
         measured="takes sequence_lens only as a constant; no Loop, no ReverseSequence; an LSTM whose Y, Y_h "
                  "and Y_c are all read stops without initial states ('Clashing resolution for expression')"),
    _row("onnx2torch", "PyTorch through onnx2torch 1.5", "portable", target_removes=_PORTABLE_REMOVES,
         sequence_lens="constant", lacks=_LOOPING | {"ReverseSequence", "Scan", "If", "ScatterElements"},
         measured="no recurrent converter of its own (the tests supply them, without sequence_lens), "
                  "no Loop, Scan, If or ReverseSequence"),
    _row("reference", "ONNX's reference evaluator (onnx.reference)", "portable", target_removes=_PORTABLE_REMOVES,
         sequence_lens="ignored", package="onnx.reference",
         measured="its LSTM, GRU and RNN take sequence_lens and do not read it"),
    _row("iree", "IREE 3.13 (llvm-cpu)", "iree",
         recurrent={"LSTM": frozenset({FORWARD, BIDIRECTIONAL}), "GRU": frozenset({FORWARD}),
                    "RNN": frozenset({FORWARD})},
         sequence_lens="ignored", scan="static", scan_squeeze=False, squeezes_unknown=False, lacks=_LOOPING | {"DFT"},
         static_shapes=True,
         activations=frozenset({"Sigmoid", "Tanh", "Relu"}), package="iree.runtime",
         measured="reverse nodes and bidirectional GRU/RNN fail to legalize; GRU/RNN need a static batch; "
                  "sequence_lens silently ignored; a Scan with dynamic dimensions returns a wrong shape; a "
                  "Squeeze in a Scan's step, or of a tensor whose shape inference leaves a dimension unknown (a "
                  "ConvLSTM2D's last step, padded as tf2onnx pads a loop's outputs), fails to compile "
                  "('tensor.collapse_shape'); no Loop, no DFT; a recurrent node's activations "
                  "other than Sigmoid, Tanh and Relu computed as Relu and their alpha and beta not read, silently "
                  "(74 single-node probes: HardSigmoid, LeakyRelu, Affine, ScaledTanh, Elu, Softsign, Softplus, "
                  "ThresholdedRelu)"),
    _row("tvm", "Apache TVM 0.27 (Relax, llvm)", "tvm", recurrent={}, scan="none",
         lacks=_LOOPING | {"ReverseSequence", "DFT"}, static_shapes=True, package="tvm",
         measured="Relax's ONNX frontend has no LSTM, GRU, RNN, Scan, Loop, ReverseSequence or DFT converter"),
    _row("ncnn", "ncnn 1.0.20261020 through pnnx 20261020", "ncnn",
         recurrent={"LSTM": frozenset({FORWARD, BIDIRECTIONAL}), "GRU": frozenset({FORWARD, BIDIRECTIONAL}),
                    "RNN": frozenset({FORWARD})}, given_states=False, shared_weights=False,
         batch_one=True, computed_gemm_bias=False, max_input_rank=5, unsized_split=False, batched_conv=False,
         empty_concat=False,
         gru_linear_before_reset_0=False, reads_y_h=frozenset(), reads_y_c=False, sequence_lens="none",
         scan="none", lacks=_LOOPING | _MASK_BOOLS | {"ReverseSequence", "If", "ScatterND", "GatherND", "CumSum",
                                                      "GatherElements"},
         negative_step_slice="dropped", static_shapes=True, recurrent_read_as="squeezed", package="ncnn",
         measured="a forward recurrent node is mapped only when its Y alone is read, by a Squeeze of axis 1, "
                  "and no initial state is given; a bidirectional LSTM or GRU is mapped to ncnn's own "
                  "bidirectional layer only when its Y alone is read, by a Transpose(0, 2, 1, 3) and a Reshape to "
                  "[T, B, 2H]; a bidirectional RNN (its layer does not load) and GRU linear_before_reset=0 "
                  "not mapped; a MatMul whose weight other MatMuls share, or a Gemm whose C is computed, is left "
                  "unmapped (F.linear); its blobs have no batch axis and at most 4 axes beside it (w, h, d, c); "
                  "pnnx takes axis 0 of what a Conv reads and writes for that batch axis: a Conv over several "
                  "images at once (ConvLSTM2D's input convolution over every step) does not load, a Squeeze of "
                  "that axis is dropped, a Concat along it leaves a 5-D output ncnn cannot hold; a Concat of an "
                  "empty constant (the Scan form's padding of a full-length output) does not load at rank 3 and "
                  "computes garbage at rank 5 (pnnx: '5-rank tensor is not supported'); a Slice with "
                  "step -1 is "
                  "silently dropped; a Split without its sizes becomes a Slice without them, which ends the "
                  "process; no GatherElements, Scan, If, Loop, ReverseSequence or the mask's bool ops; a masked "
                  "layer as its own step with its mask as float 0/1 arithmetic computes exactly"),
    _row("rknn", "rknn-toolkit2 2.5 simulator (rk3588, float16)", "rknn",
         reads_y_h=frozenset({"LSTM", "RNN"}), initial_states_needed=frozenset({"LSTM"}), sequence_lens="none",
         scan="none", lacks=_LOOPING | {"If", "ReverseSequence"} | _MASK_BOOLS, static_shapes=True,
         tolerance=2e-2, package="rknn.api",
         measured="an LSTM without initial states at batch > 1 and a GRU whose Y_h is read crash its "
                  "converter; If and Loop refused; the mask's bool arithmetic aborts ('Not Support Dtype'); "
                  "a Scan builds too slowly to use"),
)
BY_KEY = {runtime.key: runtime for runtime in RUNTIMES}
TARGETS = tuple(sorted({r.target for r in RUNTIMES if r.target and r.target != "portable"}))


_COMPACTION = frozenset({"ScatterND", "GatherND", "CumSum"})  # the portable form's mask: compaction and restore


def masked_own_step(row: Optional[Runtime]) -> str:
    """Why a masked layer is written as its own step for ``row``'s runtime ("" where a native node's mask
    runs there): the runtime lacks ops the mask's compaction around a native node needs."""
    missing = sorted(row.lacks & _COMPACTION) if row is not None else []
    missing += ["the mask's bool ops"] if row is not None and row.lacks & _MASK_BOOLS else []
    if not missing:
        return ""
    return (f"{row.name} has no {', '.join(missing)}, which a native node's mask needs: the masked layer is its "
            "own step, the mask applied at each step")


def runtime(key: str) -> Runtime:
    return BY_KEY[key]


def for_target(target: str) -> Optional[Runtime]:
    """The runtime whose own target ``target`` is (``portable`` is several runtimes' and none's own)."""
    return next((r for r in RUNTIMES if r.target == target and r.key == target), None)


@dataclass(frozen=True)
class Obstacle:
    """Why ``runtime`` does not compute a node of a written model as ONNX defines it."""

    node: str
    why: str
    silent: bool = False  # the runtime gives a wrong result, no error
    kind: str = "op"  # what about the node: op, direction, y_h, initial_states, scan, slice, inputs, ...


def obstacles(model_proto: onnx.ModelProto, row: Runtime) -> list:
    """What keeps ``row``'s runtime from computing ``model_proto`` as ONNX defines it (empty: nothing
    among the facts the table holds)."""
    constants: dict = {}
    found: list = []
    static = _static_inputs(model_proto)
    convs = not row.batched_conv and any(n.op_type == "Conv" for n in model_proto.graph.node)
    shapes = static_shapes(model_proto) if convs else None  # shape inference only where a fact asks for it
    whole = readers_of(model_proto.graph)
    readers: dict = {}  # id of a graph -> what reads each name, its own outputs read by None
    for graph, node in _nodes(model_proto.graph):
        if id(graph) not in readers:
            constants.update(constant_values(graph))
            readers[id(graph)] = {**whole, **{o.name: whole.get(o.name, []) + [None] for o in graph.output}} \
                if graph is not model_proto.graph else whole
        found.extend(node_obstacles(node, row, constants, static, readers[id(graph)],
                                    shapes if graph is model_proto.graph else None))
    ranks = [len(i.type.tensor_type.shape.dim) for i in model_proto.graph.input]
    if row.max_input_rank and max(ranks, default=0) > row.max_input_rank:
        found.insert(0, Obstacle("inputs", f"takes no input of rank {max(ranks)}", kind="rank"))
    if static and not row.squeezes_unknown:
        found.extend(_unknown_squeezes(model_proto))
    batched = batched_input(model_proto) if row.batch_one and static else None
    if batched is not None:
        found.insert(0, Obstacle("inputs", f"computes one batch row at a time: input {batched.name} has batch "
                                           f"{batched.type.tensor_type.shape.dim[0].dim_value}", kind="batch"))
    if row.static_shapes and not static:
        found.insert(0, Obstacle("inputs", "compiles fixed shapes only: the model's inputs have dynamic dimensions",
                                    kind="inputs"))
    return found


def _unknown_squeezes(model_proto: onnx.ModelProto) -> list:
    """An obstacle per ``Squeeze`` of the main graph whose input has a dimension ONNX's shape inference leaves
    unknown (the model's inputs of fixed shapes)."""
    squeezes = [n for n in model_proto.graph.node if n.op_type == "Squeeze"]
    if not squeezes:
        return []
    try:
        inferred = onnx.shape_inference.infer_shapes(model_proto, data_prop=True).graph
    except Exception:  # noqa: BLE001 - without inference, no dimension is known but those declared
        inferred = model_proto.graph
    known = {v.name: v.type.tensor_type.shape for v in list(inferred.input) + list(inferred.value_info)
             + list(inferred.output) if v.type.tensor_type.HasField("shape")}
    known.update({t.name: None for t in model_proto.graph.initializer})
    return [Obstacle(n.name or n.output[0], "fails to compile a Squeeze of a tensor whose shape it cannot fix "
                                            "('tensor.collapse_shape')", kind="shape")
            for n in squeezes if n.input[0] not in known
            or (known[n.input[0]] is not None and not all(d.HasField("dim_value") for d in known[n.input[0]].dim))]


def batched_input(model_proto: onnx.ModelProto):
    """The first input (of fixed shape) whose batch axis is not 1, or None."""
    constants = {t.name for t in model_proto.graph.initializer}
    return next((i for i in model_proto.graph.input if i.name not in constants and i.type.tensor_type.shape.dim
                 and i.type.tensor_type.shape.dim[0].dim_value != 1), None)


def node_obstacles(node: onnx.NodeProto, row: Runtime, constants: dict, static: bool, readers: dict,
                   shapes: Optional[dict] = None) -> list:
    """The obstacles of one node (``constants``: name -> value of the constants it may read; ``readers``:
    name -> the nodes that read it, None for a graph output; ``shapes``: name -> its static dimensions, where
    the row asks for them)."""
    name = node.name or node.output[0]
    if node.domain not in ("", "ai.onnx"):
        return []
    if node.op_type in row.lacks:
        kind = {"ReverseSequence": "reversal", "GatherElements": "gather"}.get(
            node.op_type, "bool" if node.op_type in _MASK_BOOLS else "op")
        return [Obstacle(name, f"has no {node.op_type}", kind=kind)]
    if node.op_type in RECURRENT_OPS:
        return _recurrent(node, row, constants, readers, name)
    if node.op_type == "Scan":
        if row.scan == "none":
            return [Obstacle(name, "has no Scan", kind="scan")]
        if row.scan == "static" and not static:
            return [Obstacle(name, "gives a Scan with dynamic dimensions the wrong output shape", True, "scan")]
        if not row.scan_squeeze and any(n.op_type == "Squeeze" for n in _body(node)):
            return [Obstacle(name, "fails to compile a Squeeze in a Scan's step", kind="scan")]
    if node.op_type == "Gemm" and not row.computed_gemm_bias and len(node.input) > 2 and node.input[2] \
            and node.input[2] not in constants:
        return [Obstacle(name, "has no Gemm whose C is computed", kind="gemm")]
    if node.op_type == "Conv" and not row.batched_conv and ((shapes or {}).get(node.input[0]) or [0])[0] > 1:
        return [Obstacle(name, "takes a Conv's axis 0 for the batch axis its blobs lack: a Conv over several "
                               "images at once does not load", kind="batched")]
    if node.op_type == "Concat" and not row.empty_concat and any(
            name in constants and np.size(constants[name]) == 0 for name in node.input):
        return [Obstacle(name, "loads a Concat of an empty constant wrongly or not at all", True, "empty")]
    if node.op_type == "Split" and not row.unsized_split and not slot(node.input, 1) \
            and attribute(node, "split") is None:
        return [Obstacle(name, "crashes on a Split whose sizes are not given", kind="split")]
    if node.op_type == "Slice" and row.negative_step_slice == "dropped" and _negative_step(node, constants):
        return [Obstacle(name, "drops a Slice with step -1", True, "slice")]
    return []


def _recurrent(node, row: Runtime, constants: dict, readers: dict, name: str) -> list:
    op, found = node.op_type, []
    direction = attribute(node, "direction", FORWARD)
    if direction not in row.recurrent.get(op, ()):
        found.append(Obstacle(name, f"has no {op}" if op not in row.recurrent else f"has no {direction} {op}",
                              kind="direction" if op in row.recurrent else "op"))
        return found
    if op == "GRU" and not attribute(node, "linear_before_reset", 0) and not row.gru_linear_before_reset_0:
        found.append(Obstacle(name, "has no GRU with linear_before_reset=0 (Keras's reset_after=False)", kind="op"))
    others = sorted(set(attribute(node, "activations", [])) - row.activations) if row.activations is not None else []
    if others:
        found.append(Obstacle(name, f"computes {op}'s {', '.join(others)} otherwise than ONNX", True, "activations"))
    lengths = slot(node.input, SEQUENCE_LENS)
    if lengths:
        if row.sequence_lens == "ignored" and lengths not in constants:
            found.append(Obstacle(name, f"ignores {op}'s computed sequence_lens", True, "sequence_lens"))
        elif row.sequence_lens == "constant" and lengths not in constants:
            found.append(Obstacle(name, f"takes {op}'s sequence_lens only as a constant", kind="sequence_lens"))
        elif row.sequence_lens == "none":
            found.append(Obstacle(name, f"has no {op} with sequence_lens", kind="sequence_lens"))
    if op == "LSTM" and slot(node.input, PEEPHOLES) and row.peepholes != "exact":
        found.append(Obstacle(name, "computes LSTM peepholes otherwise than ONNX", row.peepholes == "wrong",
                              "peepholes"))
    if slot(node.output, Y_H) and slot(node.output, Y_H) in readers and op not in row.reads_y_h:
        found.append(Obstacle(name, f"fails on a read Y_h of {op}", kind="y_h"))
    if op == "LSTM" and slot(node.output, Y_C) and slot(node.output, Y_C) in readers and not row.reads_y_c:
        found.append(Obstacle(name, "fails on a read Y_c of LSTM", kind="op"))
    if row.recurrent_read_as == "squeezed" and direction == FORWARD and not _squeezed(node.output[Y], readers,
                                                                                          constants):
        found.append(Obstacle(name, f"maps {op} only when its Y alone is read, by a Squeeze of its axis 1",
                              kind="y_h"))
    if row.recurrent_read_as == "squeezed" and direction == BIDIRECTIONAL and not _merged(node, readers, constants):
        found.append(Obstacle(name, f"maps a bidirectional {op} only when its Y alone is read, by a Transpose(0, 2, "
                                    "1, 3) and a Reshape to [T, B, 2H]", kind="y_h"))
    if not row.given_states and any(slot(node.input, s) for s in (INITIAL_H, INITIAL_C)):
        found.append(Obstacle(name, f"maps {op} only without initial states", kind="given_states"))
    if op in row.initial_states_needed and not slot(node.input, INITIAL_H):
        found.append(Obstacle(name, f"fails on {op} without initial states", kind="initial_states"))
    elif op in row.all_states_need_initial and not slot(node.input, INITIAL_H) and \
            all(slot(node.output, k) in readers for k in (Y, Y_H, Y_C)):
        found.append(Obstacle(name, f"fails on {op} without initial states whose Y, Y_h and Y_c are all read",
                              kind="initial_states"))
    return found


def attribute(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            if isinstance(value, list):
                return [v.decode() if isinstance(v, bytes) else v for v in value]
            return value.decode() if isinstance(value, bytes) else value
    return default


def slot(names, index: int) -> str:
    """The name at ``index`` of a node's inputs or outputs ("" where absent)."""
    return names[index] if len(names) > index else ""


def _negative_step(node: onnx.NodeProto, constants: dict) -> bool:
    steps = constants.get(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    return len(node.input) > 4 and bool(node.input[4]) and (steps is None or bool((np.asarray(steps) < 0).any()))


def constant_values(graph: onnx.GraphProto) -> dict:
    """name -> value of ``graph``'s initializers and Constant nodes."""
    values = {t.name: t for t in graph.initializer}
    values.update({n.output[0]: n.attribute[0].t for n in graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return {name: numpy_helper.to_array(t) for name, t in values.items()}


def _nodes(graph: onnx.GraphProto) -> Iterable:
    for node in graph.node:
        yield graph, node
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _nodes(sub)


def _body(node: onnx.NodeProto) -> list:
    return [n for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for _, n in _nodes(a.g)]


def readers_of(main: onnx.GraphProto, graph: Optional[onnx.GraphProto] = None) -> dict:
    """name -> the nodes (of ``main`` and its subgraphs) that read it; a graph output is read by None."""
    readers: dict = {}
    for _, n in _nodes(main):
        for name in n.input:
            if name:
                readers.setdefault(name, []).append(n)
    for output in list(main.output) + (list(graph.output) if graph is not None else []):
        readers.setdefault(output.name, []).append(None)
    return readers


def squeezes_axis_1(node: Optional[onnx.NodeProto], constants: Optional[dict] = None) -> bool:
    """Whether ``node`` is a Squeeze of axis 1 alone (its axes an attribute or a constant input)."""
    if node is None or node.op_type != "Squeeze":
        return False
    axes = attribute(node, "axes")
    if axes is None and len(node.input) > 1 and constants is not None:
        axes = constants.get(node.input[1])
    return axes is not None and [int(a) for a in np.asarray(axes).ravel()] == [1]


def _squeezed(y: str, readers: dict, constants: dict) -> bool:
    """A recurrent node's Y read once, by a Squeeze of axis 1 (its axes given as an attribute or a constant)."""
    found = readers.get(y, []) if y else []
    return len(found) == 1 and squeezes_axis_1(found[0], constants)


def merges_directions(transpose: Optional[onnx.NodeProto], reshape: Optional[onnx.NodeProto], hidden: int,
                      constants: dict) -> bool:
    """Whether ``transpose`` then ``reshape`` read a bidirectional Y [T, 2, B, H] as [T, B, 2H]."""
    if transpose is None or reshape is None or transpose.op_type != "Transpose" or reshape.op_type != "Reshape":
        return False
    shape = constants.get(reshape.input[1]) if len(reshape.input) > 1 else None
    return list(attribute(transpose, "perm", [])) == [0, 2, 1, 3] and shape is not None and \
        np.size(shape) == 3 and int(np.ravel(shape)[2]) == 2 * hidden and all(int(d) > 0 for d in np.ravel(shape))


def _merged(node: onnx.NodeProto, readers: dict, constants: dict) -> bool:
    """A bidirectional node's Y read once, by a Transpose(0, 2, 1, 3) read once, by a Reshape to [T, B, 2H]."""
    found = readers.get(node.output[Y], []) if node.output and node.output[Y] else []
    if len(found) != 1 or found[0] is None or not found[0].output:
        return False
    after = readers.get(found[0].output[0], [])
    return len(after) == 1 and merges_directions(found[0], after[0], int(attribute(node, "hidden_size", 0)),
                                                 constants)


def static_shapes(model_proto: onnx.ModelProto) -> dict:
    """name -> its dimensions (an int, or None where not static), by ONNX's shape inference (the main graph's)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model_proto, data_prop=True)
    except Exception:  # noqa: BLE001 - without inference, only the declared shapes are known
        inferred = model_proto
    found = {}
    graph = inferred.graph
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.tensor_type.HasField("shape"):
            found[value.name] = [d.dim_value if d.HasField("dim_value") else None
                                 for d in value.type.tensor_type.shape.dim]
    for tensor in graph.initializer:
        found[tensor.name] = list(tensor.dims)
    return found


def _static_inputs(model_proto: onnx.ModelProto) -> bool:
    constants = {t.name for t in model_proto.graph.initializer}
    return all(d.HasField("dim_value") for i in model_proto.graph.input if i.name not in constants
               for d in i.type.tensor_type.shape.dim)


def runs_in(model_proto: onnx.ModelProto) -> tuple:
    """(the runtimes that compute ``model_proto`` as ONNX defines it, {runtime: its first obstacle}) over
    every row of the table."""
    computing, not_computing = [], {}
    for row in RUNTIMES:
        found = obstacles(model_proto, row)
        if found:
            not_computing[row.key] = sorted(found, key=lambda o: not o.silent)[0]
        else:
            computing.append(row.key)
    return computing, not_computing
