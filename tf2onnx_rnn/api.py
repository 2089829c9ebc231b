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
import os
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import onnx

from .errors import ConversionError, VerificationError, first_line
from .report import ConversionReport

logger = logging.getLogger("tf2onnx_rnn")

FIRST_OPSET = 14  # the first opset whose LSTM/GRU/RNN take the layout attribute

# tf2onnx options passed through as they are (tf2onnx's own names)
TF2ONNX_OPTIONS = frozenset({"target", "extra_opset", "inputs_as_nchw", "outputs_as_nchw", "custom_ops",
                             "custom_op_handlers", "custom_rewriter", "optimizers", "shape_override"})


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

    @classmethod
    def of(cls, opset=None, assume_post_padded=False, continue_on_error=False, large_model=False,
           rename_inputs=(), rename_outputs=(), inputs=None, **tf2onnx_options) -> "Options":
        unknown = sorted(set(tf2onnx_options) - TF2ONNX_OPTIONS)
        if unknown:
            raise ConversionError(f"unknown option {unknown[0]!r}; known: "
                                  f"{', '.join(sorted(TF2ONNX_OPTIONS | {'opset', 'large_model'}))}")
        check_opset(opset)
        return cls(opset, assume_post_padded, continue_on_error, large_model, tuple(rename_inputs or ()),
                   tuple(rename_outputs or ()), inputs, dict(tf2onnx_options))


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


@dataclass
class Conversion:
    """The result of :func:`run`: the model, its report and, when asked, its verification."""

    model_proto: onnx.ModelProto
    report: ConversionReport
    verification: Optional[object] = None  # a verify.VerificationResult


# -- Keras models ------------------------------------------------------------------------------
def keras_input_signature(model) -> list:
    """TensorSpecs for a Keras model's inputs, with a dynamic batch and the model's input names.

    Dimensions the model leaves dynamic stay dynamic.
    """
    tf = _tf()
    inputs = _model_inputs(model)
    specs = []
    for index, tensor in enumerate(inputs):
        shape = [None if d is None else int(d) for d in tensor.shape]
        if shape:
            shape[0] = None
        specs.append(tf.TensorSpec(shape, _dtype_of(tensor), name=_input_name(tensor, index)))
    return specs


def _model_inputs(model) -> list:
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ConversionError("the Keras model has no defined inputs: build it (or call it once) "
                              "or pass input_signature")
    return list(inputs)


def _input_name(tensor, index: int) -> str:
    return (getattr(tensor, "name", None) or f"input_{index}").split(":")[0]


def _dtype_of(tensor):
    return _tf().as_dtype(getattr(tensor.dtype, "name", tensor.dtype))


def checked_signature(model, input_signature) -> list:
    """``input_signature`` checked against the model's inputs (count, rank, fixed dimensions),
    with the model's input names where a spec has none. None gives :func:`keras_input_signature`."""
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
            raise ConversionError(f"input {name}: input_signature gives no rank; the model takes shape {want}")
        got = spec.shape.as_list()
        if len(got) != len(want):
            raise ConversionError(f"input {name}: input_signature has rank {len(got)} {got}, "
                                  f"the model takes rank {len(want)} {want}")
        for axis, (g, w) in enumerate(zip(got, want)):
            if g is not None and w is not None and g != w:
                raise ConversionError(f"input {name}: dimension {axis} is {g} in input_signature, "
                                      f"the model's is {w} (shape {want})")
        checked.append(tf.TensorSpec(spec.shape, spec.dtype, name=spec.name or name))
    return checked


