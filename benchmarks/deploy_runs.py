"""The timing child of benchmarks/deploy.py: one runtime, driven for CPU inference as its own documentation
recommends, on one thread.

Run by the interpreter that has the runtime (``TF2ONNX_RNN_<RUNTIME>_PYTHON``, or the converting one for
onnxruntime, OpenVINO and tract), it imports numpy, onnx, the runtime and ``tf2onnx_rnn/runtime_runs.py`` (by
path: that file imports nothing of the package), nothing else of this project:

    python deploy_runs.py DRIVER        requests one a JSON line on stdin, answers one a JSON line on stdout

- ``{"prepare": KEY, "model": PATH, "feeds": NPZ, "outputs": NPZ, "options": {...}}`` compiles the model (timed),
  runs it once on the feeds (written to OUTPUTS as ``out<k>``, for the check against Keras), then three runs
  more; answers ``{"compile_s", "warm_s"}`` (warm_s: the fastest of those three) or ``{"error": LINE}``;
- ``{"time": KEY, "runs": N}`` runs the prepared model N times back to back; answers ``{"seconds": wall / N,
  "cpu": process CPU time / wall}`` (about 1 where one thread computes, more where the runtime spread the work);
- ``{"versions": true}`` answers the runtime's packages and their versions.

The tests' drivers (``runtime_runs.PREPARERS``) are not these: they compile each model the quickest way that
computes it as ONNX defines it; these are what a user deploying for speed would do, which for TVM means
tuning. What each driver does, and where its documentation says so, is in docs/performance.md ("Where to
deploy").
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("runtime_runs", os.path.join(HERE, "..", "tf2onnx_rnn",
                                                                            "runtime_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

PACKAGES = {"onnxruntime": ("onnxruntime",), "openvino": ("openvino",), "openvino-default": ("openvino",),
            "tract": ("tract",), "iree": ("iree-base-compiler", "iree-base-runtime"),
            "tvm": ("apache-tvm", "apache-tvm-ffi", "xgboost", "xgboost-cpu"), "tvm-llvm": ("apache-tvm",),
            "ncnn": ("ncnn", "pnnx")}


def prepare_onnxruntime(path: str, feeds: dict, work: str, options: dict):
    """An InferenceSession on the CPU provider, every graph optimization, one intra-op thread."""
    import onnxruntime as ort

    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session_options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session_options.intra_op_num_threads = session_options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, session_options, providers=["CPUExecutionProvider"])
    names = runs._inputs_of(path)

    def run(given: dict) -> list:
        return session.run(None, {name: given[name] for name in names})
    return run


def _openvino(precision):
    def prepare(path: str, feeds: dict, work: str, options: dict):
        """Core.compile_model for "CPU" with the LATENCY hint and one inference thread; at f32, or at the
        plugin's default precision (bf16 where the CPU has bf16 units)."""
        import openvino

        core = openvino.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        compiled = core.compile_model(core.read_model(path), "CPU", config)
        request = compiled.create_infer_request()
        names = runs._inputs_of(path)

        def run(given: dict) -> list:
            request.infer([given[name] for name in names])
            return [np.array(request.get_output_tensor(k).data) for k in range(len(compiled.outputs))]
        return run
    return prepare


def prepare_tract(path: str, feeds: dict, work: str, options: dict):
    """tract.onnx().load, each input's fact set to the feed's shape and type, into_model().into_runnable()
    (which optimizes the model for the CPU it runs on); tract runs on the calling thread."""
    return runs.prepare_tract(path, feeds, work)


