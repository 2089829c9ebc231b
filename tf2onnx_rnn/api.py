"""Python API: convert Keras models and SavedModels with recurrent layers fused into native nodes.

Both entry points take one road. A *source* (a Keras model traced in inference mode, or a
SavedModel signature) is frozen with tf2onnx's own loaders into a graph def; then one tail
converts it with the recurrent rewriter, reconciles the report with the written graph, stores
the report, checks that onnxruntime loads the model, verifies it when asked, and saves it
atomically. The CLI (``tf2onnx_rnn.convert``) calls :func:`run` and only parses and prints.
"""
from __future__ import annotations

import functools
import logging
import math
import numbers
import os
import shutil
import tempfile
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import onnx

from .errors import ConversionError, VerificationError, first_line
from .layers import recurrent_layers, stateful_layers
from .reconcile import graph_nodes, reconcile, recurrent_loops, unrolled_layers
from .report import ConversionReport

logger = logging.getLogger("tf2onnx_rnn")

FIRST_OPSET = 14  # the first opset whose LSTM/GRU/RNN take the layout attribute

# tf2onnx options passed through as they are (tf2onnx's own names)
TF2ONNX_OPTIONS = frozenset({"target", "extra_opset", "inputs_as_nchw", "outputs_as_nchw", "custom_ops",
                             "custom_op_handlers", "custom_rewriter", "optimizers", "shape_override"})
PORTABLE = "portable"  # this package's own target: masked layers without a computed sequence_lens


def _tf():
    import tensorflow as tf  # imported late: it takes seconds

    return tf


# -- options ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    """What a conversion is asked to do, whatever its source."""

    opset: Optional[int] = None
    assume_post_padded: bool = False
    continue_on_error: bool = False  # write a model even when tf2onnx left ops it could not convert
    large_model: bool = False  # weights go to a file beside the model (external data)
    rename_inputs: Sequence[str] = ()
    rename_outputs: Sequence[str] = ()
    inputs: Optional[dict] = None  # input name -> shape (None = dynamic dim), to select/fix inputs
    tf2onnx: dict = field(default_factory=dict)  # passed through to tf2onnx
    streaming: Optional[bool] = None  # recurrent states in and out of the model; None: for stateful models

    @property
    def portable(self) -> bool:
        """Whether ``target`` names :data:`PORTABLE`."""
        return PORTABLE in self.tf2onnx.get("target", ())

    @classmethod
    def of(cls, opset=None, assume_post_padded=False, continue_on_error=False, large_model=False,
           rename_inputs=(), rename_outputs=(), inputs=None, streaming=None, **tf2onnx_options) -> "Options":
        """Options checked for what can be checked without the model: names, targets, opsets, shapes.

        A single string is one name (or one target) wherever a list of them is taken.
        """
        unknown = sorted(set(tf2onnx_options) - TF2ONNX_OPTIONS)
        if unknown:
            known = TF2ONNX_OPTIONS | {"opset", "assume_post_padded", "continue_on_error", "large_model",
                                       "rename_inputs", "rename_outputs", "inputs", "streaming"}
            raise ConversionError(f"unknown option {unknown[0]!r}; known: {', '.join(sorted(known))}")
        check_opset(opset)
        if streaming not in (None, True, False):
            raise ConversionError(f"streaming must be True, False or None (automatic), got {streaming!r}")
        passed = {key: value for key, value in tf2onnx_options.items() if value is not None}
        for key in ("inputs_as_nchw", "outputs_as_nchw"):
            if key in passed:
                passed[key] = list(_name_list(passed[key], key))
        if "target" in passed:
            passed["target"] = check_targets(_name_list(passed["target"], "target"))
        if "extra_opset" in passed:
            passed["extra_opset"] = extra_opsets(passed["extra_opset"])
        return cls(opset, assume_post_padded, continue_on_error, large_model,
                   _name_list(rename_inputs, "rename_inputs", unique=True),
                   _name_list(rename_outputs, "rename_outputs", unique=True), _input_shapes(inputs), passed,
                   streaming)


def _flag(option: str) -> str:
    """An option's name as the command line spells it, for messages both roads share."""
    return "--" + option.replace("_", "-") if option.startswith(("rename", "inputs_", "outputs_")) else "--" + option


def _name_list(names, option: str, unique: bool = False) -> tuple:
    """Names given as one string (one name) or a sequence of them; empty or repeated names are refused."""
    if names is None:
        return ()
    names = (names,) if isinstance(names, str) else tuple(names)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConversionError(f"{_flag(option)}: every name must be a non-empty string, got {name!r}")
    if unique:
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConversionError(f"{_flag(option)} gives the name {repeated[0]!r} more than once")
    return names


def known_targets() -> tuple:
    """The ``target`` values: tf2onnx's workarounds for particular runtimes, and :data:`PORTABLE`
    (masked recurrent layers without a computed ``sequence_lens``, for runtimes that take it only
    as a constant, such as tract), which this package handles and tf2onnx never sees."""
    from tf2onnx import constants

    return tuple(constants.POSSIBLE_TARGETS) + (PORTABLE,)


def check_targets(targets: Sequence[str]) -> list:
    """``targets`` as a list; raise :class:`ConversionError` for a value not in :func:`known_targets`."""
    known = known_targets()
    for target in targets:
        if target not in known:
            raise ConversionError(f"unknown --target {target!r}; known: {', '.join(known)}")
    return list(targets)