def signature_with_shapes(model, shapes: dict) -> list:
    """The model's signature with the shapes given by input name (``-1``/None = dynamic)."""
    specs = keras_input_signature(model)
    known = {spec.name for spec in specs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise ConversionError(f"unknown input {unknown[0]!r}; the model's inputs are: {', '.join(sorted(known))}")
    tf = _tf()
    return checked_signature(model, [
        tf.TensorSpec([None if d is None or d < 0 else d for d in shapes[s.name]], s.dtype, name=s.name)
        if s.name in shapes else s for s in specs])


def _keras_source(model, input_signature, options: Options) -> Frozen:
    """Trace ``model(x, training=False)`` and freeze it with tf2onnx's Keras loader path.

    Captured constants (a Normalization layer's mean, a position table) stay constants: only
    the signature's tensors become graph inputs.
    """
    from tf2onnx import tf_loader
    from tf2onnx.convert import tensor_names_from_structed

    tf = _tf()
    signature = (signature_with_shapes(model, options.inputs) if options.inputs and input_signature is None
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
        graph_def, tables = tf_loader.from_trackable(model, concrete, inputs, outputs, options.large_model)
    return Frozen(graph_def, getattr(model, "name", "keras"), inputs, outputs, renames, tables,
                  functools.partial(_layer_of_scope, scopes))


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


def _recurrent_layers(model) -> dict:
    """The model's recurrent layers, nested models included, each with the name the report gives
    it: its own, or that of the Bidirectional wrapping it."""
    found, owner, pending, seen = [], {}, list(getattr(model, "layers", [])), set()
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if hasattr(layer, "cell"):
            found.append(layer)
        halves = [sub for sub in (getattr(layer, "forward_layer", None), getattr(layer, "backward_layer", None))
                  if sub is not None]
        for half in halves:
            owner.setdefault(id(half), owner.get(id(layer), layer.name))
        pending.extend(getattr(layer, "layers", []) or [])
        pending.extend(halves)
    return {layer: owner.get(id(layer), layer.name) for layer in found}


class _recording_layer_scopes:
    """While tracing, note the name scope each recurrent layer's ``call`` runs in (scope -> name).

    The ops a layer creates carry that scope, whatever suffix tracing gave it, so a loop is
    named after its Keras layer exactly (a Bidirectional's halves after the Bidirectional).
    Only the recurrent layers' own ``call`` is wrapped: a wrapper's (Bidirectional's) is left
    alone, since tf_keras reads its arguments from it.
    """

    def __init__(self, model, scopes: dict):
        self.layers, self.scopes = _recurrent_layers(model), scopes

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


def _saved_model_source(path: str, signature_def: Optional[str], tag: Optional[str],
                        concrete_function: Optional[int], options: Options) -> Frozen:
    from tf2onnx import tf_loader

    check_saved_model_dir(path)
    tags = _tags(path)
    if tag is not None and tag not in tags:
        raise ConversionError(f"unknown tag {tag!r}; the SavedModel has: {', '.join(sorted(tags)) or 'none'}")
    if signature_def is not None and concrete_function is not None:
        raise ConversionError("--signature_def and --concrete_function exclude each other")
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
        override = _shape_override(options.inputs, inputs, renames)
    return Frozen(graph_def, path, inputs, outputs, renames, tables, shape_override=override)


def _shape_override(shapes: dict, inputs: list, renames: dict) -> dict:
    """Graph tensor -> shape for inputs named by their signature name or their graph tensor name."""
    by_name = {}
    for tensor in inputs:
        for alias in (tensor, tensor.split(":")[0], renames.get(tensor, tensor)):
            by_name[alias] = tensor
    override = {}
    for name, shape in shapes.items():
        if name not in by_name:
            known = sorted({renames.get(t, t) for t in inputs})
            raise ConversionError(f"unknown input {name!r}; the model's inputs are: {', '.join(known)}")
        override[by_name[name]] = [-1 if d is None else int(d) for d in shape]
    return override


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
    is exact only when every row's kept steps come first (post-padding).
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


def run(*, keras_model=None, saved_model: Optional[str] = None, input_signature=None,
        signature_def: Optional[str] = None, tag: Optional[str] = None, concrete_function: Optional[int] = None,
        output_path: Optional[str] = None, verify: bool = False, tolerance: float = 1e-4,
        options: Options = Options()) -> Conversion:
    """The one conversion road: source -> frozen graph -> tf2onnx with the rewriter -> reconciled
    report -> loadable check -> verification -> atomic save. Raises :class:`ConversionError` for
    bad input and :class:`VerificationError` when verification fails (nothing is written then)."""
    if output_path:
        check_output_path(output_path)
    if keras_model is not None:
        source = _keras_source(keras_model, input_signature, options)
    else:
        source = _saved_model_source(saved_model, signature_def, tag, concrete_function, options)
    conversion = _convert(source, options)
    if verify:
        conversion.verification = _verify(conversion.model_proto, tolerance, keras_model, saved_model,
                                          signature_def, tag)
        if not conversion.verification.passed:
            raise VerificationFailed(conversion.verification, conversion)
    if output_path:
        save_model(conversion.model_proto, output_path)
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
    from .reconcile import reconcile, recurrent_loops
    from .rewriters.pipeline import make_rewriter

    handlers.ensure_registered()
    loops = recurrent_loops(source.graph_def)
    report = ConversionReport()
    rewriter = make_rewriter(report, source.layer_names, options.assume_post_padded)
    tf2onnx_options = dict(options.tf2onnx)
    custom = list(tf2onnx_options.pop("custom_rewriter", None) or [])
    shape_override = {**(source.shape_override or {}), **(tf2onnx_options.pop("shape_override", None) or {})}
    renames = dict(source.tensors_to_rename or {})
    renames.update(_renames(source.input_names, options.rename_inputs, "inputs", renames))
    renames.update(_renames(source.output_names, options.rename_outputs, "outputs", renames))
    tf = _tf()
    with tf.device("/cpu:0"):
        model_proto, storage = tf2onnx_convert._convert_common(  # tf2onnx's own conversion road
            source.graph_def, name=source.name, continue_on_error=True, opset=default_opset(options.opset),
            custom_rewriter=([rewriter] if rewriter else []) + custom,
            input_names=source.input_names, output_names=source.output_names, tensors_to_rename=renames,
            initialized_tables=source.initialized_tables, large_model=options.large_model,
            shape_override=shape_override or None, **tf2onnx_options)
    if storage is not None:
        _inline_external_data(model_proto, storage)
    reconcile(report, loops, model_proto, source.layer_names)
    _stamp_ir_version(model_proto)
    report.attach(model_proto)
    logger.info("tf2onnx_rnn report:\n%s", report.table())
    check_loadable(model_proto, options.continue_on_error)
    if options.large_model:
        model_proto.metadata_props.add(key=LARGE_MODEL_KEY, value="1")
    return Conversion(model_proto, report)


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

    def walk(graph):
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
                missing.add(node.op_type)
            elif node.domain not in domains and node.domain not in ("", "ai.onnx"):
                missing.add(f"{node.domain}.{node.op_type}")
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    walk(sub)

    walk(model_proto.graph)
    return sorted(missing)


def check_loadable(model_proto: onnx.ModelProto, continue_on_error: bool = False) -> None:
    """Load the model in onnxruntime; a model it refuses is a :class:`ConversionError` (naming the
    ops tf2onnx could not convert), or a warning with ``continue_on_error``."""
    left = unconverted_ops(model_proto)
    problem = None
    if left:
        problem = f"tf2onnx could not convert these TensorFlow ops: {', '.join(left)}"
    elif model_proto.ByteSize() < _PROTOBUF_LIMIT:
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


def _inline_external_data(model_proto: onnx.ModelProto, storage) -> None:
    """Put tf2onnx's external tensor storage back into the tensors (saved as external data later)."""
    from onnx.external_data_helper import _get_all_tensors

    for tensor in _get_all_tensors(model_proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        tensor.raw_data = storage.name_to_tensor_data[info["location"]]
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


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


def save_model(model_proto: onnx.ModelProto, output_path: str) -> None:
    """Write atomically: temporary files beside the target, then renames. A large model (converted
    with ``large_model=True``) keeps its weights in ``<output>.data`` beside it."""
    check_output_path(output_path)
    directory = os.path.dirname(os.path.abspath(output_path))
    large = any(p.key == LARGE_MODEL_KEY for p in model_proto.metadata_props)
    handle, temporary = tempfile.mkstemp(prefix=".tf2onnx_rnn-", suffix=".onnx", dir=directory)
    os.close(handle)
    data_name = os.path.basename(output_path) + ".data"
    temporary_data = os.path.join(directory, os.path.basename(temporary) + ".data")
    try:
        if large:
            onnx.save_model(model_proto, temporary, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(temporary_data), size_threshold=1024)
            _relocate_external_data(temporary, data_name)
            os.replace(temporary_data, os.path.join(directory, data_name))
        else:
            with open(temporary, "wb") as stream:
                stream.write(model_proto.SerializeToString())
        os.replace(temporary, output_path)
    except OSError as error:
        raise ConversionError(f"cannot write {output_path}: {error.strerror or error}") from error
    finally:
        for path in (temporary, temporary_data):
            if os.path.exists(path):
                os.unlink(path)


def _relocate_external_data(model_path: str, data_name: str) -> None:
    """Point the saved model's external tensors at ``data_name`` (their final file name)."""
    model = onnx.load(model_path, load_external_data=False)
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_name
    with open(model_path, "wb") as stream:
        stream.write(model.SerializeToString())


def report_of(model_proto: onnx.ModelProto) -> Optional[ConversionReport]:
    """The conversion report stored in a model this package converted."""
    return ConversionReport.of_model(model_proto)


