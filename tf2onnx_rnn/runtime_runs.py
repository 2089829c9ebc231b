"""A written model run in a runtime other than onnxruntime, the way that runtime's users run one.

This file is also a script, run by an interpreter that has the runtime (which may be another
environment than the converting one: each of these runtimes pins its own onnx, numpy and torch):

    python runtime_runs.py RUNTIME model.onnx feeds.npz outputs.npz
    python runtime_runs.py --serve RUNTIME     (runs of that form, one a line of stdin: see serve)
    python runtime_runs.py --time RUNTIME feeds.npz ROUNDS times.json model.onnx...   (the benchmark)

It imports numpy, onnx and the runtime only, nothing of this package. The feeds are the model's
inputs by name; the outputs are written as ``out<k>``, in the model's order. A failure prints one
line on stderr and exits 2 (the runtime refused or failed on the model); a crash of the runtime
kills only this process, which its caller (:mod:`.runtime_check`) reports.

How each runtime is driven (docs/downstream.md names the versions measured):
- ``iree``: ``iree-import-onnx`` to MLIR, ``iree-compile`` for the ``llvm-cpu`` backend, run with
  ``iree.runtime`` on the ``local-task`` driver;
- ``tvm``: Relax's ONNX frontend (``from_onnx`` with the feeds' shapes), ``tvm.compile`` for ``llvm``,
  run on Relax's virtual machine;
- ``ncnn``: ``pnnx`` writes the ncnn param and bin files for one batch row's shapes (``fp16=0``), run with
  ``ncnn.Net``; ncnn's blobs have no batch axis, so each batch row is run on its own, as ncnn's users do,
  fed as the ``model_ncnn.py`` pnnx writes feeds it (the batch axis pnnx found dropped, a Mat of its own);
- ``rknn``: rknn-toolkit2 builds for ``rk3588`` without quantization and runs its simulator (float16);
- ``openvino``: ``Core().read_model`` on the file, compiled for the CPU at f32 inference precision (on
  CPUs with bf16 units OpenVINO computes in bf16 by default), with the model's own (dynamic) shapes;
- ``tract``: ``tract.onnx().load``, each input's fact set to the feed's shape and type, made a runnable model;
- ``reference``: ONNX's reference evaluator (``onnx.reference.ReferenceEvaluator``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np


def _outputs_of(path: str) -> list:
    import onnx

    model = onnx.load(path, load_external_data=False)
    return [o.name for o in model.graph.output]


def _inputs_of(path: str) -> list:
    import onnx

    model = onnx.load(path, load_external_data=False)
    constants = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in constants]


def prepare_iree(path: str, feeds: dict, work: str):
    import iree.compiler as compiler
    import iree.runtime as runtime

    mlir = os.path.join(work, "model.mlir")
    _check_call([sys.executable, "-m", "iree.compiler.tools.import_onnx", path, "-o", mlir])
    vmfb = compiler.compile_file(mlir, target_backends=["llvm-cpu"], input_type="auto",
                                 extra_args=["--iree-llvmcpu-target-cpu=host"])
    config = runtime.Config("local-task")
    context = runtime.SystemContext(config=config)
    module = runtime.VmModule.copy_buffer(context.instance, vmfb)
    context.add_vm_module(module)
    functions = [name for name in module.function_names if not name.startswith("__") and "$" not in name]
    main = context.modules[module.name][functions[0]]
    names = _inputs_of(path)

    def run(given: dict) -> list:
        results = main(*[given[name] for name in names])
        results = results if isinstance(results, (list, tuple)) else [results]
        return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
    return run


def prepare_tvm(path: str, feeds: dict, work: str):
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(path)
    names = _inputs_of(path)
    module = from_onnx(model, shape_dict={n: list(feeds[n].shape) for n in names},
                       dtype_dict={n: str(feeds[n].dtype) for n in names}, keep_params_in_input=False)
    module = relax.transform.DecomposeOpsForInference()(module)
    module = relax.transform.LegalizeOps()(module)
    executable = tvm.compile(module, target="llvm")
    machine = relax.VirtualMachine(executable, tvm.cpu())
    tensor = tvm.runtime.tensor if hasattr(tvm.runtime, "tensor") else tvm.nd.array

    def run(given: dict) -> list:
        result = machine["main"](*[tensor(given[n]) for n in names])
        results = list(result) if not hasattr(result, "numpy") else [result]
        return [np.asarray(r.numpy()) for r in results]
    return run


def prepare_ncnn(path: str, feeds: dict, work: str, threads: int = 0):
    """``threads``: ncnn's thread count (0: its default)."""
    import ncnn

    names = _inputs_of(path)
    local = os.path.join(work, "model.onnx")
    with open(path, "rb") as source, open(local, "wb") as copy:
        copy.write(source.read())
    # one batch row at a time (ncnn's blobs have no batch axis): pnnx is given a row's shape
    shapes = ",".join("[" + ",".join(str(d) for d in (1,) + feeds[n].shape[1:]) + "]" + _type_code(feeds[n].dtype)
                      for n in names)  # with its type: pnnx refuses an int32 input (an Embedding's ids) given as f32
    _check_call(["pnnx", local, f"inputshape={shapes}", "fp16=0"], cwd=work)
    param, weights = os.path.join(work, "model.ncnn.param"), os.path.join(work, "model.ncnn.bin")
    blobs_in, blobs_out = _ncnn_blobs(param)
    batch_axes = _ncnn_batch_axes(os.path.join(work, "model_ncnn.py"), len(blobs_in))
    rows_out = _row_shapes(path)
    net = ncnn.Net()
    if threads:
        net.opt.num_threads = threads
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    net.opt.use_bf16_storage = False
    if net.load_param(param) != 0 or net.load_model(weights) != 0:
        raise RuntimeError("ncnn cannot load the param/bin pnnx wrote")

    def run(given: dict) -> list:
        outputs = [[] for _ in blobs_out]
        for row in range(given[names[0]].shape[0]):
            extractor = net.create_extractor()
            for blob, name, axis in zip(blobs_in, names, batch_axes):
                # as pnnx's own model_ncnn.py feeds it: the row with its batch axis, which the Mat drops where
                # pnnx found one (233: none), and a Mat of its own: ncnn reads the refcount of an in-place
                # layer's input, which a Mat wrapping a numpy array does not have (the process ends)
                # (ncnn's Mats hold floats: an integer input, the ids an Embed layer reads, as floats)
                rows = np.ascontiguousarray(given[name][row:row + 1], dtype=np.float32)
                extractor.input(blob, ncnn.Mat(rows, batch_index=axis).clone())
            for k, blob in enumerate(blobs_out):
                status, mat = extractor.extract(blob)
                if status != 0:
                    raise RuntimeError(f"ncnn cannot compute {blob}")
                value = np.array(mat)
                shape = rows_out[k] if k < len(rows_out) else None
                outputs[k].append(value.reshape(shape) if shape and int(np.prod(shape)) == value.size else value)
        return [np.stack(rows) for rows in outputs]
    return run


