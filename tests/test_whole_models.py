"""Whole models around recurrent layers: every Keras activation, the common layers beside
recurrent ones, and layers holding captured constants, converted with ``convert_keras`` and run
in onnxruntime against ``model(x, training=False)``.

Every case is built in Keras 3 and in tf_keras (where the flavor has the layer or activation)
with every floating weight randomized (variances positive), converted once per process
(``parity.converted_with``) and checked in ONE test per (flavor, case), so pytest-xdist never
converts a case twice. The test reports every failing aspect together:

(a) the ONNX model's graph inputs are exactly the Keras model's inputs, by name and in order
    (constants the model captures, such as a ``Normalization`` layer's given mean and variance
    or a position table made in a layer's ``__init__``, must not become inputs);
(b) onnxruntime matches Keras on every output (count, shape, dtype, values within 1e-5
    relative to max(1, |expected|), for unbounded activations such as ``exponential``), at two
    (batch, time) sizes on the same converted model.

Activations are enumerated from ``keras.activations`` / ``tf_keras.activations`` (every public
function whose first argument is ``x``), each as ``Dense(6, activation=...)`` reading the
input beside an LSTM's output sequence; ``ACTIVATION_VARIANTS`` adds argument variants (exact
and approximate GELU, ...) and supplies arguments an activation requires. A case that fails for
a known reason outside this package is a strict xfail naming the reason (it fails the run once
it passes). The last section checks this package's op handlers (``tf2onnx_rnn.handlers``) op by
op against TensorFlow at every opset from 14 to 18, and that ``convert_keras`` registers them.
"""
from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
import textwrap
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

import helpers
import parity
from parity import FEATURES, FLAVORS, UNITS
from tf2onnx_rnn.errors import first_line
from tf2onnx_rnn.handlers import ensure_registered

ROUNDS = ((3, 7), (1, 4))  # (batch, time); fixed-length models keep their own time length
FIXED_TIME = 6  # time length of models whose time axis is fixed (Flatten, Reshape, ...)
VOCAB = 7  # integer inputs are drawn from [0, VOCAB)
INPUT_SCALE = 2.0  # float inputs: standard normal * INPUT_SCALE (activations see about +-7)
TOLERANCE = 1e-5  # relative to max(1, |expected|)
NOT_ACTIVATIONS = frozenset({"get", "serialize", "deserialize"})


# -- cases ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Activation:
    """``Dense(6, activation=name)``, or ``partial(activation, **kwargs)`` when it has kwargs."""

    name: str
    kwargs: tuple = ()  # ((argument, value), ...)
    label: str = ""  # id suffix for a variant

    @property
    def id(self) -> str:
        return f"{self.name}-{self.label}" if self.label else self.name


# Arguments an activation requires, and variants worth their own case. An activation missing
# here that requires an argument fails its test (the build raises), it is never skipped.
ACTIVATION_VARIANTS = {
    "gelu": (Activation("gelu", label="exact"),
             Activation("gelu", (("approximate", True),), "approximate")),
    "threshold": (Activation("threshold", (("threshold", 0.3), ("default_value", -1.5))),),
    "relu": (Activation("relu"),
             Activation("relu", (("negative_slope", 0.1), ("max_value", 2.5), ("threshold", 0.4)),
                        "slope-max-threshold")),
    "celu": (Activation("celu"), Activation("celu", (("alpha", 0.5),), "alpha0.5")),
    "elu": (Activation("elu"), Activation("elu", (("alpha", 0.5),), "alpha0.5")),
}


# tf_keras's names for Keras 3's activation arguments
ARGUMENT_ALIASES = {"negative_slope": "alpha"}


def activation_names(flavor: str) -> list:
    """The public activation functions of the flavor's ``activations`` module."""
    module = parity.keras_module(flavor).activations
    names = []
    for name in dir(module):
        function = getattr(module, name)
        if name.startswith("_") or name in NOT_ACTIVATIONS or not inspect.isfunction(function):
            continue
        parameters = list(inspect.signature(function).parameters)
        if parameters and parameters[0] == "x":
            names.append(name)
    return sorted(names)


