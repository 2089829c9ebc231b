"""Where converted models go next: OpenVINO, tract, onnxslim and float16 conversion.

Every model of the downstream matrix (``downstream_models.py``: LSTM, GRU and SimpleRNN, one
direction with go_backwards and Bidirectional, masked and unmasked, and variants; masked ones
converted with ``target="portable"``, unmasked ones both by default and with the target) must:

- run in onnxruntime, OpenVINO (CPU, f32 inference precision, dynamic shapes) and tract, within
  1e-4 of ``model(x, training=False)``;
- survive onnxslim (``onnxslim.slim``) with unchanged results in onnxruntime;
- convert to float16 (onnxconverter-common, ``keep_io_types=True``) and run within 1e-2 of Keras.

What each runtime needs, and why the portable target exists:

- tract takes ``sequence_lens`` only as a constant: the default masked model (computed
  ``sequence_lens``) is refused with "Non constant seq_len is not supported". tract also runs a
  lone ``direction="reverse"`` node forward (it takes the direction from W's number of directions),
  so no form writes one for an unmasked layer: a go_backwards layer runs forward over its input
  reversed by a Slice (tract and onnx2torch have no ReverseSequence either). With no initial
  state given, tract's recurrent ops build the zero state themselves:
  a symbolic batch size then aborts the process (a Rust panic, ``UndeterminedSymbol``) and an LSTM
  whose sequence and final states are all outputs stops ("Clashing resolution for expression").
  The portable form gives every node its zero states explicitly: a model runs there with a symbolic
  batch size. tract reads a time reversal (a Slice with step -1 to the far end) of a symbolic time
  length as 2**62 steps: an unmasked go_backwards layer's input is reversed so, and those models run
  with their time length fixed (``set_input_fact``); a masked model, whose backward passes' kept
  steps are scattered in reverse, runs with a symbolic time length too.
- OpenVINO's CPU plugin keeps a recurrent node with a dynamic input shape as its fused sequence
  kernel, which ignores ``sequence_lens`` (its ``RNN::isSupportedOperation`` returns early for
  dynamic shapes; with static shapes it decomposes the node into a loop that honours them). The
  default masked model is therefore exact in OpenVINO only reshaped to static shapes; the portable
  form is exact with dynamic shapes. Compiled with f32 inference precision: its CPU plugin computes
  in bf16 by default on CPUs with AMX / AVX512-BF16, about 1e-2 from Keras.
- stock tf2onnx's TensorList ``Loop`` of a masked LSTM: tract does not implement Loop. OpenVINO ran
  it exactly up to 2025.4; from 2026.0 its ONNX frontend refuses it ("The provided loop body graph
  canonical inputs size ... does not match"), which is not checked here (it depends on the version).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

import helpers
import parity
import tf2onnx_rnn
from downstream_models import (
    CASES,
    DEFAULT,
    FEATURES,
    FLAVOR,
    MATRIX,
    PORTABLE,
    STATES,
    UNITS,
    Case,
    batch,
    build,
    converted,
    has_sequence_lens,
    structure_problems,
)

openvino = pytest.importorskip("openvino")
tract = pytest.importorskip("tract")
onnxslim = pytest.importorskip("onnxslim")
float16 = pytest.importorskip("onnxconverter_common.float16")

TOLERANCE = 1e-4  # Keras vs each runtime
SLIM_TOLERANCE = 1e-6  # onnxruntime before vs after onnxslim
FLOAT16_TOLERANCE = 1e-2


@pytest.fixture(scope="session")
def downstream_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("downstream")


# -- runtimes ---------------------------------------------------------------------------------

def run_onnxruntime(proto: onnx.ModelProto, x: np.ndarray) -> list:
    return helpers.ort_session(proto).run(None, {"x": x})


def run_openvino(path: str, x: np.ndarray, static: bool = False) -> list:
    """OpenVINO's CPU plugin at f32, with the model's dynamic shapes (or reshaped to ``x``'s)."""
    core = openvino.Core()
    model = core.read_model(path)
    if static:
        model.reshape({model.inputs[0].get_any_name(): list(x.shape)})
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    result = compiled([x])
    return [np.asarray(result[output]) for output in compiled.outputs]


def run_tract(path: str, x: np.ndarray, batch: bool = True, time: bool = True) -> list:
    """tract with the input's batch size and time length fixed, or left symbolic where ``batch`` or
    ``time`` is False (see the module's docstring)."""
    model = tract.onnx().load(path)
    dims = [str(x.shape[0]) if batch else "B", str(x.shape[1]) if time else "T", str(x.shape[2])]
    model.set_input_fact(0, ",".join(dims) + ",f32")
    return [tensor.to_numpy() for tensor in model.into_model().into_runnable().run([x])]


def slimmed(proto: onnx.ModelProto) -> onnx.ModelProto:
    return onnxslim.slim(onnx.ModelProto.FromString(proto.SerializeToString()))


def problems_of(label: str, expected: list, actual: list, tolerance: float) -> list:
    return parity.output_problems(label, [f"output {i}" for i in range(len(expected))], expected,
                                  [np.asarray(a) for a in actual], tolerance)[0]


# -- the matrix ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case, form", MATRIX, ids=[f"{case.id}-{form}" for case, form in MATRIX])
def test_runs_downstream(case: Case, form: str, downstream_dir):
    """onnxruntime, OpenVINO and tract within 1e-4 of Keras; onnxslim leaves the results as they
    were; float16 within 1e-2. All checked and reported together (one conversion per case and
    form). tract runs the default form too, but for an LSTM returning its states (TRACT_FAILS)."""
    entry = converted(case, form, downstream_dir)
    problems = structure_problems(case, form, entry.proto)
    reference = run_onnxruntime(entry.proto, entry.x)
    problems += problems_of("onnxruntime", entry.expected, reference, TOLERANCE)
    runtimes = [("OpenVINO", lambda: run_openvino(entry.path, entry.x))]
    if form == PORTABLE:  # a symbolic batch size, and a symbolic time length in a masked model (no Slice
        # reverses its time: a masked backward pass's steps are scattered in reverse)
        runtimes.append(("tract", lambda: run_tract(entry.path, entry.x, batch=False, time=not case.masked)))
    elif case not in TRACT_FAILS:
        runtimes.append(("tract", lambda: run_tract(entry.path, entry.x)))
    for name, run in runtimes:
        try:
            problems += problems_of(name, entry.expected, run(), TOLERANCE)
        except Exception as error:  # noqa: BLE001 - reported with the others
            problems.append(f"{name} failed: {type(error).__name__}: {str(error).splitlines()[0]}")
    try:
        problems += problems_of("onnxslim, then onnxruntime", reference,
                                run_onnxruntime(slimmed(entry.proto), entry.x), SLIM_TOLERANCE)
    except Exception as error:  # noqa: BLE001
        problems.append(f"onnxslim failed: {type(error).__name__}: {str(error).splitlines()[0]}")
    try:
        halved = float16.convert_float_to_float16(entry.proto, keep_io_types=True)
        problems += problems_of("float16", entry.expected, run_onnxruntime(halved, entry.x), FLOAT16_TOLERANCE)
    except Exception as error:  # noqa: BLE001
        problems.append(f"float16 failed: {type(error).__name__}: {str(error).splitlines()[0]}")
    assert not problems, f"{case.id}:\n- " + "\n- ".join(problems)


# tract stops running an LSTM node whose sequence and final states are outputs of the model when
# its initial states are absent, as in the default form (the portable form gives them)
TRACT_FAILS = (Case("LSTM", False, False, STATES),)


def test_tract_fails_on_an_lstm_returning_its_states_without_initial_states(downstream_dir):
    """tract 0.23's LSTM returning Y, Y_h and Y_c with no initial states given stops with an error
    (the zero state it builds clashes with the batch); onnxruntime and OpenVINO run the default form
    exactly, and tract runs the portable form, whose zero states are given (test_runs_downstream).
    Fails the day tract runs it, so that it can join the matrix there."""
    (case,) = TRACT_FAILS
    entry = converted(case, DEFAULT, downstream_dir)
    lstm = helpers.nodes_of_types(entry.proto, {"LSTM"})
    assert lstm and not any(any(node.input[5:]) for node in lstm), "the default form gives initial states"
    with pytest.raises(tract.TractError, match="Clashing resolution"):
        run_tract(entry.path, entry.x)


def _empty_batch_run(path: str) -> subprocess.CompletedProcess:
    """onnxruntime run on ``path`` with a batch of 0 rows (7 steps), in a process of its own."""
    script = ("import sys, numpy as np, onnxruntime as ort\n"
              "session = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
              "x = np.zeros((0, 7, session.get_inputs()[0].shape[-1]), np.float32)\n"
              "print([o.shape for o in session.run(None, {session.get_inputs()[0].name: x})])\n")
    return subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "SimpleRNN"])
