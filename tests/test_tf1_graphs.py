"""TensorFlow 1.x recurrent graphs: ``dynamic_rnn`` and its kin, fused into native nodes.

Every graph is built as TF 1.x built it (``tests/tf1_graphs.py``: graph mode, TF1's cells, control
flow v1 and functional loops), every variable random, frozen; converted once per process through
``convert_graph_def`` and compared with the TensorFlow session on batches whose rows are full, shorter
and empty (length 0), one where every row is shorter than the input, and a batch of one, at time
lengths unlike the batch. A cell ONNX can express becomes one native node per cell and direction
(one bidirectional node for ``bidirectional_dynamic_rnn``), no Loop or Scan left; a cell no native
node computes (``num_proj``, ``cell_clip``, ``proj_clip`` and their mixes: the projection feeds back
into the recurrence) becomes an exact Scan of the loop's own step, no Loop anywhere, the report saying
why no native node. Then the other doors: the command line, a checkpoint's meta graph, a TF1
SavedModel; and the report's names.
"""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest

import helpers
import tf1_graphs
from tf1_graphs import Case
from tf2onnx_rnn import ConversionError, convert, convert_checkpoint, convert_graph_def, convert_saved_model, report_of

TOLERANCE = 1e-5
# (lengths per row, time): full, shorter and empty rows; every row shorter; one row; batch never equal to time
BATCHES = (([7, 4, 0], 7), ([4, 2, 0], 6), ([3], 5), ([5, 5], 5))
STATIC_BATCHES = (([6, 6, 6], 6), ([6], 6))

DYNAMIC_CELLS = ("lstm", "basic_lstm", "gru", "basic_rnn", "lstm_peepholes", "multi_lstm", "multi_mixed",
                 "dropout_lstm", "lstm_block_cell", "gru_block_cell")
BIDIRECTIONAL_CELLS = ("lstm", "gru", "multi_mixed", "lstm_block_cell")
FUSED_OPS = ("block_lstm", "block_lstm_peepholes", "block_lstm_v2", "block_lstm_v2_peepholes")
# the native nodes each cell becomes (per direction)
NODES = {"lstm": {"LSTM": 1}, "basic_lstm": {"LSTM": 1}, "gru": {"GRU": 1}, "basic_rnn": {"RNN": 1},
         "lstm_peepholes": {"LSTM": 1}, "multi_lstm": {"LSTM": 2}, "multi_mixed": {"GRU": 1, "LSTM": 1, "RNN": 1},
         "dropout_lstm": {"LSTM": 1}, "lstm_block_cell": {"LSTM": 1}, "gru_block_cell": {"GRU": 1},
         **{op: {"LSTM": 1} for op in FUSED_OPS}}

FUSED = ([Case("dynamic", cell, lengths, form) for cell in DYNAMIC_CELLS for lengths in (True, False)
          for form in tf1_graphs.FORMS]
         + [Case("bidirectional", cell, lengths, form) for cell in BIDIRECTIONAL_CELLS for lengths in (True, False)
            for form in tf1_graphs.FORMS]
         + [Case("static", cell, False, form) for cell in ("lstm", "gru", "basic_rnn") for form in tf1_graphs.FORMS]
         + [Case("fused", op, lengths) for op in FUSED_OPS for lengths in (True, False)])
# cells no native node computes, each with what its row's reason must name: the matcher's, kept by the Scan
SCANNED_CELLS = {"lstm_projection": "num_proj", "lstm_cell_clip": "cell_clip", "lstm_cell_clip_projection": "num_proj",
                 "lstm_projection_clip": "not a LSTM cell"}  # (a clipped projection is no product o * a(c_t))
SCANNED = [Case("dynamic", cell, lengths, form) for cell in SCANNED_CELLS for lengths in (True, False)
           for form in tf1_graphs.FORMS]

_CONVERTED: dict = {}


def converted(case: Case):
    """(the built graph, its conversion), once per process."""
    if case not in _CONVERTED:
        built = tf1_graphs.built(case)
        _CONVERTED[case] = built, convert_graph_def(built.path, built.inputs, built.outputs)
    return _CONVERTED[case]


