"""Keras 3's ``TimeDistributed``, traced exactly and lean, and refused where a graph holds it traced wrongly.

Keras 3's ``TimeDistributed.call`` applies its inner layer once per step. With a fixed time axis it
calls the layer T times (T copies of its ops); with a dynamic one it calls
``vectorized_map(step, arange(n))`` where ``n`` is taken from the input's shape *before* the time
axis is moved first: the batch size. Traced by ``tf.function`` (a SavedModel export, a converter),
the layer then computes as many steps as there are rows in the batch, so its output's time axis is
the batch size, right only where batch equals time (eager calls see the static shape and loop over
time). tf_keras merges batch and time into one axis and calls the layer once.

While a Keras model is traced for conversion, :func:`merged_time_axis` gives each Keras 3
``TimeDistributed`` the tf_keras call: the inner layer applied once over ``batch * time`` rows (a
Dense is one MatMul, an LSTM one native node over every row), its mask merged the same way. The
inner layer sees each step independently, by ``TimeDistributed``'s definition, so the result is
Keras's. A stateful inner layer keeps Keras's own call (its state follows the rows of a batch).

A graph that already holds the mistraced form (a Keras 3 SavedModel, a frozen graph) computes the
wrong shape in TensorFlow too: :func:`refuse_mistraced` names the layer and how to convert instead.
"""
from __future__ import annotations

import contextlib
import sys

from ..errors import ConversionError


def _is_keras3_time_distributed(layer) -> bool:
    keras = sys.modules.get("keras")
    version = str(getattr(keras, "__version__", ""))
    return (type(layer).__name__ == "TimeDistributed" and type(layer).__module__.startswith("keras.")
            and version[:1].isdigit() and int(version.split(".")[0]) >= 3)


def _wrappers(model) -> list:
    """Every Keras 3 ``TimeDistributed`` in the model, nested models and wrappers included."""
    found, pending, seen = [], [model], set()
    while pending:
        layer = pending.pop()
        if layer is None or id(layer) in seen:
            continue
        seen.add(id(layer))
        if _is_keras3_time_distributed(layer):
            found.append(layer)
        pending.extend(getattr(layer, "layers", None) or [])
        pending.extend(getattr(layer, name, None) for name in ("layer", "forward_layer", "backward_layer"))
    return found


@contextlib.contextmanager
def merged_time_axis(model):
    """While tracing ``model``: each Keras 3 ``TimeDistributed`` (but one around a stateful layer)
    calls its inner layer once over the merged batch and time axes."""
    patched = [layer for layer in _wrappers(model) if not getattr(layer.layer, "stateful", False)]
    for layer in patched:
        object.__setattr__(layer, "call", _merged_call(layer))
    try:
        yield
    finally:
        for layer in patched:
            layer.__dict__.pop("call", None)


def _merged_call(wrapper):
    """``wrapper.call`` computed as tf_keras computes it: reshape to (batch * time, ...), call the
    inner layer once, reshape back to (batch, time, ...)."""
    import tensorflow as tf

    inner = wrapper.layer

    def call(inputs, training=None, mask=None):
        kwargs = {}
        if getattr(inner, "_call_has_mask_arg", False) and mask is not None:
            kwargs["mask"] = tf.reshape(mask, _merged_shape(mask))
        if getattr(inner, "_call_has_training_arg", False):
            kwargs["training"] = training
        outputs = inner.call(tf.reshape(inputs, _merged_shape(inputs)), **kwargs)
        shape = _leading(inputs) + [_dim(outputs, axis) for axis in range(1, outputs.shape.rank)]
        result = tf.reshape(outputs, _shape_tensor(shape))
        result.set_shape([d if isinstance(d, int) else None for d in shape])
        return result

    return call


def _dim(tensor, axis: int):
    """One dimension of ``tensor``: an int where it is static, else a scalar tensor."""
    import tensorflow as tf

    static = tensor.shape[axis]
    return int(static) if static is not None else tf.shape(tensor)[axis]


def _leading(tensor) -> list:
    return [_dim(tensor, 0), _dim(tensor, 1)]


def _merged_shape(tensor):
    """(batch * time, the rest...) of a (batch, time, ...) tensor."""
    return _shape_tensor([-1] + [_dim(tensor, axis) for axis in range(2, tensor.shape.rank)])


def _shape_tensor(dims: list):
    import tensorflow as tf

    if all(isinstance(d, int) for d in dims):
        return dims
    return tf.stack([tf.constant(d, tf.int32) if isinstance(d, int) else tf.cast(d, tf.int32) for d in dims])


def refuse_mistraced(graph_def) -> None:
    """Refuse a graph holding a Keras 3 ``TimeDistributed`` traced over a dynamic time axis: in the
    layer's scope, its input transposed time-first and a vectorized map (``<layer>/loop_body``) whose
    count is not that transposed tensor's first dimension (Keras takes the batch size, a constant
    once grappler folds a fixed batch)."""
    nodes = {node.name: node for node in graph_def.node}
    scopes = {name.split("/loop_body/")[0] for name in nodes if "/loop_body/" in name}
    for scope in sorted(scopes):
        transpose = nodes.get(scope + "/transpose")
        if transpose is None or transpose.op != "Transpose" or not _swaps_first_axes(nodes, transpose):
            continue
        if _counts_time(nodes, nodes.get(scope + "/range"), transpose.name):
            continue
        layer = scope.rsplit("/", 1)[-1]
        raise ConversionError(
            f"{layer}: a Keras 3 TimeDistributed traced over a dynamic time axis, which TensorFlow computes over "
            "as many steps as the batch has rows (the graph's own output has the wrong time axis wherever batch "
            "and time differ): convert the Keras model or its .keras file instead, which are traced correctly, "
            "or export with a fixed time axis")


def _swaps_first_axes(nodes: dict, transpose) -> bool:
    """Whether a Transpose's constant permutation is (1, 0, 2, ...)."""
    from tensorflow.python.framework import tensor_util

    perm = _producer(nodes, transpose.input[1])
    if perm is None or perm.op != "Const":
        return False
    order = [int(v) for v in tensor_util.MakeNdarray(perm.attr["value"].tensor).ravel()]
    return order[:2] == [1, 0] and order[2:] == list(range(2, len(order)))


def _counts_time(nodes: dict, steps, transposed: str) -> bool:
    """Whether the map's ``range`` counts the transposed tensor's first dimension (time)."""
    if steps is None or steps.op != "Range":
        return False
    limit = _producer(nodes, steps.input[1])
    shape = _producer(nodes, limit.input[0]) if limit is not None and limit.op == "StridedSlice" else None
    return shape is not None and shape.op == "Shape" and shape.input[0].split(":")[0] == transposed


def _producer(nodes: dict, tensor: str):
    return nodes.get(tensor.split(":")[0].lstrip("^"))
