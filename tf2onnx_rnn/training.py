"""Converted models for onnxruntime's training API: the training form (target ``"training"``) and
the training artifacts of a converted model.

onnxruntime's training build differentiates ONNX ``LSTM`` and ``GRU`` nodes (its ``LSTMGrad`` and
``GRUGrad`` kernels) that run forward, with ONNX's default activations and no ``sequence_lens``;
it has no gradient for ``RNN``, nor for a ``Loop``. Every converted node keeps its absent optional
inputs as ``""`` up to its initial states, which its gradient builders need; the training form
adds what inference does not need:

- masked layers in the portable form (no ``sequence_lens``), every node running forward (a
  Bidirectional layer as two forward nodes, a backward pass over its input reversed by a Slice);
- a SimpleRNN's ``RNN`` node as a ``GRU`` that computes the same: its update gate held at 0 and its
  reset gate at 1 by weights that are not trained (zero input and recurrent weights, biases of
  -/+ :data:`HOLD`, kept as initializers of their own and listed in the model's metadata under
  :data:`HELD_KEY`), so ``h = tanh(W x + R h + b)`` as the RNN computes;
- one trained bias where the Keras layer has one (LSTM, GRU ``reset_after=False``, SimpleRNN):
  ONNX adds its input and recurrent biases, so training both would move their sum twice as fast
  as Keras moves its bias; the sum trains and the recurrent half is held at zero;
- a report note on every layer that still cannot train, and why.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import ConversionError, first_line, param
from .rewriters.runtimes import DEFAULT_ACTIVATIONS

HELD_KEY = "tf2onnx_rnn.held"  # metadata: the initializers that hold a gate, never trained
HOLD = 100.0  # sigmoid(-100) and 1 - sigmoid(100) are below float32's resolution next to 1
_RECURRENT = ("LSTM", "GRU", "RNN")
_SEQUENCE_LENS = 4
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def training_form(model_proto: onnx.ModelProto, report):
    """Rewrite ``model_proto`` in place into the training form (see the module's note) and return
    ``report`` with each row's node as written and a note where a layer cannot train."""
    graph = model_proto.graph
    initializers = {i.name: i for i in graph.initializer}
    held, renamed, nodes = [], set(), []
    for node in graph.node:
        rewritten = None
        if node.op_type in _RECURRENT and not _untrainable(node):
            rewritten = _held_gate_gru(node, initializers) if node.op_type == "RNN" else _one_bias(node, initializers)
        if rewritten is None:
            nodes.append(node)
            continue
        added, made = rewritten
        nodes.extend(made)
        held.extend(added)
        if node.op_type == "RNN":
            renamed.add(node.name)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in initializers.values() if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if held:
        _add_metadata(model_proto, HELD_KEY, held)
    written = {n.name: n for n in graph.node}
    return dataclasses.replace(report, outcomes=[_row(o, written.get(o.node), renamed) for o in report.outcomes])


def _one_bias(node: onnx.NodeProto, initializers: dict) -> Optional[tuple]:
    """An LSTM's or a GRU's (``linear_before_reset=0``) biases as its Keras layer has them: ONNX adds
    Wb and Rb, so training both would move their sum twice as fast as Keras moves its one bias. Wb
    takes their sum and trains; Rb is held at zero. (A GRU with ``linear_before_reset=1`` has both,
    as Keras's ``reset_after`` layer.) (held names, the nodes), or None where nothing changes."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    b = node.input[3] if len(node.input) > 3 else ""
    if (node.op_type == "GRU" and attributes.get("linear_before_reset", 0)) or b not in initializers:
        return None
    bias = numpy_helper.to_array(initializers[b])
    half = bias.shape[-1] // 2
    names = {"Wb": f"{node.name}/Wb", "held_Rb": f"{node.name}/held_Rb"}
    values = {"Wb": bias[..., :half] + bias[..., half:], "held_Rb": np.zeros_like(bias[..., half:])}
    for key, value in values.items():
        initializers[names[key]] = numpy_helper.from_array(np.ascontiguousarray(value), names[key])
    concat = helper.make_node("Concat", [names["Wb"], names["held_Rb"]], [f"{node.name}/B"],
                              name=f"{node.name}/concat_B", axis=1)
    rewired = onnx.NodeProto()
    rewired.CopyFrom(node)
    rewired.input[3] = concat.output[0]
    return [names["held_Rb"]], [concat, rewired]


def _row(outcome, node, renamed: dict):
    """A report row in the training form: the op its node became, and a note if it cannot train."""
    if not outcome.fused or node is None:
        return outcome
    notes = []
    if outcome.node in renamed:
        notes.append("trains as a GRU with its update gate held at 0 and its reset gate at 1 (ONNX's RNN has no "
                     "gradient in onnxruntime)")
    why = _untrainable(node)
    if why:
        notes.append(f"does not train in onnxruntime: {why}")
    if not notes:
        return outcome
    activations = "; ".join(filter(None, [outcome.activations] + notes))
    return dataclasses.replace(outcome, became=node.op_type, activations=activations)


def _untrainable(node: onnx.NodeProto) -> str:
    """Why onnxruntime's training kernels refuse ``node`` ("" when they take it)."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    direction = attributes.get("direction", b"forward")
    if direction != b"forward":
        return f"the node runs {direction.decode()} (the training kernels run forward only)"
    if len(node.input) > _SEQUENCE_LENS and node.input[_SEQUENCE_LENS]:
        return ("its node takes sequence_lens, which the training kernels do not (a masked LSTM whose final cell "
                "state is used keeps it)")
    activations = tuple(a.decode().lower() for a in attributes.get("activations", ()))
    if activations and activations != tuple(a.lower() for a in DEFAULT_ACTIVATIONS[node.op_type]):
        return f"its activations {', '.join(a.decode() for a in attributes['activations'])} are not ONNX's defaults"
    others = sorted(set(attributes) - {"hidden_size", "direction", "activations", "linear_before_reset", "layout"})
    if others:
        return f"its node sets {', '.join(others)}"
    return ""


def _held_gate_gru(node: onnx.NodeProto, initializers: dict) -> Optional[tuple]:
    """(the held initializers' names, the nodes computing what the RNN ``node`` computes: Concats of
    the held gates' weights (z, r) before the RNN's own (h), then a GRU), or None when the RNN's
    weights are not initializers. ``initializers`` gains the held ones and the bias halves."""
    x, w, r, b = (list(node.input) + [""] * 4)[:4]
    if any(name and name not in initializers for name in (w, r, b)):
        return None
    recurrent = numpy_helper.to_array(initializers[r])
    dtype, hidden, features = recurrent.dtype, recurrent.shape[-1], initializers[w].dims[-1]
    bias = numpy_helper.to_array(initializers[b]) if b else np.zeros((1, 2 * hidden), dtype)
    values = {
        "held_W": np.zeros((1, 2 * hidden, features), dtype),
        "held_R": np.zeros((1, 2 * hidden, hidden), dtype),
        "held_Wb": np.concatenate([np.full(hidden, -HOLD), np.full(hidden, HOLD)]).astype(dtype)[None],
        "held_Rb": np.zeros((1, 3 * hidden), dtype),
        "Wb": bias[:, :hidden] + bias[:, hidden:],  # the RNN's bias, one as Keras's (see _one_bias)
    }
    names = {key: f"{node.name}/{key}" for key in values}
    for key, value in values.items():
        initializers[names[key]] = numpy_helper.from_array(np.ascontiguousarray(value), names[key])
    parts = {"W": [names["held_W"], w], "R": [names["held_R"], r],
             "B": [names[k] for k in ("held_Wb", "Wb", "held_Rb")]}
    made = [helper.make_node("Concat", inputs, [f"{node.name}/{key}"], name=f"{node.name}/concat_{key}", axis=1)
            for key, inputs in parts.items()]
    made.append(helper.make_node("GRU", [x] + [m.output[0] for m in made] + list(node.input[4:]), list(node.output),
                                 name=node.name, hidden_size=int(hidden), linear_before_reset=0))
    return [names[k] for k in values if k.startswith("held_")], made


def _add_metadata(model_proto: onnx.ModelProto, key: str, values: list) -> None:
    for prop in model_proto.metadata_props:
        if prop.key == key:
            prop.value = ",".join(filter(None, prop.value.split(",") + values))
            return
    model_proto.metadata_props.add(key=key, value=",".join(values))


def held_parameters(model_proto: onnx.ModelProto) -> list:
    """The initializers that hold a gate (never trained)."""
    for prop in model_proto.metadata_props:
        if prop.key == HELD_KEY:
            return [name for name in prop.value.split(",") if name]
    return []


def trainable_parameters(model_proto: onnx.ModelProto) -> list:
    """The parameters a converted model trains by default: the weights and biases of its recurrent
    nodes (through the Concats of a held-gate GRU) and of its dense layers (a MatMul's or Gemm's
    constant operands, and the bias added to a MatMul's product), but never the held gates."""
    graph = model_proto.graph
    floats = {i.name for i in graph.initializer if i.data_type in _FLOAT_TYPES}
    producers = {out: n for n in graph.node for out in n.output}
    held = set(held_parameters(model_proto))
    found = []

    def take(name: str) -> None:
        producer = producers.get(name)
        if producer is not None and producer.op_type == "Concat":
            for part in producer.input:
                take(part)
        elif name in floats and name not in held and name not in found:
            found.append(name)

    for node in graph.node:
        if node.op_type in _RECURRENT:
            for name in node.input[1:4]:
                take(name)
        elif node.op_type in ("MatMul", "Gemm"):
            for name in node.input[1:]:
                take(name)
        elif node.op_type == "Add" and any(_after_matmul(producers, t) for t in node.input):
            for name in node.input:
                take(name)
    return found


def _after_matmul(producers: dict, tensor: str) -> bool:
    """Whether ``tensor`` is a MatMul's product, through reshapes (a Dense layer's bias is added there)."""
    producer = producers.get(tensor)
    while producer is not None and producer.op_type in ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity",
                                                        "Flatten"):
        producer = producers.get(producer.input[0])
    return producer is not None and producer.op_type in ("MatMul", "Gemm")


