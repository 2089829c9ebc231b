"""Where to deploy: one layer in every runtime, each driven for CPU inference as its documentation recommends.

    python benchmarks/deploy.py                  # LSTM, GRU, SimpleRNN; batch 1 and 8; T=100, F=64, H=128
    python benchmarks/deploy.py --smoke          # LSTM at batch 1, 3 rounds, a small TVM tuning budget

Each layer (Keras 3, random weights) is converted once per form: the default form for onnxruntime, OpenVINO
and tract (the form whose report names them), the iree, tvm and ncnn targets' forms for those (ncnn's at batch
1: it computes one batch row at a time, so batch 8 is 8 rows one after another). Every runtime runs in a
child process of ``benchmarks/deploy_runs.py`` in the interpreter that has it (``TF2ONNX_RNN_<RUNTIME>_PYTHON``
for IREE, TVM and ncnn; this one for the others), all children alive at once: each model is compiled there,
checked against Keras (max abs error), then timed in rounds, the runtimes interleaved within each round (their
order rotating from round to round) so that a slow moment of the machine falls on all of them. A round runs
each model back to back for about ``--block-ms``; a cell is the median over the rounds of the time per run,
its ratio to onnxruntime's the median of the rounds' ratios.
Everything runs on one thread (onnxruntime one intra-op thread, OpenVINO INFERENCE_NUM_THREADS=1, IREE's
local-sync device, TVM_NUM_THREADS=1 and a one-core target, ncnn num_threads=1, tract as it is); the table
says the CPU time each runtime used per wall second while timed. Two more drivers run for comparison:
OpenVINO at its default precision (bf16 on a CPU with bf16 units) and TVM as the tests compile it (no
tuning, a bare ``llvm`` target).

TVM is tuned with MetaSchedule (``--tvm-trials`` per task, an evolutionary population of
``--tvm-population``): 1.5 to 4.5 minutes per model here, the whole run about 22 minutes; a
``--tvm-tuning-dir`` keeps the records for the next run, which then only applies them. Its interpreter
(``--tvm-python``, default ``TF2ONNX_RNN_TVM_PYTHON``) needs ``apache-tvm[meta-schedule,popen-pool]==0.27.0.post1``
with ``apache-tvm-ffi==0.1.14.post0`` (with 0.1.15.post2 ``tvm.ir.save_json`` crashes, and with it the tuning:
deploy_runs.prepare_tvm), e.g. a venv of its own beside the tests' TVM one.
Results: benchmarks/results/deploy.{md,json}; docs/performance.md ("Where to deploy") says how each runtime
is driven.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import numpy as np  # noqa: E402
from runtimes import FEATURES, TIME, UNITS, keras_layer  # noqa: E402

KINDS = ("LSTM", "GRU", "SimpleRNN")
# the table's columns: (driver, its name, the runtime's row in rewriters/runtimes.py, the form it runs)
RUNTIMES = (("onnxruntime", "onnxruntime", None, "default"), ("openvino", "OpenVINO", "openvino", "default"),
            ("tract", "tract", "tract", "default"), ("iree", "IREE", "iree", "iree"),
            ("tvm", "TVM", "tvm", "tvm"), ("ncnn", "ncnn", "ncnn", "ncnn"))
# run beside them, for the comparison table
COMPARED = (("openvino-default", "OpenVINO", "openvino", "default"), ("tvm-llvm", "TVM", "tvm", "tvm"))
TOLERANCE = 1e-4  # max abs error against Keras of a model computed in f32
RUNNER = os.path.join(HERE, "deploy_runs.py")


class Child:
    """One driver's process of deploy_runs.py, answering one request at a time."""

    def __init__(self, driver: str, python: str, log: str, env: dict):
        self.driver, self.log = driver, log
        self.process = subprocess.Popen([python, RUNNER, driver], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=open(log, "w"), text=True, env=env)

    def ask(self, **request) -> dict:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            with open(self.log) as handle:
                tail = handle.read().strip().splitlines()[-3:]
            return {"error": f"the {self.driver} process ended (exit {self.process.poll()}): {' / '.join(tail)}"}
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def _interpreter(row, given: dict):
    if row is None:
        return sys.executable
    if given.get(row):
        return given[row]
    from tf2onnx_rnn.rewriters.runtimes import BY_KEY
    from tf2onnx_rnn.runtime_check import python_for

    return python_for(BY_KEY[row])


