"""Float16 ``MatMul`` of a time-major swap (``rewriters.written.half_matmuls``).

onnxruntime 1.23-1.32 ends the process while creating a session on a float16 ``Transpose(perm=[1, 0,
2])`` read by a ``MatMul`` with a constant 2-D right side. The pass writes the product first and
the swap after. Hand-built graphs, each loaded in a child process (a crash ends only that process):
the shape as written ends onnxruntime (pinned, so that the pass can go the day onnxruntime loads it);
the pass's output loads and equals numpy's product; what the pass must leave alone (float32, another
perm, a right side fed at run time, a swap read elsewhere) stays as it is. The same with ``Cast`` and
``Identity`` nodes between the swap and the ``MatMul`` (a float16 or float64 swap cast to float32, cast
back to float16, passed on), whatever the types: the Scan form's hoisted projection of a ``mixed_float16``
stack of two-state cells (Keras's own stacked-cells test) wrote the first, and converting it ended the
process; it now converts, loads and equals Keras.
"""
from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tf2onnx_rnn.rewriters.written.half_matmuls import swap_half_matmuls

FEATURES, HIDDEN = 3, 5


def _model(dtype=np.float16, perm=(1, 0, 2), fed_weights: bool = False, swap_read_elsewhere: bool = False,
           in_a_branch: bool = False) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weights = numpy_helper.from_array(np.random.default_rng(3).standard_normal((FEATURES, HIDDEN)).astype(dtype), "W")
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=list(perm)),
             helper.make_node("MatMul", ["x_tm", "W"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", elem, ["T", "B", HIDDEN])]
    if swap_read_elsewhere:
        outputs.append(helper.make_tensor_value_info("x_tm", elem, ["T", "B", FEATURES]))
    inputs = [helper.make_tensor_value_info("x", elem, ["B", "T", FEATURES])]
    if fed_weights:
        inputs.append(helper.make_tensor_value_info("W", elem, [FEATURES, HIDDEN]))
    initializers = [] if fed_weights else [weights]
    if in_a_branch:  # the same nodes inside both branches of an If
        branch = helper.make_graph(nodes, "branch", [], [helper.make_tensor_value_info("y", elem, ["T", "B", HIDDEN])])
        nodes = [helper.make_node("ReduceMin", ["x"], ["low"], keepdims=0),
                 helper.make_node("Less", ["low", "zero"], ["negative"]),
                 helper.make_node("If", ["negative"], ["y"], then_branch=branch, else_branch=branch)]
        initializers.append(numpy_helper.from_array(np.zeros((), dtype), "zero"))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# (the input's type, the nodes between the swap and the MatMul: Cast targets, or "id"), the MatMul's type
CHAINS = {"float16-cast-float32": (np.float16, (np.float32,), np.float32),
          "float16-cast-float32-cast-float16": (np.float16, (np.float32, np.float16), np.float16),
          "float64-cast-float32": (np.float64, (np.float32,), np.float32),
          "float16-identity": (np.float16, ("id",), np.float16)}


def _chain_model(name: str) -> onnx.ModelProto:
    """x -> swap -> the chain's casts and identities -> MatMul with a constant right side."""
    source, between, product = CHAINS[name]
    nodes, current = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2])], "x_tm"
    for index, step in enumerate(between):
        nodes.append(helper.make_node("Identity", [current], [f"step{index}"]) if step == "id" else helper.make_node(
            "Cast", [current], [f"step{index}"], to=helper.np_dtype_to_tensor_dtype(np.dtype(step))))
        current = f"step{index}"
    nodes.append(helper.make_node("MatMul", [current, "W"], ["y"]))
    weights = numpy_helper.from_array(np.random.default_rng(3).standard_normal((FEATURES, HIDDEN)).astype(product), "W")
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(product))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", helper.np_dtype_to_tensor_dtype(np.dtype(source)), ["B", "T", FEATURES])],
        [helper.make_tensor_value_info("y", elem, ["T", "B", HIDDEN])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _load_in_a_child(model: onnx.ModelProto, tmp_path, dtype=np.float16) -> subprocess.CompletedProcess:
    """Create an onnxruntime session (its default optimizations) in a child process and print the
    first output's values on x of shape (2, 4, FEATURES)."""
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    script = ("import sys, numpy as np, onnxruntime as ort\n"
              "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
              f"x = np.random.default_rng(4).standard_normal((2, 4, {FEATURES})).astype(np.{np.dtype(dtype).name})\n"
              "feeds = {'x': x}\n"
              "if len(s.get_inputs()) > 1: feeds['W'] = np.ones((%d, %d), x.dtype)\n" % (FEATURES, HIDDEN) +
              "print(repr(s.run(None, feeds)[0].astype(np.float64).ravel().tolist()))\n")
    return subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)


