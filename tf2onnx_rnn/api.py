"""Python API: convert Keras models and SavedModels with recurrent layers fused into native nodes."""
from __future__ import annotations

import functools
import logging
import os
import tempfile
from typing import Optional

import onnx

from .errors import ConversionError, first_line as _first_line
from .report import ConversionReport

logger = logging.getLogger("tf2onnx_rnn")


def _tf():
    import tensorflow as tf  # imported late: it takes seconds

    return tf


def keras_input_signature(model) -> list:
    """TensorSpecs for a Keras model's inputs, with a dynamic batch and the model's input names.

    Dimensions the model leaves dynamic stay dynamic.
    """
    tf = _tf()
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConversionError("the Keras model has no defined inputs: build it (or call it once) "
                              "or pass input_signature")
    specs = []
    for index, tensor in enumerate(inputs):
        shape = [None if d is None else int(d) for d in tensor.shape]
        if shape:
            shape[0] = None
        name = (getattr(tensor, "name", None) or f"input_{index}").split(":")[0]
        dtype = tf.as_dtype(getattr(tensor.dtype, "name", tensor.dtype))
        specs.append(tf.TensorSpec(shape, dtype, name=name))
    return specs


def convert_keras(model, input_signature=None, opset: Optional[int] = None, output_path: Optional[str] = None,
                  verify: bool = False, tolerance: float = 1e-4, assume_post_padded: bool = False,
                  **options) -> onnx.ModelProto:
    """Convert a Keras 3 or tf_keras model to ONNX, with recurrent layers as native nodes.

    ``input_signature`` defaults to the model's inputs with a dynamic batch. Other keyword
    arguments go to ``tf2onnx.convert.from_keras`` (``extra_opset``, ``inputs_as_nchw``,
    ``shape_override``, ``target``, ...). With ``verify=True`` the ONNX model is run in
    onnxruntime against the Keras model on seeded random inputs and a
    :class:`~tf2onnx_rnn.verify.VerificationError` is raised beyond ``tolerance``.
    Masked layers are exact for any mask; ``assume_post_padded=True`` emits a leaner graph that
    is exact only when every row's kept steps come first (post-padding).
    The report is logged and stored in the model's metadata.
    """
    import tf2onnx

    from .rewriters.pipeline import RecurrentRewriter

    if input_signature is None:
        input_signature = keras_input_signature(model)
    check_opset(opset)
    rewriter = RecurrentRewriter(layer_names=_layer_names(model), assume_post_padded=assume_post_padded)
    custom = list(options.pop("custom_rewriter", None) or [])
    serve, output_names = _serving_function(model, input_signature)
    model_proto, _ = tf2onnx.convert.from_function(serve, input_signature=input_signature, opset=opset,
                                                   custom_rewriter=[rewriter] + custom, **options)
    _order_outputs(model_proto, output_names)
    model_proto = _finish(model_proto, rewriter.report)
    if verify:
        from .verify import verify_keras

        verify_keras(model, model_proto, tolerance=tolerance).raise_for_failure()
    if output_path:
        save_model(model_proto, output_path)
    return model_proto


def _serving_function(model, input_signature):
    """A tf.function calling the model in inference mode, with outputs keyed by Keras's names.

    Returns the function and its output names in Keras's order. (tf2onnx's own ``from_keras``
    loses Keras 3 output names and fails on Sequential models.)
    """
    tf = _tf()
    keras_names = _unique([str(n) for n in (getattr(model, "output_names", None) or [])])
    order: list = []

    @tf.function(input_signature=input_signature)
    def serve(*args):
        flat = tf.nest.flatten(model(list(args) if len(args) > 1 else args[0], training=False))
        keys = keras_names if len(keras_names) == len(flat) else [f"output_{i}" for i in range(len(flat))]
        order[:] = keys
        return dict(zip(keys, flat))

    serve.get_concrete_function()
    return serve, list(order)


def _unique(names: list) -> list:
    seen, result = {}, []
    for name in names:
        seen[name] = seen.get(name, -1) + 1
        result.append(name if not seen[name] else f"{name}_{seen[name]}")
    return result


def _order_outputs(model_proto: onnx.ModelProto, names: list) -> None:
    """Put the graph outputs in Keras's order (a dict of outputs reaches ONNX sorted by key)."""
    by_name = {o.name: o for o in model_proto.graph.output}
    if sorted(by_name) != sorted(names):
        return
    ordered = [by_name[n] for n in names]
    del model_proto.graph.output[:]
    model_proto.graph.output.extend(ordered)


def _layer_names(model) -> set:
    """Names of the model's layers, nested models and wrappers (Bidirectional) included."""
    names, pending = set(), list(getattr(model, "layers", []))
    while pending:
        layer = pending.pop()
        names.add(layer.name)
        pending.extend(getattr(layer, "layers", []) or [])
        pending.extend(l for l in (getattr(layer, "forward_layer", None), getattr(layer, "backward_layer", None),
                                   getattr(layer, "layer", None)) if l is not None)
    return names


