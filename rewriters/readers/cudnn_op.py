"""A cuDNN recurrent op as the readers see it: ``CudnnRNN``, ``CudnnRNNV2`` or ``CudnnRNNV3``, its input and
output positions, its mode and sizes (:mod:`.cudnn_params`), and what ONNX cannot compute of it, refused
with the reason:

- ``num_proj`` (V3): a projection of each output, which ONNX's LSTM has not;
- ``input_mode``: ``skip_input`` adds the input to each gate of layer 0, exact as identity input matrices where
  the input and hidden sizes are equal (``auto_select`` skips exactly then); other sizes are refused;
- ``dropout`` between layers while ``is_training``: random, refused where the op has several layers;
- the number of layers x directions comes from the initial state's static shape, the hidden size from its
  last axis and the features from the input's (either of the two solved from ``params``' size where
  unknown); ``params`` must evaluate to constants (a constant, a frozen variable, or a concatenation of the
  layer's kernels, as Keras writes it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cells.evaluate import NotEvaluable, attr, evaluate
from ..description import NoMatch, require
from .cudnn_params import MODES, Layout, Mode, solve_features, solve_hidden

OPS = ("CudnnRNN", "CudnnRNNV2", "CudnnRNNV3")
X, H, C, PARAMS, LENGTHS = range(5)  # the op's inputs
Y, H_OUT, C_OUT = range(3)  # its outputs read


def mode_of(node) -> Mode:
    mode = MODES.get(str(attr(node, "rnn_mode", "lstm")))
    require(mode is not None, f"{node.type}'s rnn_mode {attr(node, 'rnn_mode')!r} is none of "
            f"{', '.join(MODES)}", node.name)
    return mode


@dataclass(frozen=True)
class CudnnOp:
    """One op: its node, mode, layout, layout of its tensors, and its weights' flat buffer."""

    node: object
    mode: Mode
    layout: Layout
    time_major: bool
    params: np.ndarray  # the flat buffer's values

    @property
    def dtype(self) -> np.dtype:
        return self.params.dtype

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def what(self) -> str:
        return f"{self.node.type} ({self.mode.name})"

    @property
    def time_axis(self) -> int:
        return 0 if self.time_major else 1

    @property
    def state_axis(self) -> int:
        """The axis of layers x directions in the initial and final states: [L*D, B, H] time-major,
        [B, L*D, H] batch-major."""
        return 0 if self.time_major else 1


def read_op(graph, node) -> CudnnOp:
    """The op's mode, sizes and layout, or :class:`NoMatch` naming what ONNX cannot compute."""
    mode = mode_of(node)
    what = f"{node.type} ({mode.name})"
    require(int(attr(node, "num_proj", 0) or 0) == 0, f"{what} projects its output (num_proj): ONNX's "
            f"{mode.onnx_op} has no projection", node.name)
    direction = str(attr(node, "direction", "unidirectional"))
    require(direction in ("unidirectional", "bidirectional"), f"{what}'s direction {direction!r}", node.name)
    directions = 2 if direction == "bidirectional" else 1
    time_major_ = bool(attr(node, "time_major", True)) if node.type == "CudnnRNNV3" else True
    x_shape, h_shape = graph.get_shape(node.input[X]) or [], graph.get_shape(node.input[H]) or []
    require(len(x_shape) in (0, 3), f"{what}'s input is not of rank 3", node.name)
    features = x_shape[-1] if x_shape and x_shape[-1] not in (None, -1) else None
    state_axis = 0 if time_major_ else 1
    pseudo = h_shape[state_axis] if len(h_shape) == 3 else -1
    require(pseudo not in (None, -1) and pseudo > 0 and pseudo % directions == 0, f"{what}'s number of layers is "
            "not known statically (its initial state's layers x directions axis)", node.name)
    try:
        params = np.asarray(evaluate(graph, node.input[PARAMS]))
    except NotEvaluable as error:
        raise NoMatch(f"{what}'s params are not constant: {error.reason}", error.node_name) from error
    require(params.dtype.name in ("float32", "float16"), f"{what} computes in {params.dtype}: onnxruntime's "
            "recurrent nodes run float32 and float16 only, and no loop is left to compute it otherwise", node.name)
    layers = pseudo // directions
    input_mode = str(attr(node, "input_mode", "linear_input"))
    require(input_mode in ("linear_input", "skip_input", "auto_select"), f"{what}'s input_mode {input_mode!r}",
            node.name)
    hidden = h_shape[-1] if h_shape[-1] not in (None, -1) else None
    require(hidden is not None or features is not None, f"{what}'s input features and hidden size are not known "
            "statically", node.name)
    if hidden is None:
        skip = {"skip_input": True, "auto_select": None}.get(input_mode, False)
        hidden = solve_hidden(mode, params.size, features, layers, directions, skip)
    elif features is None:
        features = solve_features(mode, params.size, hidden, layers, directions, input_mode)
    require(hidden is not None and features is not None, f"{what}'s params ({params.size} values) fit no sizes of "
            f"{layers} layer(s) in {directions} direction(s)", node.name)
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and features == hidden)
    require(not skip or features == hidden, f"{what} uses input_mode='skip_input' with {features} input features "
            f"and hidden size {hidden}: it adds its input to each gate only where the two are equal", node.name)
    dropout = float(attr(node, "dropout", 0.0) or 0.0)
    require(layers == 1 or dropout == 0 or not attr(node, "is_training", True), f"{what} drops out {dropout:g} of "
            "each layer's outputs at random between its layers (is_training): ONNX's nodes compute no dropout",
            node.name)
    layout = Layout(mode, layers, directions, int(hidden), features, skip)
    return CudnnOp(node, mode, layout, time_major_, params)
