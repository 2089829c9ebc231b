"""A native crash of onnxruntime while the conversion checks its model ends a child process, not the caller.

onnxruntime 1.23-1.32 ends the process creating a session on a float16 ``MatMul`` of a time-major swap
(tests/test_half_matmuls.py pins it); the converter writes that product otherwise
(``rewriters.written.half_matmuls``). With that pass turned off, a frozen graph computing such a product
converts to a model onnxruntime crashes on: the conversion must raise a one-line ``RuntimeCrashed`` (a
``ConversionError``) naming onnxruntime, the signal and the stage, write nothing, and leave its caller
running; the command line exits 3. The same conversion with the pass converts, and the child's check
does not change a model that loads (``tf2onnx_rnn.isolation``).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import helpers

TURN_OFF_THE_PASS = ("import tf2onnx_rnn.rewriters.written.passes as passes\n"
                     "passes.RULES = tuple(r for r in passes.RULES if r.name != 'half MatMuls swapped')\n")


def _turned_off(monkeypatch) -> None:
    """The written model's rule that writes such a product otherwise, out of the rules the driver runs."""
    from tf2onnx_rnn.rewriters.written import passes

    monkeypatch.setattr(passes, "RULES", tuple(r for r in passes.RULES if r.name != "half MatMuls swapped"))


@pytest.fixture(scope="module")
def crashing_graph(tmp_path_factory) -> str:
    """A frozen graph: x float16 [B, T, 3] -> a swap of its first two axes -> its product with a constant."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float16, [None, None, 3], name="x")
        weights = tf.constant(np.random.default_rng(1).standard_normal((3, 5)).astype(np.float16))
        tf.identity(tf.linalg.matmul(tf.transpose(x, [1, 0, 2]), weights), name="y")
    path = str(tmp_path_factory.mktemp("crash") / "crash.pb")
    with open(path, "wb") as stream:
        stream.write(graph.as_graph_def().SerializeToString())
    return path


def _onnxruntime_crashes() -> bool:
    import onnxruntime

    return tuple(int(part) for part in onnxruntime.__version__.split(".")[:2]) >= (1, 23)


def test_a_crash_of_the_checking_runtime_is_an_error_and_the_caller_goes_on(crashing_graph, tmp_path, monkeypatch):
    from tf2onnx_rnn import ConversionError, convert_graph_def
    from tf2onnx_rnn.isolation import RuntimeCrashed

    if not _onnxruntime_crashes():
        pytest.skip("this onnxruntime loads the shape")
    _turned_off(monkeypatch)
    output = tmp_path / "model.onnx"
    with pytest.raises(RuntimeCrashed) as crashed:
        convert_graph_def(crashing_graph, ["x:0"], ["y:0"], output_path=str(output))
    message = str(crashed.value)
    assert isinstance(crashed.value, ConversionError) and "\n" not in message, message
    assert message.startswith("onnxruntime ") and ("SIGSEGV" in message or "SIGABRT" in message), message
    assert "creating a session" in message and "nothing was written" in message, message
    assert not output.exists() and os.listdir(tmp_path) == []


def test_the_command_line_exits_3_on_a_runtime_crash(crashing_graph, tmp_path):
    if not _onnxruntime_crashes():
        pytest.skip("this onnxruntime loads the shape")
    output = tmp_path / "model.onnx"
    # TensorFlow is imported as the command line imports it (its loading lines held back), then the rule is
    # turned off: importing the rules first would import TensorFlow unguarded.
    script = ("import sys\nfrom tf2onnx_rnn.convert import import_tensorflow, main\nimport_tensorflow(False)\n"
              + TURN_OFF_THE_PASS + "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", script, "--graphdef", crashing_graph, "--inputs", "x:0",
                           "--outputs", "y:0", "--output", str(output)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, (done.returncode, done.stderr[-1500:])
    line = helpers.assert_one_error_line(done.stderr)
    assert "onnxruntime" in line and "ended its process" in line, line
    assert not output.exists()


def test_the_same_graph_converts_with_the_pass_and_equals_tensorflow(crashing_graph, tmp_path):
    from tf2onnx_rnn import convert_graph_def, report_of

    proto = convert_graph_def(crashing_graph, ["x:0"], ["y:0"], verify=True, tolerance=1e-2)
    assert "verified" in report_of(proto).checked
    assert helpers.ort_session(proto) is not None


def test_the_child_leaves_a_model_that_loads_as_it_is():
    """The check of a model that loads returns and raises nothing; one that onnxruntime refuses (an
    error, not a crash) is left to the caller's own checks."""
    import onnx

    from tf2onnx_rnn.isolation import check_survives

    model = _relu_model()
    before = model.SerializeToString()
    check_survives(model, [{"x": np.ones((2, 3), np.float32)}])
    assert model.SerializeToString() == before
    refused = onnx.ModelProto.FromString(before)
    refused.graph.node[0].op_type = "NoSuchOp"
    check_survives(refused, [])


def _relu_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_one_child_checks_one_model_after_another_and_a_crashed_one_is_replaced(crashing_graph, monkeypatch):
    """The child stays for the next check of the process; one that a model crashed is replaced by a new
    one, which checks the next model as before."""
    from tf2onnx_rnn import convert_graph_def, isolation

    feeds = [{"x": np.ones((2, 3), np.float32)}]
    isolation.check_survives(_relu_model(), feeds)
    first = isolation._child.process
    isolation.check_survives(_relu_model(), feeds)
    assert isolation._child.process is first and first.poll() is None
    if not _onnxruntime_crashes():
        pytest.skip("this onnxruntime loads the crashing shape")
    _turned_off(monkeypatch)
    with pytest.raises(isolation.RuntimeCrashed):
        convert_graph_def(crashing_graph, ["x:0"], ["y:0"])
    assert first.poll() is not None and first.returncode < 0, first.returncode  # it ended by a signal
    isolation.check_survives(_relu_model(), feeds)
    assert isolation._child.process is not first and isolation._child.process.poll() is None


def test_a_forked_process_checks_in_a_child_of_its_own(monkeypatch):
    """A process forked after its parent's child started (seen as another pid) does not write to that child
    (two writers would mix their requests) nor close it: it starts one of its own."""
    from tf2onnx_rnn import isolation

    feeds = [{"x": np.ones((2, 3), np.float32)}]
    isolation.check_survives(_relu_model(), feeds)
    parents = isolation._child
    monkeypatch.setattr(isolation.os, "getpid", lambda: parents.owner + 1)
    isolation.check_survives(_relu_model(), feeds)
    assert isolation._child is not parents and isolation._child.owner == parents.owner + 1
    assert parents.process.poll() is None  # the parent's child is left to the parent
    isolation._child.process.stdin.close()  # its input closed, as when its caller ends: it ends
    assert isolation._child.process.wait(timeout=60) == 0
    monkeypatch.undo()
    isolation._child = parents
