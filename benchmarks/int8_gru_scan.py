"""Would an integer GRU beat onnxruntime's float one? A probe of the form ``dynamic`` would have to write.

    python benchmarks/int8_gru_scan.py

onnxruntime has no integer GRU kernel. The one int8 form of a GRU in its ops is a ``Scan`` whose step computes the
recurrent product with ``DynamicQuantizeMatMul`` (int8 weights, per-column scales, the state quantized at run time)
and the gates with elementwise ops, after the input projection over every step as one ``DynamicQuantizeMatMul``.
This builds that graph by hand beside a float ``GRU`` node of the same weights (random; T=100, B=16, 12 inputs,
128 units, linear_before_reset=1), checks they agree within int8's error, and times both in onnxruntime with one
thread, interleaved in five rounds of 200 calls each after a warm-up: the median of the rounds' ratios is printed.

Measured (onnxruntime 1.32, 2 cores, docs/quantization.md): the int8 Scan takes 1.06-1.14x the float node's time
(median 1.10x-1.11x over two runs), 1.8% of the output's range off: per-step node overhead outweighs the integer
product, so ``dynamic`` leaves a GRU's compute float.
"""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

T, B, INPUTS, H = 100, 16, 12, 128


def _int8_columns(w: np.ndarray) -> tuple:
    """``w`` [K, N] in int8 with one scale per column."""
    scales = np.abs(w).max(0) / 127
    return np.round(w / scales).astype(np.int8), scales.astype(np.float32)


def float_gru(w: np.ndarray, r: np.ndarray, bias: np.ndarray):
    graph = h.make_graph(
        [h.make_node("GRU", ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=H, linear_before_reset=1)], "float",
        [h.make_tensor_value_info("x", TP.FLOAT, [T, B, INPUTS])], [h.make_tensor_value_info("Yh", TP.FLOAT, None)],
        [nh.from_array(w[None], "W"), nh.from_array(r[None], "R"), nh.from_array(bias[None], "B")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 15)])


def int8_scan_gru(w: np.ndarray, r: np.ndarray, bias: np.ndarray):
    """ONNX's GRU (gates z, r, h; linear_before_reset=1) as a Scan of its step, its products integer."""
    rq, rs = _int8_columns(r.T.copy())
    step = [
        h.make_node("DynamicQuantizeMatMul", ["h", "Rq", "Rs", "Rz"], ["hr"], domain="com.microsoft"),
        h.make_node("Add", ["hr", "Rb"], ["hrb"]),
        h.make_node("Split", ["xp", "three"], ["xz", "xr", "xh"], axis=1),
        h.make_node("Split", ["hrb", "three"], ["hz", "hrr", "hh"], axis=1),
        h.make_node("Add", ["xz", "hz"], ["z0"]), h.make_node("Sigmoid", ["z0"], ["z"]),
        h.make_node("Add", ["xr", "hrr"], ["r0"]), h.make_node("Sigmoid", ["r0"], ["r"]),
        h.make_node("Mul", ["r", "hh"], ["rh"]), h.make_node("Add", ["xh", "rh"], ["n0"]),
        h.make_node("Tanh", ["n0"], ["n"]), h.make_node("Sub", ["h", "n"], ["d"]),
        h.make_node("Mul", ["z", "d"], ["zd"]), h.make_node("Add", ["n", "zd"], ["hn"]),
    ]
    body = h.make_graph(
        step, "step", [h.make_tensor_value_info("h", TP.FLOAT, [B, H]),
                       h.make_tensor_value_info("xp", TP.FLOAT, [B, 3 * H])],
        [h.make_tensor_value_info("hn", TP.FLOAT, [B, H])],
        [nh.from_array(rq, "Rq"), nh.from_array(rs, "Rs"), nh.from_array(np.zeros(3 * H, np.int8), "Rz"),
         nh.from_array(bias[3 * H:], "Rb"), nh.from_array(np.array([H, H, H], np.int64), "three")])
    wq, ws = _int8_columns(w.T.copy())
    nodes = [h.make_node("DynamicQuantizeMatMul", ["x", "Wq", "Ws", "Wz"], ["xw"], domain="com.microsoft"),
             h.make_node("Add", ["xw", "Wb"], ["xp"]),
             h.make_node("Scan", ["h0", "xp"], ["Yh"], body=body, num_scan_inputs=1)]
    graph = h.make_graph(
        nodes, "int8", [h.make_tensor_value_info("x", TP.FLOAT, [T, B, INPUTS])],
        [h.make_tensor_value_info("Yh", TP.FLOAT, None)],
        [nh.from_array(wq, "Wq"), nh.from_array(ws, "Ws"), nh.from_array(np.zeros(3 * H, np.int8), "Wz"),
         nh.from_array(bias[:3 * H], "Wb"), nh.from_array(np.zeros((B, H), np.float32), "h0")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 15), h.make_opsetid("com.microsoft", 1)])


def _median_ms(session, feeds: dict, calls: int = 200) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000


def main() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((3 * H, INPUTS)) * 0.2).astype(np.float32)
    r = (rng.standard_normal((3 * H, H)) * 0.1).astype(np.float32)
    bias = (rng.standard_normal(6 * H) * 0.1).astype(np.float32)
    feeds = {"x": rng.standard_normal((T, B, INPUTS)).astype(np.float32)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    float_session = ort.InferenceSession(float_gru(w, r, bias).SerializeToString(), options)
    int8_session = ort.InferenceSession(int8_scan_gru(w, r, bias).SerializeToString(), options)
    want, got = float_session.run(None, feeds)[0][0], int8_session.run(None, feeds)[0]
    print(f"int8 Scan against the float GRU: {np.abs(got - want).max() / np.abs(want).max():.2%} of its range off")
    for session in (float_session, int8_session):
        _median_ms(session, feeds, 20)
    ratios = []
    for _ in range(5):
        float_ms, int8_ms = _median_ms(float_session, feeds), _median_ms(int8_session, feeds)
        ratios.append(int8_ms / float_ms)
        print(f"float GRU {float_ms:.3f} ms, int8 Scan {int8_ms:.3f} ms: {int8_ms / float_ms:.2f}x")
    print(f"median ratio {np.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
