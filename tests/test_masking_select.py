"""A Keras ``Masking`` layer's select, skipped where the recurrent layers it feeds read kept steps only.

``Masking`` gives ``x`` where its mask holds (``SelectV2(m, x, 0)`` in Keras 3, ``x * cast(m)`` in
tf_keras). When that output feeds only recurrent layers masked by that same mask, their nodes read
``x`` itself: the two are equal at every kept step, and no output depends on another (compaction
and ``sequence_lens``; the portable form discards what it computes past the kept steps), so the
select's nodes go. Another reader of the Masking output (a ``TimeDistributed``, a model output)
keeps it, and the layer reads it as before; the training form keeps it too (its gradients run
through the steps past the kept ones).

Per case, in Keras 3 and tf_keras, every weight random: the graph (does the recurrent node read
``x`` through moves of its axes only, and is every ``Where``/``Mul`` of ``x`` gone, or does it read
the select), no Loop left, and onnxruntime against ``model(x, training=False)`` within 1e-5 on rows
full, post-padded, pre-padded, holed, padded at both ends, single-step and empty (post-padded and
full only with ``assume_post_padded``). Masked steps hold the mask value, here not always zero: the
node then reads inputs there that the select would have zeroed.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import helpers
import parity
import test_parity_masking as masking
from parity import FEATURES, UNITS

MOVES = frozenset({"Transpose", "GatherND", "Gather", "Flatten", "Slice", "Reshape", "Squeeze", "Unsqueeze",
                   "Identity", "ReverseSequence", "MatMul", "Add",  # MatMul, Add: the Scan form's projection
                   "ScatterND"})  # the portable form's compaction: followed through what it writes (its updates)
SELECTS = frozenset({"Where", "Mul"})


@dataclass(frozen=True)
class SelectCase:
    """A Masking layer and what reads it; ``dropped``: whether the select must be skipped."""

    layers: str  # see build()
    mask_value: float
    options: tuple = ()  # convert_keras options, (name, value) pairs
    dropped: bool = True

    @property
    def id(self) -> str:
        options = "-".join(f"{k}={v}" for k, v in self.options)
        return "-".join([self.layers, f"mv{self.mask_value:g}"] + ([options] if options else []))

    @property
    def post_padded(self) -> bool:
        return dict(self.options).get("assume_post_padded", False)

    def build(self, flavor: str):
        K = parity.keras_module(flavor)
        L = K.layers
        x = K.Input((None, FEATURES), name="x")
        m = L.Masking(self.mask_value, name="masking")(x)
        if self.layers == "lstm":
            outputs = masking.flatten(L.LSTM(UNITS, return_sequences=True, return_state=True, name="uut_lstm")(m))
        elif self.layers == "bigru":
            outputs = [L.Bidirectional(L.GRU(UNITS, return_sequences=True, name="uut_gru"), name="uut_bi")(m)]
        elif self.layers == "rnn_back":
            outputs = masking.flatten(L.SimpleRNN(UNITS, go_backwards=True, return_sequences=True, return_state=True,
                                                  name="uut_simple_rnn")(m))
        elif self.layers == "lstm_and_gru":  # two layers read the Masking output
            outputs = [L.LSTM(UNITS, name="uut_lstm")(m), L.GRU(UNITS, go_backwards=True, name="uut_gru")(m)]
        elif self.layers == "lstm_and_time_distributed":
            outputs = [L.LSTM(UNITS, name="uut_lstm")(m), L.TimeDistributed(L.Dense(3), name="uut_dense")(m)]
        elif self.layers == "lstm_and_output":
            outputs = [L.LSTM(UNITS, return_sequences=True, name="uut_lstm")(m), m]
        else:
            raise AssertionError(self.layers)
        model = K.Model(x, outputs, name="masking_select")
        parity.randomize_weights(model, seed_of(flavor, self))
        return model

    def feeds(self, mask: np.ndarray, seed: int) -> list:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(mask.shape + (FEATURES,)).astype(np.float32)
        return [np.where(mask[:, :, None], x, np.float32(self.mask_value)).astype(np.float32)]


CASES = (
    SelectCase("lstm", 0.0),
    SelectCase("bigru", -1.0),
    SelectCase("rnn_back", 2.5),
    SelectCase("lstm_and_gru", -1.0),
    SelectCase("lstm", -1.0, (("assume_post_padded", True),)),
    SelectCase("bigru", -1.0, (("target", "portable"),)),
    SelectCase("rnn_back", 2.5, (("target", "portable"),)),
    SelectCase("rnn_back", 2.5, (("target", "onnxruntime"),)),  # SimpleRNN as MatMul + Scan
    SelectCase("lstm_and_time_distributed", -1.0, dropped=False),
    SelectCase("lstm_and_output", 0.0, dropped=False),
    SelectCase("bigru", -1.0, (("target", "training"),), dropped=False),
)


def seed_of(flavor: str, case: SelectCase) -> int:
    return zlib.crc32(f"masking-select/{flavor}/{case.id}".encode())


_CONVERTED: dict = {}


def converted(flavor: str, case: SelectCase):
    """(Keras model, ONNX model), once per process."""
    if (flavor, case) not in _CONVERTED:
        from tf2onnx_rnn import convert_keras

        model = case.build(flavor)
        _CONVERTED[(flavor, case)] = (model, convert_keras(model, **dict(case.options)))
    return _CONVERTED[(flavor, case)]


def read_from(graph, tensor: str, outer: dict = None):
    """(the tensor a node's input is moved from, the node making it, or None for a graph input). An
    ``If`` (the mask's choice of compaction at run time) moves what every branch moves: each branch's
    output is followed in it, and names from outside it in the graphs around it."""
    producers = dict(outer or {})
    producers.update({out: node for node in graph.node for out in node.output})
    node = producers.get(tensor)
    while node is not None and (node.op_type in MOVES or node.op_type == "If"):
        if node.op_type == "If":
            position = list(node.output).index(tensor)
            ends = [read_from(a.g, a.g.output[position].name, producers) for a in node.attribute
                    if a.name in ("then_branch", "else_branch")]
            if len({(end, maker.name if maker is not None else None) for end, maker in ends}) != 1:
                return tensor, node
            return ends[0]
        tensor = node.input[2] if node.op_type == "ScatterND" else node.input[0]
        node = producers.get(tensor)
    return tensor, node


def graph_problems(proto, case: SelectCase) -> list:
    graph = proto.graph
    problems = []
    loops = [n for n in graph.node if n.op_type == "Loop"]
    if loops:
        problems.append(f"Loop nodes left: {[n.name for n in loops]}")
    nodes = [n for n in graph.node if n.op_type in helpers.RECURRENT_OPS | {"Scan"}]
    if not nodes:
        problems.append("no recurrent node")
    selects = [n for n in graph.node if n.op_type in SELECTS and "x" in n.input]
    for node in nodes:
        source, producer = read_from(graph, node.input[-1] if node.op_type == "Scan" else node.input[0])
        if case.dropped and (producer is not None or source != "x"):
            problems.append(f"{node.op_type} {node.name} reads its X from "
                            f"{producer.op_type + ' ' + producer.name if producer is not None else source}, "
                            "not from the input x through moves of its axes")
        if not case.dropped and (producer is None or producer.op_type not in SELECTS or "x" not in producer.input):
            problems.append(f"{node.op_type} {node.name} does not read the Masking layer's select of x "
                            f"(it reads {producer.op_type if producer is not None else source})")
    if case.dropped and selects:
        problems.append(f"the Masking layer's select is left: {[(n.op_type, n.name) for n in selects]}")
    if not case.dropped and not selects:
        problems.append("the Masking layer's select is gone, though something else reads it")
    return problems


def parity_problems(proto, model, case: SelectCase, seed: int) -> list:
    session = helpers.ort_session(proto)
    rounds = masking.post_padded_rounds() if case.post_padded else masking.rounds()
    problems = []
    for index, (label, mask) in enumerate(rounds):
        arrays = case.feeds(mask, seed + 1 + index)
        expected = parity.keras_outputs(model, arrays)
        actual = parity.run_onnx(session, ["x"], arrays)
        problems += parity.output_problems(label, [o.name for o in proto.graph.output], expected, actual,
                                           parity.TOLERANCE)[0]
    return problems


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in CASES])
def test_masking_select(flavor: str, case: SelectCase):
    model, proto = converted(flavor, case)
    problems = graph_problems(proto, case) + parity_problems(proto, model, case, seed_of(flavor, case))
    if problems:
        pytest.fail(f"{flavor} {case.id}:\n- " + "\n- ".join(problems) + "\n" + parity.report_table(proto),
                    pytrace=False)
