"""Where the time of a masked layer goes, op by op: ours (default form) against the hand-built floor.

    python benchmarks/profile_masked.py                  # the masked LSTM/GRU cases of run.py
    python benchmarks/profile_masked.py --cases lstm-uni-masked-b1 --rounds 3 --out /tmp/p.md

For each masked LSTM/GRU case of ``run.py`` the model is converted by this package (default form)
and the floor is built (``minimal.py``: Transpose -> the native node with the lengths fed ->
Transpose). Every node of either graph is given a role:

- recurrent: the LSTM/GRU node;
- transposes: the float Transposes of the input and the output (the floor has the same two);
- masking layer: a Masking layer's own work (``x != v``, ``any`` over features, twice: kept
  dimension for the select, dropped for the mask, and the select of ``x``);
- mask prep: index work shared by several uses (the mask's transpose, its 0/1 ints, shapes, ranges);
- lengths: the kept counts fed as sequence_lens;
- compaction: the rows to read for each compacted step (sort key, TopK, row arithmetic) and the
  Gather of the input;
- restore: the rows to read back for each step (CumSum, row arithmetic) and the Gather of the
  outputs (and a Where over them where one is left);
- split/concat: a Bidirectional layer's Slice of the node's two directions (if any) and the
  Concat of Keras's merge.

Each role's nodes are timed as a graph of their own in onnxruntime (one intra-op thread,
IOBinding, inputs bound once), fed the very tensors the whole graph gives them, and the time of an
empty run is subtracted; each node alone is timed the same way and summed per op type. A view
(Flatten, Squeeze, Unsqueeze, Reshape) of a tensor from outside a part is left out of it: in the
whole graph onnxruntime runs it in place, alone it would copy. A part runs on inputs hot in cache
and pays no dispatch for its neighbours: what the parts miss is the whole graph's time minus
their sum. (Timing the whole graph without a role instead moved by tens of microseconds between
rounds at batch 16, and a role's outputs fed from outside change what the rest costs.)

onnxruntime's own profiler (``enable_profiling``) is no help here: it counts whole microseconds
and adds about 2 us to every node, so a 44-node graph reads as 630 us where it runs in 400.

Reported: medians, microseconds per run, of ours, the floor and their difference per role; the
sum of the parts against the whole graph timed the same way; the wall time of each whole
graph as ``run.py`` times it (``session.run`` with numpy feeds, interleaved blocks) and their
ratio; with ``--compare``, the wall time of models saved by another version, in the same rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from run import _time_block as time_block  # noqa: E402
from run import all_cases, build_model, make_inputs, minimal_model, ours_convert  # noqa: E402

ROLES = ("recurrent", "transposes", "masking layer", "mask prep", "lengths", "compaction", "restore",
         "split/concat", "other")
RECURRENT = {"LSTM", "GRU", "RNN"}
# In the whole graph onnxruntime runs these in place (the output aliases the input); in a part of
# their own whose input comes from outside they would copy it (a caller's buffer is not reused), so
# a part leaves them out (their dispatch, a fraction of a microsecond, is in `whole` only)
VIEWS = {"Flatten", "Squeeze", "Unsqueeze", "Reshape"}


def masked_cases() -> list:
    return [case for case in all_cases()
            if case.masked and case.kind in ("LSTM", "GRU") and case.time == 100 and case.depth == 1
            and case.padding == "post"]


def _graph_maps(graph):
    producer, consumers = {}, defaultdict(list)
    for node in graph.node:
        for name in node.output:
            producer[name] = node
        for name in node.input:
            if name:
                consumers[name].append(node)
    return producer, consumers


def roles(model) -> dict:
    """node name -> role (see the module's docstring)."""
    graph = model.graph
    producer, consumers = _graph_maps(graph)
    role, sinks = {}, defaultdict(set)  # sinks: tensor -> roles of the uses it reaches
    inputs = {value.name for value in graph.input}
    for node in graph.node:
        if node.op_type not in RECURRENT:
            continue
        role[node.name] = "recurrent"
        if len(node.input) > 4 and node.input[4]:
            sinks[node.input[4]].add("lengths")
        # the input's data path: back from X through Gather/Flatten/Transpose/Where to a graph input
        tensor = node.input[0]
        while tensor not in inputs and tensor in producer:
            step = producer[tensor]
            if step.op_type == "Gather":
                role[step.name] = "compaction"
                sinks[step.input[1]].add("compaction")
                tensor = step.input[0]
            elif step.op_type == "Flatten":
                role[step.name] = "compaction"
                tensor = step.input[0]
            elif step.op_type == "Transpose":
                role[step.name] = "transposes"
                tensor = step.input[0]
            elif step.op_type == "Where":
                role[step.name] = "masking layer"
                sinks[step.input[0]].add("masking layer")
                tensor = step.input[1]
            else:
                break
        # the output's data path: forward from Y to the graph's output
        frontier = [node.output[0]]
        while frontier:
            tensor = frontier.pop()
            for step in consumers.get(tensor, []):
                if step.name in role:
                    continue
                if step.op_type == "Transpose":
                    role[step.name] = "transposes"
                elif step.op_type in ("Slice", "Concat", "Split"):
                    role[step.name] = "split/concat"
                else:
                    role[step.name] = "restore"
                    if step.op_type == "Gather":
                        sinks[step.input[1]].add("restore")
                    elif step.op_type == "Where":
                        sinks[step.input[0]].add("restore")
                frontier.extend(step.output)
    reaches: dict = {}

    def reach(node) -> frozenset:
        """The roles of the uses ``node``'s outputs reach."""
        if node.name not in reaches:
            found = set()
            for out in node.output:
                found |= sinks.get(out, set())
                for user in consumers.get(out, []):
                    if user.name not in role:
                        found |= reach(user)
            reaches[node.name] = frozenset(found)
        return reaches[node.name]

    for node in graph.node:
        if node.name in role:
            continue
        found = reach(node)
        first = producer.get(node.input[0]) if node.input else None
        if "masking layer" in found or node.op_type == "ReduceMax" or (
                node.op_type == "Cast" and first is not None and first.op_type == "ReduceMax"):
            role[node.name] = "masking layer"
        elif len(found) == 1:
            role[node.name] = next(iter(found))
        elif found:
            role[node.name] = "mask prep"
        else:
            role[node.name] = "other"
    return role


def named(model_proto):
    """Every node named (the floor's have no names)."""
    for index, node in enumerate(model_proto.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    return model_proto


def session(model_proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # a part's unused inputs are expected
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _types(model) -> dict:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {value.name: value.type.tensor_type.elem_type
             for value in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    types.update({tensor.name: tensor.data_type for tensor in model.graph.initializer})
    return types


def every_tensor(model, feeds: dict) -> dict:
    """tensor name -> its value in one run of ``model`` on ``feeds`` (inputs and initializers too)."""
    from onnx import helper, numpy_helper

    types = _types(model)
    probe = type(model)()
    probe.CopyFrom(model)
    outputs = {value.name for value in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in outputs:
                probe.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
                outputs.add(name)
    names = [value.name for value in probe.graph.output]
    values = dict(zip(names, session(probe).run(names, feeds)))
    values.update(feeds)
    values.update({tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer})
    return values


def part(model, nodes: list, values: dict):
    """A model of ``nodes`` alone: what they read from elsewhere becomes inputs (initializers stay),
    what is read elsewhere (or is the model's output) becomes outputs. None when empty."""
    from onnx import helper

    nodes = list(nodes)
    while True:  # views of what comes from outside: left out (see VIEWS)
        produced = {name for node in nodes for name in node.output}
        views = [node for node in nodes if node.op_type in VIEWS and node.input[0] not in produced]
        if not views:
            break
        nodes = [node for node in nodes if node not in views]
    if not nodes:
        return None
    graph = model.graph
    inside = {id(node) for node in nodes}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    read_outside = {name for node in graph.node if id(node) not in inside for name in node.input}
    read_outside |= {value.name for value in graph.output}
    inputs, used_initializers = [], []
    for node in nodes:
        for name in node.input:
            if not name or name in produced or name in inputs or name in [t.name for t in used_initializers]:
                continue
            if name in initializers:
                used_initializers.append(initializers[name])
            else:
                inputs.append(name)
    outputs = [name for node in nodes for name in node.output if name and name in read_outside]

    def info(name):
        value = np.asarray(values[name])
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                             [None] * value.ndim)

    sub = helper.make_graph(list(nodes), "part", [info(name) for name in inputs], [info(name) for name in outputs],
                            used_initializers)
    sub_model = helper.make_model(sub, opset_imports=list(model.opset_import))
    sub_model.ir_version = model.ir_version
    return sub_model, inputs


class Bound:
    """A session run through IOBinding on inputs bound once (no per-run copies of the feeds)."""

    def __init__(self, model_proto, inputs: list, values: dict):
        import onnxruntime as ort

        self.session = session(model_proto)
        self.binding = self.session.io_binding()
        self.keep = []
        for name in inputs:
            value = ort.OrtValue.ortvalue_from_numpy(np.array(values[name], order="C"))
            self.keep.append(value)
            self.binding.bind_ortvalue_input(name, value)
        for output in self.session.get_outputs():
            self.binding.bind_output(output.name)

    def __call__(self):
        self.session.run_with_iobinding(self.binding)


def empty_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["e"], ["f"])], "empty",
                              [helper.make_tensor_value_info("e", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("f", TensorProto.INT64, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def profile_case(case, rounds: int, block: float, per_node: bool = True, save: str = None,
                 compare: str = None) -> dict:
    import onnx

    model = build_model(case)
    feeds, keras_inputs, lengths = make_inputs(case)
    models = {"ours": named(ours_convert(model)), "floor": named(minimal_model(case, model, lengths_fed=True))}
    if save:
        os.makedirs(save, exist_ok=True)
        onnx.save(models["ours"], os.path.join(save, case.name + ".onnx"))
    all_feeds = {"ours": feeds, "floor": {"x": feeds["x"], "lengths": lengths}}
    expected = np.asarray(model(keras_inputs, training=False))
    result = {"case": case.name, "max_abs_error": float(np.max(np.abs(
        session(models["ours"]).run(None, feeds)[0] - expected)))}
    runners = {"empty": Bound(empty_model(), ["e"], {"e": np.array(0, np.int64)})}
    for name, onnx_model in models.items():
        values = every_tensor(onnx_model, all_feeds[name])
        role_of = roles(onnx_model)
        result[name + "_nodes"] = len(onnx_model.graph.node)
        whole = [value.name for value in onnx_model.graph.input]
        runners[f"{name}/whole"] = Bound(onnx_model, whole, values)
        session_feeds = all_feeds[name]
        wall_session = session(onnx_model)
        runners[f"{name}/wall"] = lambda s=wall_session, f=session_feeds: s.run(None, f)
        ops = defaultdict(lambda: defaultdict(int))
        for role in ROLES:
            nodes = [node for node in onnx_model.graph.node if role_of[node.name] == role]
            for node in nodes:
                ops[role][node.op_type] += 1
            built = part(onnx_model, nodes, values)
            if built is not None:
                runners[f"{name}/role/{role}"] = Bound(built[0], built[1], values)

        result[name + "_ops"] = {role: dict(counts) for role, counts in ops.items()}
        if per_node:
            for node in onnx_model.graph.node:
                built = part(onnx_model, [node], values)
                if built is not None:
                    runners[f"{name}/node/{node.op_type}/{node.name}"] = Bound(built[0], built[1], values)
    before = os.path.join(compare, case.name + ".onnx") if compare else None
    if before and os.path.exists(before):
        before_session = session(onnx.load(before))
        runners["before/wall"] = lambda: before_session.run(None, feeds)
    samples = defaultdict(list)
    for _ in range(rounds):  # interleaved: every runner once per round
        for key, run in runners.items():
            samples[key].append(time_block(run, block))
    micros = {key: statistics.median(values) * 1e6 for key, values in samples.items()}
    empty = micros.pop("empty")
    if "before/wall" in micros:
        result["before_wall"] = micros["before/wall"]
    result["empty_us"] = empty
    for name in models:
        result[name] = {role: max(micros.get(f"{name}/role/{role}", empty) - empty, 0.0) for role in ROLES}
        result[name]["parts"] = sum(result[name][role] for role in ROLES)
        result[name]["whole"] = micros[f"{name}/whole"] - empty
        result[name]["wall"] = micros[f"{name}/wall"]

        by_op = defaultdict(float)
        for key, value in micros.items():
            if key.startswith(f"{name}/node/"):
                by_op[key.split("/")[2]] += max(value - empty, 0.0)
        result[name + "_by_op"] = dict(by_op)
    return result


COLUMNS = ("recurrent", "transposes", "masking layer", "mask prep", "lengths", "compaction", "restore",
           "split/concat")


def table(results: list) -> str:
    head = ["case", ""] + list(COLUMNS) + ["parts", "whole", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in results:
        for name in ("ours", "floor", "diff"):
            if name == "diff":
                values = {key: row["ours"][key] - row["floor"][key] for key in COLUMNS + ("parts", "whole", "wall")}
                cells = [f"{values[key]:+.0f}" for key in COLUMNS + ("parts", "whole", "wall")]
                cells[-1] += f" ({row['ours']['wall'] / row['floor']['wall']:.3f}x)"
            else:
                cells = [f"{row[name][key]:.0f}" if row[name][key] else "-" for key in COLUMNS + ("parts", "whole",
                                                                                                   "wall")]
            lines.append("| " + " | ".join([row["case"] if name == "ours" else "", name] + cells) + " |")
    return "\n".join(lines)


def ops_table(results: list) -> str:
    lines = ["| case | nodes ours/floor | max abs error vs Keras | " + " | ".join(COLUMNS[1:]) + " |",
             "|" + "---|" * (len(COLUMNS) + 2)]
    for row in results:
        cells = [row["case"], f"{row['ours_nodes']}/{row['floor_nodes']}", f"{row['max_abs_error']:.1e}"]
        for role in COLUMNS[1:]:
            ops = row["ours_ops"].get(role, {})
            cells.append(" ".join(f"{op}{'x' + str(n) if n > 1 else ''}" for op, n in sorted(ops.items())) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def by_op_table(results: list) -> str:
    """Ours per op type (each node timed alone, summed), the recurrent node left out."""
    totals = defaultdict(float)
    for row in results:
        for op, value in row["ours_by_op"].items():
            totals[op] += value
    ops = [op for op in sorted(totals, key=totals.get, reverse=True) if op not in RECURRENT]
    lines = ["| case | " + " | ".join(ops) + " | sum |", "|" + "---|" * (len(ops) + 2)]
    for row in results:
        values = [row["ours_by_op"].get(op, 0.0) for op in ops]
        lines.append("| " + " | ".join([row["case"]] + [f"{v:.1f}" if v else "-" for v in values]
                                       + [f"{sum(values):.0f}"]) + " |")
    return "\n".join(lines)


def compare_table(results: list) -> str:
    lines = ["| case | before us | ours us | floor us | before/floor | ours/floor | ours/before |",
             "|---|---|---|---|---|---|---|"]
    for row in results:
        before, ours, floor = row["before_wall"], row["ours"]["wall"], row["floor"]["wall"]
        lines.append(f"| {row['case']} | {before:.0f} | {ours:.0f} | {floor:.0f} | {before / floor:.3f} | "
                     f"{ours / floor:.3f} | {ours / before:.3f} |")
    return "\n".join(lines)


def report(results: list, machine: dict, args) -> str:
    compared = []
    if all("before_wall" in row for row in results):
        compared = [f"Wall time against the models in {args.compare_label or args.compare} (converted by the "
                    "earlier version, `--compare`), timed in the same rounds:", "", compare_table(results), ""]
    return "\n".join([
        "# Masked layers op by op: ours (default form) against the hand-built floor",
        "",
        f"`python benchmarks/profile_masked.py` (the roles and the method: its docstring). onnxruntime "
        f"{machine['onnxruntime']}, one intra-op thread, {machine['cpu']}. T=100, 64 features, 128 units, "
        f"mixed post-padded lengths (first row full). Medians of {args.rounds} interleaved rounds of "
        f"{args.block * 1e3:g} ms blocks, microseconds per run. Between processes the same model's "
        "batch-16 time moves by up to about 3%: compare within a table.",
        "",
        "Each role alone (its nodes as a graph of their own, an empty run subtracted); `parts` is their "
        "sum, `whole` the whole graph timed the same way (IOBinding, empty run subtracted), `wall` the "
        "whole graph as `run.py` times it (`session.run`, numpy feeds), with ours/floor:",
        "",
        table(results),
        "",

        "Ops per role in ours (as converted; onnxruntime drops the bool-to-bool Cast of the mask):",
        "",
        ops_table(results),
        "",
        "Ours per op type, each node timed alone and summed (microseconds per run; the recurrent node "
        "and views left out):",
        "",
        by_op_table(results),
        "",
    ] + compared)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", help="case names (default: every masked LSTM/GRU case)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--block", type=float, default=0.03, help="seconds per timing block (default 0.03)")
    parser.add_argument("--no-per-node", action="store_true", help="skip timing each node alone")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "profile_masked.md"))
    parser.add_argument("--json", help="also write the medians here")
    parser.add_argument("--save-models", help="write our converted models to this directory (<case>.onnx)")
    parser.add_argument("--compare", help="a directory of models saved by --save-models from another version: "
                                          "their wall time is reported beside ours")
    parser.add_argument("--compare-label", help="how the report names the --compare models")
    args = parser.parse_args(argv)

    import onnxruntime
    from run import machine_info

    cases = masked_cases()
    if args.cases:
        cases = [case for case in cases if case.name in args.cases]
    results = []
    for case in cases:
        print(f"profiling {case.name} ...", file=sys.stderr, flush=True)
        results.append(profile_case(case, args.rounds, args.block, not args.no_per_node, args.save_models,
                                    args.compare))
    machine = machine_info()
    machine["onnxruntime"] = onnxruntime.__version__
    text = report(results, machine, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as stream:
        stream.write(text)
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(results, stream, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
