"""Frozen TensorFlow graphs as sources: a GraphDef file (``graphdef``) or a TF1 checkpoint's meta graph
(``checkpoint``), with the input and output tensors named by the user as in tf2onnx.

Both are loaded by tf2onnx's own loader steps (import, freeze the variables, grappler), with one
change: TensorFlow's grappler would lower every functional ``While`` whose
``_lower_using_switch_merge`` is set (how TF1's ``dynamic_rnn`` leaves its loops) into v1 control
flow, whose TensorLists tf2onnx cannot convert; the loops are marked to stay functional first, so
tf2onnx reads them as it reads a SavedModel's and the rewriter fuses what it recognises. A graph
frozen with its loops already lowered (``convert_variables_to_constants_v2`` with its default
``lower_control_flow=True``) is refused with how to freeze it instead.

Loading runs nothing the graph holds (a checkpoint's restore op only when it keeps to reading the
checkpoint); verification runs the graph for its outputs, refused with ``safe_mode`` when that
would run ops reaching outside TensorFlow.
"""
from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

from ..errors import ConversionError, first_line, param
from . import Frozen, Source, check_input_shape, placeholder_shapes
from .outside_ops import RESTORING, executed_ops, outside, refuse_outside

_WHILE_OPS = ("While", "StatelessWhile")
_LOWER = "_lower_using_switch_merge"
logger = logging.getLogger("tf2onnx_rnn")


class GraphDefFile(Source):
    """A frozen GraphDef (``.pb``) with the tensors to convert."""

    kind = "graphdef"
    options = ("outputs", "safe_mode")

    def __init__(self, path: str, outputs: Optional[Sequence[str]] = None, safe_mode: bool = True):
        self.path, self.outputs, self.safe_mode = path, _names(outputs), safe_mode
        self._frozen_graph = None  # the graph as frozen, before grappler: what verification runs
        self._tensors = ([], [])  # its input and output tensors

    def check(self) -> None:
        _check_file(self.path, self.kind, "a frozen GraphDef file (.pb)")
        _require_outputs(self.outputs)

    def prepared(self, options):
        _require_inputs(options)
        return options

    def freeze(self, options) -> Frozen:
        graph_def = _read_graph_def(self.path)
        inputs, outputs = _tensors(graph_def, options.inputs, self.outputs)
        return self._frozen(_load(lambda session: _import(graph_def), inputs, outputs), options)

    def _frozen(self, loaded: tuple, options) -> Frozen:
        self._frozen_graph, graph_def, inputs, outputs = loaded
        self._tensors = (inputs, outputs)
        override = {}
        shapes = placeholder_shapes(self._frozen_graph)
        for name, shape in (options.inputs or {}).items():
            tensor = _tensor(name)
            if shape is not None:
                check_input_shape(name, shape, shapes.get(tensor), param("inputs"))
                override[tensor] = [None if d is None else int(d) for d in shape]
        names = tf1_layer_names(self._frozen_graph)
        return Frozen(graph_def, os.path.basename(self.path), inputs, outputs, {}, shape_override=override or None,
                      layer_names=names.get, lowered=tuple(lowered_loops(self._frozen_graph)))

    def verify(self, model_proto, tolerance: float, values: bool = True):
        from ..verify import verify_graph_def

        if self.safe_mode:
            refuse_outside(outside(executed_ops(self._frozen_graph, self.outputs)),
                           "verification runs the graph, which runs")
        return verify_graph_def(self._frozen_graph, *self._tensors, model_proto, tolerance=tolerance, values=values)


class Checkpoint(GraphDefFile):
    """A TF1 checkpoint: its meta graph (``model.meta``) beside the variables it restores."""

    kind = "checkpoint"

    def check(self) -> None:
        _check_file(self.path, self.kind, "a checkpoint's meta graph (model.meta)")
        if not self.path.endswith(".meta"):
            raise ConversionError(f"{param('checkpoint')} takes a checkpoint's .meta file, got {self.path}")
        _require_outputs(self.outputs)

    def freeze(self, options) -> Frozen:
        from ..cudnn_reference import canonical_to_params_on_cpu, put_back, with_stand_ins

        meta = _read_meta_graph(self.path)
        canonical_to_params_on_cpu(meta.graph_def)  # a TF 1.x cuDNN layer restores its weights on a GPU only
        inputs, outputs = _tensors(meta.graph_def, options.inputs, self.outputs)
        if self.safe_mode and meta.saver_def.restore_op_name:
            refuse_outside(outside(executed_ops(meta.graph_def, [meta.saver_def.restore_op_name]), allowed=RESTORING),
                           "restoring the checkpoint runs")
        graph_def, stand_ins = with_stand_ins(meta.graph_def)  # no CPU kernel: a session would not even restore
        meta.graph_def.CopyFrom(graph_def)
        return self._frozen(_load(lambda session: _restore(session, self.path, meta), inputs, outputs,
                                  frozen_as=lambda frozen: put_back(frozen, stand_ins)), options)