def prepare_iree(path: str, feeds: dict, work: str, options: dict):
    """iree-import-onnx, then iree-compile for the local device's llvm-cpu backend tuned to this CPU, run on
    IREE's synchronous single-threaded CPU device (local-sync)."""
    import iree.runtime as runtime

    tools = os.path.dirname(sys.executable)

    def tool(name: str) -> str:
        found = os.path.join(tools, name)
        return found if os.path.exists(found) else name
    mlir, vmfb = os.path.join(work, "model.mlir"), os.path.join(work, "model.vmfb")
    runs._check_call([tool("iree-import-onnx"), path, "-o", mlir])
    runs._check_call([tool("iree-compile"), "--iree-hal-target-device=local",
                      "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host",
                      mlir, "-o", vmfb])
    context = runtime.SystemContext(config=runtime.Config("local-sync"))
    with open(vmfb, "rb") as handle:
        module = runtime.VmModule.copy_buffer(context.instance, handle.read())
    context.add_vm_module(module)
    functions = [name for name in module.function_names if not name.startswith("__") and "$" not in name]
    main = context.modules[module.name][functions[0]]
    names = runs._inputs_of(path)

    def run(given: dict) -> list:
        results = main(*[given[name] for name in names])
        results = results if isinstance(results, (list, tuple)) else [results]
        return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
    return run