def _ncnn_batch_axes(script: str, count: int) -> list:
    """Per input, the batch axis pnnx found for it (233: none), as the ``model_ncnn.py`` it writes feeds
    it; 0 for each where that file says nothing."""
    import re

    found = []
    if os.path.exists(script):
        with open(script) as handle:
            found = [int(k) for k in re.findall(r"ex\.input\([^\n]*batch_index=(\d+)", handle.read())]
    return found if len(found) == count else [0] * count


def _row_shapes(path: str) -> list:
    """The shape of one batch row of each model output, as declared or as ONNX's shape inference finds it
    (None where not static)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    try:
        known = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    except Exception:  # noqa: BLE001 - the declared shapes only
        known = {}
    shapes = []
    for output in model.graph.output:
        dims = [[d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
                for v in (output, known.get(output.name, output))]
        static = [d for d in dims if d and all(d)]
        shapes.append(static[0][1:] if static else None)
    return shapes


def _ncnn_blobs(param: str) -> tuple:
    """The input and output blob names pnnx gave an ncnn param file (``in0``..., ``out0``...)."""
    with open(param) as handle:
        words = handle.read().split()
    blobs = sorted({w for w in words if w.startswith(("in", "out")) and w[-1].isdigit()
                    and w.lstrip("inout").isdigit()}, key=lambda w: (w.startswith("out"), int(w.lstrip("inout"))))
    return [b for b in blobs if b.startswith("in")], [b for b in blobs if b.startswith("out")]


def prepare_rknn(path: str, feeds: dict, work: str):
    from rknn.api import RKNN

    names = _inputs_of(path)
    rknn = RKNN(verbose=False)
    rknn.config(target_platform="rk3588")
    if rknn.load_onnx(model=path, inputs=names, input_size_list=[list(feeds[n].shape) for n in names]) != 0:
        raise RuntimeError("rknn-toolkit2 cannot load the model")
    if rknn.build(do_quantization=False) != 0:
        raise RuntimeError("rknn-toolkit2 cannot build the model")
    if rknn.init_runtime() != 0:
        raise RuntimeError("rknn-toolkit2's simulator cannot start")

    def run(given: dict) -> list:
        results = rknn.inference(inputs=[given[n] for n in names], data_format=["nchw"] * len(names))
        if results is None:
            raise RuntimeError("rknn-toolkit2's simulator computed nothing")
        return [np.asarray(r) for r in results]
    return run


def prepare_openvino(path: str, feeds: dict, work: str):
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    names = _inputs_of(path)

    def run(given: dict) -> list:
        result = compiled([given[name] for name in names])
        return [np.asarray(result[output]) for output in compiled.outputs]
    return run


def prepare_tract(path: str, feeds: dict, work: str):
    import tract

    model = tract.onnx().load(path)
    names = _inputs_of(path)
    for k, name in enumerate(names):
        model.set_input_fact(k, ",".join([str(d) for d in feeds[name].shape] + [_type_code(feeds[name].dtype)]))
    runnable = model.into_model().into_runnable()

    def run(given: dict) -> list:
        return [tensor.to_numpy() for tensor in runnable.run([given[name] for name in names])]
    return run


def _type_code(dtype) -> str:
    return {"float32": "f32", "float16": "f16", "float64": "f64", "int32": "i32", "int64": "i64",
            "bool": "bool"}[np.dtype(dtype).name]


def prepare_reference(path: str, feeds: dict, work: str):
    import onnx
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(onnx.load(path))
    names = _inputs_of(path)

    def run(given: dict) -> list:
        return [np.asarray(r) for r in evaluator.run(None, {name: given[name] for name in names})]
    return run


_PREPARE = "prepare_"
# runtime key -> its preparer: the one named after the key of its row of rewriters.runtimes' table (prepare_<key>),
# the key its caller (runtime_check) passes; this script imports nothing of the package, the table included
PREPARERS = {name[len(_PREPARE):]: prepare for name, prepare in list(globals().items())
             if name.startswith(_PREPARE) and callable(prepare)}


def timings(runtime: str, paths: list, feeds: dict, rounds: int, work: str) -> dict:
    """Seconds per run of each model, ``rounds`` rounds interleaved model by model after one warm-up run:
    {path: [seconds, ...]} (the benchmark's use)."""
    import time

    runs = {}
    for k, path in enumerate(paths):
        os.makedirs(os.path.join(work, str(k)), exist_ok=True)
        runs[path] = PREPARERS[runtime](os.path.abspath(path), feeds, os.path.join(work, str(k)))
        runs[path](feeds)
    times: dict = {path: [] for path in paths}
    for _ in range(rounds):
        for path, run in runs.items():
            start = time.perf_counter()
            run(feeds)
            times[path].append(time.perf_counter() - start)
    return times


def _check_call(command: list, cwd=None) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{os.path.basename(command[0])} failed: "
                           f"{_first_error(done.stderr + done.stdout) or done.returncode}")