def test_onnxruntime_ends_the_process_on_an_empty_batch_through_an_lstm_or_gru_node(kind: str, downstream_dir):
    """onnxruntime 1.32 ends the whole process (an abort or a segmentation fault, no exception) when an
    LSTM or GRU node runs on a batch of 0 rows, with ``sequence_lens`` or without: stock tf2onnx's
    native LSTM too. Its RNN node runs it, as Keras does: the same run of a SimpleRNN shows the
    harness itself works (docs/downstream.md). Fails the day onnxruntime runs it, so that the note
    can go."""
    for masked in (False, True):
        entry = converted(Case(kind, False, masked), DEFAULT, downstream_dir)
        done = _empty_batch_run(entry.path)
        if kind == "SimpleRNN":
            assert done.returncode == 0 and "(0, 7," in done.stdout, (done.stdout, done.stderr[-500:])
        else:
            assert done.returncode < 0, (masked, done.returncode, done.stdout, done.stderr[-500:])


MASKED = [case for case in CASES if case.masked]


@pytest.mark.parametrize("case", MASKED, ids=lambda case: case.id)
def test_default_masked_form_needs_static_shapes_in_openvino_and_fails_in_tract(case: Case, downstream_dir):
    """Without the target a masked layer's node takes its computed sequence_lens: OpenVINO runs it
    (and the If nodes that decide whether a batch needs its compaction) exactly once the model is
    reshaped to static shapes; tract refuses it (its If reads the run-time test of the mask as a shape)."""
    entry = converted(case, DEFAULT, downstream_dir)
    assert any(has_sequence_lens(n) for n in helpers.nodes_of_types(entry.proto, helpers.RECURRENT_OPS))
    problems = problems_of("OpenVINO (static shapes)", entry.expected, run_openvino(entry.path, entry.x, static=True),
                           TOLERANCE)
    assert not problems, problems
    with pytest.raises(tract.TractError, match=r"Non constant seq_len is not supported|\"If__\d+\" If"):
        run_tract(entry.path, entry.x)


