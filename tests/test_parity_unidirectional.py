"""Parity of one-direction, unmasked Keras LSTM / GRU / SimpleRNN layers with their conversion.

Each case (a pairwise-covering set of layer options per kind, see ``parity.FACTORS``) is
built in Keras 3 and in tf_keras with every weight randomized, converted once per process
with ``tf2onnx_rnn.convert_keras``, and checked for:

(a) exactly one native ONNX recurrent node, of the layer's op type (LSTM / GRU / RNN);
(b) no Loop or Scan node anywhere, subgraphs included;
(c) onnxruntime matches ``model(x, training=False)`` on every output within 1e-5, at several
    batch sizes and time lengths on the same converted model;
(d) the conversion report lists the layer as fused, with its kind, op and direction.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import helpers
import parity
from helpers import ONNX_OP
from parity import Case

CASES = parity.cases()
PARAMS = [pytest.param(flavor, case, id=f"{flavor}-{case.id}") for flavor in parity.FLAVORS for case in CASES]


# -- the case table itself ----------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(parity.FACTORS))
def test_cases_cover_every_pair_of_option_values(kind):
    factors = parity.FACTORS[kind]
    names = list(factors)
    rows = [{name: getattr(case, name) for name in names} for case in CASES if case.kind == kind]
    covered = set().union(*(parity.pairs_of(row, names) for row in rows))
    assert parity.value_pairs(factors) <= covered
    assert len(rows) == len({tuple(sorted(row.items())) for row in rows}), "duplicate cases"


def test_case_ids_are_unique():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))


# -- (a) one native node --------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", PARAMS)
def test_one_native_node_of_the_layers_op(flavor: str, case: Case):
    proto = parity.converted(flavor, case).proto
    recurrent = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    assert [n.op_type for n in recurrent] == [ONNX_OP[case.kind]], \
        f"expected one {ONNX_OP[case.kind]} node, got {[(n.op_type, n.name) for n in recurrent]}\n" \
        + parity.report_table(proto)
    (node,) = recurrent
    assert helpers.attribute(node, "hidden_size") == parity.UNITS


# -- (b) no loops -------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", PARAMS)
def test_no_loop_or_scan_anywhere(flavor: str, case: Case):
    proto = parity.converted(flavor, case).proto
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    assert not loops, f"Loop/Scan nodes left: {[(n.op_type, n.name) for n in loops]}\n" + parity.report_table(proto)


# -- (c) numerical parity -------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", PARAMS)
def test_outputs_match_keras(flavor: str, case: Case):
    entry = parity.converted(flavor, case)
    proto, model = entry.proto, entry.model
    graph_inputs = [i.name for i in proto.graph.input
                    if i.name not in {init.name for init in proto.graph.initializer}]
    names = parity.input_names(case)
    assert sorted(graph_inputs) == sorted(names), f"ONNX inputs {graph_inputs}, Keras inputs {names}"
    assert len(proto.graph.output) == parity.expected_output_count(case)
    session = helpers.ort_session(proto)
    seed = parity.case_seed(flavor, case)
    for round_index, (batch, time) in enumerate(parity.ROUNDS):
        arrays = parity.make_inputs(case, batch, time, seed + 1 + round_index)
        expected = parity.keras_outputs(model, arrays)
        actual = parity.run_onnx(session, names, arrays)
        assert len(expected) == parity.expected_output_count(case)
        assert len(actual) == len(expected), f"Keras gives {len(expected)} outputs, ONNX {len(actual)}"
        for index, (want, got) in enumerate(zip(expected, actual)):
            where = f"output {index} ({proto.graph.output[index].name}) at batch={batch}, time={time}"
            assert got.shape == want.shape, f"{where}: ONNX shape {got.shape}, Keras {want.shape}"
            assert got.dtype == want.dtype, f"{where}: ONNX dtype {got.dtype}, Keras {want.dtype}"
            error = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            assert error <= parity.TOLERANCE, f"{where}: max abs error {error:.3g}"


# -- (d) the report -------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", PARAMS)
def test_report_lists_the_layer_as_fused(flavor: str, case: Case):
    from tf2onnx_rnn import report_of

    proto = parity.converted(flavor, case).proto
    report = report_of(proto)
    assert report is not None, "no conversion report in the model's metadata"
    assert len(report.outcomes) == 1, report.table()
    (outcome,) = report.outcomes
    assert parity.layer_matches(outcome.layer, case.layer_name), report.table()
    assert outcome.fused, report.table()
    assert outcome.kind == case.kind, report.table()
    assert outcome.became == ONNX_OP[case.kind], report.table()
    assert outcome.direction == ("backward" if case.go_backwards else "forward"), report.table()
    named = [n for n in helpers.all_nodes(proto.graph) if n.name == outcome.node]
    assert [n.op_type for n in named] == [outcome.became], \
        f"the report names node {outcome.node!r}, the graph has {[(n.op_type, n.name) for n in named]}"
    assert not report.loops, report.table()


# -- the ONNX checker -------------------------------------------------------------------------

# every input and output a layer can have: initial states in, sequence and states out
FULL_CASES = (
    Case(kind="LSTM", recurrent_activation="hard_sigmoid", go_backwards=True, return_sequences=True,
         return_state=True, initial_state=True),
    Case(kind="GRU", recurrent_activation="sigmoid", reset_after=True, go_backwards=True,
         return_sequences=True, return_state=True, initial_state=True),
    Case(kind="SimpleRNN", activation="relu", go_backwards=True, return_sequences=True, return_state=True,
         initial_state=True),
)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_full_check_passes(flavor: str):
    for case in FULL_CASES:
        proto = parity.converted(flavor, case).proto
        try:
            onnx.checker.check_model(proto, full_check=True)
        except onnx.checker.ValidationError as error:
            pytest.fail(f"{case.id}: {error}")
