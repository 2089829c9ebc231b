"""``RNN(StackedRNNCells([...]))``: one native node per cell, chained like a stack of layers.

Keras steps every cell of the stack inside one while-loop. Each case is converted and must give:
one report row (kind StackedRNNCells) per loop, fused, naming the cells in order; one native node
per cell and no Loop/Scan; onnxruntime equal to ``model(x, training=False)`` on every output
(Keras returns every cell's states with ``return_state``) within 1e-5, at two batch sizes and
time lengths. Cell mixes of every kind, both GRU modes, ``return_sequences``, ``return_state``,
``initial_state``, ``go_backwards``, ``Bidirectional`` and masks (rows pre-padded, post-padded,
holed and empty), in both Keras flavors. Streaming names each cell's states
``<layer>/cell_<k>/h_in`` ... and runs chunk by chunk as whole.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import helpers
import parity
import tf2onnx_rnn

FEATURES = 3
ONNX_OP = {**helpers.ONNX_OP, "GRU_before": "GRU"}  # GRU_before: a GRU cell with reset_after=False
STATES = {**helpers.STATE_COUNT, "GRU_before": 1}
UNITS = (4, 3, 2)


@dataclass(frozen=True)
class Case:
    cells: tuple  # LSTM, GRU (reset_after), GRU_before (reset_after=False), SimpleRNN; bottom first
    return_sequences: bool = True
    return_state: bool = False
    initial_state: bool = False
    go_backwards: bool = False
    bidirectional: bool = False
    masked: bool = False

    @property
    def id(self) -> str:
        flags = [name for name in ("return_sequences", "return_state", "initial_state", "go_backwards",
                                   "bidirectional", "masked") if getattr(self, name)]
        return "-".join(self.cells) + ("+" + "+".join(flags) if flags else "")

    def cell(self, K, kind: str, units: int):
        if kind == "LSTM":
            return K.layers.LSTMCell(units)
        if kind.startswith("GRU"):
            return K.layers.GRUCell(units, reset_after=kind == "GRU")
        return K.layers.SimpleRNNCell(units)

    def state_sizes(self) -> list:
        return [units for kind, units in zip(self.cells, UNITS) for _ in range(STATES[kind])]

    def build(self, flavor: str):
        K = parity.keras_module(flavor)
        x = K.Input((None, FEATURES), name="x")
        inputs, h, call = [x], x, {}
        if self.masked:
            h = K.layers.Masking(0.0, name="masking")(x)
        if self.initial_state:
            states = [K.Input((size,), name=f"s{i}") for i, size in enumerate(self.state_sizes())]
            inputs += states
            call["initial_state"] = states
        cells = [self.cell(K, kind, units) for kind, units in zip(self.cells, UNITS)]
        layer = K.layers.RNN(K.layers.StackedRNNCells(cells), return_sequences=self.return_sequences,
                             return_state=self.return_state, go_backwards=self.go_backwards, name="stack")
        if self.bidirectional:
            layer = K.layers.Bidirectional(layer, name="bi")
        out = layer(h, **call)
        model = K.Model(inputs if len(inputs) > 1 else x, out)
        parity.randomize_weights(model, zlib.crc32(f"stacked/{flavor}/{self.id}".encode()))
        return model

    def feeds(self, batch: int, time: int, seed: int) -> list:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((batch, time, FEATURES)).astype(np.float32)
        if self.masked:  # rows pre-padded, post-padded, holed, empty (as many as the batch has)
            kinds = [slice(0, 2), slice(time // 2, None), slice(1, time - 1, 2), slice(None)]
            for row in range(min(batch, len(kinds))):
                x[row, kinds[row]] = 0.0
        return [x] + [rng.standard_normal((batch, size)).astype(np.float32) for size in self.state_sizes()
                      if self.initial_state]


CASES = [
    Case(("LSTM", "GRU", "SimpleRNN")),
    Case(("GRU_before", "LSTM"), return_sequences=False, return_state=True),
    Case(("SimpleRNN", "GRU"), initial_state=True, return_state=True),
    Case(("LSTM", "SimpleRNN"), go_backwards=True),
    Case(("GRU", "LSTM"), bidirectional=True),
    Case(("SimpleRNN", "SimpleRNN"), return_sequences=False),
]
MASKED_CASES = [
    Case(("LSTM", "GRU"), masked=True),
    Case(("GRU_before", "SimpleRNN"), masked=True, go_backwards=True, return_state=True),
    Case(("SimpleRNN", "LSTM"), masked=True, bidirectional=True),
    Case(("LSTM", "SimpleRNN"), masked=True, return_sequences=False),
]

_CONVERTED: dict = {}


def converted(flavor: str, case: Case):
    key = (flavor, case)
    if key not in _CONVERTED:
        model = case.build(flavor)
        _CONVERTED[key] = (model, tf2onnx_rnn.convert_keras(model))
    return _CONVERTED[key]


def parity_problems(flavor: str, case: Case, model, model_proto) -> list:
    session = helpers.ort_session(model_proto)
    names = [i.name for i in model_proto.graph.input]
    problems = []
    for batch, time in ((4, 6), (1, 7)):
        arrays = case.feeds(batch, time, zlib.crc32(f"{flavor}{case.id}{batch}".encode()))
        import tensorflow as tf

        # Keras returns a stack's states nested per cell: flattened, they are in the ONNX model's order
        expected = [np.asarray(t) for t in tf.nest.flatten(model(arrays if len(arrays) > 1 else arrays[0],
                                                                 training=False))]
        actual = session.run(None, dict(zip(names, arrays)))
        found, _ = parity.output_problems(f"batch {batch} time {time}", [o.name for o in model_proto.graph.output],
                                          expected, actual, 1e-5)
        problems += found
    return problems


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS
                                          for c in CASES + MASKED_CASES])
def test_stacked_cells_become_one_node_per_cell(flavor, case):
    model, model_proto = converted(flavor, case)
    report = tf2onnx_rnn.report_of(model_proto)
    problems = []
    loops = 2 if case.bidirectional else 1
    rows = report.outcomes
    if len(rows) != loops or not all(o.fused and o.kind == "StackedRNNCells" for o in rows):
        problems.append(f"expected {loops} fused StackedRNNCells row(s)")
    for row in rows:
        kinds = [kind.split("_")[0] for kind in case.cells]
        if re.findall(r"(\w+) \[", row.activations) != kinds or not row.activations.startswith("cells: "):
            problems.append(f"the row does not name the cells {kinds} in order: {row.activations}")
    node_types = {n.name: n.op_type for n in helpers.nodes_of_types(model_proto, helpers.RECURRENT_OPS)}
    for row in rows:  # the row names every cell's node: the lower ones in cell_nodes, the top one in node
        named = [node_types.get(name) for name in row.cell_nodes + (row.node,)]
        if named != [ONNX_OP[kind] for kind in case.cells]:
            problems.append(f"the row names nodes of types {named}")
    if helpers.nodes_of_types(model_proto, helpers.LOOP_OPS):
        problems.append("Loop/Scan left")
    native = [n.op_type for n in helpers.nodes_of_types(model_proto, helpers.RECURRENT_OPS)]
    if sorted(native) != sorted([ONNX_OP[kind] for kind in case.cells] * loops):
        problems.append(f"native nodes {native}")
    problems += parity_problems(flavor, case, model, model_proto)
    assert not problems, f"{flavor} {case.id}:\n- " + "\n- ".join(problems) + "\n" + report.table()


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_stack_streams_with_a_state_per_cell(flavor):
    case = Case(("LSTM", "GRU", "SimpleRNN"))
    model = case.build(flavor)
    model_proto = tf2onnx_rnn.convert_keras(model, streaming=True)
    state_names = [i.name for i in model_proto.graph.input if i.name != "x"]
    assert state_names == ["stack/cell_0/h_in", "stack/cell_0/c_in", "stack/cell_1/h_in", "stack/cell_2/h_in"]
    x = case.feeds(2, 9, 5)[0]
    session = helpers.ort_session(model_proto)
    names = [o.name for o in session.get_outputs()]
    sizes = {i.name: i.type.tensor_type.shape.dim[1].dim_value for i in model_proto.graph.input if i.name != "x"}
    states = {name: np.zeros((2, size), np.float32) for name, size in sizes.items()}
    outputs, start = [], 0
    for size in (1, 3, 5):
        result = dict(zip(names, session.run(None, {"x": x[:, start:start + size], **states})))
        outputs.append(result[names[0]])
        states = {name: result[name[:-2] + "out"] for name in states}
        start += size
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), np.asarray(model(x, training=False)),
                               rtol=0, atol=1e-5)