@pytest.mark.xfail(reason="OpenVINO's CPU plugin ignores sequence_lens in a fused sequence node with dynamic "
                          "shapes (RNN::isSupportedOperation)", strict=False)
@pytest.mark.parametrize("case", [c for c in MASKED if not c.bidirectional or c.kind == "SimpleRNN"],
                         ids=lambda case: case.id)
def test_default_masked_form_in_openvino_with_dynamic_shapes(case: Case, downstream_dir):
    """Fails while OpenVINO keeps ignoring sequence_lens: passes the day it does not. (Bidirectional
    LSTM and GRU nodes carry an ``activations`` attribute, for which OpenVINO's ONNX frontend builds
    two loops that honour sequence_lens; they are exact.)"""
    entry = converted(case, DEFAULT, downstream_dir)
    problems = problems_of("OpenVINO", entry.expected, run_openvino(entry.path, entry.x), TOLERANCE)
    assert not problems, problems


def test_float16_breaks_on_an_output_read_inside_the_graph():
    """onnxconverter-common 1.16's ``keep_io_types=True`` renames the producer of a float output and
    casts it back to float under the output's name, but leaves the graph's other readers of that
    name on the float tensor while typing their outputs float16: onnxruntime refuses the model. A
    Keras model whose output also feeds another layer meets this with any converter; the models
    above keep their outputs unread. Fails the day onnxconverter-common handles it."""
    K = parity.keras_module(FLAVOR)
    x = K.Input((None, FEATURES), name="x")
    y = K.layers.GRU(UNITS, return_sequences=True)(x)
    model = K.Model(x, [y, K.layers.Dense(UNITS)(y)])
    halved = float16.convert_float_to_float16(tf2onnx_rnn.convert_keras(model), keep_io_types=True)
    with pytest.raises(Exception, match="does not match expected type"):
        helpers.ort_session(halved)