def write_training_artifacts(model_proto: onnx.ModelProto, directory: str, trainable: Optional[Sequence[str]] = None,
                             loss: str = "mse", optimizer: str = "adamw") -> list:
    """Write onnxruntime's training artifacts for a converted model (best converted with
    ``target="training"``) into ``directory``: the training, evaluation and optimizer models and the
    checkpoint, as ``onnxruntime.training.artifacts.generate_artifacts`` makes them. ``trainable``:
    the initializers to train (default :func:`trainable_parameters`); ``loss``: ``"mse"``,
    ``"crossentropy"``, ``"bce"`` or ``"l1"`` over the model's outputs; ``optimizer``: ``"adamw"``
    or ``"sgd"``. Returns the files written. Needs onnxruntime's training build
    (``onnxruntime-training``)."""
    check_trainable(model_proto)
    artifacts = training_build()
    losses = {"mse": "MSELoss", "crossentropy": "CrossEntropyLoss", "bce": "BCEWithLogitsLoss", "l1": "L1Loss"}
    optimizers = {"adamw": "AdamW", "sgd": "SGD"}
    for value, known, name in ((loss, losses, "loss"), (optimizer, optimizers, "optimizer")):
        if value not in known:
            raise ConversionError(f"unknown {param(name)} {value!r}; known: {', '.join(known)}")
    names = {i.name for i in model_proto.graph.initializer}
    trainable = list(trainable_parameters(model_proto) if trainable is None else trainable)
    unknown = [name for name in trainable if name not in names]
    if unknown or not trainable:
        raise ConversionError(f"no initializer {unknown[0]!r} to train" if unknown else
                              "the model has nothing to train")
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConversionError(f"not a directory: {directory}")
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".training-", dir=os.path.dirname(directory))
    try:  # written beside the directory, then moved in: a failure leaves nothing half written
        artifacts.generate_artifacts(model_proto, requires_grad=trainable,
                                     frozen_params=sorted(names - set(trainable)),
                                     loss=getattr(artifacts.LossType, losses[loss]),
                                     optimizer=getattr(artifacts.OptimType, optimizers[optimizer]),
                                     artifact_directory=staging, loss_input_names=[o.name for o in
                                                                                    model_proto.graph.output])
        os.makedirs(directory, exist_ok=True)
        written = []
        for name in sorted(os.listdir(staging)):
            os.replace(os.path.join(staging, name), os.path.join(directory, name))
            written.append(os.path.join(directory, name))
        return written
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - onnxruntime's own refusal of the model
        raise ConversionError(f"onnxruntime cannot make training artifacts for this model: {first_line(error)}") \
            from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_trainable(model_proto: onnx.ModelProto) -> None:
    """:class:`ConversionError` naming what onnxruntime's training build cannot differentiate: a
    Loop or Scan (its artifact generation aborts the process on one), a recurrent node its training
    kernels refuse, an RNN node (no gradient)."""
    for node in model_proto.graph.node:
        why = ""
        if node.op_type in ("Loop", "Scan"):
            why = "a Loop or Scan, which onnxruntime's training build cannot differentiate (a layer the report " \
                  "says stayed a Loop or became a Scan of its own step)"
        elif node.op_type == "RNN":
            why = "an RNN node, which has no gradient in onnxruntime: convert with target=\"training\" (--target " \
                  "training), which makes it a GRU computing the same"
        elif node.op_type in _RECURRENT:
            why = _untrainable(node)
            if why and len(node.input) > _SEQUENCE_LENS and node.input[_SEQUENCE_LENS]:
                why += "; convert with target=\"training\" (--target training) where the layer allows"
        if why:
            raise ConversionError(f"the model cannot train in onnxruntime: node {node.name!r} is {why}"
                                  if node.op_type in ("Loop", "Scan", "RNN") else
                                  f"the model cannot train in onnxruntime: node {node.name!r}: {why}")


def training_build():
    """onnxruntime's training artifacts module, or :class:`ConversionError` saying how to get it."""
    try:
        from onnxruntime.training import artifacts
    except ImportError:
        raise ConversionError("training artifacts need onnxruntime's training build (onnxruntime-training-cpu "
                              "1.19, with numpy<2 and onnx<1.18: see docs/training.md)") from None
    return artifacts
