"""Parity of multi-layer and wrapped recurrent structures with their conversion.

Every case is built in Keras 3 and in tf_keras with every weight (biases included)
randomized, converted once per process (``parity.converted_with``), and checked in ONE test
per (flavor, case), so that pytest-xdist never converts a case twice. The test checks, and
reports every failing aspect together:

(a) the exact multiset of native ONNX recurrent nodes (op type, ``direction``, attributes);
(b) no Loop or Scan anywhere, subgraphs included (or, for cases expected to stay a Loop,
    exactly those Loops);
(c) the conversion report: one entry per recurrent while-loop, with its layer, kind,
    direction and what it became; a fused entry names an existing node of that op and
    direction, and a bidirectional node is named by exactly its forward and backward entry;
(d) onnxruntime matches ``model(x, training=False)`` on every output, at batch 3 and two
    time lengths on the same converted model, within 1e-5 (relative to max(1, |expected|)
    for the activation cases, whose outputs are unbounded);
(e) case-specific structure: initial states wired into the node, no Transpose between
    stacked recurrent nodes.

Sections: 1 Bidirectional merge modes x return_sequences x return_state (a covering design),
2 Bidirectional with initial states, 3 explicit ``backward_layer``, 4 deep mixed stacks,
5 encoder-decoder, 6 ``RNN(cell)`` and ``StackedRNNCells``, 7 dropout, 8 activations
(``leaky_relu`` is tested in both flavors: tf_keras 2.21 has it as an activation too).
"""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import helpers
import parity
from helpers import KINDS, ONNX_OP, SCOPE_NAME, STATE_NAMES
from parity import FEATURES, UNITS

ROUNDS = ((3, 5), (3, 9))  # (batch, time), both on the same converted model
MERGE_MODES = ("concat", "sum", "mul", "ave", None)
# ops allowed on the data path from one recurrent node's output to the next one's X
PASS_THROUGH = frozenset({"Squeeze", "Unsqueeze", "Slice", "Split", "Concat", "ReverseSequence", "Identity"})


# -- expectations ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """An expected native node: op type, the ``direction`` values accepted, fixed attributes."""

    op: str
    directions: tuple = ("forward",)
    attrs: tuple = ()  # ((name, value), ...)

    def accepts(self, node) -> bool:
        return (node.op_type == self.op and helpers.direction_of(node) in self.directions
                and all(helpers.attribute(node, k) == v for k, v in self.attrs))

    def __str__(self):
        extra = "".join(f", {k}={v}" for k, v in self.attrs)
        return f"{self.op}({'|'.join(self.directions)}{extra})"


@dataclass(frozen=True)
class Loop:
    """An expected report entry for one recurrent while-loop.

    ``layer`` is a Keras layer name, or ``"<wrapper>:forward"`` / ``"<wrapper>:backward"`` for
    a Bidirectional's sub-layers (whose names differ between Keras versions).
    ``became`` is the ONNX op, or "Loop" with ``reason`` a text the reason must contain;
    ``became=None`` accepts either (a fused entry, or a Loop with a non-empty reason).
    """

    layer: str
    kind: Optional[str]
    direction: Optional[str]  # forward / backward; None: not checked
    became: Optional[str]
    node_directions: tuple = ("forward",)
    reason: str = ""




def gru_attrs(reset_after: bool) -> tuple:
    return (("linear_before_reset", int(reset_after)),)


def node_of(kind: str, directions=("forward",), reset_after: Optional[bool] = None) -> Node:
    if kind == "GRU":
        return Node("GRU", tuple(directions), gru_attrs(True if reset_after is None else reset_after))
    return Node(ONNX_OP[kind], tuple(directions))


def one_direction(go_backwards: bool) -> tuple:
    """ONNX directions a go_backwards layer may become: reverse over the input, or forward over
    Keras's reversed input (when the reversed-order sequence is used)."""
    return ("forward", "reverse") if go_backwards else ("forward",)


