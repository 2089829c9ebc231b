"""The Scan form: recurrences no ONNX node names become a Scan of their own step, exact.

Keras's own layers with activations ONNX's recurrent nodes lack and hand-written ``RNN(cell)`` cells
(``scan_cells.py``: a LayerNormalization or a Dense inside, three states of two sizes, constants), plain,
masked (rows full, post-padded, pre-padded, holed and empty), Bidirectional and stacked, in Keras 3 and
tf_keras: each converts with no Loop, one Scan per loop, no per-step read of a sequence left in a step
and the input's own work hoisted out of it; equal to Keras in onnxruntime (dynamic batch and time, a
batch unlike the time length, batch 1), and in OpenVINO and tract. Loops that are not a per-step map
stay Loops, with the reason.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import helpers
import parity
import scan_cells
from scan_cells import CONSTANTS, DESIGNS, FEATURES, masked_batch

FORMS = ("plain", "masked", "bidirectional", "stacked")
ROUNDS = ((5, 7), (5, 3), (1, 6))  # (batch, time): batch unlike time, and batch 1
RELATIVE = 1e-5
_SEQUENCE_OPS = {"SequenceAt", "SequenceInsert", "SequenceEmpty", "SequenceConstruct", "SplitToSequence",
                 "ConcatFromSequence", "SequenceLength"}


def _build(flavor: str, case: tuple):
    design, form = case
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    inputs, h = [x], (K.layers.Masking()(x) if form == "masked" else x)
    if design.constants:
        k = K.Input((scan_cells.CONSTANT_FEATURES,), name="k")
        inputs.append(k)
        out = design.layer(K, return_sequences=True)(h, constants=k)
    elif form == "bidirectional":
        out = K.layers.Bidirectional(design.layer(K, return_sequences=True),
                                     backward_layer=design.layer(K, return_sequences=True, go_backwards=True))(h)
    elif form == "stacked":
        out = design.layer(K, return_sequences=True)(h)
        out = design.layer(K, go_backwards=True)(out)
    else:
        out = design.layer(K, return_sequences=True)(h)
    model = K.Model(inputs if len(inputs) > 1 else x, out)
    scan_cells.randomize(model, 7)
    return model


class _Case(tuple):
    @property
    def id(self) -> str:
        return f"{self[0].name}-{self[1]}"


CASES = [pytest.param(flavor, _Case((design, form)), id=f"{design.name}-{form}-{flavor}")
         for design in DESIGNS for form in FORMS for flavor in parity.FLAVORS]
CASES += [pytest.param("tf_keras", _Case((CONSTANTS, form)), id=f"constants-{form}-tf_keras")
          for form in ("plain", "masked")]


def _inputs(case: tuple, batch_time: tuple, seed: int) -> list:
    design, form = case
    if form == "masked":
        x = masked_batch(batch_time, seed)
    else:
        x = np.random.default_rng(seed).standard_normal(batch_time + (FEATURES,)).astype(np.float32)
    if design.constants:
        return [x, np.random.default_rng(seed + 1).standard_normal(
            (batch_time[0], scan_cells.CONSTANT_FEATURES)).astype(np.float32)]
    return [x]


def _expected_loops(case: tuple) -> int:
    return 2 if case[1] in ("bidirectional", "stacked") else 1


def _scans(proto) -> list:
    return [n for n in helpers.all_nodes(proto) if n.op_type == "Scan"]


@pytest.mark.parametrize("flavor, case", CASES)
def test_equals_keras_in_onnxruntime(flavor, case):
    entry = parity.converted_with(flavor, case, _build)
    session = helpers.ort_session(entry.proto)
    names = [i.name for i in session.get_inputs()]
    for round_, batch_time in enumerate(ROUNDS):
        arrays = _inputs(case, batch_time, seed=round_)
        want = np.asarray(entry.model(arrays if len(arrays) > 1 else arrays[0], training=False))
        (got,) = session.run(None, dict(zip(names, arrays)))
        assert got.shape == want.shape, f"{batch_time}: {got.shape} != {want.shape}"
        error = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)))
        assert error <= RELATIVE, f"{batch_time}: relative error {error:.3g}\n{parity.report_table(entry.proto)}"


@pytest.mark.parametrize("flavor, case", CASES)
def test_every_loop_is_a_lean_scan_with_its_reason(flavor, case):
    """No Loop anywhere; one Scan per loop; in each step no sequence or TensorList op and no read of an
    outer sequence (the Scan slices them); the input's own work hoisted (only the recurrent MatMuls stay);
    the report's rows say Scan and keep the matchers' reason."""
    entry = parity.converted_with(flavor, case, _build)
    ops = helpers.op_counts(entry.proto)
    assert not ops["Loop"], parity.report_table(entry.proto)
    scans = _scans(entry.proto)
    assert len(scans) == _expected_loops(case), parity.report_table(entry.proto)
    matmuls = []
    for scan in scans:
        body = helpers.attribute(scan, "body")
        body_ops = [n.op_type for n in body.node]
        assert not set(body_ops) & _SEQUENCE_OPS and not any(op.startswith("TensorList") for op in body_ops)
        local = {i.name for i in body.input} | {out for n in body.node for out in n.output}
        reads = [n.name for n in body.node if n.op_type in ("Gather", "Slice") and n.input[0] not in local]
        assert not reads, f"a step reads a row of an outer sequence itself: {reads}"
        split = _input_only_terms_split(scan, body)
        assert not split, f"a step does input-only work apart (x @ W + h @ U + b, -a * c): {split}"
        matmuls.append(body_ops.count("MatMul"))
    # the input's projection runs once over the sequence, in every layer of a stack too
    assert set(matmuls) == {case[0].loop_matmuls}, matmuls
    # a backward layer runs forward over its input reversed by a Slice (tract has no ReverseSequence,
    # and its releases before September 2026 ignore a Scan's directions)
    for scan in scans:
        for name in ("scan_input_directions", "scan_output_directions"):
            assert not any(helpers.attribute(scan, name) or ()), f"{scan.name} runs backwards"
    if case[1] != "masked":
        assert not ops["ReverseSequence"], parity.report_table(entry.proto)
    report = entry.get() and parity_report(entry.proto)
    rows = report.scans
    assert len(rows) == _expected_loops(case) and not report.loops, report.table()
    for row in rows:  # the matchers' reason, not a fault of ours
        assert row.node in {s.name for s in scans}, report.table()
        assert row.reason.strip() and not row.reason.startswith("internal error"), report.table()


def _input_only_terms_split(scan, body) -> list:
    """The step's Adds of an input-only term to a sum that holds another input-only term: such terms are
    summed once over the sequence instead (``Add(Add(u, v), c)`` -> ``Add(Add(u, c), v)``); and its
    products of a negation by an input-only factor (that factor is negated once instead)."""
    states = len(scan.input) - helpers.attribute(scan, "num_scan_inputs")
    varying = {value.name for value in body.input[:states]}
    for node in body.node:
        if varying & set(node.input):
            varying.update(node.output)
    made_by = {out: node for node in body.node for out in node.output}
    split = []
    for node in body.node:
        if node.op_type == "Mul":  # Mul(Neg(a), c): the sign belongs to c (Keras's gelu's -x / sqrt(2))
            split += [node.name for name, other in zip(node.input, reversed(node.input))
                      if name in made_by and made_by[name].op_type == "Neg" and other not in varying]
        if node.op_type != "Add":
            continue
        for term, other in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            inner = made_by.get(other)
            if term not in varying and inner is not None and inner.op_type == "Add" \
                    and any(name not in varying for name in inner.input):
                split.append(node.name)
    return split


def parity_report(proto):
    from tf2onnx_rnn import report_of

    return report_of(proto)


_DOWNSTREAM = [pytest.param(flavor, _Case((design, form)), id=f"{design.name}-{form}-{flavor}")
               for design in DESIGNS for form in FORMS for flavor in parity.FLAVORS[:1]]


@pytest.mark.parametrize("flavor, case", _DOWNSTREAM)
def test_loads_and_equals_keras_in_openvino_and_tract(flavor, case, tmp_path):
    """Every Scan-form model, in the default form (backward layers and Bidirectional ones included), runs
    in OpenVINO (f32) and tract, equal to Keras within 1e-4."""
    openvino = pytest.importorskip("openvino")
    tract = pytest.importorskip("tract")
    entry = parity.converted_with(flavor, case, _build)
    path = str(tmp_path / "model.onnx")
    onnx.save(entry.proto, path)
    (x,) = _inputs(case, (3, 7), seed=5)
    want = np.asarray(entry.model(x, training=False))
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                   "INFERENCE_NUM_THREADS": 1})
    got_openvino = np.asarray(compiled([x])[compiled.outputs[0]])
    model = tract.onnx().load(path)
    model.set_input_fact(0, "3,7,%d,f32" % FEATURES)
    got_tract = model.into_model().into_runnable().run([x])[0].to_numpy()
    for runtime, got in (("OpenVINO", got_openvino), ("tract", got_tract)):
        assert float(np.max(np.abs(got - want))) <= 1e-4, f"{runtime}: {np.max(np.abs(got - want)):.3g}"


# -- a layer normalisation in the step -----------------------------------------------------------

_LN_ELMAN = next(design for design in DESIGNS if design.name == "ln_elman")


@pytest.mark.parametrize("form", ("plain", "masked"))
def test_a_layer_normalisation_in_the_step_is_one_node_from_opset_17(form, tmp_path):
    """Keras 3's LayerNormalization inside a cell: at opset 17 the step holds one LayerNormalization
    node and none of the moments' nodes, and still equals Keras in onnxruntime (1e-5 relative), OpenVINO
    and tract; at the default opset it keeps its nodes and the report says how to get the one node."""
    import tf2onnx_rnn

    case = _Case((_LN_ELMAN, form))
    model = _build(parity.FLAVORS[0], case)
    proto = tf2onnx_rnn.convert_keras(model, opset=17)
    (body,) = [helpers.attribute(scan, "body") for scan in _scans(proto)]
    body_ops = [n.op_type for n in body.node]
    assert body_ops.count("LayerNormalization") == 1 and not {"ReduceMean", "Sqrt", "Reciprocal"} & set(body_ops)
    (row,) = parity_report(proto).scans
    assert "1 layer normalisation(s) as one node" in row.form, row.form
    for batch_time in ROUNDS:
        (x,) = _inputs(case, batch_time, seed=3)
        want = np.asarray(model(x, training=False))
        (got,) = helpers.ort_session(proto).run(None, {"x": x})
        error = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)))
        assert error <= RELATIVE, f"{batch_time}: relative error {error:.3g}"
    openvino, tract = pytest.importorskip("openvino"), pytest.importorskip("tract")
    path = str(tmp_path / "model.onnx")
    onnx.save(proto, path)
    (x,) = _inputs(case, (3, 7), seed=5)
    want = np.asarray(model(x, training=False))
    compiled = openvino.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    loaded = tract.onnx().load(path)
    loaded.set_input_fact(0, "3,7,%d,f32" % FEATURES)
    for runtime, got in (("OpenVINO", np.asarray(compiled([x])[compiled.outputs[0]])),
                         ("tract", loaded.into_model().into_runnable().run([x])[0].to_numpy())):
        assert float(np.max(np.abs(got - want))) <= 1e-4, f"{runtime}: {np.max(np.abs(got - want)):.3g}"
    default = parity.converted_with(parity.FLAVORS[0], case, _build).proto
    (row,) = parity_report(default).scans
    assert "left as a dozen nodes each" in row.form and "--opset 17" in row.form, row.form


# -- loops that are not a per-step map stay Loops, with the reason --------------------------------

def _loop_model(cond_bound_offset: int = 0, read_offset: int = 0, trip_from_shape: bool = True) -> onnx.ModelProto:
    """A hand-written Loop as tf2onnx writes one: ``h = tanh(x[t] + h)`` over ``x`` [T, B, H], its trip
    count ``T`` (or a constant), its condition ``t + 1 < T + cond_bound_offset`` and its read ``x[t +
    read_offset]``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2, 3])
    h0 = helper.make_tensor_value_info("h0", TensorProto.FLOAT, [2, 3])
    out = helper.make_tensor_value_info("hs", TensorProto.FLOAT, [None, 2, 3])
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("first", TensorProto.INT64, [1], [0]),
             helper.make_tensor("second", TensorProto.INT64, [1], [1]),
             helper.make_tensor("offset", TensorProto.INT64, [], [cond_bound_offset]),
             helper.make_tensor("read_offset", TensorProto.INT64, [], [read_offset]),
             helper.make_tensor("five", TensorProto.INT64, [], [5])]
    outer = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "first", "second", "first"], ["t1"]),
             helper.make_node("Squeeze", ["t1", "first"], ["steps"]),
             helper.make_node("Add", ["steps", "offset"], ["bound"]) if cond_bound_offset else
             helper.make_node("Identity", ["steps"], ["bound"]),
             helper.make_node("Less", ["zero", "bound"], ["cond0"])]
    body = helper.make_graph(
        [helper.make_node("Add", ["t", "one"], ["t_next"]),
         helper.make_node("Add", ["t", "read_offset"], ["row"]),
         helper.make_node("Gather", ["x", "row"], ["x_t"], axis=0),
         helper.make_node("Add", ["x_t", "h"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_next"]),
         helper.make_node("Identity", ["h_next"], ["h_out"]),
         helper.make_node("Less", ["t_next", "bound"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("t", TensorProto.INT64, []),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("t_next", TensorProto.INT64, []),
         helper.make_tensor_value_info("h_next", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 3])])
    loop = helper.make_node("Loop", ["steps" if trip_from_shape else "five", "cond0", "zero", "h0"],
                            ["t_final", "h_final", "hs"], name="rnn/while_loop", body=body)
    graph = helper.make_graph(outer + [loop], "g", [x, h0], [out], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _scan_form(model: onnx.ModelProto):
    from tf2onnx_rnn.rewriters.outcome import Findings, Outcome
    from tf2onnx_rnn.rewriters.written.scan import scan_loops

    findings = Findings([Outcome("rnn/while", "rnn", "unknown", "", "Loop", reason="not a SimpleRNN cell: test")])
    scan_loops(model, findings)
    return findings.outcomes[0]


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    h0 = np.zeros((2, 3), np.float32)
    return helpers.ort_session(model).run(None, {"x": x, "h0": h0})[0]


def test_a_hand_written_per_step_loop_becomes_a_scan_with_the_same_outputs():
    x = np.random.default_rng(0).standard_normal((6, 2, 3)).astype(np.float32)
    model = _loop_model()
    want = _run(model, x)
    row = _scan_form(model)
    assert row.became == "Scan" and [n.op_type for n in model.graph.node].count("Scan") == 1, row
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(_run(model, x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs, why", [
    (dict(cond_bound_offset=-2), "early exit"),  # an early exit: the condition stops it 2 steps short
    (dict(read_offset=1), "another step's row"),  # it reads the next step's row
    (dict(trip_from_shape=False), "trip count is not the length"),  # 5 steps, whatever the sequence
], ids=["early-exit", "reads-the-next-step", "constant-trip-count"])
def test_a_loop_that_is_not_a_per_step_map_stays_a_loop_with_the_reason(kwargs, why):
    model = _loop_model(**kwargs)
    row = _scan_form(model)
    assert row.became == "Loop" and why in row.reason and row.reason.startswith("not a SimpleRNN cell"), row
    assert [n.op_type for n in model.graph.node].count("Loop") == 1


def test_a_peephole_lstm_in_the_portable_form_is_a_scan_exact_in_openvino(tmp_path):
    """OpenVINO reads an LSTM node's peepholes (``P``) otherwise than onnxruntime and TensorFlow: the
    portable form writes a peephole cell as a Scan of its own step, exact there; the default form keeps
    the native node, exact in onnxruntime."""
    openvino = pytest.importorskip("openvino")
    import cells
    from tf2onnx_rnn import convert_keras, report_of

    K = parity.keras_module(parity.FLAVORS[0])
    cell = next(c for c in cells.CELLS if c.name == "lstm_peephole")
    x = K.Input((None, FEATURES), name="x")
    model = K.Model(x, K.layers.RNN(cells.cell_layer(K, cell, 4), return_sequences=True, name="lstm_peep")(x))
    scan_cells.randomize(model, 11)
    xv = np.random.default_rng(12).standard_normal((3, 7, FEATURES)).astype(np.float32)
    want = np.asarray(model(xv, training=False))
    default, portable = convert_keras(model), convert_keras(model, target="portable")
    assert [o.became for o in report_of(default).outcomes] == ["LSTM"]
    # the default form's report names OpenVINO and the target to use; the portable form's has no such note
    notes = [line for line in report_of(default).notes() if "OpenVINO" in line]
    assert len(notes) == 1 and "--target portable" in notes[0] and "peepholes" in notes[0], report_of(default).table()
    assert not any("OpenVINO" in line for line in report_of(portable).notes()), report_of(portable).table()
    (row,) = report_of(portable).outcomes
    assert row.became == "Scan" and "peepholes" in row.reason, report_of(portable).table()
    path = str(tmp_path / "portable.onnx")
    onnx.save(portable, path)
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert float(np.max(np.abs(np.asarray(compiled([xv])[compiled.outputs[0]]) - want))) <= 1e-5
    (got,) = helpers.ort_session(default).run(None, {"x": xv})
    assert float(np.max(np.abs(got - want))) <= 1e-5


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_a_tf1_dynamic_rnn_over_a_cell_no_node_names_has_no_loop(form):
    """TF 1.x's ``dynamic_rnn`` over ``LSTMCell(num_proj)`` (no ONNX node projects its hidden state): in
    both control-flow forms a Scan of the loop's own step (not tf2onnx's Scan of a v1 loop left as it
    is) and no Loop, equal to the TensorFlow session."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def, report_of

    case = tf1_graphs.Case("dynamic", "lstm_projection", False, form)
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs)
    ops = helpers.op_counts(proto)
    assert ops["Scan"] == 1 and not ops["Loop"], report_of(proto).table()
    (row,) = report_of(proto).outcomes
    assert "num_proj" in row.reason, row
    assert row.became == "Scan" and "a Scan of the loop's own step" in row.form, report_of(proto).table()
    session = helpers.ort_session(proto)
    for batch, time in ((3, 5), (1, 7)):
        feeds = tf1_graphs.feeds_for(case, None, time)
        feeds[0] = feeds[0][:batch]
        want = built.run(feeds)
        got = session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds)))
        for g, w in zip(got, want):
            assert float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1.0))) <= RELATIVE


def _openvino_and_tract(path: str, feeds: list) -> tuple:
    """The outputs of the model at ``path`` in OpenVINO (f32) and in tract, its inputs' shapes fixed to
    ``feeds``' (float32 and int32 inputs); skipped where either is not installed."""
    openvino = pytest.importorskip("openvino")
    tract = pytest.importorskip("tract")
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled(feeds)
    model = tract.onnx().load(path)
    for slot, value in enumerate(feeds):
        model.set_input_fact(slot, ",".join(map(str, value.shape)) + (",f32" if value.dtype == np.float32 else ",i32"))
    return ([np.asarray(result[out]) for out in compiled.outputs],
            [out.to_numpy() for out in model.into_model().into_runnable().run(feeds)])


@pytest.mark.parametrize("form", ["v1", "v2"])
@pytest.mark.parametrize("lengths", [False, True], ids=["no-lengths", "sequence_length"])
@pytest.mark.parametrize("cell", ["lstm_projection", "lstm_projection_clip", "lstm_cell_clip_projection"])
def test_a_tf1_dynamic_rnn_scan_loads_in_openvino_and_tract(tmp_path, form, lengths, cell):
    """The Scan of a TF 1.x ``dynamic_rnn`` over ``LSTMCell(num_proj)`` (its projection clipped, or its cell
    state), in both control-flow forms, with and without ``sequence_length``, runs in OpenVINO (f32) and
    tract, equal to the TensorFlow session (rows of mixed lengths, an empty one among them, and a batch
    unlike the time length)."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def

    case = tf1_graphs.Case("dynamic", cell, lengths, form)
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs)
    assert helpers.op_counts(proto)["Scan"] == 1 and not helpers.op_counts(proto)["Loop"]
    path = str(tmp_path / "model.onnx")
    onnx.save(proto, path)
    feeds = tf1_graphs.feeds_for(case, [5, 0, 2] if lengths else None, 5)
    want = built.run(feeds)
    got_openvino, got_tract = _openvino_and_tract(path, feeds)
    for runtime, got in (("OpenVINO", got_openvino), ("tract", got_tract)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert float(np.max(np.abs(g - w))) <= 1e-4, f"{runtime}: {np.max(np.abs(g - w)):.3g}"


@pytest.mark.parametrize("form", ["v1", "v2"])
@pytest.mark.parametrize("cell", ["lstm_projection", "lstm_peepholes"])
def test_a_tf1_bidirectional_dynamic_rnn_with_lengths_in_the_portable_form(tmp_path, form, cell):
    """TF 1.x ``bidirectional_dynamic_rnn`` with ``sequence_length`` over a cell no ONNX node computes
    (``num_proj``) or one OpenVINO computes otherwise (peepholes), in the portable form: two Scans, no
    Loop, and the input's reversal by the lengths an element gather (tract has no ReverseSequence).
    Equal to the TensorFlow session in onnxruntime, OpenVINO (f32) and tract, on rows of mixed lengths,
    an empty one among them."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def, report_of

    case = tf1_graphs.Case("bidirectional", cell, True, form)
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs, target="portable")
    ops = helpers.op_counts(proto)
    assert ops["Scan"] == 2 and not ops["Loop"] and not ops["LSTM"], report_of(proto).table()
    assert not ops["ReverseSequence"] and ops["GatherElements"] == 2, ops
    _equals_the_session_in_every_runtime(proto, built, tf1_graphs.feeds_for(case, [5, 0, 2], 5), tmp_path)


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_a_tf1_bidirectional_dynamic_rnn_without_lengths_reverses_by_a_slice(tmp_path, form):
    """TF 1.x ``bidirectional_dynamic_rnn`` without ``sequence_length`` over a cell no ONNX node computes
    (``num_proj``), in the default form: two Scans, both running forward, the backward one over its input
    reversed by a Slice (no ReverseSequence: tract has none); equal to the TensorFlow session in
    onnxruntime, OpenVINO (f32) and tract."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def, report_of

    case = tf1_graphs.Case("bidirectional", "lstm_projection", False, form)
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs)
    ops = helpers.op_counts(proto)
    assert ops["Scan"] == 2 and not ops["Loop"] and not ops["ReverseSequence"], report_of(proto).table()
    for scan in helpers.nodes_of_types(proto, ["Scan"]):
        assert not any(helpers.attribute(scan, "scan_input_directions") or ()), f"{scan.name} runs backwards"
    assert {row.direction for row in report_of(proto).outcomes} == {"forward", "backward"}, report_of(proto).table()
    _equals_the_session_in_every_runtime(proto, built, tf1_graphs.feeds_for(case, None, 5), tmp_path)


def _equals_the_session_in_every_runtime(proto, built, feeds: list, tmp_path) -> None:
    """``proto`` in onnxruntime, OpenVINO (f32) and tract within 1e-4 of the TensorFlow session."""
    path = str(tmp_path / "model.onnx")
    onnx.save(proto, path)
    want = built.run(feeds)
    session = helpers.ort_session(proto)
    got_ort = session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds)))
    got_openvino, got_tract = _openvino_and_tract(path, feeds)
    for runtime, got in (("onnxruntime", got_ort), ("OpenVINO", got_openvino), ("tract", got_tract)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert float(np.max(np.abs(g - w))) <= 1e-4, f"{runtime}: {np.max(np.abs(g - w)):.3g}"


@pytest.mark.parametrize("lengths", [False, True], ids=["no-lengths", "sequence_length"])
def test_tf2onnx_own_scan_of_a_tf1_loop_declares_no_dimension_names(lengths):
    """tf2onnx's own Scan of a TF 1.x control-flow loop, its step's symbolic dimension names cleared
    (tract unifies a step's names with those outside and refuses the Scan where they meet fixed
    sizes); still equal to the TensorFlow session in onnxruntime."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def

    case = tf1_graphs.Case("dynamic", "lstm_projection", lengths, "v1")
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs)
    (scan,) = helpers.nodes_of_types(proto, ["Scan"])
    body = helpers.attribute(scan, "body")
    named = [v.name for v in list(body.input) + list(body.output) + list(body.value_info)
             if any(d.HasField("dim_param") for d in v.type.tensor_type.shape.dim)]
    assert not named, named
    feeds = tf1_graphs.feeds_for(case, [5, 0, 3] if lengths else None, 5)
    session = helpers.ort_session(proto)
    for got, want in zip(session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds))), built.run(feeds)):
        assert float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0))) <= RELATIVE


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_a_tf1_dynamic_rnn_with_lengths_over_a_cell_no_node_names(form):
    """The same with ``sequence_length``, TensorFlow's own masking, in both control-flow forms: a Scan of
    the loop's own step, no Loop, its input projection run once over the sequence (TF 1.x's ``[x, h] @
    W`` split into ``x @ W_x``, outside, and ``h @ W_h``). The functional loop ends at the longest row;
    past each row's length its steps keep the states and stack zeros, so the Scan runs every step and
    its row says so. Equal to the TensorFlow session on rows of mixed lengths, an empty one among them,
    and on rows all shorter than the input."""
    import tf1_graphs
    from tf2onnx_rnn import convert_graph_def, report_of

    case = tf1_graphs.Case("dynamic", "lstm_projection", True, form)
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, inputs=built.inputs, outputs=built.outputs)
    ops, report = helpers.op_counts(proto), report_of(proto)
    (row,) = report.outcomes
    assert ops["Scan"] == 1 and not ops["Loop"], report.table()
    (scan,) = helpers.nodes_of_types(proto, ["Scan"])
    assert row.became == "Scan" and row.own_step and row.node == scan.name, report.table()
    assert "a Scan of the loop's own step" in row.form and "num_proj" in row.reason, report.table()
    if form == "v2":
        assert "longest row of seq_len" in row.form, report.table()
    step = [n.op_type for n in helpers.attribute(scan, "body").node]
    assert step.count("MatMul") == 2 and "Concat" not in step, step  # h @ W_h and the projection
    assert not {"ReduceMax", "Min", "Less", "And"} & {n.op_type for n in proto.graph.node}  # the Loop's test
    session = helpers.ort_session(proto)
    for rows, time in (([5, 0, 3], 5), ([7], 7), ([2, 3], 6), ([0], 4)):
        feeds = tf1_graphs.feeds_for(case, rows, time)
        want = built.run(feeds)
        got = session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds)))
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1.0))) <= RELATIVE


