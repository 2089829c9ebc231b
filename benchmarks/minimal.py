"""The hand-built floors: Transpose -> one native LSTM/GRU/RNN node -> Transpose, nothing else
(:func:`build`), and SimpleRNN's as an input MatMul and a Scan (:func:`build_scan`).

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
          linear_before_reset: bool = True, lengths_from: str = "") -> onnx.ModelProto:
    """``directions``: one (W, R, B) per direction (two means bidirectional).

    Input ``x`` [B, T, F] (and ``lengths`` [B] int32 when masked); output ``y`` [B, T, D*H]
    for one direction, [B, T, D, H] transposed back for two. ``lengths_from``: the lengths are
    computed in the graph instead of fed: ``"x"``, each row's steps with a feature other than 0
    counted, as Keras's ``Masking`` computes its mask (``any(x != 0, -1)``); ``"mask"``, the kept
    steps of a bool ``mask`` input [B, T] counted. That floor is exact for post-padded rows only.
    """
    count = len(directions)
    stacked = [np.stack([d[i] for d in directions]) for i in range(3)]
    initializers = [helper.make_tensor(name, TensorProto.FLOAT, value.shape, value.ravel())
                    for name, value in zip(("W", "R", "B"), stacked)]
    attrs = {"hidden_size": hidden, "direction": "bidirectional" if count == 2 else "forward"}
    if op == "GRU":
        attrs["linear_before_reset"] = int(linear_before_reset)
    inputs = ["x_tm", "W", "R", "B"] + (["lengths"] if masked else [])
    nodes = []
    if masked and lengths_from == "x":
        initializers.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
        nodes += [helper.make_node("Equal", ["x", "zero"], ["padding"]), helper.make_node("Not", ["padding"], ["some"]),
                  helper.make_node("Cast", ["some"], ["some_u8"], to=TensorProto.UINT8),
                  helper.make_node("ReduceMax", ["some_u8"], ["kept_u8"], axes=[2], keepdims=0),
                  helper.make_node("Cast", ["kept_u8"], ["kept"], to=TensorProto.INT32)]
    elif masked and lengths_from == "mask":
        nodes.append(helper.make_node("Cast", ["mask"], ["kept"], to=TensorProto.INT32))
    if masked and lengths_from:
        initializers.append(helper.make_tensor("time_axis", TensorProto.INT64, [1], [1]))
        nodes.append(helper.make_node("ReduceSum", ["kept", "time_axis"], ["lengths"], keepdims=0))
    nodes += [
        helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
        helper.make_node(op, inputs, ["Y"], **attrs),
        helper.make_node("Transpose", ["Y"], ["y"], perm=[2, 0, 1, 3]),
    ]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", features])]
    if masked and lengths_from == "mask":
        graph_inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "time"]))
    elif masked and not lengths_from:
        graph_inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, ["batch"]))
    graph = helper.make_graph(nodes, "minimal", graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def build_scan(directions: list, features: int, hidden: int, masked: bool) -> onnx.ModelProto:
    """SimpleRNN's floor in onnxruntime's fastest form: per direction, x W^T + b over every step as
    one MatMul, then a Scan whose body is h R^T, an Add and a Tanh (with ``lengths``: outputs past a
    row's length zeroed after the Scan, the backward direction reversed within each row's length).
    ``directions``: (W, R, B) per direction, as :func:`onnx_weights` gives them for ``RNN``.
    Output ``y`` [B, T, D*H]."""
    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
             helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Gather", ["x_shape", "zero_i"], ["batch"], axis=0),
             helper.make_node("Concat", ["batch", "hidden"], ["h0_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["h0_shape"], ["h0"])]
    initializers = [helper.make_tensor("zero_i", TensorProto.INT64, [1], [0]),
                    helper.make_tensor("hidden", TensorProto.INT64, [1], [hidden])]
    if masked:
        nodes += [helper.make_node("Gather", ["x_shape", "one_i"], ["time"], axis=0),
                  helper.make_node("Squeeze", ["time"], ["time_s"]),
                  helper.make_node("Range", ["zero_s", "time_s", "one_s"], ["steps"]),
                  helper.make_node("Cast", ["lengths"], ["lengths64"], to=TensorProto.INT64),
                  helper.make_node("Unsqueeze", ["steps", "one_i"], ["steps_col"]),
                  helper.make_node("Unsqueeze", ["lengths64", "zero_i"], ["lengths_row"]),
                  helper.make_node("Less", ["steps_col", "lengths_row"], ["within_tb"]),
                  helper.make_node("Unsqueeze", ["within_tb", "two_i"], ["within"])]
        initializers += [helper.make_tensor("one_i", TensorProto.INT64, [1], [1]),
                         helper.make_tensor("two_i", TensorProto.INT64, [1], [2]),
                         helper.make_tensor("zero_s", TensorProto.INT64, [], [0]),
                         helper.make_tensor("one_s", TensorProto.INT64, [], [1]),
                         helper.make_tensor("zero_f", f32, [], [0.0])]
    outputs = []
    for index, (W, R, B) in enumerate(directions):
        backward, d = index == 1, f"d{index}"
        initializers += [helper.make_tensor(f"W_T_{d}", f32, W.T.shape, W.T.ravel()),
                         helper.make_tensor(f"b_{d}", f32, [hidden], B[:hidden] + B[hidden:])]
        nodes += [helper.make_node("MatMul", ["x_tm", f"W_T_{d}"], [f"xw_{d}"]),
                  helper.make_node("Add", [f"xw_{d}", f"b_{d}"], [f"xwb_{d}"])]
        scanned = f"xwb_{d}"
        if masked and backward:
            nodes.append(helper.make_node("ReverseSequence", [scanned, "lengths64"], [f"xwb_r_{d}"],
                                          batch_axis=1, time_axis=0))
            scanned = f"xwb_r_{d}"
        body = [helper.make_node("MatMul", ["h", "R_T"], ["hr"]), helper.make_node("Add", ["xw_t", "hr"], ["a"]),
                helper.make_node("Tanh", ["a"], ["h_out"]), helper.make_node("Identity", ["h_out"], ["y_t"])]
        body_inputs = [helper.make_tensor_value_info("h", f32, ["batch", hidden]),
                       helper.make_tensor_value_info("xw_t", f32, ["batch", hidden])]
        body_outputs = [helper.make_tensor_value_info(n, f32, ["batch", hidden]) for n in ("h_out", "y_t")]
        body_graph = helper.make_graph(body, f"step_{d}", body_inputs, body_outputs,
                                       [helper.make_tensor("R_T", f32, R.T.shape, R.T.ravel())])
        reverse = int(backward and not masked)
        nodes.append(helper.make_node("Scan", ["h0", scanned], [f"h_last_{d}", f"y_all_{d}"], body=body_graph,
                                      num_scan_inputs=1, scan_input_directions=[reverse],
                                      scan_output_directions=[reverse]))
        nodes.append(helper.make_node("Where", ["within", f"y_all_{d}", "zero_f"], [f"y_{d}"]) if masked
                     else helper.make_node("Identity", [f"y_all_{d}"], [f"y_{d}"]))
        y = f"y_{d}"
        if masked and backward:
            nodes.append(helper.make_node("ReverseSequence", [y, "lengths64"], [f"y_r_{d}"], batch_axis=1,
                                          time_axis=0))
            y = f"y_r_{d}"
        outputs.append(y)
    if len(outputs) > 1:
        nodes.append(helper.make_node("Concat", outputs, ["y_tm"], axis=2))
    else:
        nodes.append(helper.make_node("Identity", outputs, ["y_tm"]))
    nodes.append(helper.make_node("Transpose", ["y_tm"], ["y"], perm=[1, 0, 2]))
    graph_inputs = [helper.make_tensor_value_info("x", f32, ["batch", "time", features])]
    if masked:
        graph_inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, ["batch"]))
    graph = helper.make_graph(nodes, "minimal_scan", graph_inputs, [helper.make_tensor_value_info("y", f32, None)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