def activation_cases(flavor: str) -> list:
    return [case for name in activation_names(flavor)
            for case in ACTIVATION_VARIANTS.get(name, (Activation(name),))]


def build_activation(flavor: str, case: Activation):
    K = parity.keras_module(flavor)
    if case.kwargs:
        function = getattr(K.activations, case.name)
        parameters = inspect.signature(function).parameters
        kwargs = {ARGUMENT_ALIASES.get(k, k) if k not in parameters else k: v for k, v in case.kwargs}
        activation = functools.partial(function, **kwargs)
    else:
        activation = case.name  # as users write it: Dense(..., activation="gelu")
    x = K.Input((None, FEATURES), name="x")
    h = K.layers.LSTM(UNITS, return_sequences=True, name="lstm")(x)
    y = K.layers.Dense(6, activation=activation, name="head")(K.layers.Concatenate()([x, h]))
    return randomized(K.Model(x, y), flavor, case)


@dataclass(frozen=True)
class Layers:
    """A small model around the named layers, built by ``build(K)`` with the given inputs."""

    id: str
    build: Callable  # build(K) -> Keras model; input names are the model's own
    requires: tuple = ()  # layers or activations the flavor must have for the case to exist there
    known_failure: Optional[Callable] = None  # known_failure(flavor) -> reason (strict xfail) or None


def available(flavor: str, case: Layers) -> bool:
    K = parity.keras_module(flavor)
    return all(hasattr(K.layers, name) or hasattr(K.activations, name) for name in case.requires)


def build_layers(flavor: str, case: Layers):
    return randomized(case.build(parity.keras_module(flavor)), flavor, case)


def randomized(model, flavor: str, case):
    """Every floating weight seeded normal * 0.5; variances uniform in [0.5, 2]."""
    rng = np.random.default_rng(zlib.crc32(f"{flavor}/{case.id}".encode()))
    for weight in model.weights:
        dtype = np.dtype(getattr(weight.dtype, "name", weight.dtype))
        if not np.issubdtype(dtype, np.floating):
            continue
        name = getattr(weight, "path", None) or weight.name
        shape = tuple(weight.shape)
        if "variance" in name:
            value = rng.uniform(0.5, 2.0, shape)
        else:
            value = rng.standard_normal(shape) * 0.5
        weight.assign(value.astype(dtype))
    return model


# -- layer models (K is keras or tf_keras) ------------------------------------------------------

def _seq(K, name="x", time=None):
    return K.Input((time, FEATURES), name=name)


def _normalization_given(K):
    x = K.Input((None, WIDE), name="x")
    rng = np.random.default_rng(11)
    mean, variance = rng.standard_normal(WIDE), rng.uniform(0.5, 3.0, WIDE)
    h = K.layers.Normalization(mean=mean.tolist(), variance=variance.tolist())(x)
    return K.Model(x, K.layers.LSTM(UNITS)(h))


def _normalization_adapted(K):
    x = _seq(K)
    layer = K.layers.Normalization()
    layer.adapt(np.random.default_rng(12).standard_normal((16, 3, FEATURES)).astype(np.float32) * 3 + 1)
    return K.Model(x, K.layers.LSTM(UNITS)(layer(x)))


def _layer_normalization(K):
    x = _seq(K)
    h = K.layers.LSTM(UNITS, return_sequences=True)(x)
    return K.Model(x, K.layers.Dense(3)(K.layers.LayerNormalization()(h)))


def _batch_normalization(K):
    x = _seq(K)
    h = K.layers.BatchNormalization()(x)
    h = K.layers.GRU(UNITS, return_sequences=True)(h)
    return K.Model(x, K.layers.BatchNormalization()(h))