def bidi_loops(wrapper: str, kind: str) -> tuple:
    op = ONNX_OP[kind]
    return (Loop(f"{wrapper}:forward", kind, "forward", op, ("bidirectional",)),
            Loop(f"{wrapper}:backward", kind, "backward", op, ("bidirectional",)))


def rnn_layer(K, kind: str, name: str, reset_after: Optional[bool] = None, **kwargs):
    if kind == "GRU" and reset_after is not None:
        kwargs["reset_after"] = reset_after
    return getattr(K.layers, kind)(UNITS, name=name, **kwargs)


def outputs_list(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def seq_input(name: str = "x", features: int = FEATURES, time_delta: int = 0) -> tuple:
    return (name, "seq", features, time_delta)


def state_inputs(prefix: str, kind: str) -> tuple:
    return tuple((f"{prefix}_{s}", "state", UNITS, 0) for s in STATE_NAMES[kind])


# -- cases ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bidi:
    """Sections 1-3: one Bidirectional layer around LSTM / GRU / SimpleRNN."""

    kind: str
    merge_mode: Optional[str] = "concat"
    return_sequences: bool = False
    return_state: bool = False
    reset_after: Optional[bool] = None  # GRU only
    initial_state: bool = False  # both directions' states from model inputs
    backward: Optional[str] = None  # explicit backward_layer: "same" config, or "relu" activation
    section: str = "merge"

    @property
    def id(self) -> str:
        parts = ["bidi", self.kind]
        if self.reset_after is not None:
            parts.append("reset_after" if self.reset_after else "reset_before")
        parts += [str(self.merge_mode).lower(), "seq" if self.return_sequences else "last"]
        if self.return_state:
            parts.append("state")
        if self.initial_state:
            parts.append("init")
        if self.backward:
            parts.append("backward_layer_" + self.backward)
        return "-".join(parts)

    @property
    def inputs(self) -> tuple:
        states = (state_inputs("init_fwd", self.kind) + state_inputs("init_bwd", self.kind)
                  if self.initial_state else ())
        return (seq_input(),) + states

    @property
    def nodes(self) -> tuple:
        return (node_of(self.kind, ("bidirectional",), self.reset_after),)

    @property
    def loops(self) -> tuple:
        return bidi_loops("uut_bi", self.kind)

    relative = False
    weight_scale = 0.5

    def build(self, K):
        common = dict(return_sequences=self.return_sequences, return_state=self.return_state,
                      reset_after=self.reset_after)
        inner = rnn_layer(K, self.kind, "uut_" + SCOPE_NAME[self.kind], **common)
        extra = {}
        if self.backward:
            activation = {"same": {}, "relu": {"activation": "relu"}}[self.backward]
            extra["backward_layer"] = rnn_layer(K, self.kind, "back_" + SCOPE_NAME[self.kind], go_backwards=True,
                                                **common, **activation)
        bi = K.layers.Bidirectional(inner, merge_mode=self.merge_mode, name="uut_bi", **extra)
        inputs = make_keras_inputs(K, self.inputs)
        if self.initial_state:
            out = bi(inputs[0], initial_state=inputs[1:])
        else:
            out = bi(inputs[0])
        return K.Model(inputs if len(inputs) > 1 else inputs[0], outputs_list(out), name="bidi")

    def extra_checks(self, proto) -> list:
        if not self.initial_state:
            return []
        problems = []
        slots = (5, 6) if self.kind == "LSTM" else (5,)
        for node in helpers.nodes_of_types(proto, {ONNX_OP[self.kind]}):
            for slot in slots:
                if len(node.input) <= slot or not node.input[slot]:
                    problems.append(f"node {node.name} has no initial state input {slot}: {list(node.input)}")
        return problems


@dataclass(frozen=True)
class Stack:
    """Section 4: three stacked recurrent layers, the first one (or two) Bidirectional."""

    variant: str

    @property
    def id(self) -> str:
        return "stack-" + self.variant

    inputs = (seq_input(),)
    relative = False
    weight_scale = 0.5

    @property
    def nodes(self) -> tuple:
        return {
            "bilstm-gru_back-rnn": (node_of("LSTM", ("bidirectional",)),
                                    node_of("GRU", one_direction(True), reset_after=False),
                                    node_of("SimpleRNN")),
            "bigru-birnn-lstm_back": (node_of("GRU", ("bidirectional",), reset_after=True),
                                      node_of("SimpleRNN", ("bidirectional",)),
                                      node_of("LSTM", one_direction(True))),
        }[self.variant]

    @property
    def loops(self) -> tuple:
        return {
            "bilstm-gru_back-rnn": bidi_loops("uut_bi", "LSTM") + (
                Loop("uut_gru", "GRU", "backward", "GRU", one_direction(True)),
                Loop("uut_simple_rnn", "SimpleRNN", "forward", "RNN")),
            "bigru-birnn-lstm_back": bidi_loops("uut_bi_gru", "GRU") + bidi_loops("uut_bi_rnn", "SimpleRNN") + (
                Loop("uut_lstm", "LSTM", "backward", "LSTM", one_direction(True)),),
        }[self.variant]

    def build(self, K):
        x = K.Input((None, FEATURES), name="x")
        if self.variant == "bilstm-gru_back-rnn":
            y = K.layers.Bidirectional(rnn_layer(K, "LSTM", "uut_lstm", return_sequences=True), name="uut_bi")(x)
            y = rnn_layer(K, "GRU", "uut_gru", reset_after=False, go_backwards=True, return_sequences=True)(y)
            y = rnn_layer(K, "SimpleRNN", "uut_simple_rnn")(y)
        else:
            y = K.layers.Bidirectional(rnn_layer(K, "GRU", "uut_gru", return_sequences=True), name="uut_bi_gru")(x)
            y = K.layers.Bidirectional(rnn_layer(K, "SimpleRNN", "uut_simple_rnn", return_sequences=True),
                                       name="uut_bi_rnn")(y)
            y = rnn_layer(K, "LSTM", "uut_lstm", go_backwards=True, return_sequences=True)(y)
        return K.Model(x, y, name="stack")

    def extra_checks(self, proto) -> list:
        """Between recurrent nodes only slicing, squeezing, concatenation and reversal."""
        problems = []
        recurrent = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
        for node in recurrent:
            ops, sources = data_path(proto, node.input[0])
            if not sources:
                continue  # fed from the model input: the first layer
            if "input" in sources:
                problems.append(f"{node.name}'s X comes from a recurrent node and from a graph input")
            bad = [f"{n.op_type} {n.name}" for n in ops if n.op_type not in PASS_THROUGH]
            if bad:
                problems.append(f"between {sorted(sources - {'input'})} and {node.name}'s X: "
                                f"{bad} (only {sorted(PASS_THROUGH)} expected)")
        fed = sum(1 for node in recurrent if data_path(proto, node.input[0])[1] - {"input"})
        if fed != len(recurrent) - 1:
            problems.append(f"{fed} recurrent node(s) fed from another recurrent node, expected "
                            f"{len(recurrent) - 1}")
        return problems


@dataclass(frozen=True)
class EncoderDecoder:
    """Section 5: the encoder's final states are the decoder's initial state."""

    kind: str
    state_output: bool = False  # the encoder's states are model outputs too

    @property
    def id(self) -> str:
        return f"encdec-{self.kind}" + ("-state_out" if self.state_output else "")

    # the decoder reads a shorter sequence with other features
    inputs = (seq_input("enc_x"), seq_input("dec_x", 3, -2))
    relative = False
    weight_scale = 0.5

    @property
    def nodes(self) -> tuple:
        return (node_of(self.kind), node_of(self.kind))

    @property
    def loops(self) -> tuple:
        op = ONNX_OP[self.kind]
        return (Loop("encoder", self.kind, "forward", op), Loop("decoder", self.kind, "forward", op))

    def build(self, K):
        enc_x, dec_x = K.Input((None, FEATURES), name="enc_x"), K.Input((None, 3), name="dec_x")
        _, *states = rnn_layer(K, self.kind, "encoder", return_state=True)(enc_x)
        y = rnn_layer(K, self.kind, "decoder", return_sequences=True)(dec_x, initial_state=states)
        return K.Model([enc_x, dec_x], [y] + (states if self.state_output else []), name="encdec")

    def extra_checks(self, proto) -> list:
        return []


@dataclass(frozen=True)
class Single:
    """Sections 6-8: one layer, ``RNN(cell)``, dropout, activations."""

    kind: str
    cell: str = ""  # "" (the layer), "cell" (RNN(<kind>Cell)) or "stacked" (RNN(StackedRNNCells))
    activation: Optional[str] = None
    recurrent_activation: Optional[str] = None
    dropout: bool = False
    reset_after: Optional[bool] = None
    go_backwards: bool = False
    return_sequences: bool = False
    return_state: bool = False
    stays_loop: str = ""  # the op the reason must name when the layer must stay a Loop
    section: str = ""

    @property
    def id(self) -> str:
        parts = [self.section, self.kind]
        if self.cell:
            parts.append(self.cell)
        if self.activation:
            parts.append("a_" + self.activation)
        if self.recurrent_activation:
            parts.append("ra_" + self.recurrent_activation)
        if self.reset_after is not None:
            parts.append("reset_after" if self.reset_after else "reset_before")
        if self.go_backwards:
            parts.append("bwd")
        parts.append("seq" if self.return_sequences else "last")
        if self.return_state:
            parts.append("state")
        return "-".join(parts)

    inputs = (seq_input(),)

    @property
    def relative(self) -> bool:
        return self.section == "activation"

    @property
    def weight_scale(self) -> float:
        """Smaller weights where unbounded activations would overflow float32 within 9 steps."""
        if self.section != "activation":
            return 0.5
        return 0.05 if "exponential" in (self.activation, self.recurrent_activation) else 0.25

    @property
    def name(self) -> str:
        return "uut_rnn" if self.cell else "uut_" + SCOPE_NAME[self.kind]

    @property
    def nodes(self) -> Optional[tuple]:
        if self.cell == "stacked":  # one node per cell (two cells)
            return (node_of(self.kind, one_direction(self.go_backwards), self.reset_after),) * 2
        if self.stays_loop:
            return ()
        return (node_of(self.kind, one_direction(self.go_backwards), self.reset_after),)

    @property
    def loops(self) -> tuple:
        direction = "backward" if self.go_backwards else "forward"
        if self.cell == "stacked":
            return (Loop(self.name, "StackedRNNCells", direction, ONNX_OP[self.kind],
                         one_direction(self.go_backwards)),)
        if self.stays_loop:
            return (Loop(self.name, self.kind, None, "Loop", reason=self.stays_loop),)
        return (Loop(self.name, self.kind, direction, ONNX_OP[self.kind], one_direction(self.go_backwards)),)

    def build(self, K):
        kwargs = dict(go_backwards=self.go_backwards, return_sequences=self.return_sequences,
                      return_state=self.return_state)
        cell_kwargs = {}
        if self.activation:
            cell_kwargs["activation"] = self.activation
        if self.recurrent_activation:
            cell_kwargs["recurrent_activation"] = self.recurrent_activation
        if self.dropout:
            cell_kwargs.update(dropout=0.3, recurrent_dropout=0.3)
        if self.reset_after is not None:
            cell_kwargs["reset_after"] = self.reset_after
        if self.cell == "cell":
            cell = getattr(K.layers, self.kind + "Cell")(UNITS, **cell_kwargs)
            layer = K.layers.RNN(cell, name=self.name, **kwargs)
        elif self.cell == "stacked":
            cells = [getattr(K.layers, self.kind + "Cell")(UNITS, **cell_kwargs) for _ in range(2)]
            layer = K.layers.RNN(K.layers.StackedRNNCells(cells), name=self.name, **kwargs)
        else:
            layer = getattr(K.layers, self.kind)(UNITS, name=self.name, **kwargs, **cell_kwargs)
        x = K.Input((None, FEATURES), name="x")
        return K.Model(x, outputs_list(layer(x)), name="single")

    def extra_checks(self, proto) -> list:
        return []


# -- the case lists --------------------------------------------------------------------------

def bidi_design(kind: str) -> list:
    """Ten cases per kind: every merge mode with two complementary (return_sequences,
    return_state[, reset_after]) rows, rotated so that every pair of values of two options
    appears together (and each reset_after meets every merge mode, for GRU)."""
    rows = ((False, False, True), (False, True, False), (True, False, False), (True, True, True))
    cases = []
    for index, merge_mode in enumerate(MERGE_MODES):
        base = rows[index % len(rows)]
        for seq, state, reset_after in (base, tuple(not v for v in base)):
            cases.append(Bidi(kind, merge_mode, seq, state, reset_after=reset_after if kind == "GRU" else None))
    return cases


BIDI_CASES = [case for kind in KINDS for case in bidi_design(kind)]

INITIAL_STATE_CASES = [
    Bidi("LSTM", "concat", True, True, initial_state=True, section="initial_state"),
    Bidi("GRU", "sum", False, True, reset_after=False, initial_state=True, section="initial_state"),
    Bidi("GRU", "mul", True, False, reset_after=True, initial_state=True, section="initial_state"),
    Bidi("SimpleRNN", None, True, True, initial_state=True, section="initial_state"),
]

BACKWARD_LAYER_CASES = [
    Bidi("LSTM", "concat", True, False, backward="same", section="backward_layer"),
    Bidi("LSTM", "sum", False, True, backward="relu", section="backward_layer"),
    Bidi("GRU", "ave", True, True, reset_after=False, backward="same", section="backward_layer"),
    Bidi("SimpleRNN", None, True, False, backward="relu", section="backward_layer"),
]

STACK_CASES = [Stack("bilstm-gru_back-rnn"), Stack("bigru-birnn-lstm_back")]

ENCODER_DECODER_CASES = [EncoderDecoder("LSTM"), EncoderDecoder("GRU", state_output=True)]

CELL_CASES = [
    Single("LSTM", cell="cell", section="cell"),
    Single("GRU", cell="cell", return_sequences=True, go_backwards=True, section="cell"),
    Single("GRU", cell="cell", reset_after=False, return_state=True, section="cell"),
    Single("SimpleRNN", cell="cell", return_sequences=True, return_state=True, section="cell"),
    Single("LSTM", cell="stacked", return_sequences=True, section="cell"),
]

DROPOUT_CASES = [
    Single("LSTM", dropout=True, return_sequences=True, section="dropout"),
    Single("GRU", dropout=True, return_state=True, section="dropout"),
    Single("GRU", dropout=True, reset_after=False, go_backwards=True, section="dropout"),
    Single("SimpleRNN", dropout=True, return_sequences=True, return_state=True, section="dropout"),
]

# native in both flavors (leaky_relu is a Keras activation in tf_keras 2.21 too)
NATIVE_ACTIVATIONS = ("linear", "softsign", "softplus", "relu", "sigmoid", "tanh", "hard_sigmoid", "elu",
                      "leaky_relu")
# LSTM activation -> recurrent_activation: each activation once in each role; only one pair has
# both unbounded (linear -> relu), so the cell state stays far from float32 overflow
LSTM_ACTIVATION_PAIRS = (("linear", "relu"), ("softsign", "linear"), ("softplus", "tanh"),
                         ("relu", "hard_sigmoid"), ("sigmoid", "elu"), ("tanh", "leaky_relu"),
                         ("hard_sigmoid", "softplus"), ("elu", "softsign"), ("leaky_relu", "sigmoid"))
# activation -> what the report says of a layer no native node computes for it (a Scan of its own step)
LOOP_ACTIVATIONS = {name: f"activation {name}: no ONNX recurrent node computes it" for name in ("selu", "exponential")}


def activation_cases() -> list:
    cases = [Single("SimpleRNN", activation=a, return_sequences=True, section="activation")
             for a in NATIVE_ACTIVATIONS]
    cases += [Single("LSTM", activation=a, recurrent_activation=r, return_sequences=True, section="activation")
              for a, r in LSTM_ACTIVATION_PAIRS]
    for a, op in LOOP_ACTIVATIONS.items():
        cases.append(Single("SimpleRNN", activation=a, stays_loop=op, section="activation"))
        cases.append(Single("LSTM", activation=a, stays_loop=op, section="activation"))
        cases.append(Single("LSTM", recurrent_activation=a, stays_loop=op, section="activation"))
    return cases


ACTIVATION_CASES = activation_cases()

ALL_CASES = (BIDI_CASES + INITIAL_STATE_CASES + BACKWARD_LAYER_CASES + STACK_CASES + ENCODER_DECODER_CASES
             + CELL_CASES + DROPOUT_CASES + ACTIVATION_CASES)
PARAMS = [pytest.param(flavor, case, id=f"{flavor}-{case.id}") for flavor in parity.FLAVORS for case in ALL_CASES]


# -- building, running, walking -----------------------------------------------------------------

def make_keras_inputs(K, specs) -> list:
    return [K.Input((None, size) if role == "seq" else (size,), name=name) for name, role, size, _ in specs]


def build_structure(flavor: str, case):
    model = case.build(parity.keras_module(flavor))
    parity.randomize_weights(model, zlib.crc32(f"{flavor}/{case.id}".encode()), case.weight_scale)
    return model


def make_arrays(case, batch: int, time: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, time + delta, size) if role == "seq" else (batch, size)).astype(np.float32)
            for _, role, size, delta in case.inputs]