def _names(names) -> tuple:
    if names is None:
        return ()
    if isinstance(names, str):
        names = names.split(",")
    return tuple(str(name).strip() for name in names if str(name).strip())


def _tensor(name: str) -> str:
    """A tensor's graph name: ``name:0`` for a node name."""
    return name if ":" in name else f"{name}:0"


def _check_file(path: str, kind: str, what: str) -> None:
    if not os.path.exists(path):
        raise ConversionError(f"no such file for {param(kind)}: {path}")
    if os.path.isdir(path):
        raise ConversionError(f"{param(kind)} takes {what}, got a directory: {path}")


def _require_outputs(outputs: tuple) -> None:
    if not outputs:
        raise ConversionError(f"a frozen graph needs {param('outputs')}: the tensors to convert (e.g. Identity:0)")


def _require_inputs(options) -> None:
    if not options.inputs:
        raise ConversionError(f"a frozen graph needs {param('inputs')}: its input placeholders (e.g. x:0, or "
                              "x:0[1,50,16] to fix a shape)")


def _read_graph_def(path: str):
    import tensorflow as tf
    from google.protobuf import message, text_format

    graph_def = tf.compat.v1.GraphDef()
    with open(path, "rb") as stream:
        content = stream.read()
    try:
        graph_def.ParseFromString(content)
    except message.DecodeError:
        try:
            text_format.Parse(content.decode("utf-8"), graph_def)
        except (UnicodeDecodeError, text_format.ParseError):
            raise ConversionError(f"not a TensorFlow GraphDef (binary or text): {path}") from None
    if not graph_def.node:
        raise ConversionError(f"not a TensorFlow GraphDef (it has no nodes): {path}")
    return graph_def


def _read_meta_graph(path: str):
    from google.protobuf import message
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    try:
        with open(path, "rb") as stream:
            meta.ParseFromString(stream.read())
    except message.DecodeError:
        raise ConversionError(f"not a checkpoint meta graph: {path}") from None
    if not meta.graph_def.node:
        raise ConversionError(f"not a checkpoint meta graph (its graph has no nodes): {path}")
    return meta


def _tensors(graph_def, inputs: Optional[dict], outputs: tuple) -> tuple:
    """The input and output tensors, each checked to be in the graph (a name without ``:N`` is ``:0``)."""
    nodes = {node.name: node for node in graph_def.node}
    placeholders = sorted(n.name + ":0" for n in graph_def.node if n.op == "Placeholder")
    found = []
    for names, option, known in ((list(inputs or {}), "inputs", placeholders), (outputs, "outputs", None)):
        for name in names:
            if _tensor(name).split(":")[0] not in nodes:
                hint = f"; its placeholders are: {', '.join(placeholders) or 'none'}" if known is not None else ""
                raise ConversionError(f"unknown tensor {name!r} in {param(option)}: the graph has no node "
                                      f"{_tensor(name).split(':')[0]!r}{hint}")
        found.append([_tensor(name) for name in names])
    return tuple(found)


def _import(graph_def) -> None:
    import tensorflow as tf

    tf.import_graph_def(graph_def, name="")


def _restore(session, path: str, meta) -> None:
    """Import the meta graph ``meta`` (read from ``path``) and restore its variables from the checkpoint."""
    from tf2onnx import tf_loader

    saver = tf_loader.tf_import_meta_graph(meta, clear_devices=True)
    saver.restore(session, path[:-len(".meta")])