def _group_and_unit_normalization(K):
    x = _seq(K)
    h = K.layers.LSTM(UNITS, return_sequences=True)(x)
    return K.Model(x, [K.layers.GroupNormalization(groups=2)(h), K.layers.UnitNormalization()(h)])


def _attention(K):
    x = _seq(K)
    query = K.layers.LSTM(UNITS, return_sequences=True)(x)
    value = K.layers.Dense(UNITS)(x)
    dot = K.layers.Attention()([query, value])
    causal = K.layers.Attention()([query, value], use_causal_mask=True)
    concat = K.layers.Attention(use_scale=True, score_mode="concat")([query, value])
    additive = K.layers.AdditiveAttention()([query, value], use_causal_mask=True)
    return K.Model(x, [dot, causal, concat, additive])


def _multi_head_attention(K):
    x = _seq(K)
    h = K.layers.LSTM(UNITS, return_sequences=True)(x)
    attended = K.layers.MultiHeadAttention(num_heads=2, key_dim=3)(h, h)
    causal = K.layers.MultiHeadAttention(num_heads=2, key_dim=2)(attended, h, use_causal_mask=True)
    return K.Model(x, [K.layers.GRU(UNITS)(attended), causal])


def _conv1d(K):
    x = _seq(K)
    h = K.layers.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu")(x)
    h = K.layers.LSTM(UNITS, return_sequences=True)(h)
    return K.Model(x, K.layers.Conv1D(3, 2, strides=2, padding="same")(h))


def _separable_and_transposed_conv1d(K):
    x = _seq(K)
    h = K.layers.SeparableConv1D(4, 3, padding="same")(x)
    h = K.layers.GRU(UNITS, return_sequences=True)(h)
    return K.Model(x, K.layers.Conv1DTranspose(3, 3, strides=2)(h))


def _pooling(K):
    x = _seq(K)
    h = K.layers.MaxPooling1D(2)(x)
    h = K.layers.LSTM(UNITS, return_sequences=True)(h)
    pooled = K.layers.AveragePooling1D(2, padding="same")(h)
    return K.Model(x, [pooled, K.layers.GlobalAveragePooling1D()(h), K.layers.GlobalMaxPooling1D()(h)])


def _embedding(K, mask_zero=False):
    tokens = K.Input((None,), dtype="int32", name="tokens")
    h = K.layers.Embedding(VOCAB, FEATURES, mask_zero=mask_zero)(tokens)
    return K.Model(tokens, K.layers.LSTM(UNITS)(h))