def _first_error(text: str) -> str:
    """The line of a runtime's message that says what failed (its first "error:" line, else its last)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return next((line for line in lines if "error:" in line.lower()), lines[-1] if lines else "")


class _Prepared:
    """The model last prepared (compiled) in this process, kept for runs of the same file at the same feed
    shapes (a verification's rounds, a stream's chunks): the runtime compiles it once."""

    key = None
    run = None
    work = None

    @classmethod
    def runner(cls, runtime: str, path: str, feeds: dict):
        stat = os.stat(path)
        key = (runtime, os.path.abspath(path), stat.st_mtime_ns, stat.st_size,
               tuple(sorted((name, value.shape, str(value.dtype)) for name, value in feeds.items())))
        if key != cls.key:
            cls.key = cls.run = None
            if cls.work is not None:
                cls.work.cleanup()
            cls.work = tempfile.TemporaryDirectory()
            cls.run = PREPARERS[runtime](os.path.abspath(path), feeds, cls.work.name)
            cls.key = key
        return cls.run


def run_once(runtime: str, path: str, feeds_path: str, outputs_path: str) -> str:
    """Run the model in ``runtime`` on the feeds, its outputs written: "" done, else the one line saying why
    not (the runtime refused or failed on the model)."""
    feeds = dict(np.load(feeds_path))
    try:
        results = _Prepared.runner(runtime, path, feeds)(feeds)
    except Exception as error:  # noqa: BLE001 - one line for the caller
        return f"{type(error).__name__}: {_first_error(str(error))}"
    np.savez(outputs_path, **{f"out{k}": r for k, r in enumerate(results)})
    return ""


def serve(runtime: str) -> int:
    """Runs one after another in one process, which imports the runtime once: each line of stdin is a JSON
    list [model.onnx, feeds.npz, outputs.npz], answered by a JSON line on stdout, "" done or the line saying
    why not. What the runtime itself prints goes to stderr. A crash ends the process (its caller sees the
    answer missing); end of input ends it."""
    import json

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the runtime's own prints, Python's and its libraries', away from the answers
    for line in sys.stdin:
        answers.write(json.dumps(run_once(runtime, *json.loads(line))) + "\n")
        answers.flush()
    return 0


def main(argv: list) -> int:
    if argv and argv[0] == "--serve":
        return serve(argv[1])
    if argv and argv[0] == "--time":  # --time RUNTIME FEEDS ROUNDS OUT.json MODEL...
        import json

        runtime, feeds_path, rounds, out = argv[1:5]
        with tempfile.TemporaryDirectory() as work:
            found = timings(runtime, argv[5:], dict(np.load(feeds_path)), int(rounds), work)
        with open(out, "w") as handle:
            json.dump(found, handle)
        return 0
    failure = run_once(*argv)
    if failure:
        print(failure, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