def load_saved_model_graph(path: str, signature_def: Optional[str] = None, tag: Optional[str] = None):
    """Load a SavedModel with tf2onnx's loader; bad input raises :class:`ConversionError`."""
    from tf2onnx import tf_loader

    if not os.path.exists(path):
        raise ConversionError(f"no such SavedModel directory: {path}")
    if not os.path.isdir(path) or not any(os.path.exists(os.path.join(path, f))
                                          for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise ConversionError(f"not a SavedModel directory (no saved_model.pb): {path}")
    tags = _tags(path)
    if tag is not None and tag not in tags:
        raise ConversionError(f"unknown tag {tag!r}; the SavedModel has: {', '.join(sorted(tags)) or 'none'}")
    signatures = _signature_names(path, tag)
    if signature_def is not None and signature_def not in signatures:
        raise ConversionError(f"unknown signature_def {signature_def!r}; the SavedModel has: "
                              f"{', '.join(sorted(signatures)) or 'none'}")
    try:
        return tf_loader.from_saved_model(path, None, None, tag,
                                          [signature_def] if signature_def else None, None, False,
                                          return_initialized_tables=True, return_tensors_to_rename=True)
    except Exception as error:  # tf2onnx and TensorFlow raise many kinds here
        raise ConversionError(f"cannot load SavedModel {path}: {_first_line(error)}") from error


def convert_saved_model(path: str, output_path: Optional[str] = None, opset: Optional[int] = None,
                        signature_def: Optional[str] = None, tag: Optional[str] = None,
                        verify: bool = False, tolerance: float = 1e-4, assume_post_padded: bool = False,
                        **options) -> onnx.ModelProto:
    """Convert a SavedModel directory; like :func:`convert_keras`, for the CLI's ``--saved-model``."""
    from tf2onnx import convert as tf2onnx_convert

    from .rewriters.pipeline import RecurrentRewriter

    check_opset(opset)
    graph_def, inputs, outputs, tables, renames = load_saved_model_graph(path, signature_def, tag)
    rewriter = RecurrentRewriter(assume_post_padded=assume_post_padded)
    tf = _tf()
    with tf.device("/cpu:0"):
        model_proto, _ = tf2onnx_convert._convert_common(  # the tf2onnx CLI's own path
            graph_def, name=path, continue_on_error=True, opset=opset,
            custom_rewriter=[rewriter] + list(options.pop("custom_rewriter", None) or []),
            input_names=inputs, output_names=outputs, tensors_to_rename=renames,
            initialized_tables=tables, **options)
    model_proto = _finish(model_proto, rewriter.report)
    if verify:
        from .verify import verify_saved_model

        verify_saved_model(path, model_proto, signature_def=signature_def, tag=tag,
                           tolerance=tolerance).raise_for_failure()
    if output_path:
        save_model(model_proto, output_path)
    return model_proto


def report_of(model_proto: onnx.ModelProto) -> Optional[ConversionReport]:
    """The conversion report stored in a model this package converted."""
    return ConversionReport.of_model(model_proto)


def save_model(model_proto: onnx.ModelProto, output_path: str) -> None:
    """Write atomically: a temporary file beside the target, then a rename."""
    directory = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(directory):
        raise ConversionError(f"output directory does not exist: {directory}")
    try:
        handle, temporary = tempfile.mkstemp(prefix=".tf2onnx_rnn-", suffix=".onnx", dir=directory)
    except OSError as error:
        raise ConversionError(f"output directory is not writable: {directory} ({error.strerror})") from error
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(model_proto.SerializeToString())
        os.replace(temporary, output_path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def supported_opsets() -> range:
    """Opsets this package converts to: 14 (the first with LSTM's layout attribute) up to the
    newest that both tf2onnx's onnx and the installed onnxruntime support."""
    from tf2onnx import constants

    newest = min(max(constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version(), _ort_max_opset())
    return range(14, newest + 1)


def check_opset(opset: Optional[int]) -> None:
    """Raise :class:`ConversionError` for an opset outside :func:`supported_opsets`."""
    if opset is None:
        return
    supported = supported_opsets()
    if opset not in supported:
        raise ConversionError(f"opset {opset} is not supported; use {supported.start} to {supported.stop - 1}")


@functools.lru_cache(maxsize=None)
def _ort_max_ir() -> int:
    """The newest IR version the installed onnxruntime loads."""
    import onnxruntime as ort

    for ir_version in range(onnx.IR_VERSION, 6, -1):
        model = _identity_model(ir_version, 13)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return ir_version
        except Exception:  # noqa: BLE001 - this IR is too new for this onnxruntime
            continue
    return 7


@functools.lru_cache(maxsize=None)
def _ort_max_opset() -> int:
    import onnxruntime as ort

    for opset in range(onnx.defs.onnx_opset_version(), 13, -1):
        model = _identity_model(min(_ort_max_ir(), onnx.helper.find_min_ir_version_for(
            [onnx.helper.make_opsetid("", opset)])), opset)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return opset
        except Exception:  # noqa: BLE001
            continue
    return 14


def _identity_model(ir_version: int, opset: int) -> onnx.ModelProto:
    helper = onnx.helper
    value = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _finish(model_proto: onnx.ModelProto, report: ConversionReport) -> onnx.ModelProto:
    needed = onnx.helper.find_min_ir_version_for(list(model_proto.opset_import), ignore_unknown=True)
    model_proto.ir_version = max(needed, min(model_proto.ir_version, _ort_max_ir()))
    report.attach(model_proto)
    logger.info("tf2onnx_rnn report:\n%s", report.table())
    return model_proto


def _tags(path: str) -> set:
    from tensorflow.python.tools import saved_model_utils

    try:
        return {tag for meta in saved_model_utils.read_saved_model(path).meta_graphs
                for tag in meta.meta_info_def.tags}
    except Exception as error:  # noqa: BLE001
        raise ConversionError(f"cannot read SavedModel {path}: {_first_line(error)}") from error


def _signature_names(path: str, tag: Optional[str]) -> set:
    from tensorflow.python.tools import saved_model_utils

    names = set()
    for meta in saved_model_utils.read_saved_model(path).meta_graphs:
        if tag is None or tag in meta.meta_info_def.tags:
            names.update(k for k in meta.signature_def.keys() if not k.startswith("__"))
    return names