def _expected() -> np.ndarray:
    x = np.random.default_rng(4).standard_normal((2, 4, FEATURES)).astype(np.float16)
    w = np.random.default_rng(3).standard_normal((FEATURES, HIDDEN)).astype(np.float16)
    return (x.astype(np.float32).transpose(1, 0, 2) @ w.astype(np.float32)).ravel()


def test_onnxruntime_ends_the_process_loading_the_shape_as_written(tmp_path):
    """Fails the day onnxruntime loads it: the pass and its note can then go."""
    import onnxruntime

    done = _load_in_a_child(_model(), tmp_path)
    if tuple(int(part) for part in onnxruntime.__version__.split(".")[:2]) < (1, 23):
        pytest.skip(f"onnxruntime {onnxruntime.__version__} loads it")
    assert done.returncode < 0, (done.returncode, done.stdout, done.stderr[-500:])


@pytest.mark.parametrize("in_a_branch", [False, True], ids=["main-graph", "if-branches"])
def test_the_product_first_loads_and_equals_the_product(tmp_path, in_a_branch):
    model = _model(in_a_branch=in_a_branch)
    assert swap_half_matmuls(model) == (2 if in_a_branch else 1)
    onnx.checker.check_model(model, full_check=True)
    graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    for graph in graphs:
        ops = [n.op_type for n in graph.node]
        if "MatMul" in ops:
            assert ops.index("MatMul") < ops.index("Transpose"), ops
            matmul = graph.node[ops.index("MatMul")]
            assert matmul.input[0] == "x", "the product reads x itself"
    done = _load_in_a_child(model, tmp_path)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    got = np.array(ast.literal_eval(done.stdout.strip()))
    np.testing.assert_allclose(got, _expected(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("variant", [dict(dtype=np.float32), dict(perm=(0, 2, 1)), dict(fed_weights=True)],
                         ids=["float32", "other-perm", "fed-weights"])
def test_what_onnxruntime_loads_stays_as_it_is(variant):
    model = _model(**variant)
    before = model.SerializeToString()
    assert swap_half_matmuls(model) == 0
    assert model.SerializeToString() == before


def test_a_swap_read_elsewhere_stays_for_its_other_reader(tmp_path):
    model = _model(swap_read_elsewhere=True)
    assert swap_half_matmuls(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Transpose") == 2 and ops.count("MatMul") == 1, ops
    onnx.checker.check_model(model, full_check=True)
    done = _load_in_a_child(model, tmp_path)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])


def _two_readers(third: str) -> onnx.ModelProto:
    """Two MatMuls read one swap (``third`` "none"), or one MatMul and an If branch ("branch")."""
    weights = numpy_helper.from_array(np.random.default_rng(3).standard_normal((FEATURES, HIDDEN)).astype(np.float16),
                                      "W")
    shape = ["T", "B", HIDDEN]
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["x_tm", "W"], ["a"]),
             helper.make_node("MatMul", ["x_tm", "W"], ["b"]) if third == "none" else helper.make_node(
                 "Identity", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)]
    if third == "branch":
        branch = helper.make_graph([helper.make_node("Identity", ["x_tm"], ["z"])], "branch", [],
                                   [helper.make_tensor_value_info("z", TensorProto.FLOAT16, ["T", "B", FEATURES])])
        nodes += [helper.make_node("Constant", [], ["yes"], value=numpy_helper.from_array(np.array(True))),
                  helper.make_node("If", ["yes"], ["z"], then_branch=branch, else_branch=branch)]
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT16, ["T", "B", FEATURES]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["B", "T", FEATURES])
    graph = helper.make_graph(nodes, "g", [x], outputs, [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("third", ["none", "branch"])
def test_a_swap_two_matmuls_read_goes_unless_a_branch_reads_it(third):
    """Each MatMul takes the product first; the swap itself goes once no node reads it, and stays for an
    ``If`` branch that reads it from outside."""
    model = _two_readers(third)
    assert swap_half_matmuls(model) == (2 if third == "none" else 1)
    onnx.checker.check_model(model, full_check=True)
    swaps = [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] == "x"]
    assert len(swaps) == (1 if third == "branch" else 0), [n.name for n in model.graph.node]
    assert all(n.input[0] == "x" for n in model.graph.node if n.op_type == "MatMul")


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_casts_or_identities_between_the_swap_and_the_matmul(name: str, tmp_path):
    """As written, onnxruntime ends the process loading it (pinned); rewritten, the casts come before the
    swap and the product before it too, and the model loads and equals numpy's product."""
    import onnxruntime

    source, between, product = CHAINS[name]
    done = _load_in_a_child(_chain_model(name), tmp_path, dtype=source)
    if tuple(int(part) for part in onnxruntime.__version__.split(".")[:2]) >= (1, 23):
        assert done.returncode < 0, (done.returncode, done.stdout, done.stderr[-500:])
    model = _chain_model(name)
    assert swap_half_matmuls(model) == 1
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops[-2:] == ["MatMul", "Transpose"] and "Identity" not in ops, ops
    done = _load_in_a_child(model, tmp_path, dtype=source)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    x = np.random.default_rng(4).standard_normal((2, 4, FEATURES)).astype(source)
    w = np.random.default_rng(3).standard_normal((FEATURES, HIDDEN)).astype(product)
    expected = (x.transpose(1, 0, 2).astype(product).astype(np.float64) @ w.astype(np.float64)).ravel()
    tolerance = 2e-3 if product == np.float16 else 1e-5
    np.testing.assert_allclose(np.array(ast.literal_eval(done.stdout.strip())), expected, rtol=tolerance,
                               atol=tolerance)


def test_two_matmuls_of_one_cast_swap_share_the_moved_cast(tmp_path):
    """Two MatMuls read one cast of a swap (a float32 cell's two input kernels in a ``mixed_float16`` RNN):
    the cast is moved before the swap once, both products read it, every node keeps a name of its own, and
    the model loads and equals numpy's products."""
    w = np.random.default_rng(3).standard_normal((FEATURES, HIDDEN)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["x_tm"], perm=[1, 0, 2], name="swap"),
             helper.make_node("Cast", ["x_tm"], ["x32"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["x32", "W1"], ["a"], name="first"),
             helper.make_node("MatMul", ["x32", "W2"], ["b"], name="second"),
             helper.make_node("Add", ["a", "b"], ["y"], name="sum")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["B", "T", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "B", HIDDEN])],
        [numpy_helper.from_array(w, "W1"), numpy_helper.from_array(2 * w, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert swap_half_matmuls(model) == 2
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(names) == len(set(names)), names
    assert [n.op_type for n in model.graph.node].count("Cast") == 1, names
    done = _load_in_a_child(model, tmp_path)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    x = np.random.default_rng(4).standard_normal((2, 4, FEATURES)).astype(np.float16)
    expected = (x.transpose(1, 0, 2).astype(np.float64) @ (3 * w).astype(np.float64)).ravel()
    np.testing.assert_allclose(np.array(ast.literal_eval(done.stdout.strip())), expected, rtol=1e-5, atol=1e-5)


def test_a_mixed_float16_stack_of_two_state_cells_converts_and_loads(tmp_path):
    """Keras's own stacked-cells test's model (``RNN`` over three ``TwoStatesRNNCell``s of 3, 4 and 5 units,
    ``mixed_float16``, input fixed at (2, 3, 4)): its Scan's hoisted projection read a cast of a float16
    swap, and the loadability check's session ended the converting process. Converted in a child process
    (a crash there fails the test, not the suite), it loads and equals Keras."""
    script = """
import sys, numpy as np, keras, onnxruntime as ort
from tf2onnx_rnn import convert_keras
try:
    from keras.src.layers.rnn.rnn_test import TwoStatesRNNCell
except ImportError:
    sys.exit(77)
x = keras.Input((3, 4), batch_size=2, name="x")
layer = keras.layers.RNN([TwoStatesRNNCell(3), TwoStatesRNNCell(4), TwoStatesRNNCell(5)], dtype="mixed_float16")
model = keras.Model(x, layer(x))
rng = np.random.default_rng(0)
model.set_weights([(rng.standard_normal(w.shape) * 0.3).astype(w.dtype) for w in model.get_weights()])
proto = convert_keras(model)
session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
data = rng.standard_normal((2, 3, 4)).astype(np.float32)
got = session.run(None, {"x": data})[0].astype(np.float64)
want = np.asarray(model(data)).astype(np.float64)
print(float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))))
"""
    import parity

    if not parity.KERAS3:
        pytest.skip("Keras 3's stacked-cells test model")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if done.returncode == 77:
        pytest.skip("this Keras has no rnn_test.TwoStatesRNNCell")
    assert done.returncode == 0, (done.returncode, done.stderr[-1500:])
    assert float(done.stdout.strip().splitlines()[-1]) <= 3e-2, done.stdout