def data_path(proto, tensor: str):
    """The nodes on the data path that leads to ``tensor`` back to the nearest recurrent nodes
    or graph inputs (Concat follows every input, other ops their first), and the names of those
    recurrent nodes ("input" for a graph input)."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    ops, sources, pending, seen = [], set(), [tensor], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is None:
            sources.add("input")
        elif node.op_type in helpers.RECURRENT_OPS:
            sources.add(node.name)
        else:
            ops.append(node)
            pending.extend(node.input if node.op_type == "Concat" else node.input[:1])
    if sources == {"input"}:
        return ops, set()
    return ops, sources


def report_rows(outcomes: list, ref: str, direction: Optional[str]) -> list:
    """The report rows of a layer reference: ``name``, or ``wrapper:forward``/``wrapper:backward``
    for a Bidirectional's halves, which the report names after the wrapper (told apart by their
    direction when the expectation gives one, else by their order)."""
    if ":" not in ref:
        return [o for o in outcomes if parity.layer_matches(o.layer, ref)]
    wrapper, side = ref.split(":")
    halves = [o for o in outcomes if parity.layer_matches(o.layer, wrapper)]
    assert len(halves) == 2, f"report entries for Bidirectional {wrapper!r}: {[o.layer for o in halves]}"
    if direction is not None and all(o.direction for o in halves):
        return [o for o in halves if o.direction == direction]
    return [halves[0 if side == "forward" else 1]]


# -- the checks ---------------------------------------------------------------------------------

def check_nodes(case, proto) -> None:
    recurrent = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    for node in recurrent:
        assert helpers.attribute(node, "hidden_size") == UNITS, f"{node.name}: hidden_size"
    if case.nodes is None:
        return
    found = [f"{n.op_type}({helpers.direction_of(n)}) {n.name}" for n in recurrent]
    unmatched = list(recurrent)
    for expected in case.nodes:
        hit = next((n for n in unmatched if expected.accepts(n)), None)
        assert hit is not None, f"expected nodes {[str(e) for e in case.nodes]}, found {found}"
        unmatched.remove(hit)
    assert not unmatched, f"expected nodes {[str(e) for e in case.nodes]}, found {found}"


def check_loops(case, proto, report) -> None:
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    kept = [o for o in report.outcomes if not o.fused] if report is not None else []
    described = [f"{n.op_type} {n.name}" for n in loops]
    if all(loop.became not in (None, "Loop") for loop in case.loops) or not kept:
        assert not loops, f"Loop/Scan nodes left: {described}"
    else:
        scans = {o.node for o in kept if o.became == "Scan"}  # no native node: a Scan of the loop's own step
        assert {n.name for n in loops if n.op_type == "Scan"} == scans, f"Scan nodes: {described}"
        assert len(loops) == len(kept), f"{len(kept)} loop(s) reported kept, graph has {described}"


def check_report(case, proto, model, report) -> None:
    assert report is not None, "no conversion report in the model's metadata"
    outcomes = list(report.outcomes)
    assert len(outcomes) == len(case.loops), f"{len(outcomes)} report entries, expected {len(case.loops)}"
    nodes = {n.name: n for n in helpers.all_nodes(proto.graph)}
    for expected in case.loops:
        name = expected.layer
        matching = report_rows(outcomes, name, expected.direction)
        assert len(matching) == 1, f"report entries for layer {name!r}: {[o.layer for o in matching]}"
        (outcome,) = matching
        what = f"report entry for {name!r}"
        if expected.kind is not None:
            assert outcome.kind == expected.kind, f"{what}: kind {outcome.kind!r}, expected {expected.kind!r}"
        if expected.became == "Loop" or (expected.became is None and not outcome.fused):
            assert outcome.became in ("Loop", "Scan"), f"{what}: became {outcome.became!r}, expected no native node"
            assert outcome.reason.strip(), f"{what}: stays a Loop without a reason"
            assert expected.reason in outcome.reason, \
                f"{what}: reason {outcome.reason!r} does not name {expected.reason!r}"
            continue
        if expected.became is not None:
            assert outcome.became == expected.became, \
                f"{what}: became {outcome.became!r} ({outcome.reason}), expected {expected.became!r}"
        if expected.direction is not None:
            assert outcome.direction == expected.direction, \
                f"{what}: direction {outcome.direction!r}, expected {expected.direction!r}"
        node = nodes.get(outcome.node)
        assert node is not None and node.op_type == outcome.became, \
            f"{what}: names node {outcome.node!r}, which is not a {outcome.became} node of the graph"
        assert helpers.direction_of(node) == outcome.node_direction, \
            f"{what}: node_direction {outcome.node_direction!r}, the node's direction is {helpers.direction_of(node)!r}"
        if expected.became is not None:
            assert outcome.node_direction in expected.node_directions, \
                f"{what}: node_direction {outcome.node_direction!r}, expected {expected.node_directions}"
    # every node is named by one entry, a bidirectional one by its forward and its backward entry
    by_node: dict = {}
    for outcome in outcomes:
        if outcome.fused:
            for name in (outcome.node,) + tuple(outcome.cell_nodes):  # a stack's cells below the top too
                by_node.setdefault(name, []).append(outcome.direction)
    for node in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS):
        directions = sorted(by_node.get(node.name, []))
        wanted = ["backward", "forward"] if helpers.direction_of(node) == "bidirectional" else directions[:1]
        assert directions and directions == wanted, \
            f"node {node.name} ({helpers.direction_of(node)}) is named by report entries with directions {directions}"


def check_parity(case, flavor, proto, model) -> None:
    initializers = {init.name for init in proto.graph.initializer}
    graph_inputs = [i.name for i in proto.graph.input if i.name not in initializers]
    names = [spec[0] for spec in case.inputs]
    assert sorted(graph_inputs) == sorted(names), f"ONNX inputs {graph_inputs}, Keras inputs {names}"
    session = helpers.ort_session(proto)
    seed = zlib.crc32(f"{flavor}/{case.id}".encode())
    for index, (batch, time) in enumerate(ROUNDS):
        arrays = make_arrays(case, batch, time, seed + 1 + index)
        expected = parity.keras_outputs(model, arrays)
        actual = parity.run_onnx(session, names, arrays)
        assert len(actual) == len(expected), f"Keras gives {len(expected)} outputs, ONNX {len(actual)}"
        for position, (want, got) in enumerate(zip(expected, actual)):
            where = f"output {position} ({proto.graph.output[position].name}) at batch={batch}, time={time}"
            assert got.shape == want.shape, f"{where}: ONNX shape {got.shape}, Keras {want.shape}"
            assert got.dtype == want.dtype, f"{where}: ONNX dtype {got.dtype}, Keras {want.dtype}"
            assert np.all(np.isfinite(want)), f"{where}: Keras output not finite (case too unstable)"
            error = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            scale = max(1.0, float(np.max(np.abs(want)))) if case.relative else 1.0
            assert error <= parity.TOLERANCE * scale, \
                f"{where}: max abs error {error:.3g} (allowed {parity.TOLERANCE * scale:.3g})"


@contextlib.contextmanager
def aspect(problems: list, name: str):
    """Collect an assertion failure under ``name`` instead of stopping at it."""
    try:
        yield
    except AssertionError as error:
        problems.append(f"[{name}] {error}")


# -- the tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", PARAMS)
def test_structure_converts_natively_and_matches_keras(flavor: str, case):
    from tf2onnx_rnn import report_of

    entry = parity.converted_with(flavor, case, build_structure).get()
    proto, model = entry.proto, entry.model
    report = report_of(proto)
    problems: list = []
    with aspect(problems, "native nodes"):
        check_nodes(case, proto)
    with aspect(problems, "no Loop/Scan"):
        check_loops(case, proto, report)
    with aspect(problems, "report"):
        check_report(case, proto, model, report)
    with aspect(problems, "structure"):
        extra = case.extra_checks(proto)
        assert not extra, "; ".join(extra)
    with aspect(problems, "parity"):
        check_parity(case, flavor, proto, model)
    if problems:
        pytest.fail("\n".join(problems) + "\n" + parity.report_table(proto), pytrace=False)


# -- the case tables themselves -------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_bidirectional_design_covers_merge_modes_and_return_options(kind):
    rows = [c for c in BIDI_CASES if c.kind == kind]
    assert len(rows) <= 12
    assert {c.merge_mode for c in rows} == set(MERGE_MODES)
    combos = {(c.return_sequences, c.return_state) for c in rows}
    assert combos == {(s, t) for s in (False, True) for t in (False, True)}
    for merge_mode in MERGE_MODES:  # every merge mode with each value of each option
        of_mode = [c for c in rows if c.merge_mode == merge_mode]
        assert {c.return_sequences for c in of_mode} == {False, True}
        assert {c.return_state for c in of_mode} == {False, True}
    if kind == "GRU":
        assert {(c.merge_mode, c.reset_after) for c in rows} == {(m, r) for m in MERGE_MODES for r in (False, True)}
        both = {(a, b) for a in (False, True) for b in (False, True)}
        assert {(c.return_sequences, c.reset_after) for c in rows} == both
        assert {(c.return_state, c.reset_after) for c in rows} == both


def test_activation_cases_cover_every_activation_in_every_role():
    native = set(NATIVE_ACTIVATIONS)
    assert {c.activation for c in ACTIVATION_CASES if c.kind == "SimpleRNN" and not c.stays_loop} == native
    lstm = [c for c in ACTIVATION_CASES if c.kind == "LSTM" and not c.stays_loop]
    assert sorted(c.activation for c in lstm) == sorted(native)
    assert sorted(c.recurrent_activation for c in lstm) == sorted(native)
    loops = {(c.kind, c.activation, c.recurrent_activation) for c in ACTIVATION_CASES if c.stays_loop}
    assert loops == {(k, a, r) for a in LOOP_ACTIVATIONS for k, a, r in
                     (("SimpleRNN", a, None), ("LSTM", a, None), ("LSTM", None, a))}


def test_case_ids_are_unique():
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