def test_a_tflite_while_loop_the_readers_decline_becomes_a_scan(tmp_path):
    """A Keras 3 LSTM(activation="selu") exported to TFLite is a WHILE loop no matcher claims: a Scan,
    no Loop, equal to Keras (the TFLite interpreter's source)."""

    from tf2onnx_rnn import convert_tflite, report_of

    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((7, FEATURES), batch_size=1, name="x")
    model = K.Model(x, K.layers.LSTM(4, activation="selu", return_sequences=True)(x))
    scan_cells.randomize(model, 13)
    path = str(tmp_path / "model.tflite")
    with open(path, "wb") as stream:
        stream.write(helpers.keras_tflite(model))
    proto = convert_tflite(path, verify=True)
    ops = helpers.op_counts(proto)
    assert ops["Scan"] == 1 and not ops["Loop"], report_of(proto).table()
    xv = np.random.default_rng(14).standard_normal((1, 7, FEATURES)).astype(np.float32)
    session = helpers.ort_session(proto)
    (got,) = session.run(None, {session.get_inputs()[0].name: xv})
    assert float(np.max(np.abs(got - np.asarray(model(xv, training=False))))) <= 1e-5


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_mixed_float16_and_a_fixed_signature(flavor):
    """A ``mixed_float16`` SimpleRNN(gelu) becomes a Scan computing in float16, within Keras's own float16
    rounding (3e-2); the same layer converted at a fixed batch-1 signature is a Scan, exact."""
    import tensorflow as tf

    from tf2onnx_rnn import convert_keras

    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    half = K.Model(x, K.layers.SimpleRNN(4, activation="gelu", return_sequences=True, dtype="mixed_float16")(x))
    full = K.Model(x, K.layers.SimpleRNN(4, activation="gelu", return_sequences=True)(x))
    scan_cells.randomize(half, 15)
    scan_cells.randomize(full, 16)
    xv = np.random.default_rng(17).standard_normal((1, 6, FEATURES)).astype(np.float32)
    signature = [tf.TensorSpec([1, 6, FEATURES], tf.float32, name="x")]
    for model, proto, tolerance in ((half, convert_keras(half), 3e-2),
                                    (full, convert_keras(full, input_signature=signature), 1e-5)):
        ops = helpers.op_counts(proto)
        assert ops["Scan"] == 1 and not ops["Loop"]
        (got,) = helpers.ort_session(proto).run(None, {"x": xv})
        want = np.asarray(model(xv, training=False)).astype(np.float32)
        assert float(np.max(np.abs(got.astype(np.float32) - want))) <= tolerance


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_stacked_scans_of_different_sizes_keep_their_own_shapes(flavor, dtype):
    """Two Scans of layers with states of different sizes (LSTM(selu) of 3 units, then of 1; float64
    LSTMs, which onnxruntime's node does not run): tf_keras names the tensors of every loop body alike,
    and the first Scan once declared the second's [B, 1] states for its own [B, 3] ones, so onnxruntime
    refused the model. Each Scan carries its own shapes; both equal Keras."""
    from tf2onnx_rnn import convert_keras

    K = parity.keras_module(flavor)
    activation = "selu" if dtype == "float32" else "tanh"
    x = K.Input((None, 2), name="x", dtype=dtype)
    h = K.layers.LSTM(3, activation=activation, return_sequences=True, dtype=dtype)(x)
    model = K.Model(x, K.layers.LSTM(1, activation=activation, return_state=True, dtype=dtype)(h))
    scan_cells.randomize(model, 21)
    proto = convert_keras(model)
    scans = _scans(proto)
    assert len(scans) == 2 and not helpers.op_counts(proto)["Loop"], parity.report_table(proto)
    state_sizes = sorted(body_input.type.tensor_type.shape.dim[-1].dim_value
                         for scan in scans for body_input in helpers.attribute(scan, "body").input[:2])
    assert state_sizes == [1, 1, 3, 3], state_sizes
    xv = np.random.default_rng(22).standard_normal((3, 5, 2)).astype(dtype)
    got = helpers.ort_session(proto).run(None, {"x": xv})
    for g, w in zip(got, model(xv, training=False)):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_the_report_reads_as_the_users_model(flavor):
    """A built-in layer that is a Scan only for its activation says so; a Bidirectional Scan layer's two
    rows carry their directions; the input axis a Scan steps through is named ``time`` though the output
    drops it."""
    from tf2onnx_rnn import convert_keras, report_of

    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    h = K.layers.Bidirectional(K.layers.SimpleRNN(4, activation="gelu", return_sequences=True), name="bi")(x)
    model = K.Model(x, K.layers.GRU(3, activation="selu", name="last")(h))
    report = report_of(convert_keras(model))
    rows = {(row.layer, row.direction): row for row in report.outcomes}
    assert set(rows) == {("bi", "forward"), ("bi", "backward"), ("last", "forward")}, report.table()
    assert all(row.became == "Scan" for row in rows.values()), report.table()
    assert rows["bi", "forward"].reason == "activation gelu: no ONNX recurrent node computes it", report.table()
    assert rows["last", "forward"].reason == "activation selu: no ONNX recurrent node computes it", report.table()
    assert report.dimensions.startswith("x[batch, time, "), report.dimensions


