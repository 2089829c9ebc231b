"""Latency of recurrences no ONNX node names: ours (a Scan of the loop's own step) against a Scan
built by hand (the floor) and stock tf2onnx's Loop, in onnxruntime and OpenVINO.

    python benchmarks/custom_cells.py                  # every case, results in benchmarks/results/
    python benchmarks/custom_cells.py --smoke          # one case, one short round: checks the script runs
    python benchmarks/custom_cells.py --cells ln-elman # some cases only (printed, not written)

Cases (T=100, F=64, H=128, batch 1 and 16, Keras 3): SimpleRNN(activation="gelu"), the same behind
Masking (rows of mixed lengths), an Elman cell with LayerNormalization on its pre-activation
(``RNN(cell)``), LSTM(activation="selu"). The floor: ``x @ K + b`` over every step as one MatMul, then
a Scan whose body is ``h @ R``, the Add and the cell's own nonlinearity (ONNX's LayerNormalization op,
gelu in its erf form), Transposes around. Every runner is checked against Keras before it is timed.
onnxruntime and OpenVINO each run on one thread (OpenVINO at f32 precision); runners are interleaved
round by round and the medians reported, with ours/floor and stock/ours. Stock's Loops do not load in
OpenVINO: its column there says so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from run import ort_session, stock_convert  # noqa: E402

FEATURES, HIDDEN, TIME = 64, 128, 100
CELLS = ("gelu", "gelu-masked", "ln-elman", "lstm-selu")


def build_model(cell: str, seed: int = 0):
    import keras

    import scan_cells

    x = keras.Input((None, FEATURES), name="x")
    h = keras.layers.Masking()(x) if cell.endswith("masked") else x
    if cell.startswith("gelu"):
        layer = keras.layers.SimpleRNN(HIDDEN, activation="gelu", return_sequences=True)
    elif cell == "lstm-selu":
        layer = keras.layers.LSTM(HIDDEN, activation="selu", return_sequences=True)
    else:
        layer = keras.layers.RNN(scan_cells._layer_normalised_elman(keras, HIDDEN), return_sequences=True)
    model = keras.Model(x, layer(h))
    rng = np.random.default_rng(seed)
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model, layer


def make_input(cell: str, batch: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, TIME, FEATURES)).astype(np.float32)
    if cell.endswith("masked"):
        lengths = rng.integers(TIME // 2, TIME + 1, batch)
        lengths[0] = TIME
        for row, length in enumerate(lengths):
            x[row, length:] = 0.0
    return x


def _const(name: str, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def floor_model(cell: str, layer):
    """The hand-built Scan for ``cell`` (see the module's note)."""
    f32 = TensorProto.FLOAT
    masked = cell.endswith("masked")
    if cell == "ln-elman":
        c = layer.cell
        kernel, recurrent, bias = (np.asarray(v) for v in (c.kernel, c.recurrent, c.bias))
        gamma, beta = (np.asarray(v) for v in (c.norm.gamma, c.norm.beta))
    else:
        kernel, recurrent, bias = (np.asarray(w) for w in layer.cell.get_weights())
    initializers = [_const("K", kernel), _const("b", bias)]
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["x_tm", "K"], ["xk"]), helper.make_node("Add", ["xk", "b"], ["xw"]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero_i", "one_i"], ["batch"]),
             helper.make_node("Concat", ["batch", "units"], ["h_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["h_shape"], ["h0"])]
    initializers += [numpy_helper.from_array(np.array([0], np.int64), "zero_i"),
                     numpy_helper.from_array(np.array([1], np.int64), "one_i"),
                     numpy_helper.from_array(np.array([HIDDEN], np.int64), "units")]
    body = [helper.make_node("MatMul", ["h", "R"], ["hr"]), helper.make_node("Add", ["xw_t", "hr"], ["a"])]
    body_init = [_const("R", recurrent)]
    states, scanned = ["h0"], ["xw"]
    body_inputs = [helper.make_tensor_value_info("h", f32, [None, HIDDEN])]
    state_outputs = ["h_new"]
    if cell.startswith("gelu"):
        body_init += [_const("inv_sqrt2", 1 / np.sqrt(2)), _const("half", 0.5), _const("one", 1.0)]
        body += [helper.make_node("Mul", ["a", "inv_sqrt2"], ["as"]), helper.make_node("Erf", ["as"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a", "half"], ["ah"]),
                 helper.make_node("Mul", ["ah", "e1"], ["g"])]
        if masked:
            nodes += [helper.make_node("Transpose", ["x"], ["x_t"], perm=[1, 0, 2]),
                      helper.make_node("Equal", ["x_t", "zero_f"], ["is_zero"]), helper.make_node("Not", ["is_zero"],
                                                                                                  ["nonzero"]),
                      helper.make_node("Cast", ["nonzero"], ["nonzero_f"], to=f32),
                      helper.make_node("ReduceMax", ["nonzero_f", "minus_one"], ["kept_f"], keepdims=1),
                      helper.make_node("Cast", ["kept_f"], ["kept"], to=TensorProto.BOOL)]
            initializers += [_const("zero_f", 0.0), numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
            scanned.append("kept")
            body.append(helper.make_node("Where", ["m_t", "g", "h"], ["h_new"]))
        else:
            body.append(helper.make_node("Identity", ["g"], ["h_new"]))
    elif cell == "ln-elman":
        body_init += [_const("gamma", gamma), _const("beta", beta)]
        body += [helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-3),
                 helper.make_node("Tanh", ["n"], ["h_new"])]
    else:  # LSTM with selu: Keras's gates i, f, c, o
        states.append("h0")
        body_inputs.append(helper.make_tensor_value_info("c", f32, [None, HIDDEN]))
        state_outputs.append("c_new")
        body += [helper.make_node("Split", ["a"], ["zi", "zf", "zc", "zo"], axis=-1, num_outputs=4),
                 helper.make_node("Sigmoid", ["zi"], ["i"]), helper.make_node("Sigmoid", ["zf"], ["f"]),
                 helper.make_node("Sigmoid", ["zo"], ["o"]), helper.make_node("Selu", ["zc"], ["cc"]),
                 helper.make_node("Mul", ["f", "c"], ["fc"]), helper.make_node("Mul", ["i", "cc"], ["ic"]),
                 helper.make_node("Add", ["fc", "ic"], ["c_new"]), helper.make_node("Selu", ["c_new"], ["sc"]),
                 helper.make_node("Mul", ["o", "sc"], ["h_new"])]
    body.append(helper.make_node("Identity", ["h_new"], ["y_t"]))
    body_inputs += [helper.make_tensor_value_info("xw_t", f32, [None, body_width(cell)])]
    if masked:
        body_inputs.append(helper.make_tensor_value_info("m_t", TensorProto.BOOL, [None, 1]))
    body_outputs = [helper.make_tensor_value_info(n, f32, None) for n in state_outputs + ["y_t"]]
    graph = helper.make_graph(body, "step", body_inputs, body_outputs, body_init)
    finals = [f"final_{i}" for i in range(len(states))]
    nodes += [helper.make_node("Scan", states + scanned, finals + ["y_tm"], body=graph, num_scan_inputs=len(scanned)),
              helper.make_node("Transpose", ["y_tm"], ["y"], perm=[1, 0, 2])]
    model = helper.make_model(
        helper.make_graph(nodes, "floor", [helper.make_tensor_value_info("x", f32, [None, None, FEATURES])],
                          [helper.make_tensor_value_info("y", f32, None)], initializers),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def body_width(cell: str) -> int:
    return 4 * HIDDEN if cell == "lstm-selu" else HIDDEN


def openvino_run(model_proto):
    """A callable running the model in OpenVINO (one thread, f32), or why it does not load."""
    import onnx
    import openvino

    core = openvino.Core()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.onnx")
        onnx.save(model_proto, path)
        try:
            compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                         "INFERENCE_NUM_THREADS": 1})
        except Exception as error:  # noqa: BLE001 - recorded in the results
            return str(error).strip().splitlines()[0][:120]
    request = compiled.create_infer_request()
    return lambda x: request.infer([x])[compiled.outputs[0]]


def median_ms(run, x, rounds: int, block: float) -> float:
    samples = []
    for _ in range(rounds):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < block:
            run(x)
            count += 1
        samples.append((time.perf_counter() - start) / count * 1e3)
    return statistics.median(samples)


def time_case(cell: str, batch: int, rounds: int, block: float) -> dict:
    from tf2onnx_rnn import convert_keras

    model, layer = build_model(cell)
    x = make_input(cell, batch)
    want = np.asarray(model(x, training=False))
    protos = {"ours": convert_keras(model, opset=17), "floor": floor_model(cell, layer), "stock": stock_convert(model)}
    runners, errors = runners_of(protos)
    for name, run in runners.items():
        if run is not None:
            error = float(np.max(np.abs(np.asarray(run(x)) - want)))
            if error > 1e-4:
                raise AssertionError(f"{cell} b{batch} {name} differs from Keras by {error:.3g}")
    return timed(f"{cell}, batch {batch}", runners, x, rounds, block, errors)


def runners_of(protos: dict) -> tuple:
    """(``{"ort <name>" / "openvino <name>": a function of the input giving the first output, or None where
    OpenVINO does not load it}``, ``{name: why OpenVINO does not load it}``) for each model of ``protos``."""
    runners, errors = {}, {}
    for name, proto in protos.items():
        session = ort_session(proto)
        feed = session.get_inputs()[0].name
        runners[f"ort {name}"] = lambda v, s=session, f=feed: s.run(None, {f: v})[0]
        ov = openvino_run(proto)
        runners[f"openvino {name}"] = ov if callable(ov) else None
        if not callable(ov):
            errors[name] = ov
    return runners, errors


def timed(case: str, runners: dict, x, rounds: int, block: float, errors: dict) -> dict:
    """The median milliseconds of each runner that loaded (None: it did not), interleaved round by round;
    stock's OpenVINO entry says why where it did not load (``errors``)."""
    samples = {name: [] for name, run in runners.items() if run is not None}
    for _ in range(rounds):  # interleaved: every runner once per round
        for name in samples:
            samples[name].append(median_ms(runners[name], x, 1, block))
    result = {"case": case}
    result.update({name: statistics.median(values) for name, values in samples.items()})
    result["openvino stock"] = result.get("openvino stock") or errors.get("stock", "does not load")
    return result


def table(results: list) -> str:
    lines = ["| case | runtime | ours ms | floor ms | stock ms | ours/floor | stock/ours |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        for runtime in ("ort", "openvino"):
            ours, floor, stock = (r.get(f"{runtime} {k}") for k in ("ours", "floor", "stock"))
            numeric = isinstance(stock, float)
            lines.append(f"| {r['case']} | {'onnxruntime' if runtime == 'ort' else 'OpenVINO'} | {ours:.3f} | "
                         f"{floor:.3f} | {f'{stock:.3f}' if numeric else 'fails to load'} | {ours / floor:.2f} | "
                         f"{f'{stock / ours:.2f}' if numeric else '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--cells", default=",".join(CELLS),
                        help="comma-separated cases to time; the results files are written only for all of them")
    args = parser.parse_args(argv)
    cells = [cell for cell in args.cells.split(",") if cell]
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        parser.error(f"unknown cell {unknown[0]!r}; known: {', '.join(CELLS)}")
    cases = [("gelu", 1)] if args.smoke else [(cell, batch) for cell in cells for batch in (1, 16)]
    rounds, block = (1, 0.05) if args.smoke else (args.rounds, 0.25)
    results = [time_case(cell, batch, rounds, block) for cell, batch in cases]
    text = table(results)
    print(text)
    if not args.smoke and set(cells) == set(CELLS):
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "custom_cells.md"), "w") as stream:
            stream.write("# Recurrences no ONNX node names: the Scan form\n\n" + __doc__.split("\n\n", 2)[2]
                         + "\n" + text + "\n")
        with open(os.path.join(args.out, "custom_cells.json"), "w") as stream:
            json.dump(results, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
