"""A SavedModel directory as a source: one signature (or concrete function), frozen by tf2onnx.

``tf.saved_model.save``, Keras 3's ``model.export`` and tf_keras's ``save`` all give one. Its
rows are named from the graph's scopes: a SavedModel has no Keras layers left.
"""
from __future__ import annotations

import contextlib
import os
from typing import Optional

from ..errors import ConversionError, first_line, param
from . import Frozen, Source, check_input_shape, placeholder_shapes, resolve_names
from .keras_file import KERAS_EXTENSIONS
from .outside_ops import RESTORING, executed_ops, outside, refuse_outside


class SavedModel(Source):
    """A SavedModel directory, with the signature (or concrete function) and tag to convert.

    A SavedModel is a program. Converting loads it, which runs its initializers; verifying also
    runs the signature. With ``safe_mode`` (the default) neither happens when the ops it would run
    reach outside TensorFlow (:mod:`.outside_ops`); reading its own variables and vocabularies is
    part of loading any SavedModel."""

    kind = "saved_model"
    options = ("signature_def", "tag", "concrete_function", "safe_mode")

    def __init__(self, path: str, signature_def: Optional[str] = None, tag: Optional[str] = None,
                 concrete_function: Optional[int] = None, safe_mode: bool = True):
        self.path, self.signature_def, self.tag, self.concrete_function = path, signature_def, tag, concrete_function
        self.safe_mode = safe_mode

    def check(self) -> None:
        if self.signature_def is not None and self.concrete_function is not None:
            raise ConversionError(f"{param('signature_def')} and {param('concrete_function')} exclude each other")
        if self.concrete_function is not None and (isinstance(self.concrete_function, bool)
                                                   or self.concrete_function < 0):
            raise ConversionError(f"{param('concrete_function')} is an index from 0, got {self.concrete_function}")
        check_saved_model_dir(self.path)

    def freeze(self, options) -> Frozen:
        if self.safe_mode:
            meta = _meta_graph(self.path, self.tag)
            refuse_outside(outside(executed_ops(meta.graph_def, _init_nodes(meta), _initializers(meta)),
                                   allowed=LOADING), "loading the SavedModel runs")
        return freeze_saved_model(self.path, self.signature_def, self.tag, self.concrete_function, options)

    def verify(self, model_proto, tolerance: float, values: bool = True):
        from ..verify import verify_saved_model

        if self.safe_mode:
            meta = _meta_graph(self.path, self.tag)
            key = self.signature_def or ("serving_default" if "serving_default" in meta.signature_def
                                         else sorted(meta.signature_def)[0] if meta.signature_def else None)
            if key in meta.signature_def:
                outputs = [t.name for t in meta.signature_def[key].outputs.values()]
                refuse_outside(outside(executed_ops(meta.graph_def, outputs), allowed=LOADING),
                               f"verification runs the signature {key!r}, which runs")
        return verify_saved_model(self.path, model_proto, signature_def=self.signature_def, tag=self.tag,
                                  tolerance=tolerance, values=values)