def assert_exact(case: Case, built, proto) -> None:
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    batches = STATIC_BATCHES if case.driver == "static" else BATCHES
    if case.time_major and case.lengths:  # its batch is fixed
        batches = [(lengths, time) for lengths, time in batches if len(lengths) == tf1_graphs.FUSED_BATCH]
    for index, (lengths, time) in enumerate(batches):
        feeds = tf1_graphs.feeds_for(case, lengths, time, seed=index)
        expected, actual = built.run(feeds), session.run(None, dict(zip(names, feeds)))
        for name, want, got in zip(built.outputs, expected, actual):
            assert got.shape == want.shape, f"{name} at lengths {lengths}: {got.shape} vs TensorFlow {want.shape}"
            error = float(np.max(np.abs(got - want))) if want.size else 0.0
            assert error <= TOLERANCE, f"{name} at lengths {lengths}, time {time}: max error {error:.3g}"


@pytest.mark.parametrize("case", FUSED, ids=lambda case: case.id)
def test_tf1_cells_fuse_exactly(case):
    built, proto = converted(case)
    table = report_of(proto).table()
    assert not helpers.nodes_of_types(proto, helpers.LOOP_OPS), table
    counts, expected = helpers.op_counts(proto), dict(NODES[case.cell])
    stacked = case.cell.startswith("multi")
    if case.driver == "bidirectional" and stacked:  # a stack's cells never pair: a node per cell and direction
        expected = {op: 2 * count for op, count in expected.items()}
    assert {op: counts[op] for op in helpers.RECURRENT_OPS if counts[op]} == expected, table
    if case.driver == "bidirectional" and not stacked:  # one bidirectional node
        assert all(helpers.direction_of(n) == "bidirectional" for n in helpers.nodes_of_types(proto, expected)), table
    rows = report_of(proto).outcomes
    assert rows and all(row.fused for row in rows), table
    if case.lengths and not stacked:  # (a loop tf2onnx's own rewriter fused says so instead)
        assert all(row.mask.startswith("sequence_length") or "tf2onnx's own" in row.activations for row in rows), table
    assert_exact(case, built, proto)


@pytest.mark.parametrize("case", SCANNED, ids=lambda case: case.id)
def test_what_no_native_node_computes_is_an_exact_scan_of_its_own_step_with_the_reason(case):
    """The loop is written as a Scan of its own step (ours, not tf2onnx's Scan of a v1 loop left as it is):
    no Loop anywhere, subgraphs included; the row says Scan and keeps why no native node computes the
    cell; equal to the TensorFlow session, rows of length 0 among them."""
    built, proto = converted(case)
    table = report_of(proto).table()
    ops = helpers.op_counts(proto)
    assert not ops["Loop"] and ops["Scan"] == 1 and not ops["LSTM"], f"{dict(ops)}\n{table}"
    (scan,) = helpers.nodes_of_types(proto, ["Scan"])
    assert [n.name for n in proto.graph.node if n.op_type == "Scan"] == [scan.name], f"a Scan in a subgraph\n{table}"
    (row,) = report_of(proto).outcomes
    assert row.became == "Scan" and row.own_step and not row.fused and row.node == scan.name, table
    assert "a Scan of the loop's own step" in row.form, table
    assert row.reason.startswith("not a LSTM cell") and SCANNED_CELLS[case.cell] in row.reason, table
    assert "not a Scan either" not in row.reason and "internal error" not in row.reason, table
    if case.lengths and case.form == "v2":  # the functional loop ends at the longest row: the Scan runs every step
        assert "longest row of seq_len" in row.form, table
    assert_exact(case, built, proto)


def test_a_fused_op_that_clips_its_cell_state_is_refused_in_one_line():
    built = tf1_graphs.built(Case("fused", "block_lstm_clip", True))
    with pytest.raises(ConversionError, match=r"^BlockLSTM: BlockLSTM clips its cell state at 3 each step"):
        convert_graph_def(built.path, built.inputs, built.outputs)


@pytest.mark.parametrize("form", tf1_graphs.FORMS)
def test_static_rnn_with_lengths_stays_as_its_exact_steps(form):
    case = Case("static", "lstm", True, form)
    built = tf1_graphs.built(case)
    proto = convert_graph_def(built.path, built.inputs, built.outputs)
    assert not helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    assert_exact(case, built, proto)


