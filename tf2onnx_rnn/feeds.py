"""The inputs a check feeds a converted model: seeded random rounds at two sizes of every dynamic
dimension (so a model right only for the traced length or batch fails), a streamed model's states fed
zeros apart from the source's inputs, and the inputs and outputs the model takes NCHW where its source
takes them NHWC (both read from the model's report).
"""
from __future__ import annotations

import contextvars
from typing import Optional

import numpy as np
import onnx

from .inputs import random_inputs
from .report import ConversionReport

# (batch size, time: the size of dimension 1) of each verification round; every later dynamic
# dimension takes a size of its own (:func:`round_sizes`), so no two dynamic dimensions are alike
ROUNDS = ((2, 5), (3, 9))
# the rounds a check feeds where they are given rather than random: a quantized model's calibration data
GIVEN_ROUNDS: contextvars.ContextVar = contextvars.ContextVar("tf2onnx_rnn_given_rounds", default=None)


def round_sizes(batch: int, time: int, rank: int = 8) -> dict:
    """Axis -> size of a round's dynamic dimensions: ``batch``, ``time``, then ``time + 2``,
    ``time + 3``... (all distinct where ``batch < time``)."""
    return {0: batch, 1: time, **{axis: time + axis for axis in range(2, rank)}}


def onnx_input_specs(model_proto: onnx.ModelProto, defaulted: bool = False) -> list:
    """(name, shape with None for dynamic dims, numpy dtype) of each graph input a caller must feed
    (with ``defaulted``, also of each one an initializer gives a default: a streamed state's)."""
    initializers = {i.name for i in model_proto.graph.initializer}
    specs = []
    for value in model_proto.graph.input:
        if value.name in initializers and not defaulted:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        specs.append((value.name, shape, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    return specs


def fed_specs(model_proto: onnx.ModelProto) -> list:
    """The specs (:func:`onnx_input_specs`) of the inputs a check feeds: a streamed model's states are fed apart."""
    state_inputs, _ = streamed_states(model_proto)
    return [spec for spec in onnx_input_specs(model_proto) if spec[0] not in state_inputs]


def feed_rounds(model_proto: onnx.ModelProto, seed: int, inputs: Optional[list]) -> tuple:
    """(the specs of the inputs a check feeds, its rounds of arrays in their order): ``inputs``, or the rounds
    :data:`GIVEN_ROUNDS` holds, or one round of seeded random arrays per :data:`ROUNDS` entry. A streamed
    model's state inputs are fed apart (:func:`feeds_of`)."""
    specs = fed_specs(model_proto)
    given = GIVEN_ROUNDS.get()
    rounds = [inputs] if inputs is not None else list(given) if given is not None else [
        random_inputs(specs, seed + i, round_sizes(batch, time)) for i, (batch, time) in enumerate(ROUNDS)]
    return specs, rounds


def feeds_of(model_proto: onnx.ModelProto, specs: list, arrays: list) -> dict:
    """One round's feeds by input name: the arrays, and a streamed model's states as zeros (its usual start)."""
    state_inputs, _ = streamed_states(model_proto)
    feeds = {name: a for (name, _, _), a in zip(specs, arrays)}
    batch = len(arrays[0]) if arrays and np.ndim(arrays[0]) else 1
    feeds.update({name: np.zeros([batch if shape[0] is None else shape[0]] + shape[1:], dtype)
                  for name, shape, dtype in onnx_input_specs(model_proto, defaulted=True) if name in state_inputs})
    return feeds


def check_feeds(model_proto: onnx.ModelProto, seed: int = 0) -> list:
    """The feeds, round by round, the output shape check and verification give the model (by default)."""
    specs, rounds = feed_rounds(model_proto, seed, None)
    return [feeds_of(model_proto, specs, arrays) for arrays in rounds]


def streamed_states(model_proto: onnx.ModelProto) -> tuple:
    """(state input names, state output names) of a streamed model, from its report."""
    report = ConversionReport.of_model(model_proto)
    rows = report.outcomes if report is not None else []
    return ({name for o in rows for name in o.state_inputs if name},
            {name for o in rows for name in o.state_outputs})


def transposed(model_proto: onnx.ModelProto) -> tuple:
    """(inputs, outputs) the model takes or gives NCHW where its source has them NHWC, from its report."""
    report = ConversionReport.of_model(model_proto)
    return (set(report.nchw_inputs), set(report.nchw_outputs)) if report is not None else (set(), set())


def nhwc(array):
    """An NCHW array as its source takes it."""
    return np.transpose(array, (0, 2, 3, 1))


def nchw(array):
    """A source's NHWC array as the model gives it."""
    return np.transpose(np.asarray(array), (0, 3, 1, 2))