def test_float16_of_a_stack_whose_first_sequence_is_an_output_loads():
    """A stack's first sequence as an output too: the next recurrent node reads that node's squeezed sequence,
    not the output (rewriters.written.shared_sequences), so onnxconverter-common's ``keep_io_types`` has no
    other reader to leave behind, and the float16 model runs within 1e-2 of Keras."""
    K = parity.keras_module(FLAVOR)
    x = K.Input((None, FEATURES), name="x")
    y = K.layers.GRU(UNITS, return_sequences=True)(x)
    model = K.Model(x, [y, K.layers.GRU(UNITS)(y)])
    halved = float16.convert_float_to_float16(tf2onnx_rnn.convert_keras(model), keep_io_types=True)
    batch = np.random.default_rng(3).normal(size=(3, 7, FEATURES)).astype(np.float32)
    got = helpers.ort_session(halved).run(None, {"x": batch})
    for g, w in zip(got, model(batch, training=False)):
        np.testing.assert_allclose(g, np.asarray(w), atol=1e-2)


def test_stock_tf2onnx_masked_lstm_does_not_load_in_tract(downstream_dir):
    """Stock tf2onnx (``from_keras``) leaves a masked LSTM a TensorList Loop, which tract does not
    implement (the portable form of the same model runs there: test_runs_downstream)."""
    import tensorflow as tf
    import tf2onnx

    case = Case("LSTM", False, True)
    model = build(FLAVOR, case)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=[tf.TensorSpec((None, None, FEATURES), tf.float32,
                                                                                name="x")], opset=17)
    assert helpers.nodes_of_types(proto, {"Loop"})
    path = str(downstream_dir / "stock-masked-lstm.onnx")
    onnx.save(proto, path)
    with pytest.raises(tract.TractError, match=r"Unimplemented\(Loop\)"):
        run_tract(path, batch(True))


@pytest.mark.parametrize("case", [c for c in CASES if c.bidirectional and c.kind != "SimpleRNN"], ids=lambda c: c.id)
def test_openvino_runs_unmasked_bidirectional_nodes_as_its_sequence_kernel(case: Case, downstream_dir):
    """A node whose activations are ONNX's defaults leaves them out unless it takes sequence_lens:
    OpenVINO's ONNX frontend turns a bidirectional LSTM/GRU that lists them into TensorIterator loops
    (several times slower), while its fused kernel, which it otherwise uses, ignores sequence_lens
    when shapes are dynamic (so masked nodes keep the attribute, and stay exact there)."""
    entry = converted(case, DEFAULT, downstream_dir)
    (node,) = helpers.nodes_of_types(entry.proto, helpers.RECURRENT_OPS)
    names = [a.name for a in node.attribute]
    assert ("activations" in names) == case.masked, names
    compiled = openvino.Core().compile_model(entry.path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    layers = {op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()}
    assert ("TensorIterator" in layers) == case.masked, sorted(layers)