def test_the_report_names_layers_from_the_graphs_scopes():
    layers = {case: [row.layer for row in report_of(converted(case)[1]).outcomes] for case in (
        Case("dynamic", "lstm", True, "v1"), Case("bidirectional", "gru", True, "v2"),
        Case("dynamic", "multi_lstm", False, "v2"))}
    assert list(layers.values()) == [["rnn/lstm_cell"],
                                     ["bidirectional_rnn/fw/gru_cell", "bidirectional_rnn/bw/gru_cell"],
                                     ["rnn/multi_rnn_cell"]], layers


# -- the other doors -------------------------------------------------------------------------------

def _tf1_session_graph(form: str):
    """A TF1 graph with its variables, session open: (graph, session, x, lengths, outputs by name)."""
    import tensorflow as tf

    with tf1_graphs.graph_form(form) as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, None, tf1_graphs.FEATURES], name="x")
        lengths = tf.compat.v1.placeholder(tf.int32, [None], name="seq_len")
        (forward, backward), _ = tf.compat.v1.nn.bidirectional_dynamic_rnn(
            tf1_graphs.make_cell("lstm"), tf1_graphs.make_cell("lstm"), x, sequence_length=lengths, dtype=tf.float32)
        y = tf.identity(tf.concat([forward, backward], -1), name="y")
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
        rng = np.random.default_rng(3)
        for variable in tf.compat.v1.global_variables():
            session.run(variable.assign(rng.uniform(-0.8, 0.8, variable.shape.as_list()).astype(np.float32)))
    return graph, session, x, lengths, y


def _check_bidirectional(proto, run) -> None:
    assert helpers.op_counts(proto)["LSTM"] == 1 and not helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    for lengths, time in BATCHES:
        x = np.random.default_rng(time).standard_normal((len(lengths), time, tf1_graphs.FEATURES)).astype(np.float32)
        feeds = {name: np.asarray(lengths, np.int32) if "seq_len" in name else x for name in names}
        np.testing.assert_allclose(session.run(None, feeds)[0], run(x, lengths), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("form", tf1_graphs.FORMS)
def test_a_checkpoint_converts_fused_and_exact(form, tmp_path):
    import tensorflow as tf

    graph, session, x, lengths, y = _tf1_session_graph(form)
    with graph.as_default():
        prefix = tf.compat.v1.train.Saver().save(session, str(tmp_path / "model"))
    proto = convert_checkpoint(prefix + ".meta", inputs=["x:0", "seq_len:0"], outputs=["y:0"])
    _check_bidirectional(proto, lambda a, b: session.run(y, {x: a, lengths: b}))
    session.close()


@pytest.mark.parametrize("form", tf1_graphs.FORMS)
def test_a_tf1_saved_model_converts_fused_and_exact(form, tmp_path):
    import tensorflow as tf

    graph, session, x, lengths, y = _tf1_session_graph(form)
    path = str(tmp_path / "saved")
    with graph.as_default():
        tf.compat.v1.saved_model.simple_save(session, path, inputs={"x": x, "seq_len": lengths}, outputs={"y": y})
    proto = convert_saved_model(path)
    _check_bidirectional(proto, lambda a, b: session.run(y, {x: a, lengths: b}))
    session.close()


def test_the_command_line_converts_and_verifies_a_tf1_graph(tmp_path, capfd):
    built = tf1_graphs.built(Case("bidirectional", "gru", True, "v1"))
    output = tmp_path / "model.onnx"
    code = convert.main(["--graphdef", built.path, "--inputs", ",".join(built.inputs), "--outputs",
                         ",".join(built.outputs), "--output", str(output), "--verify"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "2 fused into native nodes" in out and "ONNX vs TensorFlow" in out, out
    assert os.path.getsize(output) > 0


def test_the_cases_cover_every_cell_and_driver():
    drivers = collections.Counter(case.driver for case in FUSED + SCANNED)
    assert set(drivers) == {"dynamic", "bidirectional", "static", "fused"}
    assert {case.form for case in FUSED} == set(tf1_graphs.FORMS)
