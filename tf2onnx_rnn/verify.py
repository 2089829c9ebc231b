"""Verification: run the source model and the converted model on the same seeded random inputs, and
compare every output (:mod:`.comparison`, over the rounds :mod:`.feeds` makes).

Each source runs as the reference here: a Keras model (``model(x, training=False)``, on the CPU's
kernels), a SavedModel's serving signature, a TFLite file in the TFLite interpreter, a frozen graph
in a TensorFlow session. :func:`verify_keras` and its kin return a
:class:`~.comparison.VerificationResult`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import onnx

from .comparison import RUNNER, OutputCheck, VerificationResult, compare
from .errors import ConversionError
from .feeds import ROUNDS, check_feeds, onnx_input_specs, round_sizes, streamed_states
from .keras_kernels import cpu_kernels, gpu_visible
from .keras_layers import states_kept, zero_states

__all__ = ["ROUNDS", "RUNNER", "OutputCheck", "VerificationResult", "check_feeds", "compare", "onnx_input_specs",
           "round_sizes", "verify_graph_def", "verify_keras", "verify_saved_model", "verify_tflite"]


def _in_onnx_order(outputs, onnx_names: Sequence[str]) -> list:
    """A model's outputs as a list in the ONNX model's output order: by name when every ONNX
    output names one of a dict's entries, else flattened as the conversion traced them."""
    import tensorflow as tf

    if isinstance(outputs, dict):
        keys = [name.split(":")[0] for name in onnx_names]
        if len(outputs) == len(keys) and all(key in outputs for key in keys):
            return [np.asarray(outputs[key]) for key in keys]
    return [np.asarray(o) for o in tf.nest.flatten(outputs)]


def verify_keras(model, model_proto: onnx.ModelProto, tolerance: float = 1e-4, seed: int = 0,
                 inputs: Optional[list] = None, values: bool = True) -> VerificationResult:
    """Compare a Keras model (``model(x, training=False)``) with its conversion. A stateful model
    starts every call from zero states, and its stored states are left as they were. The model computes
    as on a CPU (:func:`.keras_kernels.cpu_kernels`), as it was traced: on a machine with a GPU, Keras
    would run cuDNN's kernel, which takes right-padded masks only."""
    _, state_outputs = streamed_states(model_proto)
    onnx_names = [o.name for o in model_proto.graph.output if o.name not in state_outputs]

    def reference(arrays):
        zero_states(model)
        with cpu_kernels(eager=True):
            outputs = model(arrays if len(arrays) > 1 else arrays[0], training=False)
        return _in_onnx_order(outputs, onnx_names)

    name = "Keras (its CPU kernels: this machine's GPU would run cuDNN's)" if gpu_visible() else "Keras"
    with states_kept(model):
        return compare(reference, model_proto, tolerance, seed, inputs, reference_name=name, values=values)


def verify_saved_model(path: str, model_proto: onnx.ModelProto, signature_def: Optional[str] = None,
                       tag: Optional[str] = None, tolerance: float = 1e-4, seed: int = 0,
                       inputs: Optional[list] = None, values: bool = True) -> VerificationResult:
    """Compare a SavedModel's serving signature with its conversion, matching outputs by name."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=[tag] if tag else None)
    signatures = dict(loaded.signatures)
    if not signatures:
        raise ConversionError(f"the SavedModel {path} has no signatures to verify against")
    key = signature_def or ("serving_default" if "serving_default" in signatures else sorted(signatures)[0])
    if key not in signatures:
        raise ConversionError(f"unknown signature_def {key!r}; the SavedModel has: {', '.join(sorted(signatures))}")
    function = signatures[key]
    arg_names = list(function.structured_input_signature[1].keys())
    state_inputs, state_outputs = streamed_states(model_proto)
    onnx_names = [name for name, _, _ in onnx_input_specs(model_proto) if name not in state_inputs]
    output_names = [o.name for o in model_proto.graph.output if o.name not in state_outputs]

    def reference(arrays):
        by_name = dict(zip(onnx_names, arrays))
        feeds = {arg: tf.constant(by_name.get(arg, by_name.get(arg + ":0", arrays[i])))
                 for i, arg in enumerate(arg_names)}
        return _in_onnx_order(function(**feeds), output_names)

    return compare(reference, model_proto, tolerance, seed, inputs, reference_name="TensorFlow", values=values)


def interpreter(path: str, model_content: Optional[bytes] = None):
    """The TFLite interpreter for a file: LiteRT's where the ``ai_edge_litert`` package is installed, else
    TensorFlow's (deprecated in TensorFlow 2.20 and later, still there)."""
    import warnings

    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Interpreter(model_path=path) if model_content is None else Interpreter(model_content=model_content)


def verify_tflite(path: str, model_proto: onnx.ModelProto, tolerance: float = 1e-4, seed: int = 0,
                  inputs: Optional[list] = None, values: bool = True) -> VerificationResult:
    """Compare a TFLite file, run in the TFLite interpreter, with its conversion. The interpreter's
    state variables (a fused LSTM's states) are reset before every call, so each starts from zeros
    as the ONNX model does; dynamic dimensions are resized to each round's."""
    runner = interpreter(path)
    details = runner.get_input_details()
    onnx_names = [name for name, _, _ in onnx_input_specs(model_proto)]
    output_names = [o.name for o in model_proto.graph.output]

    def reference(arrays):
        by_name = dict(zip(onnx_names, arrays))
        feeds = [np.asarray(by_name.get(d["name"], arrays[i])) for i, d in enumerate(details)]
        for detail, array in zip(details, feeds):
            if list(detail["shape"]) != list(array.shape):
                runner.resize_tensor_input(detail["index"], list(array.shape), strict=True)
        runner.allocate_tensors()
        runner.reset_all_variables()
        for detail, array in zip(details, feeds):
            runner.set_tensor(detail["index"], array.astype(detail["dtype"]))
        runner.invoke()
        produced = {d["name"]: runner.get_tensor(d["index"]) for d in runner.get_output_details()}
        ordered = [produced.get(name) for name in output_names]
        return ordered if all(o is not None for o in ordered) else list(produced.values())

    return compare(reference, model_proto, tolerance, seed, inputs, reference_name="TFLite", values=values)


def verify_graph_def(graph_def, graph_inputs: Sequence[str], graph_outputs: Sequence[str],
                     model_proto: onnx.ModelProto, tolerance: float = 1e-4, seed: int = 0,
                     inputs: Optional[list] = None, values: bool = True,
                     reference_name: str = "TensorFlow") -> VerificationResult:
    """Compare a frozen graph, run in TensorFlow, with its conversion, whose inputs and outputs are the
    graph's tensors ``graph_inputs`` and ``graph_outputs`` in order (renamed or not)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")

    def reference(arrays):
        with tf.compat.v1.Session(graph=graph) as session:
            return session.run(list(graph_outputs), dict(zip(graph_inputs, arrays)))

    return compare(reference, model_proto, tolerance, seed, inputs, reference_name=reference_name, values=values)
