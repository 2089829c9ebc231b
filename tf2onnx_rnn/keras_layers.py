"""The recurrent layers of a Keras model, as the API and verification both need them."""
from __future__ import annotations

import contextlib
import hashlib

import numpy as np


def _layers_named(model) -> list:
    """Every layer of the model, nested models' and wrapped layers' included, once each, with the name the report
    gives it: its own, or that of the wrapper holding it (a Bidirectional, a TimeDistributed)."""
    found, owner, pending, seen = [], {}, list(getattr(model, "layers", [])), set()
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        wrapped = [sub for sub in (getattr(layer, "forward_layer", None), getattr(layer, "backward_layer", None))
                   if sub is not None] or [sub for sub in [getattr(layer, "layer", None)] if hasattr(sub, "name")]
        for sub in wrapped:
            owner.setdefault(id(sub), owner.get(id(layer), layer.name))
        pending.extend(getattr(layer, "layers", []) or [])
        pending.extend(wrapped)
    return [(layer, owner.get(id(layer), layer.name)) for layer in found]


def recurrent_layers(model) -> dict:
    """The model's recurrent layers, nested models included, each with the name the report gives
    it: its own, or that of the wrapper holding it (a Bidirectional, a TimeDistributed)."""
    return {layer: name for layer, name in _layers_named(model) if hasattr(layer, "cell")}


# the activations, by Keras's names, that ONNX's LSTM, GRU and RNN nodes compute (with alpha and beta where
# they take them: Keras 3's and tf_keras's hard_sigmoid are each one)
_ONNX_ACTIVATIONS = frozenset({"tanh", "sigmoid", "relu", "hard_sigmoid", "softsign", "softplus", "linear", "elu",
                               "leaky_relu"})
_BUILT_IN = frozenset({"LSTM", "GRU", "SimpleRNN"})


def inexpressible_activations(model) -> dict:
    """Report name of each built-in LSTM, GRU or SimpleRNN layer -> the names of its activations no ONNX
    recurrent node computes (``gelu``, ``selu``...), for the layers that have such."""
    found: dict = {}
    for layer, name in recurrent_layers(model).items():
        if type(layer).__name__ not in _BUILT_IN:
            continue
        for attribute in ("activation", "recurrent_activation"):
            label = getattr(getattr(layer.cell, attribute, None), "__name__", None)
            if isinstance(label, str) and label not in _ONNX_ACTIVATIONS and label not in found.get(name, ()):
                found[name] = found.get(name, ()) + (label,)
    return found


def weight_key(value) -> str:
    """What identifies a matrix weight's value (float32) in :func:`weight_owners`: a digest, not a copy."""
    return hashlib.sha1(np.ascontiguousarray(value, np.float32).tobytes()).hexdigest()


def weight_owners(model) -> dict:
    """:func:`weight_key` of each matrix weight (and of it transposed) -> the report's name of the model's layer
    holding it: a layer of the model or of a model nested in it, its cells' and wrapped layers' weights included (a
    Dense's kernel names the Dense; a recurrent cell's, its layer). What names a quantized layer in the report."""
    found: dict = {}
    for layer, name in _layers_named(model):
        if getattr(layer, "layers", None) and not hasattr(layer, "cell"):  # a nested model: its layers are read
            continue
        try:
            weights = [np.asarray(w, np.float32) for w in layer.get_weights()]
        except Exception:  # noqa: BLE001 - a layer whose weights cannot be read names nothing
            continue
        for value in weights:
            if value.ndim == 2:
                found.setdefault(weight_key(value), name)
                found.setdefault(weight_key(value.T), name)
    return found


def layer_kinds(model) -> dict:
    """Report name of each recurrent layer -> its Keras class's name (a Bidirectional's: its layer's)."""
    return {name: type(layer).__name__ for layer, name in recurrent_layers(model).items()}


def stateful_layers(model) -> tuple:
    """Report names of the model's ``stateful=True`` recurrent layers."""
    return tuple(sorted({name for layer, name in recurrent_layers(model).items() if getattr(layer, "stateful", False)}))


def _state_variables(model) -> list:
    return [variable for layer in recurrent_layers(model) if getattr(layer, "stateful", False)
            for variable in (getattr(layer, "states", None) or []) if hasattr(variable, "assign")]


@contextlib.contextmanager
def states_kept(model):
    """Run ``model`` freely inside the block: its stateful layers' stored states are as they were
    afterwards. :func:`zero_states` starts a call from zeros, as a streamed model fed zeros does."""
    variables = _state_variables(model)
    saved = [np.array(variable.numpy()) for variable in variables]
    try:
        yield
    finally:
        for variable, value in zip(variables, saved):
            variable.assign(value)


def zero_states(model) -> None:
    for variable in _state_variables(model):
        variable.assign(np.zeros(tuple(variable.shape), np.dtype(getattr(variable.dtype, "name", variable.dtype))))