# domains tf2onnx imports itself: the default one at --opset, and ai.onnx.ml
_OWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def extra_opsets(opsets) -> list:
    """``extra_opset`` as OperatorSetIdProtos: each given as one, or as a ``domain:version`` string.

    The domains tf2onnx imports itself (the default one, ai.onnx.ml) and a domain given twice are
    refused: the model would import them twice.
    """
    if isinstance(opsets, (str, onnx.OperatorSetIdProto)):
        opsets = [opsets]
    result, seen = [], set()
    for item in opsets:
        if isinstance(item, str):
            domain, _, version = item.strip().rpartition(":")
            if not domain or not version.strip().isdigit():
                raise ConversionError(f"--extra_opset {item!r} is not domain:version (e.g. com.microsoft:1)")
            item = onnx.helper.make_opsetid(domain.strip(), int(version))
        elif not isinstance(item, onnx.OperatorSetIdProto):
            raise ConversionError(f"--extra_opset takes domain:version strings or onnx.helper.make_opsetid(...), "
                                  f"got {item!r}")
        if item.domain in _OWN_DOMAINS:
            raise ConversionError(f"--extra_opset cannot import {item.domain or 'the default domain'!r}: "
                                  "tf2onnx imports it itself (set the default domain's version with --opset)")
        if item.version < 1:
            raise ConversionError(f"--extra_opset {item.domain}:{item.version}: the version must be 1 or more")
        if item.domain in seen:
            raise ConversionError(f"--extra_opset gives the domain {item.domain!r} more than once")
        seen.add(item.domain)
        result.append(item)
    return result


def _input_shapes(inputs) -> Optional[dict]:
    """``inputs`` (name -> shape, or None to keep the model's) with every dimension checked:
    a positive size, or -1/None for a dynamic one."""
    if inputs is None:
        return None
    if not isinstance(inputs, dict):
        raise ConversionError(f"--inputs takes a dict of input name -> shape, got {inputs!r}")
    checked = {}
    for name, shape in inputs.items():
        if shape is None:
            checked[name] = None
            continue
        dims = []
        for d in shape:
            if d is None or (isinstance(d, (int, np.integer)) and int(d) == -1):
                dims.append(None)
            elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and int(d) > 0:
                dims.append(int(d))
            else:
                raise ConversionError(f"--inputs {name}{list(shape)}: a dimension must be a positive size "
                                      f"or -1 (dynamic), got {d!r}")
        checked[name] = dims
    return checked


@dataclass
class Frozen:
    """A frozen TensorFlow graph and what tf2onnx needs to convert it."""

    graph_def: object
    name: str
    input_names: list
    output_names: list
    tensors_to_rename: dict
    initialized_tables: Optional[dict] = None
    layer_names: Callable[[str], Optional[str]] = lambda loop: None  # loop op name -> Keras layer
    shape_override: Optional[dict] = None
    stateful_layers: tuple = ()  # report names of Keras stateful=True recurrent layers


@dataclass
class Conversion:
    """The result of :func:`run`: the model, its report and, when asked, its verification."""

    model_proto: onnx.ModelProto
    report: ConversionReport
    verification: Optional[object] = None  # a verify.VerificationResult
    written: list = field(default_factory=list)  # the files written: the model, and its external data if any


# -- Keras models ------------------------------------------------------------------------------
def keras_input_signature(model) -> list:
    """TensorSpecs for a Keras model's inputs, with a dynamic batch and the model's input names.

    Dimensions the model leaves dynamic stay dynamic. A model with stateful layers keeps its
    batch size: Keras fixes it for them.
    """
    tf = _tf()
    inputs = _model_inputs(model)
    keep_batch = bool(stateful_layers(model))
    specs = []
    for index, tensor in enumerate(inputs):
        shape = [None if d is None else int(d) for d in tensor.shape]
        if shape and not keep_batch:
            shape[0] = None
        specs.append(tf.TensorSpec(shape, _dtype_of(tensor), name=_input_name(tensor, index)))
    return specs


def _model_inputs(model) -> list:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # Keras 3 before 3.6 raises for an unbuilt Sequential
        inputs = None
    if not inputs:
        raise ConversionError("the Keras model has no defined inputs: build it (or call it once) "
                              "or pass input_signature")
    return list(inputs)


def _input_name(tensor, index: int) -> str:
    return (getattr(tensor, "name", None) or f"input_{index}").split(":")[0]


def _dtype_of(tensor):
    return _tf().as_dtype(getattr(tensor.dtype, "name", tensor.dtype))


def checked_signature(model, input_signature, given_by: str = "input_signature") -> list:
    """``input_signature`` checked against the model's inputs (count, rank, fixed dimensions),
    with the model's input names where a spec has none. None gives :func:`keras_input_signature`.
    ``given_by`` names what gave the shapes, in messages."""
    if input_signature is None:
        return keras_input_signature(model)
    tf = _tf()
    specs = list(input_signature) if isinstance(input_signature, (list, tuple)) else [input_signature]
    inputs = _model_inputs(model)
    if len(specs) != len(inputs):
        raise ConversionError(f"input_signature has {len(specs)} spec(s), the model takes {len(inputs)} input(s)")
    checked = []
    for index, (spec, tensor) in enumerate(zip(specs, inputs)):
        if not isinstance(spec, tf.TensorSpec):
            raise ConversionError(f"input_signature[{index}] is not a tf.TensorSpec: {spec!r}")
        name = _input_name(tensor, index)
        want = [None if d is None else int(d) for d in tensor.shape]
        if spec.shape.rank is None:
            raise ConversionError(f"input {name}: {given_by} gives no rank; the model takes shape {want}")
        check_input_shape(name, spec.shape.as_list(), want, given_by)
        checked.append(tf.TensorSpec(spec.shape, spec.dtype, name=spec.name or name))
    return checked