def check_saved_model_dir(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` is a SavedModel directory."""
    if not os.path.exists(path):
        raise ConversionError(f"no such SavedModel directory: {path}")
    if not os.path.isdir(path):
        hint = f" (use {param('keras_file')} for Keras files)" if path.lower().endswith(KERAS_EXTENSIONS) else ""
        raise ConversionError(f"{param('saved_model')} needs a directory, got a file: {path}{hint}")
    if not any(os.path.exists(os.path.join(path, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise ConversionError(f"not a SavedModel directory (no saved_model.pb): {path}")


def freeze_saved_model(path: str, signature_def: Optional[str], tag: Optional[str],
                       concrete_function: Optional[int], options) -> Frozen:
    from tf2onnx import tf_loader

    tags = _tags(path)
    if tag is not None and tag not in tags:
        raise ConversionError(f"unknown tag {tag!r}; the SavedModel has: "
                              f"{', '.join(sorted(tags)) or 'none'}")
    signatures = _signature_names(path, tag)
    if signature_def is not None and signature_def not in signatures:
        raise ConversionError(f"unknown signature_def {signature_def!r}; the SavedModel has: "
                              f"{', '.join(sorted(signatures)) or 'none'}")
    try:
        with _restored_on_cpu():
            graph_def, inputs, outputs, tables, renames = tf_loader.from_saved_model(
                path, None, None, tag, [signature_def] if signature_def else None, concrete_function,
                options.large_model, return_initialized_tables=True, return_tensors_to_rename=True)
    except Exception as error:  # tf2onnx and TensorFlow raise many kinds here
        raise ConversionError(f"cannot load SavedModel {path}: {first_line(error)}") from error
    override = None
    if options.inputs:
        override = _shape_override(options.inputs, inputs, renames, placeholder_shapes(graph_def))
    return Frozen(graph_def, path, inputs, outputs, renames, tables, shape_override=override)


@contextlib.contextmanager
def _restored_on_cpu():
    """While a SavedModel loads: a TF 1.x meta graph's ``CudnnRNNCanonicalToParams`` (how a TF 1.x cuDNN
    layer restores its weights from the canonical ones it saved; GPU-only in TensorFlow) computed by CPU
    ops (:func:`..cudnn_reference.canonical_to_params_on_cpu`)."""
    from tensorflow.python.saved_model import loader_impl

    from ..cudnn_reference import canonical_to_params_on_cpu

    original = loader_impl.SavedModelLoader.get_meta_graph_def_from_tags

    def on_cpu(self, tags):
        meta = original(self, tags)
        if any(node.op in CANONICAL_TO_PARAMS for node in meta.graph_def.node):
            from tensorflow.core.protobuf import meta_graph_pb2

            meta = meta_graph_pb2.MetaGraphDef.FromString(meta.SerializeToString())
            canonical_to_params_on_cpu(meta.graph_def)
        return meta

    loader_impl.SavedModelLoader.get_meta_graph_def_from_tags = on_cpu
    try:
        yield
    finally:
        loader_impl.SavedModelLoader.get_meta_graph_def_from_tags = original


# the ops that restore a TF 1.x cuDNN layer's opaque weights from canonical ones
CANONICAL_TO_PARAMS = ("CudnnRNNCanonicalToParams", "CudnnRNNCanonicalToParamsV2")


def _shape_override(shapes: dict, inputs: list, renames: dict, model_shapes: dict) -> dict:
    """Graph tensor -> shape for inputs named by their signature name or their graph tensor name,
    each checked against the shape the model gives the input (``model_shapes``, by graph tensor)."""
    tensors = resolve_names(shapes, inputs, "inputs", "inputs", renames)
    override = {}
    for (name, shape), tensor in zip(shapes.items(), tensors):
        if shape is None:  # named only: keeps the model's shape
            continue
        check_input_shape(name, shape, model_shapes.get(tensor), param("inputs"))
        override[tensor] = [None if d is None else int(d) for d in shape]  # as tf2onnx's --inputs: None = dynamic
    return override


# what loading any SavedModel runs by design: its variables restored, its vocabularies read into tables
LOADING = RESTORING | {"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"}


def _meta_graph(path: str, tag: Optional[str]):
    """The meta graph TensorFlow would load for ``tag`` (read, not loaded)."""
    from tensorflow.python.tools import saved_model_utils

    for meta in saved_model_utils.read_saved_model(path).meta_graphs:
        if tag in meta.meta_info_def.tags or (tag is None and "serve" in meta.meta_info_def.tags):
            return meta
    return saved_model_utils.read_saved_model(path).meta_graphs[0]


def _init_nodes(meta) -> list:
    """The graph nodes TensorFlow runs when it loads the meta graph: its init op and main op."""
    nodes = [t.name for t in meta.signature_def["__saved_model_init_op"].outputs.values()] \
        if "__saved_model_init_op" in meta.signature_def else []
    for key in ("saved_model_main_op", "legacy_init_op", "table_initializer"):
        if key in meta.collection_def:
            nodes += list(meta.collection_def[key].node_list.value)
    return nodes


def _initializers(meta) -> set:
    """The functions TensorFlow 2's loader calls for restored resources and assets (their creation
    and initialization, and at the end their destruction)."""
    objects = meta.object_graph_def.nodes
    names = set()
    for node in objects:
        if node.WhichOneof("kind") not in ("resource", "asset", "user_object"):
            continue
        for child in node.children:
            if child.local_name in ("_create_resource", "_initialize", "_destroy_resource"):
                names |= _concrete_names(objects[child.node_id])
    return names


def _concrete_names(node) -> set:
    kind = node.WhichOneof("kind")
    if kind == "function":
        return set(node.function.concrete_functions)
    if kind == "bare_concrete_function":
        return {node.bare_concrete_function.concrete_function_name}
    return set()


def _tags(path: str) -> set:
    from tensorflow.python.tools import saved_model_utils

    try:
        return {tag for meta in saved_model_utils.read_saved_model(path).meta_graphs
                for tag in meta.meta_info_def.tags}
    except Exception as error:  # noqa: BLE001
        raise ConversionError(f"cannot read SavedModel {path}: {first_line(error)}") from error


def _signature_names(path: str, tag: Optional[str]) -> set:
    from tensorflow.python.tools import saved_model_utils

    names = set()
    for meta in saved_model_utils.read_saved_model(path).meta_graphs:
        if tag is None or tag in meta.meta_info_def.tags:
            names.update(k for k in meta.signature_def.keys() if not k.startswith("__"))
    return names