def _reshape_and_flatten(K):
    x = _seq(K, time=FIXED_TIME)
    h = K.layers.Reshape((FIXED_TIME // 2, 2 * FEATURES))(x)
    h = K.layers.LSTM(UNITS, return_sequences=True)(h)
    return K.Model(x, K.layers.Dense(3)(K.layers.Flatten()(h)))


def _permute(K):
    x = K.Input((FEATURES, FIXED_TIME), name="x")  # features first
    return K.Model(x, K.layers.LSTM(UNITS)(K.layers.Permute((2, 1))(x)))


def _repeat_vector(K):
    x = _seq(K)
    encoded = K.layers.LSTM(UNITS)(x)
    decoded = K.layers.LSTM(UNITS, return_sequences=True)(K.layers.RepeatVector(3)(encoded))
    return K.Model(x, K.layers.TimeDistributed(K.layers.Dense(2))(decoded))


def _dense_dropout(K):
    x = _seq(K)
    h = K.layers.Dropout(0.5)(x)
    h = K.layers.LSTM(UNITS, return_sequences=True, dropout=0.3, recurrent_dropout=0.2)(h)
    h = K.layers.Dropout(0.5)(h)
    return K.Model(x, K.layers.Dense(2)(K.layers.Dense(3, activation="tanh")(h)))


def _time_distributed_dynamic_time(K):
    x = _seq(K)
    h = K.layers.LSTM(UNITS, return_sequences=True)(x)
    return K.Model(x, K.layers.TimeDistributed(K.layers.Dense(3))(h))


def _recurrent_activations(K):
    x = _seq(K)
    h = K.layers.LSTM(UNITS, activation="gelu", return_sequences=True)(x)  # Erfc in the loop body
    return K.Model(x, K.layers.SimpleRNN(UNITS, activation="selu")(h))


def _gru_celu(K):
    x = _seq(K)
    return K.Model(x, K.layers.GRU(UNITS, activation="celu")(x))  # Expm1 in the loop body


def _conv_lstm1d(K):
    x = _seq(K)
    h = K.layers.Reshape((-1, FEATURES, 1))(x)
    return K.Model(x, K.layers.ConvLSTM1D(2, 3, padding="same")(h))


def _noise_layers(K):
    x = _seq(K)
    h = K.layers.GaussianNoise(0.3)(x)
    h = K.layers.GaussianDropout(0.3)(h)
    h = K.layers.SpatialDropout1D(0.3)(h)
    h = K.layers.AlphaDropout(0.3)(h)
    h = K.layers.ActivityRegularization(0.1, 0.1)(h)
    return K.Model(x, K.layers.SimpleRNN(UNITS)(h))


def _crop_pad_upsample(K):
    x = _seq(K)
    h = K.layers.ZeroPadding1D((1, 2))(x)
    h = K.layers.UpSampling1D(2)(h)
    h = K.layers.Cropping1D((2, 1))(h)
    return K.Model(x, K.layers.GRU(UNITS)(h))


def _activation_layers(K):
    x = _seq(K)
    h = K.layers.LSTM(UNITS, return_sequences=True)(x)
    h = K.layers.Dense(6)(h)
    outputs = [K.layers.ReLU(max_value=1.0, negative_slope=0.1, threshold=0.2)(h), K.layers.LeakyReLU()(h),
               K.layers.PReLU(shared_axes=[1])(h), K.layers.ELU(alpha=0.7)(h), K.layers.Softmax()(h),
               K.layers.Rescaling(0.5, offset=0.25)(h)]
    return K.Model(x, outputs)


def _merging(K):
    a, b = _seq(K, "a"), _seq(K, "b")
    ha = K.layers.LSTM(UNITS, return_sequences=True)(a)
    hb = K.layers.GRU(UNITS, return_sequences=True)(b)
    L = K.layers
    outputs = [L.Add()([ha, hb]), L.Subtract()([ha, hb]), L.Multiply()([ha, hb]), L.Average()([ha, hb]),
               L.Maximum()([ha, hb]), L.Minimum()([ha, hb]), L.Concatenate()([ha, hb]),
               L.Dot(axes=2, normalize=True)([ha, hb])]
    return K.Model([a, b], outputs)


def _discretization(K):
    values = K.Input((None,), name="values")
    buckets = K.layers.Discretization(bin_boundaries=[-2.0, -0.5, 0.0, 0.7, 2.5])(values)
    h = K.layers.Embedding(6, FEATURES)(buckets)
    return K.Model(values, K.layers.LSTM(UNITS)(h))


# -- layers holding captured constants and variables -------------------------------------------

# Captured tensors of up to 128 elements are folded into the traced graph as constants, larger
# ones stay captures (placeholders) until frozen: the captured-constant cases are bigger than that.
PATCHES = 144  # a 12 x 12 grid of patches
WIDE = 130  # features of the Normalization and non-trainable-variable cases


@functools.lru_cache(maxsize=None)
def custom_layers(K) -> dict:
    """Custom layer classes for the flavor module ``K`` (made once: Keras names classes)."""
    import tensorflow as tf

    class PatchEncoder(K.layers.Layer):
        """ViT-style patch encoder: a projection plus a learned embedding of the positions,
        with the positions (``tf.range``) and a fixed sinusoid table (``tf.constant``) made in
        ``__init__`` and captured by ``call``."""

        def __init__(self, patches, dim, **kwargs):
            super().__init__(**kwargs)
            self.positions = tf.range(start=0, limit=patches, delta=1)
            angles = np.arange(patches)[:, None] / 10.0 ** (np.arange(dim)[None, :] / dim)
            self.table = tf.constant(np.where(np.arange(dim) % 2, np.cos(angles), np.sin(angles)), tf.float32)
            self.projection = K.layers.Dense(dim)
            self.position_embedding = K.layers.Embedding(patches, dim)

        def call(self, patches):
            return self.projection(patches) + self.position_embedding(self.positions) + self.table

    class NonTrainableScale(K.layers.Layer):
        """``x * scale + shift``: ``scale`` a non-trainable weight, ``shift`` a non-trainable
        ``tf.Variable`` made in ``__init__``."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.shift = tf.Variable(np.linspace(-1.0, 1.0, WIDE, dtype=np.float32), trainable=False)

        def build(self, input_shape):
            self.scale = self.add_weight(name="scale", shape=(int(input_shape[-1]),), initializer="ones",
                                         trainable=False)
            super().build(input_shape)

        def call(self, x):
            return x * self.scale + self.shift

    return {"PatchEncoder": PatchEncoder, "NonTrainableScale": NonTrainableScale}


def _patch_position_embedding(K):
    patches = _seq(K, "patches", time=PATCHES)
    h = custom_layers(K)["PatchEncoder"](PATCHES, 8)(patches)
    return K.Model(patches, K.layers.LSTM(UNITS)(h))


def _non_trainable_variable(K):
    x = K.Input((None, WIDE), name="x")
    return K.Model(x, K.layers.LSTM(UNITS)(custom_layers(K)["NonTrainableScale"]()(x)))


LAYER_CASES = [
    Layers("normalization-mean-variance", _normalization_given),
    Layers("normalization-adapted", _normalization_adapted),
    Layers("layer-normalization", _layer_normalization),
    Layers("batch-normalization", _batch_normalization),
    Layers("group-unit-normalization", _group_and_unit_normalization, ("GroupNormalization", "UnitNormalization")),
    Layers("attention-additive-attention-causal", _attention),
    Layers("multi-head-attention-causal", _multi_head_attention),
    Layers("conv1d-causal-strided", _conv1d),
    Layers("separable-conv1d-conv1d-transpose", _separable_and_transposed_conv1d),
    Layers("pooling-1d", _pooling),
    Layers("embedding", _embedding),
    Layers("embedding-mask-zero", functools.partial(_embedding, mask_zero=True)),
    Layers("reshape-flatten", _reshape_and_flatten),
    Layers("permute", _permute),
    Layers("repeat-vector-time-distributed", _repeat_vector),
    Layers("dense-dropout", _dense_dropout),
    Layers("time-distributed-dense-dynamic-time", _time_distributed_dynamic_time),
    Layers("lstm-gelu-simple-rnn-selu", _recurrent_activations),
    Layers("gru-celu", _gru_celu, ("celu",)),
    Layers("conv-lstm1d", _conv_lstm1d, ("ConvLSTM1D",)),
    Layers("noise-and-dropout-layers", _noise_layers),
    Layers("zero-padding-upsampling-cropping", _crop_pad_upsample),
    Layers("activation-layers-rescaling", _activation_layers),
    Layers("merging-layers-two-inputs", _merging),
    Layers("discretization", _discretization),
    Layers("custom-patch-position-embedding", _patch_position_embedding),
    Layers("custom-non-trainable-variable", _non_trainable_variable),
]


def _params(cases_of) -> list:
    params = []
    for flavor in FLAVORS:
        for case in cases_of(flavor):
            reason = case.known_failure(flavor) if getattr(case, "known_failure", None) else None
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(pytest.param(flavor, case, id=f"{flavor}-{case.id}", marks=marks))
    return params


# -- checks -----------------------------------------------------------------------------------

def model_inputs(model) -> list:
    """(name, shape without batch, numpy dtype) of each Keras model input, in order."""
    result = []
    for tensor in model.inputs:
        name = str(getattr(tensor, "name", "")).split(":")[0]
        dtype = np.dtype(getattr(tensor.dtype, "name", tensor.dtype))
        result.append((name, tuple(tensor.shape)[1:], dtype))
    return result


def make_arrays(model, batch: int, time: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    arrays = []
    for _, shape, dtype in model_inputs(model):
        full = (batch,) + tuple(time if d is None else int(d) for d in shape)
        if np.issubdtype(dtype, np.integer):
            arrays.append(rng.integers(0, VOCAB, full).astype(dtype))
        else:
            arrays.append((rng.standard_normal(full) * INPUT_SCALE).astype(dtype))
    return arrays


def keras_outputs(model, arrays: list) -> list:
    result = model(arrays if len(arrays) > 1 else arrays[0], training=False)
    if not isinstance(result, (list, tuple)):
        result = [result]
    return [np.asarray(r) for r in result]


def problems_of(flavor: str, case) -> tuple:
    """(problems, converted proto) for one case: graph inputs, then every round's outputs."""
    build = build_activation if isinstance(case, Activation) else build_layers
    entry = parity.converted_with(flavor, case, build)
    model, proto = entry.model, entry.proto
    problems = []
    keras_inputs = model_inputs(model)
    want_names = [name for name, _, _ in keras_inputs]
    onnx_names = [i.name for i in proto.graph.input]
    if onnx_names != want_names:
        problems.append(f"graph inputs {onnx_names}, the Keras model's are {want_names}")
        return problems, proto
    try:
        session = helpers.ort_session(proto)
    except Exception as error:  # noqa: BLE001 - the message is the finding
        return problems + [f"onnxruntime cannot load the model: {first_line(error)}"], proto
    output_names = [o.name for o in proto.graph.output]
    for round_index, (batch, time) in enumerate(ROUNDS):
        arrays = make_arrays(model, batch, time, seed=zlib.crc32(f"{flavor}/{case.id}/{round_index}".encode()))
        label = f"batch {batch}, time {time}"
        expected = keras_outputs(model, arrays)
        try:
            actual = parity.run_onnx(session, want_names, arrays)
        except Exception as error:  # noqa: BLE001
            problems.append(f"{label}: onnxruntime failed: {first_line(error)}")
            continue
        problems += [f"{label}, output {i}: ONNX dtype {got.dtype}, Keras {want.dtype}"
                     for i, (want, got) in enumerate(zip(expected, actual)) if got.dtype != want.dtype]
        # relative to max(1, |expected|): activations such as exponential are unbounded
        scales = [np.maximum(1.0, np.abs(want.astype(np.float64))) for want in expected]
        problems += parity.output_problems(
            label, output_names, [want.astype(np.float64) / s for want, s in zip(expected, scales)],
            [got.astype(np.float64) / s if got.shape == s.shape else got for got, s in zip(actual, scales)],
            TOLERANCE)[0]
    return problems, proto


def check(flavor: str, case) -> None:
    problems, _ = problems_of(flavor, case)
    if problems:
        pytest.fail(f"{flavor} {case.id}:\n- " + "\n- ".join(problems), pytrace=False)


@pytest.mark.parametrize("flavor, case", _params(activation_cases))
def test_activation_matches_keras(flavor: str, case: Activation):
    check(flavor, case)


@pytest.mark.parametrize("flavor, case", _params(lambda flavor: [c for c in LAYER_CASES if available(flavor, c)]))
def test_layers_match_keras(flavor: str, case: Layers):
    check(flavor, case)


def test_cases_cover_the_required_activations_and_unique_ids():
    """The enumeration finds what each Keras has (``keras`` is Keras 2, flavor "keras2", on
    TensorFlow 2.15)."""
    keras2 = {"elu", "exponential", "gelu", "hard_sigmoid", "linear", "mish", "relu", "selu", "sigmoid",
              "softmax", "softplus", "softsign", "swish", "tanh"}
    keras3 = keras2 | {"celu", "glu", "hard_silu", "hard_tanh", "leaky_relu", "log_softmax", "silu", "sparse_plus",
                       "squareplus", "tanh_shrink", "threshold"}
    assert set(activation_names(FLAVORS[0])) >= (keras3 if parity.KERAS3 else keras2)
    assert set(activation_names("tf_keras")) >= keras2
    for flavor in FLAVORS:
        ids = [c.id for c in activation_cases(flavor)]
        assert len(ids) == len(set(ids))
        assert {"gelu-exact", "gelu-approximate"} <= set(ids)
    assert len({c.id for c in LAYER_CASES}) == len(LAYER_CASES)
    assert all(available(flavor, c) for flavor in FLAVORS for c in LAYER_CASES if not c.requires)


# -- the op handlers, op by op ------------------------------------------------------------------

BOUNDARIES = [-3.0, -1.0, -0.25, 0.0, 0.5, 2.0]
HANDLED_OPS = frozenset({"Erfc", "Expm1", "Bucketize"})


@functools.lru_cache(maxsize=None)
def handler_function():
    """Each handled op on a float32 and a float64 input; outputs keyed ``<op>_<dtype>``."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x32"),
                                  tf.TensorSpec([None], tf.float64, name="x64")])
    def ops(x32, x64):
        outputs = {}
        for dtype, x in (("float32", x32), ("float64", x64)):
            outputs.update({f"erfc_{dtype}": tf.math.erfc(x), f"expm1_{dtype}": tf.math.expm1(x),
                            f"bucketize_{dtype}": tf.raw_ops.Bucketize(input=x, boundaries=BOUNDARIES),
                            f"bucketize-empty_{dtype}": tf.raw_ops.Bucketize(input=x, boundaries=[])})
        return outputs

    return ops


def handler_inputs(dtype, nan: bool = False) -> np.ndarray:
    grid = np.linspace(-12.0, 12.0, 4801)  # steps of 0.005
    near_zero = np.linspace(-1e-3, 1e-3, 401)
    special = [0.0, -0.0, 1e-30, -1e-30, 1e-7, 80.0, 88.7, 88.8, 120.0, -120.0, np.inf, -np.inf] + BOUNDARIES
    return np.concatenate([grid, near_zero, special] + ([[np.nan, 1.0, np.nan]] if nan else [])).astype(dtype)


def run_handler_function(opset: int, nan: bool = False) -> tuple:
    """(expected, actual) outputs of :func:`handler_function` converted at ``opset``."""
    import onnx
    import tf2onnx

    ensure_registered()
    function = handler_function()
    proto, _ = tf2onnx.convert.from_function(function, input_signature=function.input_signature, opset=opset)
    onnx.checker.check_model(proto, full_check=True)
    left = sorted(set(helpers.op_types(proto)) & HANDLED_OPS)
    assert not left, f"TF ops left in the graph: {left}"
    arrays = [handler_inputs("float32", nan), handler_inputs("float64", nan)]
    expected = {key: value.numpy() for key, value in function(*arrays).items()}
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    assert len(names) == 2, names
    feeds = dict(zip(names, arrays if "32" in names[0] else arrays[::-1]))
    actual = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    assert sorted(actual) == sorted(expected)
    return expected, actual


@pytest.mark.parametrize("opset", range(14, 19))
def test_handlers_match_tensorflow(opset: int):
    """Erfc within 1e-6 absolute, Expm1 within 1e-6 relative (1e-14 for float64) and
    Bucketize exactly, against TensorFlow, infinities included; none of the TF ops is left."""
    expected, actual = run_handler_function(opset)
    for key, want in expected.items():
        got = actual[key]
        op, dtype = key.split("_")
        assert got.dtype == want.dtype and got.shape == want.shape, (key, got.dtype, got.shape)
        if op.startswith("bucketize"):
            np.testing.assert_array_equal(got, want, err_msg=key)
            continue
        infinite = np.isinf(want)
        assert np.array_equal(np.isinf(got), infinite) and np.all(got[infinite] == want[infinite]), key
        finite = np.isfinite(want)
        error = np.abs(got[finite].astype(np.float64) - want[finite])
        if op == "erfc":
            assert error.max() <= 1e-6, f"{key}: max abs error {error.max():.3g}"
        else:
            relative = error / np.maximum(np.abs(want[finite]), np.finfo(dtype).tiny)
            limit = 1e-6 if dtype == "float32" else 1e-14
            assert relative.max() <= limit, f"{key}: max relative error {relative.max():.3g}"


def test_handlers_propagate_nan_in_expm1_and_bucketize():
    """Expm1(NaN) is NaN; Bucketize puts NaN in the last bucket, as TensorFlow does. (Erfc(NaN)
    is whatever onnxruntime's Erf gives: NaN in 1.31, 1.0 in older releases.)"""
    expected, actual = run_handler_function(17, nan=True)
    for key, want in expected.items():
        got = actual[key][-3:]
        if key.startswith("bucketize"):
            np.testing.assert_array_equal(got, want[-3:], err_msg=key)
        elif key.startswith("expm1"):
            assert np.isnan(got[[0, 2]]).all() and not np.isnan(got[1]), f"{key}: {got}"


def test_conversion_registers_the_handlers_lazily_and_keeps_tf2onnx_handlers():
    """In a fresh process: importing the package imports neither TensorFlow nor tf2onnx;
    ``convert_keras`` registers the handlers itself (an exact-GELU model converts and matches
    Keras without any call to ``ensure_registered``), through tf2onnx's registry, leaving an op
    that already has a handler (one registered first, as a future tf2onnx would) alone; and
    ``ensure_registered`` is idempotent."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import tf2onnx_rnn, tf2onnx_rnn.handlers
        assert "tensorflow" not in sys.modules and "tf2onnx" not in sys.modules, "imported eagerly"
        from tf2onnx import handler
        import tf2onnx.tfonnx

        @handler.tf_op("Expm1")
        class Theirs:
            @classmethod
            def version_1(cls, ctx, node, **kwargs):
                pass

        import keras
        sys.path.insert(0, sys.argv[1])  # tests/, for helpers
        import helpers
        x = keras.Input((None, 3), name="x")
        model = keras.Model(x, keras.layers.Dense(4, activation="gelu")(keras.layers.LSTM(2, return_sequences=True)(x)))
        proto = tf2onnx_rnn.convert_keras(model)
        data = np.linspace(-4, 4, 2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
        session = helpers.ort_session(proto)
        error = np.abs(session.run(None, {"x": data})[0] - np.asarray(model(data, training=False))).max()
        assert error <= 1e-5, error
        assert tf2onnx_rnn.handlers._REGISTERED, "convert_keras did not register the handlers"
        registered = tf2onnx_rnn.handlers.ensure_registered()
        assert registered == tf2onnx_rnn.handlers.ensure_registered(), "not idempotent"
        # Expm1 is "theirs" here, kept; the others this package adds are its own
        assert registered["Expm1"] is False and registered["Erfc"] and registered["Bucketize"], registered
        assert all(registered[op] for op in ("IRFFT", "Real", "Imag")), registered
        mapping = handler.tf_op.create_mapping(17, [])
        assert mapping["Expm1"][0].__self__ is Theirs, "an existing handler was replaced"
        assert mapping["Erfc"][0].__module__.startswith("tf2onnx_rnn.handlers."), mapping["Erfc"]
        print("ok")
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    tests = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, "-c", script, tests], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
