"""The hand-built floor: Transpose -> one native LSTM/GRU/RNN node -> Transpose, nothing else.

Weights are mapped from the Keras layer by the documented rules (ONNX gate order, kernels
transposed, one Keras bias in Wb), independently of the converter, so the floor is also a
check on the converter: for unmasked layers its outputs must equal Keras's.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

# Keras gate blocks -> ONNX order
_GATE_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [0, 1, 2], "RNN": [0]}


def _blocks(matrix: np.ndarray, gates: int, order: list) -> np.ndarray:
    parts = np.split(matrix, gates, axis=-1)
    return np.concatenate([parts[i] for i in order], axis=-1)


def onnx_weights(op: str, kernel: np.ndarray, recurrent: np.ndarray, bias: np.ndarray):
    """W [G*H, F], R [G*H, H], B [2*G*H] from Keras kernel [F, G*H], recurrent [H, G*H] and bias."""
    order = _GATE_ORDER[op]
    gates = len(order)
    hidden = recurrent.shape[0]
    W = _blocks(kernel, gates, order).T
    R = _blocks(recurrent, gates, order).T
    bias = np.asarray(bias)
    if bias.ndim == 2:  # GRU reset_after: [input bias, recurrent bias]
        B = np.concatenate([_blocks(bias[0], gates, order), _blocks(bias[1], gates, order)])
    else:
        B = np.concatenate([_blocks(bias, gates, order), np.zeros(gates * hidden, bias.dtype)])
    return W.astype(np.float32), R.astype(np.float32), B.astype(np.float32)


def build(op: str, directions: list, features: int, hidden: int, masked: bool,
          linear_before_reset: bool = True) -> onnx.ModelProto:
    """``directions``: one (W, R, B) per direction (two means bidirectional).

    Input ``x`` [B, T, F] (and ``lengths`` [B] int32 when masked); output ``y`` [B, T, D*H]
    for one direction, [B, T, D, H] transposed back for two.
    """
    count = len(directions)
    stacked = [np.stack([d[i] for d in directions]) for i in range(3)]
    initializers = [helper.make_tensor(name, TensorProto.FLOAT, value.shape, value.ravel())
                    for name, value in zip(("W", "R", "B"), stacked)]
    attrs = {"hidden_size": hidden, "direction": "bidirectional" if count == 2 else "forward"}
    if op == "GRU":
        attrs["linear_before_reset"] = int(linear_before_reset)
    inputs = ["x_tm", "W", "R", "B"] + (["lengths"] if masked else [])
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
        helper.make_node(op, inputs, ["Y"], **attrs),
        helper.make_node("Transpose", ["Y"], ["y"], perm=[2, 0, 1, 3]),
    ]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", features])]
    if masked:
        graph_inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, ["batch"]))
    graph = helper.make_graph(nodes, "minimal", graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
