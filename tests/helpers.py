"""Helpers the test modules share: the recurrent kinds, onnxruntime sessions and graph walking.

Test modules import it by plain name (``import helpers``): ``tests/`` is on ``sys.path`` (see
conftest.py). It imports neither TensorFlow nor Keras, and onnxruntime only when a session is made.
"""
from __future__ import annotations

import collections
import hashlib
import os
import re
from typing import TYPE_CHECKING, Iterator, Union

import onnx
from onnx import numpy_helper

if TYPE_CHECKING:
    import onnxruntime

# -- the recurrent kinds ------------------------------------------------------------------------

KINDS = ("LSTM", "GRU", "SimpleRNN")  # the Keras layers (and cells) that become native nodes
# ONNX op each Keras kind must become, and the kind the report must name
ONNX_OP = {"LSTM": "LSTM", "GRU": "GRU", "SimpleRNN": "RNN"}
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
LOOP_OPS = frozenset({"Loop", "Scan"})
# a kind's states, in Keras's order (its return_state outputs and initial_state inputs)
STATE_NAMES = {"LSTM": ("h", "c"), "GRU": ("h",), "SimpleRNN": ("h",)}
STATE_COUNT = {kind: len(names) for kind, names in STATE_NAMES.items()}
# a kind's default layer name and name scope in Keras ("simple_rnn" for SimpleRNN)
SCOPE_NAME = {"LSTM": "lstm", "GRU": "gru", "SimpleRNN": "simple_rnn"}


# -- onnxruntime --------------------------------------------------------------------------------

def ort_session(model: Union[onnx.ModelProto, str, os.PathLike]) -> onnxruntime.InferenceSession:
    """A CPU onnxruntime session, one thread, on a model proto or on a file (str or path-like;
    external data is resolved beside the file)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


# -- graph walking ------------------------------------------------------------------------------

GraphLike = Union[onnx.ModelProto, onnx.GraphProto]


def _graph(model: GraphLike) -> onnx.GraphProto:
    return model.graph if isinstance(model, onnx.ModelProto) else model


def all_nodes(model: GraphLike) -> Iterator[onnx.NodeProto]:
    """Every node of a model or graph and of its subgraphs (GRAPH and GRAPHS attributes: Loop and
    Scan bodies, If branches), recursively, each node before its subgraphs' nodes: the package's
    own walk."""
    from tf2onnx_rnn.probes import graph_nodes

    yield from graph_nodes(_graph(model))


def op_types(model: GraphLike) -> list:
    """The op type of every node, those in subgraphs included (in :func:`all_nodes`'s order)."""
    return [node.op_type for node in all_nodes(model)]


def nodes_of_types(model: GraphLike, types) -> list:
    """Every node (subgraphs included) whose op type is in ``types``."""
    return [node for node in all_nodes(model) if node.op_type in types]


def op_counts(model: GraphLike) -> collections.Counter:
    """How many nodes of each op type, subgraphs included (0 for an op type not there)."""
    return collections.Counter(op_types(model))


def attribute(node: onnx.NodeProto, name: str):
    """The value of a node's attribute (``onnx.helper.get_attribute_value``), None if not set."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return None


def direction_of(node: onnx.NodeProto) -> str:
    """A recurrent node's ``direction`` attribute (ONNX's default is forward)."""
    value = attribute(node, "direction")
    if value is None:
        return "forward"
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the command line's stderr ------------------------------------------------------------------
# TensorFlow's C++ log lines ("I0000 00:00:... port.cc:153] ...", "W... ", "E... "), which its
# runtime, once loaded in a process, may write at any time
_TF_CPP_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|^WARNING: All log messages before absl::InitializeLog")


def without_tf_log(stderr: str) -> str:
    """``stderr`` without TensorFlow's own C++ log lines."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not _TF_CPP_LOG.match(line))


def assert_one_error_line(stderr: str) -> str:
    """The one line a refused command writes: ``error: ...``, no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def save_serving(model, path, features: int) -> None:
    """Save a Keras model as a SavedModel whose ``serving_default`` takes ``x`` [batch, time, features]
    and gives ``y``."""
    import tensorflow as tf

    module = tf.Module()
    module.weights = list(model.weights)
    module.serve = tf.function(lambda x: {"y": model(x, training=False)},
                               input_signature=[tf.TensorSpec((None, None, features), tf.float32, name="x")])
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve.get_concrete_function()})


def keras_tflite(model, configure=None) -> bytes:
    """``tf.lite.TFLiteConverter.from_keras_model(model).convert()`` (``configure`` sets the converter up
    first), traced without tf_keras's cuDNN variant: its converter fuses an LSTM from the loop the layer
    traces, marked as Keras's, so the file has the same ops, tensors and outputs either way (measured on
    a Bidirectional LSTM under a GRU), and registering the variant and its gradients took half the
    export's time (:func:`tf2onnx_rnn.keras_kernels.cpu_kernels`)."""
    import tensorflow as tf

    from tf2onnx_rnn.keras_kernels import cpu_kernels

    with cpu_kernels():
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        if configure is not None:
            configure(converter)
        return converter.convert()


def run_in_chunks(model_proto: onnx.ModelProto, data, chunks, pairs: dict, states: dict) -> list:
    """Output 0 of a streamed model on each chunk of ``data`` (input ``x``, cut along axis 1 into
    ``chunks``), the first chunk from ``states`` (state input -> value; those left out take their
    defaults), each later one from the states the last ended with (``pairs``: state input -> output)."""
    session = ort_session(model_proto)
    names = [o.name for o in session.get_outputs()]
    outputs, start = [], 0
    for size in chunks:
        result = dict(zip(names, session.run(None, {"x": data[:, start:start + size], **states})))
        outputs.append(result[names[0]])
        states = {name: result[output] for name, output in pairs.items()}
        start += size
    return outputs


def structure(model_proto: onnx.ModelProto) -> list:
    """The graph as sorted lines, one a node, each tensor named by what computes it (its producer's op,
    attributes and inputs, so named, and its output index), constants by their values and inputs by
    their names: two conversions of one model compare equal whatever names tf2onnx's counters gave
    their tensors and in whichever order equal graphs list their independent nodes (a graph tf2onnx
    re-optimizes from a deep copy may list them otherwise)."""

    def walk(graph, outer: dict) -> tuple:
        names = dict(outer)
        for tensor in graph.initializer:
            value = numpy_helper.to_array(tensor).tobytes().hex()
            names[tensor.name] = f"{tensor.data_type}{list(tensor.dims)}:{value}"
        for index, value in enumerate(graph.input):
            names[value.name] = f"input {value.name if graph is model_proto.graph else index}"
        lines = []
        for node in graph.node:
            attributes = []
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    attributes.append(f"{attribute.name}={walk(attribute.g, names)}")
                elif attribute.type == onnx.AttributeProto.TENSOR:
                    attributes.append(f"{attribute.name}={numpy_helper.to_array(attribute.t).tobytes().hex()}")
                else:
                    attributes.append(f"{attribute.name}={onnx.helper.get_attribute_value(attribute)}")
            line = f"{node.op_type} {[names.get(i, i) for i in node.input]} {attributes}"
            digest = hashlib.sha1(line.encode()).hexdigest()[:16]
            for index, output in enumerate(node.output):
                if output:
                    names[output] = f"{digest}:{index}"
            lines.append(f"{line} -> {[names.get(o, '') for o in node.output]}")
        return sorted(lines), [names[o.name] for o in graph.output]

    lines, outputs = walk(model_proto.graph, {})
    return lines + [f"output {name}" for name in outputs]
