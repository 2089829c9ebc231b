"""A live Keras model as a source: traced as ``model(x, training=False)`` and frozen.

Keras 3, tf_keras, or TensorFlow 2.15's Keras 2. Without an input signature the model's own
inputs are taken with a dynamic batch. Each loop is named after its Keras layer: the scope each
recurrent layer's ``call`` runs in is recorded while tracing.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from ..errors import ConversionError, first_line, param
from ..keras_kernels import cpu_kernels
from ..keras_layers import inexpressible_activations, layer_kinds, recurrent_layers, stateful_layers, weight_owners
from . import Frozen, Source, check_input_shape
from .outside_ops import executed_ops, outside, refuse_outside
from .time_distributed import merged_time_axis


def _tf():
    import tensorflow as tf  # imported late: it takes seconds

    return tf


class KerasModel(Source):
    """A Keras model object, converted as ``model(x, training=False)``. Verification calls the model:
    with ``safe_mode`` (the default) only when its traced call reaches nothing outside TensorFlow."""

    kind = "keras_model"
    options = ("input_signature", "safe_mode")

    def __init__(self, model, input_signature=None, safe_mode: bool = True):
        self.model, self.input_signature, self.safe_mode = model, input_signature, safe_mode
        self._traced = None  # the traced call's graph (functions included), once frozen

    def check(self) -> None:
        backend = _backend_of(self.model)
        if backend not in (None, "tensorflow"):
            raise ConversionError(
                f"the Keras model runs on Keras's {backend} backend, and this converter reads TensorFlow graphs: "
                "save it (model.save('model.keras')) and convert the file (the command line loads it on "
                "TensorFlow), or load it in a process with KERAS_BACKEND=tensorflow and convert that")

    def prepared(self, options):
        """A model with stateful layers streams (unless streaming is refused, which cannot be exact)."""
        stateful = stateful_layers(self.model)
        if stateful and options.streaming is False:
            raise ConversionError(f"stateful layer(s) {', '.join(stateful)}: without streaming the ONNX model "
                                  "could not carry their states from one call to the next as Keras does; "
                                  "convert with streaming (the default for stateful models)")
        if stateful and options.streaming is None:
            return dataclasses.replace(options, streaming=True)
        return options

    def freeze(self, options) -> Frozen:
        frozen = freeze_keras(self.model, self.input_signature, options)
        self._traced = frozen.traced
        return frozen

    def verify(self, model_proto, tolerance: float, values: bool = True):
        from ..verify import verify_keras

        if self.safe_mode and self._traced is not None:
            refuse_outside(outside(executed_ops(self._traced)), "verification calls the Keras model, whose call runs")
        return verify_keras(self.model, model_proto, tolerance=tolerance, values=values)


def _backend_of(model) -> Optional[str]:
    """The Keras 3 backend a model object runs on (None for tf_keras and Keras 2 models)."""
    import sys

    keras = sys.modules.get("keras")
    if keras is None or not type(model).__module__.startswith("keras") or not hasattr(keras, "config"):
        return None
    backend = getattr(keras.config, "backend", None)
    return backend() if callable(backend) else None


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
    inputs = _defined_inputs(model)
    if not inputs:
        declared = _declared_batch_shape(model)
        if declared is not None:  # an unbuilt Sequential whose first layer declares its input shape
            try:
                model.build(declared)
            except Exception as error:  # noqa: BLE001 - Keras raises many kinds
                raise ConversionError(f"cannot build the Keras model for the input shape {list(declared)} its "
                                      f"first layer declares: {first_line(error)}") from error
            inputs = _defined_inputs(model)
    if not inputs:
        raise ConversionError("the Keras model has no defined inputs: build it (or call it once) "
                              f"or pass {param('input_signature')}")
    return list(inputs)


def _defined_inputs(model):
    try:
        return model.inputs
    except (AttributeError, ValueError):  # Keras 3 before 3.6 raises for an unbuilt Sequential
        return None


def _declared_batch_shape(model) -> Optional[tuple]:
    """The batch shape the first layer of a Sequential declares (``input_shape``/``input_dim`` in
    Keras 3, ``batch_input_shape`` in Keras 2), looking into wrappers (Bidirectional, and
    TimeDistributed, whose layer's shape is per step); None when none does."""
    layers = list(getattr(model, "layers", None) or [])
    layer = layers[0] if layers and hasattr(model, "add") else None
    steps = 0  # TimeDistributed wrappers gone through: each adds a time axis the inner layer does not see
    while layer is not None:
        shape = getattr(layer, "_input_shape_arg", None)
        batch = getattr(layer, "_batch_input_shape", None)
        if shape is not None or batch is not None:
            batch = (None,) + tuple(shape) if shape is not None else tuple(batch)
            return batch[:1] + (None,) * steps + batch[1:]
        inner = getattr(layer, "layer", None) or getattr(layer, "forward_layer", None)
        steps += type(layer).__name__ == "TimeDistributed" and inner is not None
        layer = inner
    return None


def _input_name(tensor, index: int) -> str:
    return (getattr(tensor, "name", None) or f"input_{index}").split(":")[0]


def _dtype_of(tensor):
    return _tf().as_dtype(getattr(tensor.dtype, "name", tensor.dtype))


def checked_signature(model, input_signature, given_by: str = param("input_signature")) -> list:
    """``input_signature`` checked against the model's inputs (count, rank, fixed dimensions),
    with the model's input names where a spec has none. None gives :func:`keras_input_signature`.
    ``given_by`` names what gave the shapes, in messages."""
    if input_signature is None:
        return keras_input_signature(model)
    tf = _tf()
    specs = list(input_signature) if isinstance(input_signature, (list, tuple)) else [input_signature]
    inputs = _model_inputs(model)
    if len(specs) != len(inputs):
        raise ConversionError(f"{param('input_signature')} has {len(specs)} spec(s), the model takes "
                              f"{len(inputs)} input(s)")
    checked = []
    for index, (spec, tensor) in enumerate(zip(specs, inputs)):
        if not isinstance(spec, tf.TensorSpec):
            raise ConversionError(f"{param('input_signature')}[{index}] is not a tf.TensorSpec: {spec!r}")
        name = _input_name(tensor, index)
        want = [None if d is None else int(d) for d in tensor.shape]
        if spec.shape.rank is None:
            raise ConversionError(f"input {name}: {given_by} gives no rank; the model takes shape {want}")
        check_input_shape(name, spec.shape.as_list(), want, given_by)
        checked.append(tf.TensorSpec(spec.shape, spec.dtype, name=spec.name or name))
    return checked


def signature_with_shapes(model, shapes: dict) -> list:
    """The model's signature with the shapes given by input name (``-1``/None = dynamic; a name
    with shape None keeps the model's shape)."""
    specs = keras_input_signature(model)
    known = {spec.name for spec in specs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise ConversionError(f"unknown name {unknown[0]!r} in {param('inputs')}; the model's inputs are: "
                              f"{', '.join(spec.name for spec in specs)}")
    tf = _tf()
    return checked_signature(model, [
        tf.TensorSpec([None if d is None or d < 0 else d for d in shapes[s.name]], s.dtype, name=s.name)
        if shapes.get(s.name) is not None else s for s in specs], given_by=param("inputs"))


def freeze_keras(model, input_signature, options) -> Frozen:
    """Trace ``model(x, training=False)`` and freeze it with tf2onnx's Keras loader path.

    Captured constants (a Normalization layer's mean, a position table) stay constants: only
    the signature's tensors become graph inputs.
    """
    from tf2onnx import tf_loader
    from tf2onnx.convert import tensor_names_from_structed

    tf = _tf()
    if options.inputs and input_signature is not None:
        raise ConversionError(f"{param('input_signature')} and {param('inputs')} exclude each other: give the "
                              "shapes in one of them")
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
        with _recording_layer_scopes(model, scopes), merged_time_axis(model), cpu_kernels():
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
    traced = concrete.graph.as_graph_def()
    with tf.device("/cpu:0"), _eager_functions_kept(traced.library):
        try:
            graph_def, tables = tf_loader.from_trackable(model, concrete, inputs, outputs, options.large_model)
        except ValueError as error:  # tf2onnx's words for a graph over protobuf's 2 GB
            if "protobuf size of 2GB" not in str(error):
                raise
            raise ConversionError("the model is over 2 GB, protobuf's limit: convert it with "
                                  f"{param('large_model')}") from error
    return Frozen(graph_def, getattr(model, "name", "keras"), inputs, outputs, renames, tables,
                  functools.partial(_layer_of_scope, scopes), stateful_layers=stateful_layers(model),
                  inexpressible=inexpressible_activations(model), layer_kinds=layer_kinds(model),
                  weight_owners=functools.partial(weight_owners, model),
                  traced=traced, shape_override=_unranked_output_shapes(model, concrete, by_key, order) or None)


def _unranked_output_shapes(model, concrete, by_key: dict, order: list) -> dict:
    """Output tensor -> its shape as the Keras model declares it, for each output TensorFlow's trace gives no
    rank (a layer reshaping to a shape it computes, such as Keras 3's ``associative_scan``): an ONNX graph
    output needs one. Outputs whose trace has a rank keep it."""
    declared = list(getattr(model, "outputs", None) or [])
    ranks = {t.name: t.shape.rank for t in concrete.outputs}
    shapes = {}
    for index, key in enumerate(order):
        tensor = by_key.get(key)
        if tensor is None or ranks.get(tensor) is not None or index >= len(declared) or len(order) != len(declared):
            continue
        shape = getattr(declared[index], "shape", None)
        if shape is not None and getattr(shape, "rank", len(tuple(shape))) is not None:
            shapes[tensor] = [None if d is None else int(d) for d in tuple(shape)]
    return shapes


class _eager_functions_kept:
    """Inside the block, freezing may unregister the traced call's functions (``library``: its while-loop
    bodies and conditions) from TensorFlow's eager context; on leaving, every one of them that was
    registered is registered again.

    TensorFlow's ``convert_variables_to_constants_v2`` (which tf2onnx freezes with) removes them to
    register the frozen copies in their place, but when building the frozen function fails (it does for
    a model with stateful tf_keras layers: "incompatible with expected resource"), tf2onnx falls back to
    another freezing path and nothing is registered again. The traced function still owns them: when it is
    garbage-collected, TensorFlow removes each one again and, finding it gone, prints "Exception ignored
    in AtomicFunction.__del__ ... Tried to remove non-existent function" wherever the collection happens."""

    def __init__(self, library):
        from tensorflow.python.eager import context

        self._context = context.context()
        self._functions = [f for f in library.function if self._context.has_function(f.signature.name)]

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        for function_def in self._functions:
            if not self._context.has_function(function_def.signature.name):
                self._context.add_function_def(function_def)
        return False


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
        """``call``, noting its scope; a TensorFlow decorator, so that a wrapper reading the layer's
        arguments from it (tf_keras's TimeDistributed passes ``mask`` only where ``call`` takes one)
        still sees ``call``'s own."""
        from tensorflow.python.util import tf_decorator

        scopes = self.scopes

        def recording(*args, **kwargs):
            scope = _tf().compat.v1.get_default_graph().get_name_scope()
            if scope:
                scopes.setdefault(scope, name)
            return call(*args, **kwargs)

        return tf_decorator.make_decorator(call, recording)

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.__dict__.pop("call", None)
        return False


def _layer_of_scope(scopes: dict, loop_name: str) -> Optional[str]:
    """The report name of the recurrent layer whose call scope (the innermost) holds ``loop_name``."""
    holding = [scope for scope in scopes if loop_name.startswith(scope + "/")]
    return scopes[max(holding, key=len)] if holding else None