def check_input_shape(name: str, got: list, want: Optional[list], given_by: str) -> None:
    """Raise :class:`ConversionError` unless shape ``got`` fits the model's ``want`` (None = dynamic
    dimension; ``want`` None = unknown rank): same rank, and equal wherever both are fixed."""
    if want is None:
        return
    if len(got) != len(want):
        raise ConversionError(f"input {name}: {given_by} has rank {len(got)} {got}, "
                              f"the model takes rank {len(want)} {want}")
    for axis, (g, w) in enumerate(zip(got, want)):
        if g is not None and w is not None and g != w:
            raise ConversionError(f"input {name}: dimension {axis} is {g} in {given_by}, "
                                  f"the model's is {w} (shape {want})")


def signature_with_shapes(model, shapes: dict) -> list:
    """The model's signature with the shapes given by input name (``-1``/None = dynamic; a name
    with shape None keeps the model's shape)."""
    specs = keras_input_signature(model)
    known = {spec.name for spec in specs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise ConversionError(f"unknown name {unknown[0]!r} in --inputs; the model's inputs are: "
                              f"{', '.join(spec.name for spec in specs)}")
    tf = _tf()
    return checked_signature(model, [
        tf.TensorSpec([None if d is None or d < 0 else d for d in shapes[s.name]], s.dtype, name=s.name)
        if shapes.get(s.name) is not None else s for s in specs], given_by="--inputs")


def _keras_source(model, input_signature, options: Options) -> Frozen:
    """Trace ``model(x, training=False)`` and freeze it with tf2onnx's Keras loader path.

    Captured constants (a Normalization layer's mean, a position table) stay constants: only
    the signature's tensors become graph inputs.
    """
    from tf2onnx import tf_loader
    from tf2onnx.convert import tensor_names_from_structed

    tf = _tf()
    if options.inputs and input_signature is not None:
        raise ConversionError("input_signature and --inputs exclude each other: give the shapes in one of them")
    signature = (signature_with_shapes(model, options.inputs) if options.inputs
                 else checked_signature(model, input_signature))
    keras_names = _unique([str(n) for n in (getattr(model, "output_names", None) or [])])
    order: list = []
    scopes: dict = {}

    @tf.autograph.experimental.do_not_convert
    def keyed(flat: list) -> dict:
        keys = keras_names if len(keras_names) == len(flat) else [f"output_{i}" for i in range(len(flat))]
        order[:] = keys
        return dict(zip(keys, flat))

    @tf.function(input_signature=signature)
    def serve(*args):
        with _recording_layer_scopes(model, scopes):
            result = model(list(args) if len(args) > 1 else args[0], training=False)
        return keyed(tf.nest.flatten(result))

    try:
        concrete = serve.get_concrete_function()
    except (ValueError, TypeError) as error:
        raise ConversionError(f"cannot trace the Keras model with this signature: {first_line(error)}") from error
    captured = _captured_input_names(concrete)
    inputs = [t.name for t in concrete.inputs if t.name not in captured and t.dtype != tf.dtypes.resource]
    outputs = [t.name for t in concrete.outputs if t.dtype != tf.dtypes.resource]
    renames = tensor_names_from_structed(concrete, inputs, outputs)
    by_key = {key: tensor for tensor, key in renames.items() if tensor in outputs}
    outputs = [by_key[key] for key in order if key in by_key] or outputs
    with tf.device("/cpu:0"):
        try:
            graph_def, tables = tf_loader.from_trackable(model, concrete, inputs, outputs, options.large_model)
        except ValueError as error:  # tf2onnx's words for a graph over protobuf's 2 GB
            if "protobuf size of 2GB" not in str(error):
                raise
            raise ConversionError("the model is over 2 GB, protobuf's limit: convert it with --large_model") from error
    return Frozen(graph_def, getattr(model, "name", "keras"), inputs, outputs, renames, tables,
                  functools.partial(_layer_of_scope, scopes), stateful_layers=stateful_layers(model))


def _unique(names: list) -> list:
    seen, result = {}, []
    for name in names:
        seen[name] = seen.get(name, -1) + 1
        result.append(name if not seen[name] else f"{name}_{seen[name]}")
    return result


def _captured_input_names(concrete) -> set:
    """Names of a concrete function's inputs that are captures (variables, constants), not arguments."""
    graph = concrete.graph
    if hasattr(graph, "_captures"):  # older TensorFlow
        return {placeholder.name for _, placeholder in graph._captures.values()}  # pylint: disable=protected-access
    return {t.name for t in graph.function_captures.by_val_internal.values()}


class _recording_layer_scopes:
    """While tracing, note the name scope each recurrent layer's ``call`` runs in (scope -> name).

    The ops a layer creates carry that scope, whatever suffix tracing gave it, so a loop is
    named after its Keras layer exactly (a Bidirectional's halves after the Bidirectional).
    Only the recurrent layers' own ``call`` is wrapped: a wrapper's (Bidirectional's) is left
    alone, since tf_keras reads its arguments from it.
    """

    def __init__(self, model, scopes: dict):
        self.layers, self.scopes = recurrent_layers(model), scopes

    def __enter__(self):
        for layer, name in self.layers.items():
            object.__setattr__(layer, "call", self._recording(name, layer.call))
        return self

    def _recording(self, name: str, call):
        scopes = self.scopes

        @functools.wraps(call)
        def recording(*args, **kwargs):
            scope = _tf().compat.v1.get_default_graph().get_name_scope()
            if scope:
                scopes.setdefault(scope, name)
            return call(*args, **kwargs)

        return recording

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.__dict__.pop("call", None)
        return False


def _layer_of_scope(scopes: dict, loop_name: str) -> Optional[str]:
    """The report name of the recurrent layer whose call scope (the innermost) holds ``loop_name``."""
    holding = [scope for scope in scopes if loop_name.startswith(scope + "/")]
    return scopes[max(holding, key=len)] if holding else None


# -- SavedModels -------------------------------------------------------------------------------
def check_saved_model_dir(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` is a SavedModel directory."""
    if not os.path.exists(path):
        raise ConversionError(f"no such SavedModel directory: {path}")
    if not os.path.isdir(path):
        hint = " (use --keras for Keras files)" if path.lower().endswith(KERAS_EXTENSIONS) else ""
        raise ConversionError(f"--saved-model needs a directory, got a file: {path}{hint}")
    if not any(os.path.exists(os.path.join(path, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise ConversionError(f"not a SavedModel directory (no saved_model.pb): {path}")


def check_source_options(*, keras: bool, signature_def: Optional[str] = None, tag: Optional[str] = None,
                         concrete_function: Optional[int] = None, input_signature=None) -> None:
    """Raise :class:`ConversionError` for options the source does not take, or that exclude each other
    (before anything is loaded)."""
    if keras:
        for flag, value in (("--signature_def", signature_def), ("--tag", tag),
                            ("--concrete_function", concrete_function)):
            if value is not None:
                raise ConversionError(f"{flag} applies to --saved-model only")
        return
    if input_signature is not None:
        raise ConversionError("input_signature applies to Keras models only (use --inputs for a SavedModel)")
    if signature_def is not None and concrete_function is not None:
        raise ConversionError("--signature_def and --concrete_function exclude each other")
    if concrete_function is not None and (isinstance(concrete_function, bool) or concrete_function < 0):
        raise ConversionError(f"--concrete_function is an index from 0, got {concrete_function}")


def _saved_model_source(path: str, signature_def: Optional[str], tag: Optional[str],
                        concrete_function: Optional[int], options: Options) -> Frozen:
    from tf2onnx import tf_loader

    check_saved_model_dir(path)
    tags = _tags(path)
    if tag is not None and tag not in tags:
        raise ConversionError(f"unknown tag {tag!r}; the SavedModel has: {', '.join(sorted(tags)) or 'none'}")
    signatures = _signature_names(path, tag)
    if signature_def is not None and signature_def not in signatures:
        raise ConversionError(f"unknown signature_def {signature_def!r}; the SavedModel has: "
                              f"{', '.join(sorted(signatures)) or 'none'}")
    try:
        graph_def, inputs, outputs, tables, renames = tf_loader.from_saved_model(
            path, None, None, tag, [signature_def] if signature_def else None, concrete_function,
            options.large_model, return_initialized_tables=True, return_tensors_to_rename=True)
    except Exception as error:  # tf2onnx and TensorFlow raise many kinds here
        raise ConversionError(f"cannot load SavedModel {path}: {first_line(error)}") from error
    override = None
    if options.inputs:
        override = _shape_override(options.inputs, inputs, renames, _placeholder_shapes(graph_def))
    return Frozen(graph_def, path, inputs, outputs, renames, tables, shape_override=override)


def _shape_override(shapes: dict, inputs: list, renames: dict, model_shapes: dict) -> dict:
    """Graph tensor -> shape for inputs named by their signature name or their graph tensor name,
    each checked against the shape the model gives the input (``model_shapes``, by graph tensor)."""
    tensors = _resolve_names(shapes, inputs, "--inputs", "inputs", renames)
    override = {}
    for (name, shape), tensor in zip(shapes.items(), tensors):
        if shape is None:  # named only: keeps the model's shape
            continue
        check_input_shape(name, shape, model_shapes.get(tensor), "--inputs")
        override[tensor] = [None if d is None else int(d) for d in shape]  # as tf2onnx's --inputs: None = dynamic
    return override


def _resolve_names(names, tensors: list, option: str, kind: str, *renamings: dict) -> list:
    """The graph tensor each name stands for: a tensor's graph name (with or without ``:0``) or a
    name a renaming gives it (the last renaming gives its name in the ONNX model). An unknown name
    is a :class:`ConversionError` naming the model's ``kind`` (inputs or outputs)."""
    by_alias = {}
    for tensor in tensors:
        aliases = [tensor, tensor.split(":")[0]] + [renaming[tensor] for renaming in renamings if tensor in renaming]
        for alias in aliases:
            by_alias.setdefault(alias, tensor)
    unknown = [name for name in names if name not in by_alias]
    if unknown:
        known = [renamings[-1].get(t, t) if renamings else t for t in tensors]
        raise ConversionError(f"unknown name {unknown[0]!r} in {option}; the model's {kind} are: {', '.join(known)}")
    return [by_alias[name] for name in names]


def _placeholder_shapes(graph_def) -> dict:
    """Graph tensor ("name:0") -> shape (None = dynamic dimension) of each placeholder of known rank."""
    shapes = {}
    for node in graph_def.node:
        if node.op != "Placeholder" or "shape" not in node.attr or node.attr["shape"].shape.unknown_rank:
            continue
        shapes[node.name + ":0"] = [None if d.size < 0 else int(d.size) for d in node.attr["shape"].shape.dim]
    return shapes


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


# -- Keras files -------------------------------------------------------------------------------
KERAS_EXTENSIONS = (".keras", ".h5", ".hdf5")
HDF5_EXTENSIONS = (".h5", ".hdf5")


def check_keras_file(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` looks like a Keras model file."""
    import zipfile

    if not os.path.exists(path):
        raise ConversionError(f"no such Keras file: {path}")
    if os.path.isdir(path):
        raise ConversionError(f"--keras needs a .keras or .h5 file, got a directory: {path} "
                              "(use --saved-model for a SavedModel)")
    if not path.lower().endswith(KERAS_EXTENSIONS):
        raise ConversionError(f"--keras needs a .keras or .h5 file, got: {path}")
    if path.lower().endswith(HDF5_EXTENSIONS):
        import h5py

        if not h5py.is_hdf5(path):
            raise ConversionError(f"not an HDF5 file: {path}")
    elif not zipfile.is_zipfile(path):
        raise ConversionError(f"not a .keras model archive (a .keras file is a zip archive): {path}")


def load_keras_file(path: str):
    """Load a Keras model file with ``keras`` (Keras 3, or Keras 2 in TensorFlow 2.15); an .h5
    file that fails gets a second try with tf_keras where it is installed."""
    check_keras_file(path)
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many kinds for unreadable files
        first_error = error
    if not path.lower().endswith(HDF5_EXTENSIONS):
        raise ConversionError(f"cannot load Keras model {path}: {first_line(first_error)}") from first_error
    try:
        import tf_keras
    except ImportError:
        raise ConversionError(f"cannot load Keras model {path} with Keras {keras.__version__} "
                              f"({first_line(first_error)}), and tf_keras is not installed to try") from first_error
    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as error:  # as above
        raise ConversionError(f"cannot load Keras model {path}: Keras {keras.__version__}: "
                              f"{first_line(first_error)}; tf_keras: {first_line(error)}") from error


# -- public entry points -----------------------------------------------------------------------
def convert_keras(model, input_signature=None, opset: Optional[int] = None, output_path: Optional[str] = None,
                  verify: bool = False, tolerance: float = 1e-4, assume_post_padded: bool = False,
                  **options) -> onnx.ModelProto:
    """Convert a Keras model (Keras 3, tf_keras, or TensorFlow 2.15's Keras 2) to ONNX, with
    recurrent layers as native nodes.

    ``input_signature`` (tf.TensorSpecs) defaults to the model's inputs with a dynamic batch; a
    signature that contradicts the model raises :class:`ConversionError`. Other keyword
    arguments: ``continue_on_error``, ``large_model``, ``rename_inputs``, ``rename_outputs`` and
    tf2onnx's ``target``, ``extra_opset``, ``inputs_as_nchw``, ``outputs_as_nchw``,
    ``shape_override``, ``custom_ops``, ``custom_op_handlers``, ``custom_rewriter``,
    ``optimizers``. With ``verify=True`` the ONNX model is run in onnxruntime against the Keras
    model on seeded random inputs and :class:`VerificationError` is raised beyond ``tolerance``.
    Masked layers are exact for any mask; ``assume_post_padded=True`` emits a leaner graph that
    is exact only when every row's kept steps come first (post-padding). ``target="portable"``
    (beside or instead of tf2onnx's targets) gives masked layers no computed ``sequence_lens``,
    for runtimes that take it only as a constant (tract), exact wherever the report does not say
    otherwise.
    The report is logged and stored in the model's metadata.
    """
    conversion = run(keras_model=model, input_signature=input_signature, output_path=output_path, verify=verify,
                     tolerance=tolerance, options=Options.of(opset, assume_post_padded, **options))
    return conversion.model_proto


def convert_saved_model(path: str, output_path: Optional[str] = None, opset: Optional[int] = None,
                        signature_def: Optional[str] = None, tag: Optional[str] = None,
                        verify: bool = False, tolerance: float = 1e-4, assume_post_padded: bool = False,
                        concrete_function: Optional[int] = None, **options) -> onnx.ModelProto:
    """Convert a SavedModel directory; like :func:`convert_keras`, for the CLI's ``--saved-model``."""
    conversion = run(saved_model=path, signature_def=signature_def, tag=tag, concrete_function=concrete_function,
                     output_path=output_path, verify=verify, tolerance=tolerance,
                     options=Options.of(opset, assume_post_padded, **options))
    return conversion.model_proto


def check_tolerance(tolerance) -> None:
    """The verification tolerance: a finite number >= 0."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not math.isfinite(tolerance) \
            or tolerance < 0:
        raise ConversionError(f"tolerance must be a finite number >= 0, got {tolerance!r}")


def run(*, keras_model=None, saved_model: Optional[str] = None, input_signature=None,
        signature_def: Optional[str] = None, tag: Optional[str] = None, concrete_function: Optional[int] = None,
        output_path: Optional[str] = None, verify: bool = False, tolerance: float = 1e-4,
        options: Options = Options()) -> Conversion:
    """The one conversion road: source -> frozen graph -> tf2onnx with the rewriter -> reconciled
    report -> loadable check -> verification -> atomic save. Raises :class:`ConversionError` for
    bad input and :class:`VerificationError` when verification fails (nothing is written then)."""
    if (keras_model is None) == (saved_model is None):
        raise ConversionError("give one source: keras_model or saved_model")
    check_tolerance(tolerance)
    check_source_options(keras=keras_model is not None, signature_def=signature_def, tag=tag,
                         concrete_function=concrete_function, input_signature=input_signature)
    if output_path:
        check_output_path(output_path)
    if keras_model is not None:
        stateful = stateful_layers(keras_model)
        if stateful and options.streaming is False:
            raise ConversionError(f"stateful layer(s) {', '.join(stateful)}: without streaming the ONNX model "
                                  "could not carry their states from one call to the next as Keras does; "
                                  "convert with streaming (the default for stateful models)")
        if stateful and options.streaming is None:
            options = dataclasses.replace(options, streaming=True)
        source = _keras_source(keras_model, input_signature, options)
    else:
        source = _saved_model_source(saved_model, signature_def, tag, concrete_function, options)
    conversion = _convert(source, options)
    in_memory = fits_in_protobuf(conversion.model_proto)
    if verify:
        if not in_memory:  # verification runs the model from memory, which protobuf caps at 2 GB
            raise ConversionError("--verify cannot run a model over 2 GB (protobuf's limit for a model held in "
                                  "memory); convert without --verify: the written model is still checked to "
                                  "load in onnxruntime")
        conversion.verification = _verify(conversion.model_proto, tolerance, keras_model, saved_model,
                                          signature_def, tag)
        if not conversion.verification.passed:
            raise VerificationFailed(conversion.verification, conversion)
    if output_path:
        # a model too big to load from memory is loaded from its written files before they replace the output
        conversion.written = save_model(conversion.model_proto, output_path,
                                        check_loads=not in_memory and not options.continue_on_error)
    return conversion


def _verify(model_proto, tolerance, keras_model, saved_model, signature_def, tag):
    from . import verify

    if keras_model is not None:
        return verify.verify_keras(keras_model, model_proto, tolerance=tolerance)
    return verify.verify_saved_model(saved_model, model_proto, signature_def=signature_def, tag=tag,
                                     tolerance=tolerance)


class VerificationFailed(VerificationError):
    """Verification failed: ``result`` holds the per-output checks, ``conversion`` what was converted
    (and not written)."""

    def __init__(self, result, conversion: Conversion):
        super().__init__(result.table())
        self.result, self.conversion = result, conversion


def _convert(source: Frozen, options: Options) -> Conversion:
    from tf2onnx import convert as tf2onnx_convert

    from . import handlers
    from .rewriters.pipeline import make_rewriter

    handlers.ensure_registered()
    loops = recurrent_loops(source.graph_def)
    report = ConversionReport()
    try:  # make_rewriter guards the rewriter's construction; this guards make_rewriter itself
        rewriter = make_rewriter(report, source.layer_names, options.assume_post_padded, bool(options.streaming),
                                 portable=options.portable)
    except Exception as error:  # noqa: BLE001 - the conversion goes on without fusing, exact
        report.setup_error = f"internal error while setting up the rewriter: {type(error).__name__}: {error}"
        logger.warning("recurrent layers stay Loops: %s", report.setup_error)
        rewriter = None
    tf2onnx_options = dict(options.tf2onnx)
    if "target" in tf2onnx_options:  # tf2onnx gets its own targets only
        tf2onnx_options["target"] = [t for t in tf2onnx_options["target"] if t != PORTABLE]
    custom = list(tf2onnx_options.pop("custom_rewriter", None) or [])
    shape_override = {**(source.shape_override or {}), **(tf2onnx_options.pop("shape_override", None) or {})}
    renames = dict(source.tensors_to_rename or {})
    renames.update(_renames(source.input_names, options.rename_inputs, "inputs", renames))
    renames.update(_renames(source.output_names, options.rename_outputs, "outputs", renames))
    nchw = {}  # option -> the names it transposes, as in the ONNX model
    for option, tensors, kind in (("inputs_as_nchw", source.input_names, "inputs"),
                                  ("outputs_as_nchw", source.output_names, "outputs")):
        if option in tf2onnx_options:
            chosen = _resolve_names(tf2onnx_options[option], tensors, _flag(option), kind,
                                    source.tensors_to_rename or {}, renames)
            tf2onnx_options[option] = chosen
            nchw[option] = [renames.get(t, t) for t in chosen]
    if "inputs_as_nchw" in nchw:  # tf2onnx fails on an input of unknown rank: check before converting
        known = {**_placeholder_shapes(source.graph_def), **shape_override}
        _check_nchw({renames.get(t, t): None if known.get(t) is None else len(known[t]) for t in source.input_names},
                    {"inputs_as_nchw": nchw["inputs_as_nchw"]})
    tf = _tf()
    with tf.device("/cpu:0"):
        common = dict(name=source.name, continue_on_error=True, opset=default_opset(options.opset),
                      custom_rewriter=([rewriter] if rewriter else []) + custom,
                      input_names=source.input_names, output_names=source.output_names, tensors_to_rename=renames,
                      initialized_tables=source.initialized_tables, shape_override=shape_override or None,
                      **tf2onnx_options)
        try:
            if options.large_model:
                model_proto = _convert_large(source.graph_def, **common)
            else:
                model_proto, _ = tf2onnx_convert._convert_common(source.graph_def, **common)  # tf2onnx's own road
        except ConversionError:
            raise
        except Exception as error:  # tf2onnx's own failure on this graph (say, a type its onnx cannot hold)
            raise ConversionError(f"tf2onnx cannot convert this model: {type(error).__name__}: "
                                  f"{first_line(error)}") from error
    _check_nchw(_io_ranks(model_proto), nchw)
    reconcile(report, loops, model_proto, source.layer_names, unrolled_layers(source.graph_def))
    report.outcomes = [dataclasses.replace(o, stateful=True) if o.layer in source.stateful_layers else o
                       for o in report.outcomes]
    if options.streaming:
        check_streamed(report)
    _stamp_ir_version(model_proto)
    report.attach(model_proto)
    logger.info("tf2onnx_rnn report:\n%s", report.table())
    check_loadable(model_proto, options.continue_on_error)
    if options.large_model:
        model_proto.metadata_props.add(key=LARGE_MODEL_KEY, value="1")
    return Conversion(model_proto, report)


def check_streamed(report: ConversionReport) -> None:
    """Streaming is all or nothing: every recurrent layer must carry its states in and out, else
    :class:`ConversionError` naming each layer that cannot and why."""
    refused: dict = {}  # (layer, kind, why) -> directions, once per layer however many loops it has
    for o in report.outcomes:
        if not o.state_outputs:
            refused.setdefault((o.layer, o.kind, o.reason or f"became {o.became}"), []).append(o.direction)
    if refused:
        layers = "; ".join(f"{layer} ({' '.join([kind] + [d for d in directions if d])}): {why}"
                           for (layer, kind, why), directions in refused.items())
        raise ConversionError(f"cannot stream {len(refused)} recurrent layer(s): {layers}")


def _convert_large(graph_def, name: str, custom_ops=None, custom_op_handlers=None, optimizers=None,
                   **kwargs) -> onnx.ModelProto:
    """tf2onnx's conversion of a large frozen graph: the steps of its ``_convert_common`` with
    ``large_model``, every tensor kept in the returned model proto.

    As in tf2onnx, the graph's big constants are taken out before TensorFlow imports it (a graph
    def over 2 GB cannot be imported) and handed to tf2onnx beside it. tf2onnx's external tensor
    storage is not used: tf2onnx 1.17 fails in it under numpy 2, and :func:`save_model` writes
    the external data file itself.
    """
    from tf2onnx import optimizer
    from tf2onnx.convert import make_default_custom_op_handler
    from tf2onnx.tf_utils import compress_graph_def
    from tf2onnx.tfonnx import process_tf_graph

    if custom_ops:
        custom_op_handlers = dict(custom_op_handlers or {})
        custom_op_handlers.update({op: (make_default_custom_op_handler(domain), [])
                                   for op, domain in custom_ops.items()})
    tf = _tf()
    with tf.Graph().as_default() as tf_graph:
        const_node_values = compress_graph_def(graph_def)
        tf.import_graph_def(graph_def, name="")
        graph = process_tf_graph(tf_graph, const_node_values=const_node_values,
                                 custom_op_handlers=custom_op_handlers, **kwargs)
        # as tf2onnx for large models: an optimizer failure is raised, not undone on a copy of the graph
        onnx_graph = optimizer.optimize_graph(graph, catch_errors=False, optimizers=optimizers)
        return onnx_graph.make_model(f"converted from {name}")


def _io_ranks(model_proto: onnx.ModelProto) -> dict:
    """Rank (None if unknown) of each graph input and output, by name."""
    return {value.name: (len(value.type.tensor_type.shape.dim) if value.type.tensor_type.HasField("shape") else None)
            for value in list(model_proto.graph.input) + list(model_proto.graph.output)}


def _check_nchw(ranks: dict, nchw: dict) -> None:
    """tf2onnx transposes only rank-4 inputs and outputs and skips others with a log line: refuse them."""
    for option, names in nchw.items():
        for name in names:
            if ranks.get(name) != 4:
                rank = "unknown rank" if ranks.get(name) is None else f"rank {ranks[name]}"
                raise ConversionError(f"{_flag(option)}: {name} has {rank}; NHWC <-> NCHW takes rank 4")


def _renames(names: list, new_names: Sequence[str], what: str, renames: dict) -> dict:
    if not new_names:
        return {}
    if len(new_names) != len(names):
        shown = ", ".join(renames.get(n, n) for n in names)
        raise ConversionError(f"--rename-{what} gives {len(new_names)} name(s), the model has "
                              f"{len(names)} {what}: {shown}")
    return dict(zip(names, new_names))


# -- opsets and IR versions ----------------------------------------------------------------------
def supported_opsets() -> range:
    """Opsets this package converts to: 14 (the first with LSTM's layout attribute) up to the
    newest that both tf2onnx's onnx and the installed onnxruntime support."""
    from tf2onnx import constants

    newest = min(max(constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version(), _ort_max_opset())
    return range(FIRST_OPSET, newest + 1)


def default_opset(opset: Optional[int]) -> int:
    """``opset``, or tf2onnx's preferred opset capped at what the installed onnxruntime runs."""
    if opset is not None:
        return opset
    from tf2onnx import constants

    supported = supported_opsets()
    return max(supported.start, min(constants.PREFERRED_OPSET, supported.stop - 1))


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
    for ir_version in range(onnx.IR_VERSION, 6, -1):
        if _ort_loads(_identity_model(ir_version, 13)):
            return ir_version
    return 7


@functools.lru_cache(maxsize=None)
def _ort_max_opset() -> int:
    for opset in range(onnx.defs.onnx_opset_version(), FIRST_OPSET - 1, -1):
        ir_version = min(_ort_max_ir(), onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)]))
        if _ort_loads(_identity_model(ir_version, opset)):
            return opset
    return FIRST_OPSET


def _ort_loads(model: onnx.ModelProto) -> bool:
    try:
        _session(model)
        return True
    except Exception:  # noqa: BLE001 - too new for this onnxruntime
        return False


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _identity_model(ir_version: int, opset: int) -> onnx.ModelProto:
    helper = onnx.helper
    value = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _stamp_ir_version(model_proto: onnx.ModelProto) -> None:
    needed = onnx.helper.find_min_ir_version_for(list(model_proto.opset_import), ignore_unknown=True)
    model_proto.ir_version = max(needed, min(model_proto.ir_version, _ort_max_ir()))


# -- the written model --------------------------------------------------------------------------
def unconverted_ops(model_proto: onnx.ModelProto) -> list:
    """Op types in the graph (subgraphs included) that no ONNX domain the model imports defines:
    what tf2onnx left unconverted."""
    domains = {o.domain for o in model_proto.opset_import}
    missing = set()
    for node in graph_nodes(model_proto.graph):
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
            missing.add(node.op_type)
        elif node.domain not in domains and node.domain not in ("", "ai.onnx"):
            missing.add(f"{node.domain}.{node.op_type}")
    return sorted(missing)


def check_loadable(model_proto: onnx.ModelProto, continue_on_error: bool = False) -> None:
    """Load the model in onnxruntime; a model it refuses is a :class:`ConversionError` (naming the
    ops tf2onnx could not convert), or a warning with ``continue_on_error``."""
    left = unconverted_ops(model_proto)
    problem = None
    if left:
        problem = f"tf2onnx could not convert these TensorFlow ops: {', '.join(left)}"
    elif fits_in_protobuf(model_proto):  # a larger model is loaded from its written files (save_model)
        try:
            _session(model_proto)
        except Exception as error:  # noqa: BLE001 - onnxruntime raises its own kinds
            problem = f"onnxruntime cannot load the converted model: {first_line(error)}"
    if problem is None:
        return
    if not continue_on_error:
        raise ConversionError(problem + " (continue_on_error writes it anyway)")
    logger.warning("%s; written anyway (continue_on_error)", problem)


_PROTOBUF_LIMIT = 2**31 - 1
LARGE_MODEL_KEY = "tf2onnx_rnn.large_model"


def check_output_path(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` can be written (before converting anything)."""
    if os.path.isdir(path):
        raise ConversionError(f"--output is a directory, not a file: {path}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConversionError(f"output directory does not exist: {directory}")
    try:  # a real probe: os.access says yes to root even where writing fails
        with tempfile.TemporaryFile(prefix=".tf2onnx_rnn-probe-", dir=directory):
            pass
    except OSError as error:
        raise ConversionError(f"output directory is not writable: {directory} ({error.strerror})") from None


EXTERNAL_DATA_THRESHOLD = 1024  # bytes: a large model's tensors of this size and more go to <output>.data


def fits_in_protobuf(model_proto: onnx.ModelProto) -> bool:
    """Whether the whole model serializes as one protobuf message (under 2 GB)."""
    try:
        return model_proto.ByteSize() < _PROTOBUF_LIMIT
    except Exception:  # noqa: BLE001 - some protobuf builds refuse to size a message that large
        return False


def save_model(model_proto: onnx.ModelProto, output_path: str, check_loads: bool = False) -> list:
    """Write atomically: the files are written in a temporary directory beside the target, then
    renamed over it. A large model (converted with ``large_model=True``) keeps every tensor of
    1 KB or more in ``<output>.data`` beside the model, which names it relatively; ``model_proto``
    is left as it is. With ``check_loads`` onnxruntime must load the written files before they
    replace anything. Returns the paths written."""
    check_output_path(output_path)
    directory = os.path.dirname(os.path.abspath(output_path))
    large = any(p.key == LARGE_MODEL_KEY for p in model_proto.metadata_props)
    if not large and not fits_in_protobuf(model_proto):
        raise ConversionError("the model is over 2 GB, protobuf's limit for one file: convert it with --large_model")
    staging = tempfile.mkdtemp(prefix=".tf2onnx_rnn-", dir=directory)
    name = os.path.basename(output_path)
    staged, staged_data = os.path.join(staging, name), os.path.join(staging, name + ".data")
    try:
        if large:
            _write_with_external_data(model_proto, staged, staged_data, name + ".data")
        else:
            with open(staged, "wb") as stream:
                stream.write(model_proto.SerializeToString())
        if check_loads:
            _check_file_loads(staged)
        written = []
        if os.path.exists(staged_data):
            os.replace(staged_data, output_path + ".data")
            written.append(output_path + ".data")
        os.replace(staged, output_path)
        return [output_path] + written
    except OSError as error:
        raise ConversionError(f"cannot write {output_path}: {error.strerror or error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_file_loads(path: str) -> None:
    import onnxruntime as ort

    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own kinds
        raise ConversionError(f"onnxruntime cannot load the converted model: {first_line(error)}") from error


def _write_with_external_data(model_proto: onnx.ModelProto, model_file: str, data_file: str, location: str) -> None:
    """Write ``model_proto`` to ``model_file`` with each tensor of :data:`EXTERNAL_DATA_THRESHOLD`
    bytes or more (subgraphs and Constant attributes included) stored in ``data_file``, named
    ``location`` in the model. No data file when no tensor is that large.

    The model written is a copy in which those tensors hold no data, built field by field, so
    the weights are never held twice in memory and the caller's model is not changed.
    """
    data = None

    def external(tensor, into) -> bool:
        nonlocal data
        if (tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data")
                or len(tensor.raw_data) < EXTERNAL_DATA_THRESHOLD):
            return False
        if data is None:
            data = open(data_file, "wb")  # noqa: SIM115 - closed below
        raw = tensor.raw_data
        offset = data.tell()
        data.write(raw)
        _copy_fields(tensor, into, external=None, skip=("raw_data",))
        into.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            into.external_data.add(key=key, value=value)
        return True

    skeleton = onnx.ModelProto()
    try:
        _copy_fields(model_proto, skeleton, external)
    finally:
        if data is not None:
            data.close()
    with open(model_file, "wb") as stream:
        stream.write(skeleton.SerializeToString())


def _copy_fields(source, target, external, skip: Sequence[str] = ()) -> None:
    """Copy the protobuf message ``source`` into ``target`` field by field; each TensorProto is
    first offered to ``external(tensor, into)``, which fills ``into`` itself when it returns True."""
    for descriptor, value in source.ListFields():
        if descriptor.name in skip:
            continue
        repeated = (descriptor.is_repeated if hasattr(descriptor, "is_repeated")
                    else descriptor.label == descriptor.LABEL_REPEATED)
        if descriptor.message_type is None:
            if repeated:
                getattr(target, descriptor.name).extend(value)
            else:
                setattr(target, descriptor.name, value)
            continue
        for item in (value if repeated else [value]):
            into = getattr(target, descriptor.name).add() if repeated else getattr(target, descriptor.name)
            into.SetInParent()
            if external is not None and isinstance(item, onnx.TensorProto) and external(item, into):
                continue
            _copy_fields(item, into, external)


def report_of(model_proto: onnx.ModelProto) -> Optional[ConversionReport]:
    """The conversion report stored in a model this package converted."""
    return ConversionReport.of_model(model_proto)