def test_a_step_whose_state_is_made_from_its_output_runs_in_tract(tmp_path):
    """A cell whose new state is computed from its output (a CfC's step: the output is also written into the
    state): the Scan's scanned output is read inside its step, which tract 0.23 refuses ('outputs[0].rank ==
    inputs[0].rank + 1'); the written step gives that output an Identity of its own, and the model equals
    Keras in onnxruntime and in tract."""
    import tf2onnx_rnn

    tract = pytest.importorskip("tract")
    K = parity.keras_module(parity.FLAVORS[0])

    class OutputIntoState(K.layers.Layer):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units, self.state_size, self.output_size = units, units, units

        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1], self.units), name="w")
            self.u = self.add_weight(shape=(self.units, self.units), name="u")

        def call(self, x, states):
            y = K.activations.gelu(K.ops.matmul(x, self.w) + K.ops.matmul(states[0], self.u))
            return y, [0.5 * y + 0.5 * states[0]]

    x = K.Input((None, FEATURES), name="x")
    model = K.Model(x, K.layers.RNN(OutputIntoState(4), return_sequences=True, name="rnn")(x))
    parity.randomize_weights(model, seed=3)
    proto = tf2onnx_rnn.convert_keras(model)
    assert [n.op_type for n in helpers.nodes_of_types(proto, ["Scan", "Loop"])] == ["Scan"]
    data = np.random.default_rng(2).standard_normal((3, 7, FEATURES)).astype(np.float32)
    want = np.asarray(model(data, training=False))
    np.testing.assert_allclose(helpers.ort_session(proto).run(None, {"x": data})[0], want, rtol=0, atol=1e-5)
    path = str(tmp_path / "model.onnx")
    onnx.save(proto, path)
    loaded = tract.onnx().load(path)
    loaded.set_input_fact(0, "3,7,%d,f32" % FEATURES)
    got = loaded.into_model().into_runnable().run([data])[0].to_numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