def _load(populate, inputs: list, outputs: list, frozen_as=None) -> tuple:
    """tf2onnx's loader steps for a session ``populate`` fills: (the frozen graph, the graph optimized
    for tf2onnx with functional loops kept, inputs, outputs). ``frozen_as`` (in place) turns the frozen
    graph into the one to convert before it is optimized."""
    from tf2onnx import tf_loader

    tf_loader.tf_reset_default_graph()
    try:
        with tf_loader.tf_session() as session:
            populate(session)
            inputs = tf_loader.inputs_without_resource(session, inputs)
            frozen = tf_loader.freeze_session(session, input_names=inputs, output_names=outputs)
            inputs = tf_loader.remove_redundant_inputs(frozen, inputs)
        if frozen_as is not None:
            frozen_as(frozen)
        freeze_defaults(frozen, inputs)
        keep_loops_functional(frozen)
        tf_loader.tf_reset_default_graph()
        with tf_loader.tf_session():
            optimized = tf_loader.tf_optimize(inputs, outputs, frozen)
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - TensorFlow raises many kinds while importing and freezing
        raise ConversionError(f"cannot load the graph: {first_line(error)}") from error
    finally:
        tf_loader.tf_reset_default_graph()
    return frozen, optimized, inputs, outputs


def freeze_defaults(graph_def, inputs: Sequence[str]) -> list:
    """A ``PlaceholderWithDefault`` that is not one of the ``inputs`` is its default: the model's inputs
    are the ones named (TF1 graphs feed a dropout's ``keep_prob`` so, 1 at inference). Returns the
    names of those frozen."""
    named = {name.split(":")[0] for name in inputs}
    frozen = []
    for node in graph_def.node:
        if node.op == "PlaceholderWithDefault" and node.name not in named:
            dtype = node.attr["dtype"].type
            node.op = "Identity"
            node.attr.clear()
            node.attr["T"].type = dtype
            frozen.append(node.name)
    return frozen


_TF1_CELL_SCOPES = ("lstm_cell", "basic_lstm_cell", "gru_cell", "basic_rnn_cell", "multi_rnn_cell", "lstm_block_cell",
                    "gru_block_cell")


def tf1_layer_names(graph_def) -> dict:
    """Report names of the loops of TF 1.x's RNN functions (``dynamic_rnn`` and its kin): the scope of
    the cell whose weights the loop reads (``rnn/lstm_cell``, ``bidirectional_rnn/fw/gru_cell``,
    ``rnn/multi_rnn_cell``), by loop name. A loop of another kind (a Keras layer's) is not named here."""
    nodes = {node.name: node for node in graph_def.node}
    weights: dict = {}  # loop name -> names of the weights it reads
    for node in graph_def.node:
        if node.op in _WHILE_OPS:
            weights.setdefault(node.name, []).extend(node.input)
        elif node.op == "Enter" and "/while/" in node.name:
            weights.setdefault(node.name.split("/while/")[0] + "/while", []).extend(node.input)
    names = {}
    for loop, inputs in weights.items():
        kernels = [_weight_scope(nodes, tensor) for tensor in inputs]
        scopes = sorted({scope for scope in kernels if scope})
        if not scopes:
            continue
        common = os.path.commonprefix([scope.split("/") for scope in scopes])
        cell = next((i for i, part in enumerate(common) if part in _TF1_CELL_SCOPES), None)
        if cell is not None and common[0] == loop.split("/")[0]:
            names[loop] = "/".join(common[:cell + 1])
    return names


def _weight_scope(nodes: dict, tensor: str) -> str:
    """The scope of the variable a frozen weight was (``rnn/lstm_cell`` for ``rnn/lstm_cell/kernel``), through
    the Identity reading it; "" for anything else."""
    node = nodes.get(tensor.split(":")[0].lstrip("^"))
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    if node is None or node.op != "Const" or "/kernel" not in node.name:
        return ""
    return node.name.split("/kernel")[0].rsplit("/gates", 1)[0].rsplit("/candidate", 1)[0]


def keep_loops_functional(graph_def) -> int:
    """Mark every functional while-loop (in the graph and its functions) to stay one op through
    grappler; the number marked."""
    marked = 0
    for nodes in [graph_def.node] + [f.node_def for f in graph_def.library.function]:
        for node in nodes:
            if node.op in _WHILE_OPS and node.attr[_LOWER].b:
                node.attr[_LOWER].b = False
                marked += 1
    return marked


def lowered_loops(graph_def) -> list:
    """The TF 1.x loops of a graph that step TensorLists: functional loops lowered when the graph was frozen
    (``convert_variables_to_constants_v2`` lowers them by default)."""
    from ..reconcile import v1_loops

    return [frame for frame, ops in v1_loops(graph_def).items() if any(op.startswith("TensorList") for op in ops)]