def _children(drivers: tuple, work: str, given: dict) -> dict:
    children = {}
    for driver, name, row, _ in drivers:
        python = _interpreter(row, given)
        if python is None:
            print(f"{driver}: not installed (set TF2ONNX_RNN_{row.upper()}_PYTHON); its column says so", flush=True)
            continue
        env = dict(os.environ, PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""),
                   OMP_NUM_THREADS="1", TVM_NUM_THREADS="1")
        children[driver] = Child(driver, python, os.path.join(work, f"{driver}.log"), env)
    return children


def _models(kind: str, batch: int, work: str) -> tuple:
    """{form: path} of the layer's conversions, the feeds' path and Keras's output."""
    import onnx
    import tensorflow as tf

    from tf2onnx_rnn import convert_keras

    model, _ = keras_layer(kind)
    x = np.random.default_rng(batch).standard_normal((batch, TIME, FEATURES)).astype(np.float32)
    want = np.asarray(model(x, training=False))
    feeds = os.path.join(work, f"{kind}_{batch}_feeds.npz")
    np.savez(feeds, x=x)
    paths = {}
    for form in ("default", "iree", "tvm", "ncnn"):
        spec = [tf.TensorSpec((1 if form == "ncnn" else batch, TIME, FEATURES), tf.float32, name="x")]
        proto = convert_keras(model, input_signature=spec, **({} if form == "default" else {"target": form}))
        paths[form] = os.path.join(work, f"{kind}_{batch}_{form}.onnx")
        onnx.save(proto, paths[form])
    return paths, feeds, want


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="LSTM at batch 1, 3 rounds, 4 TVM trials per task")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--block-ms", type=float, default=50.0, help="each model's time in a round")
    parser.add_argument("--runtimes", default=",".join(r[0] for r in RUNTIMES), help="comma-separated drivers")
    parser.add_argument("--tvm-trials", type=int, default=16, help="MetaSchedule trials per tuning task")
    parser.add_argument("--tvm-population", type=int, default=32, help="MetaSchedule's evolutionary population")
    parser.add_argument("--tvm-python", default=os.environ.get("TF2ONNX_RNN_TVM_PYTHON", ""),
                        help="an interpreter with apache-tvm[meta-schedule] (default: TF2ONNX_RNN_TVM_PYTHON)")
    parser.add_argument("--tvm-tuning-dir", default="", help="keep (and reuse) TVM's tuning records here")
    parser.add_argument("--out", default="", help="also write the markdown here")
    args = parser.parse_args(argv)
    kinds, batches, rounds = (KINDS[:1], (1,), 3) if args.smoke else (KINDS, (1, 8), args.rounds)
    trials = 4 if args.smoke and args.tvm_trials == 16 else args.tvm_trials
    wanted = set(args.runtimes.split(","))
    # a compared driver runs where its runtime's column does
    drivers = tuple(d for d in RUNTIMES + COMPARED if d[0].split("-")[0] in wanted)
    options = {"tvm": {"trials": trials, "population": args.tvm_population,
                       "tuning_dir": os.path.abspath(args.tvm_tuning_dir) if args.tvm_tuning_dir else ""}}
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    cases, results = [(k, b) for k in kinds for b in batches], {}
    with tempfile.TemporaryDirectory() as work:
        children = _children(drivers, work, {"tvm": args.tvm_python} if args.tvm_python else {})
        versions = {d: children[d].ask(versions=True).get("versions", {}) for d in children}
        prepared = {}  # (case, driver) -> runs per block
        for kind, batch in cases:
            paths, feeds, want = _models(kind, batch, work)
            for driver, _, _, form in drivers:
                cell = results.setdefault((kind, batch, driver), {})
                if driver not in children:
                    cell["error"] = "not installed"
                    continue
                outputs = os.path.join(work, f"{kind}_{batch}_{driver}.out.npz")
                answer = children[driver].ask(prepare=f"{kind}_{batch}", model=paths[form], feeds=feeds,
                                              outputs=outputs, options=options.get(driver, {}))
                if "error" in answer:
                    cell["error"] = answer["error"]
                else:
                    got = np.load(outputs)["out0"]
                    cell.update(compile_s=answer["compile_s"],
                                error_abs=float(np.abs(np.reshape(got, want.shape) - want).max()))
                    if driver == "openvino-default" or cell["error_abs"] <= TOLERANCE:
                        prepared[(kind, batch, driver)] = max(1, round(args.block_ms / 1e3 / answer["warm_s"]))
                print(f"{kind} batch {batch} {driver}: {cell}", flush=True)
        timed, load_rounds = list(prepared), []
        for number in range(rounds):
            for kind, batch in cases:
                order = [d for d, *_ in drivers if (kind, batch, d) in prepared]
                shift = number % max(1, len(order))
                for driver in order[shift:] + order[:shift]:
                    answer = children[driver].ask(time=f"{kind}_{batch}", runs=prepared[(kind, batch, driver)])
                    cell = results[(kind, batch, driver)]
                    if "error" in answer:
                        cell["error"] = answer["error"]
                        prepared.pop((kind, batch, driver))
                        continue
                    cell.setdefault("seconds", []).append(answer["seconds"])
                    cell.setdefault("cpu", []).append(answer["cpu"])
            load_rounds.append(os.getloadavg()[0])
            print(f"round {number + 1}/{rounds} done (load average {load_rounds[-1]:.1f})", flush=True)
        for child in children.values():
            child.close()
    for key in timed:
        cell = results[key]
        if cell.get("seconds"):
            cell["ms"] = statistics.median(cell["seconds"]) * 1e3
            cell["cpu_per_wall"] = statistics.median(cell["cpu"])
            # against onnxruntime: the median of the rounds' ratios (both timed in the same round)
            base = results.get((key[0], key[1], "onnxruntime"), {}).get("seconds")
            if base:
                cell["vs_onnxruntime"] = statistics.median(t / b for t, b in zip(cell["seconds"], base))
    run = {"started": started.isoformat(timespec="seconds"), "rounds": rounds, "block_ms": args.block_ms,
           "load_before": load_before, "load_after": os.getloadavg(),
           "load_rounds": load_rounds, "cpu": _cpu(), "cores": os.cpu_count(),
           "python": platform.python_version(), "versions": versions, "tvm_trials": trials,
           "tvm_population": args.tvm_population, "smoke": args.smoke,
           "cells": [dict(kind=k, batch=b, driver=d, **{n: v for n, v in c.items() if n not in ("seconds", "cpu")})
                     for (k, b, d), c in results.items()]}
    text = _markdown(run, cases, drivers)
    print(text)
    if not args.smoke:
        with open(os.path.join(HERE, "results", "deploy.md"), "w") as handle:
            handle.write(text)
        with open(os.path.join(HERE, "results", "deploy.json"), "w") as handle:
            json.dump(run, handle, indent=1)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    return 0


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _markdown(run: dict, cases: list, drivers: tuple) -> str:
    cells = {(c["kind"], c["batch"], c["driver"]): c for c in run["cells"]}
    columns = [d for d in RUNTIMES if d in drivers]

    def ms(cell: dict, relative: bool = False) -> str:
        if "ms" in cell:
            ratio = cell.get("vs_onnxruntime") if relative and cell["driver"] != "onnxruntime" else None
            return f"{cell['ms']:.3f}" + (f" ({ratio:.2f}x)" if ratio else "")
        if "error_abs" in cell and cell["error_abs"] > TOLERANCE:
            return f"differs from Keras ({cell['error_abs']:.1e})"
        return "fails: " + cell.get("error", "not timed")[:80]

    versions = "; ".join(f"{d}: " + ", ".join(f"{p} {v}" for p, v in run["versions"].get(d, {}).items())
                         for d, *_ in drivers if run["versions"].get(d))
    loads = run.get("load_rounds") or [run["load_after"][0]]
    lines = [f"Median ms per run (T={TIME}, F={FEATURES}, H={UNITS}, Keras 3, one thread; in parentheses the "
             "time over onnxruntime's, the median of the rounds' ratios); one run, "
             f"{run['started']}, {run['rounds']} interleaved rounds of ~{run['block_ms']:.0f} ms per model; "
             f"{run['cpu']}, {run['cores']} cores, load average {run['load_before'][0]:.1f} before, "
             f"{min(loads):.1f} to {max(loads):.1f} while timed; Python {run['python']}; {versions}; TVM tuned with "
             f"{run['tvm_trials']} MetaSchedule trials per task (population {run['tvm_population']}).", "",
             "| layer | batch | " + " | ".join(name for _, name, *_ in columns) + " | fastest |",
             "|---|---|" + "---|" * (len(columns) + 1)]
    for kind, batch in cases:
        row = [cells[(kind, batch, d)] for d, *_ in columns]
        timed = sorted((c["ms"], name) for c, (_, name, *_) in zip(row, columns) if "ms" in c)
        fastest = timed[0][1] if timed else "-"
        if len(timed) > 1:
            fastest += f" (then {timed[1][1]}, {timed[1][0] / timed[0][0]:.2f}x)"
        lines.append(f"| {kind} | {batch} | " + " | ".join(ms(c, True) for c in row) + f" | {fastest} |")
    def per_cell(title: str, key: str, form: str) -> list:  # a table of one figure of every cell
        table = ["", title, "", "| layer | batch | " + " | ".join(name for _, name, *_ in columns) + " |",
                 "|---|---|" + "---|" * len(columns)]
        return table + [f"| {kind} | {batch} | " + " | ".join(
            format(cells[(kind, batch, d)][key], form) if key in cells[(kind, batch, d)] else "-"
            for d, *_ in columns) + " |" for kind, batch in cases]

    lines += per_cell("Max abs error against Keras of the model timed (each checked before it was timed):",
                      "error_abs", ".1e")
    lines += per_cell("Compile seconds per model (TVM's include its tuning; ncnn's, pnnx's conversion; the first "
                      "model's, importing the runtime):", "compile_s", ".1f")
    compared = [d for d, *_ in COMPARED if d in [c[0] for c in drivers]]
    if compared:
        lines += ["", "For comparison, in the same rounds: OpenVINO at its default precision (bf16 on a CPU with "
                  "bf16 units) and TVM as the tests compile it (no tuning, a bare llvm target):", "",
                  "| layer | batch | OpenVINO f32 | OpenVINO default | its max abs error | TVM tuned | TVM bare llvm |"
                  " bare/tuned |", "|---|---|---|---|---|---|---|---|"]
        for kind, batch in cases:
            get = {d: cells.get((kind, batch, d), {}) for d in ("openvino", "openvino-default", "tvm", "tvm-llvm")}
            ratio = (f"{get['tvm-llvm']['ms'] / get['tvm']['ms']:.1f}" if "ms" in get["tvm"] and "ms" in
                     get["tvm-llvm"] else "-")
            error = get["openvino-default"].get("error_abs")
            lines.append(f"| {kind} | {batch} | {ms(get['openvino'])} | {ms(get['openvino-default'])} | "
                         f"{'-' if error is None else f'{error:.1e}'} | {ms(get['tvm'])} | {ms(get['tvm-llvm'])} | "
                         f"{ratio} |")
    busy = {}
    for c in run["cells"]:
        if "cpu_per_wall" in c:
            busy.setdefault(c["driver"], []).append(c["cpu_per_wall"])
    lines += ["", "CPU seconds per wall second while timed (1.00: one busy thread; less: the process waited for a "
              "core), the lowest and highest over the cases: " +
              ", ".join(f"{d} {min(v):.2f}-{max(v):.2f}" for d, v in busy.items()) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