def _tvm_serializes() -> str:
    """"" where TVM writes a module as JSON (MetaSchedule's builders and database do), else why not: with
    apache-tvm-ffi 0.1.15.post2 beside apache-tvm 0.27.0.post1, ``tvm.ir.save_json`` crashes the process."""
    probe = ("import tvm\nfrom tvm import te\na = te.placeholder((4,), name='a')\n"
             "b = te.compute((4,), lambda i: a[i] + 1.0, name='b')\n"
             "tvm.ir.save_json(tvm.IRModule({'main': te.create_prim_func([a, b])}))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if done.returncode == 0:
        return ""
    from importlib import metadata

    return (f"tvm.ir.save_json crashed (exit {done.returncode}; apache-tvm-ffi {metadata.version('apache-tvm-ffi')}):"
            " MetaSchedule cannot tune here; pip install 'apache-tvm-ffi==0.1.14.post0'")


_TVM_RUNNER = None


def prepare_tvm(path: str, feeds: dict, work: str, options: dict):
    """Relax's ONNX frontend at the feeds' shapes, tuned with MetaSchedule for this CPU (target {"kind": "llvm",
    "mcpu": the host CPU, "num-cores": 1}), the passes of relax.get_pipeline("static_shape_tuning") with a
    budget of ``trials`` per task, compiled with tvm.compile and run on Relax's VM (TVM_NUM_THREADS=1).

    The pipeline itself cannot be used as it is here: MetaSchedule's LocalBuilder gives each batch of
    candidates 30 s in a fresh process, and that process spends about 30 s of CPU importing
    tvm.s_tir.tensor_intrin, so every candidate timed out. The same passes run with tune_relax called with a
    builder that builds in this process and one LocalRunner for all the models; the evolutionary search's
    population (512, 4 generations by default: about 10 minutes on a model's largest fused step alone) is
    ``population``, 1 generation, and its initial sampling stops at ``population`` unmeasured candidates (a
    fused step of a hundred concatenated outputs has one schedule, and MetaSchedule samples it until it gives
    up: about 30 s per try at a population of 64). ``tuning_dir`` keeps the tuning records of each model (by
    its bytes, target and budget) for a later run, which then only applies them."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.ir.utils import derived_object
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export
    from tvm.target import codegen

    why_not = _tvm_serializes()
    if why_not:
        raise RuntimeError(why_not)

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs):
            results = []
            for item in build_inputs:
                try:
                    results.append(BuilderResult(default_export(default_build(item.mod, item.target, None)), None))
                except Exception as error:  # noqa: BLE001 - a candidate that does not build is skipped
                    results.append(BuilderResult(None, str(error)))
            return results

    global _TVM_RUNNER
    trials, population = int(options.get("trials", 16)), int(options.get("population", 64))
    target = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": 1})
    names = runs._inputs_of(path)
    module = from_onnx(onnx.load(path), shape_dict={n: list(feeds[n].shape) for n in names},
                       dtype_dict={n: str(feeds[n].dtype) for n in names}, keep_params_in_input=False)
    with open(path, "rb") as handle:
        key = hashlib.sha256(handle.read() + json.dumps([str(target), trials, population]).encode()).hexdigest()
    records = os.path.join(options.get("tuning_dir") or work, key[:16])
    tuned = os.path.exists(os.path.join(records, "database_tuning_record.json"))
    if _TVM_RUNNER is None:  # one runner for all the models: starting its process takes about 30 s
        _TVM_RUNNER = ms.runner.LocalRunner()
    with target:
        module = relax.transform.DecomposeOpsForInference()(module)
        module = relax.transform.CanonicalizeBindings()(module)
        module = relax.get_pipeline("zero")(module)
        if not tuned:
            tasks = ms.relax_integration.extract_tasks(module, target)
            ms.relax_integration.tune_relax(
                module, {}, target, records + ".partial", max_trials_global=trials * len(tasks),
                max_trials_per_task=trials, num_trials_per_iter=min(trials, 64), builder=InProcessBuilder(),
                runner=_TVM_RUNNER, seed=0, strategy=ms.search_strategy.EvolutionarySearch(
                    population_size=population, init_min_unmeasured=min(50, population), genetic_num_iters=1))
            shutil.rmtree(records, ignore_errors=True)
            os.replace(records + ".partial", records)
        module = relax.transform.MetaScheduleApplyDatabase(records)(module)
    machine = relax.VirtualMachine(tvm.compile(module, target=target), tvm.cpu())
    tensor = tvm.runtime.tensor

    def run(given: dict) -> list:
        result = machine["main"](*[tensor(given[n]) for n in names])
        results = list(result) if not hasattr(result, "numpy") else [result]
        return [np.asarray(r.numpy()) for r in results]
    return run


def prepare_tvm_llvm(path: str, feeds: dict, work: str, options: dict):
    """How the tests compile for TVM (runtime_runs.prepare_tvm): LegalizeOps, tvm.compile for a bare "llvm"
    target, no tuning; for comparison."""
    return runs.prepare_tvm(path, feeds, work)


def prepare_ncnn(path: str, feeds: dict, work: str, options: dict):
    """As the tests run ncnn (runtime_runs.prepare_ncnn: pnnx writes the param and bin files for one row's shape,
    fp16=0; ncnn.Net with float16 storage and arithmetic off, light mode, its default; each batch row on its own,
    one after another, since ncnn's blobs have no batch axis), on one thread."""
    return runs.prepare_ncnn(path, feeds, work, threads=1)


DRIVERS = {"onnxruntime": prepare_onnxruntime, "openvino": _openvino("f32"), "openvino-default": _openvino(None),
           "tract": prepare_tract, "iree": prepare_iree, "tvm": prepare_tvm, "tvm-llvm": prepare_tvm_llvm,
           "ncnn": prepare_ncnn}


def versions(driver: str) -> dict:
    from importlib import metadata

    found = {}
    for package in PACKAGES[driver]:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def serve(driver: str) -> int:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the runtime's own prints away from the answers
    prepared, work = {}, tempfile.TemporaryDirectory()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "prepare" in request:
                key = request["prepare"]
                feeds = dict(np.load(request["feeds"]))
                folder = os.path.join(work.name, str(len(prepared)))
                os.makedirs(folder)
                start = time.perf_counter()
                run = DRIVERS[driver](os.path.abspath(request["model"]), feeds, folder, request.get("options", {}))
                compile_s = time.perf_counter() - start
                np.savez(request["outputs"], **{f"out{k}": r for k, r in enumerate(run(feeds))})
                warm = []
                for _ in range(3):
                    start = time.perf_counter()
                    run(feeds)
                    warm.append(time.perf_counter() - start)
                prepared[key] = (run, feeds)
                answer = {"compile_s": compile_s, "warm_s": min(warm)}
            elif "time" in request:
                run, feeds = prepared[request["time"]]
                count = int(request["runs"])
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(count):
                    run(feeds)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                answer = {"seconds": wall / count, "cpu": cpu / wall}
            else:
                answer = {"versions": versions(driver)}
        except Exception as error:  # noqa: BLE001 - one line for the caller
            answer = {"error": f"{type(error).__name__}: {runs._first_error(str(error))}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    work.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
