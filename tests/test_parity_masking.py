"""Parity of MASKED Keras LSTM / GRU / SimpleRNN layers with their conversion.

Keras is the oracle: onnxruntime must match ``model(inputs, training=False)`` on every output
within 1e-5, in Keras 3 (``keras``) and tf_keras, with every weight (biases and embeddings
included) randomized.

Masks come from three sources: a ``Masking`` layer (padded steps of x are all-zero vectors),
``Embedding(input_dim, F, mask_zero=True)`` on int ids (padded ids are 0), or an explicit
``mask=`` argument fed from a bool model input (x is random everywhere). Every converted model is
run on batches mixing rows that are full, post-padded, pre-padded, holed, padded at both ends,
single-step and EMPTY (no kept step) at two time lengths (and once at T=1), and on batches of
post-padded and full rows only and of full rows only (the lean branches of the default form).

Sections:
1. single layers (a covering design, see ``design()``): every kind (LSTM, GRU reset_after
   True/False, SimpleRNN) meets every direction (forward, go_backwards, Bidirectional) and every
   mask source; every pair of the other options (return_sequences, return_state,
   initial_state fed from model inputs, merge modes concat/sum/mul/None) appears.
   One test per (flavor, case) checks, and reports together: the native nodes (one per Keras
   layer, Bidirectional = one ``bidirectional`` node), no Loop/Scan anywhere, ``sequence_lens``
   computed in the graph from a model input, the report (fused, kind, direction, mask field),
   and the outputs against Keras.
   Keras 3 quirk: its ``Layer.__call__`` fills ``mask`` only when the layer gets ONE tensor
   argument, so ``layer(masked_x, initial_state=states)`` silently ignores the upstream mask.
   With initial states the Keras 3 models therefore pass the upstream mask explicitly (tf_keras
   propagates it by itself); one test checks the conversion also follows Keras 3's implicit call.
2. masked stacks where the mask propagates from layer to layer.
3. ``assume_post_padded=True``: exact on post-padded (and full) rows, fewer nodes than the
   default conversion, the report says post-padding is assumed.

Each test checks every aspect of its case and reports all failing ones together, so that
pytest-xdist converts each model once per worker (conversions are cached per process).
"""
from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import helpers
import parity
from helpers import ONNX_OP, SCOPE_NAME, STATE_NAMES
from parity import FEATURES, UNITS

VOCAB = 9  # Embedding input_dim: kept ids are 1..VOCAB-1, padded ids are 0
TIMES = (6, 11)  # two padded lengths on the same converted model
SOURCE_IN_REPORT = {"masking": "Masking", "embedding": "Embedding", "input": "mask input m"}


# -- rows of a batch ------------------------------------------------------------------------

ROW_KINDS = ("full", "post", "pre", "holed", "both_ends", "single", "empty")


def mask_row(kind: str, time: int) -> np.ndarray:
    """One row's mask (True = kept step) of a given shape of padding."""
    t = np.arange(time)
    pad = max(2, time // 3)
    row = {
        "full": t >= 0,
        "post": t < time - pad,  # kept steps first
        "pre": t >= pad,  # kept steps last
        "holed": ~(((t >= 1) & (t < 1 + pad)) | (t == time - 2)),  # first and last kept, holes between
        "both_ends": (t >= 1) & (t < time - 2),
        "single": t == time // 2,
        "empty": t < 0,
    }[kind]
    return row.astype(bool)


def mask_batch(kinds, time: int) -> np.ndarray:
    return np.stack([mask_row(kind, time) for kind in kinds])


def rounds() -> list:
    """(description, mask [B, T]) per round, all on the same converted model: every row kind at
    two time lengths (rows in a different order each time), and T=1; then batches of post-padded
    and full rows only, and of full rows only. The default form decides at run time whether a batch
    needs its compaction and restore: the mixed rounds take the heavy branch of its ``If`` nodes,
    the others the lean ones (a post-padded batch, a batch with nothing masked)."""
    kinds = list(ROW_KINDS)
    shifted = kinds[3:] + kinds[:3]
    return [(f"T={TIMES[0]} rows {kinds}", mask_batch(kinds, TIMES[0])),
            (f"T={TIMES[1]} rows {shifted}", mask_batch(shifted, TIMES[1])),
            ("T=1 rows [full, empty]", np.array([[True], [False]]))] + post_padded_rounds() + [
            (f"T={TIMES[0]} rows [full] * 3", np.ones((3, TIMES[0]), bool))]


def post_padded_rounds() -> list:
    """Only full and post-padded rows (different kept counts), at two time lengths."""
    result = []
    for time in TIMES:
        lengths = [time, time - 1, time // 2, 1, time]
        mask = np.stack([np.arange(time) < n for n in lengths])
        result.append((f"T={time} post-padded lengths {lengths}", mask))
    return result


# -- cases ------------------------------------------------------------------------------------

VARIANTS = {  # variant -> (kind, reset_after)
    "LSTM": ("LSTM", None),
    "GRU_reset_after": ("GRU", True),
    "GRU_reset_before": ("GRU", False),
    "SimpleRNN": ("SimpleRNN", None),
}
NOT_BIDI = "-"  # merge_mode of a layer that is not Bidirectional
MERGE_MODES = ("concat", "sum", "mul", "none")


@dataclass(frozen=True)
class MaskCase:
    """One masked recurrent layer (optionally Bidirectional) fed from one mask source."""

    variant: str  # a key of VARIANTS
    direction: str  # forward, backward (go_backwards=True), bidirectional
    source: str  # masking, embedding, input
    return_sequences: bool = False
    return_state: bool = False
    initial_state: bool = False  # initial states fed from model inputs
    merge_mode: str = NOT_BIDI  # Bidirectional only; "none" is merge_mode=None
    # Keras 3 drops an implicit mask (Masking, Embedding) when initial_state is passed too (its
    # Layer.__call__ fills ``mask`` only for a single tensor argument), so with initial states the
    # Keras 3 models pass the upstream layer's mask explicitly. True keeps Keras 3's implicit call.
    keras3_implicit: bool = False

    @property
    def kind(self) -> str:
        return VARIANTS[self.variant][0]

    @property
    def reset_after(self) -> Optional[bool]:
        return VARIANTS[self.variant][1]

    @property
    def bidirectional(self) -> bool:
        return self.direction == "bidirectional"

    @property
    def id(self) -> str:
        parts = [self.variant, self.direction, self.source, "seq" if self.return_sequences else "last"]
        if self.return_state:
            parts.append("state")
        if self.initial_state:
            parts.append("init")
        if self.bidirectional:
            parts.append("merge_" + self.merge_mode)
        if self.keras3_implicit:
            parts.append("keras3_implicit")
        return "-".join(parts)

    @property
    def layer_name(self) -> str:
        return "uut_" + SCOPE_NAME[self.kind]

    @property
    def state_inputs(self) -> list:
        if not self.initial_state:
            return []
        prefixes = ("init_fwd", "init_bwd") if self.bidirectional else ("init",)
        return [f"{p}_{s}" for p in prefixes for s in STATE_NAMES[self.kind]]

    @property
    def input_names(self) -> list:
        main = {"masking": ["x"], "embedding": ["ids"], "input": ["x", "m"]}[self.source]
        return main + self.state_inputs

    @property
    def output_count(self) -> int:
        sequences = 2 if self.bidirectional and self.merge_mode == "none" else 1
        states = len(STATE_NAMES[self.kind]) * (2 if self.bidirectional else 1) if self.return_state else 0
        return sequences + states

    def expected_nodes(self) -> list:
        """(op, accepted directions, attributes) of the one native node this layer must become."""
        if self.bidirectional:
            directions = ("bidirectional",)
        elif self.direction == "backward":
            directions = ("forward", "reverse")  # forward over Keras's reversed input, or reverse
        else:
            directions = ("forward",)
        attrs = {"hidden_size": UNITS}
        if self.kind == "GRU":
            attrs["linear_before_reset"] = int(self.reset_after)
        return [(ONNX_OP[self.kind], directions, attrs)]

    def expected_loops(self) -> list:
        """(layer name part, kind, direction) of every report entry."""
        if self.bidirectional:  # the report names a Bidirectional's halves after the wrapper
            return [("uut_bi", self.kind, "forward"), ("uut_bi", self.kind, "backward")]
        return [(self.layer_name, self.kind, self.direction)]

    def build(self, flavor: str):
        K = parity.keras_module(flavor)
        inputs, x, mask = masked_inputs(K, self.source)
        kwargs = dict(return_sequences=self.return_sequences, return_state=self.return_state,
                      go_backwards=self.direction == "backward")
        if self.reset_after is not None:
            kwargs["reset_after"] = self.reset_after
        layer = getattr(K.layers, self.kind)(UNITS, name=self.layer_name, **kwargs)
        if self.bidirectional:
            merge = None if self.merge_mode == "none" else self.merge_mode
            layer = K.layers.Bidirectional(layer, merge_mode=merge, name="uut_bi")
        call = {}
        if mask is None and flavor == "keras3" and self.initial_state and not self.keras3_implicit:
            mask = x._keras_mask  # see keras3_implicit
            assert mask is not None, "the upstream layer gives no mask"
        if mask is not None:
            call["mask"] = mask
        if self.initial_state:
            states = [K.Input((UNITS,), name=name) for name in self.state_inputs]
            inputs += states
            call["initial_state"] = states
        out = layer(x, **call)
        return K.Model(inputs if len(inputs) > 1 else inputs[0], flatten(out), name="masked")

    def feeds(self, mask: np.ndarray, seed: int) -> list:
        return make_feeds(self.source, mask, seed, [UNITS] * len(self.state_inputs))


def masked_inputs(K, source: str):
    """(model inputs, the tensor the first recurrent layer reads, explicit mask or None)."""
    if source == "masking":
        x = K.Input((None, FEATURES), name="x")
        return [x], K.layers.Masking(mask_value=0.0, name="masking")(x), None
    if source == "embedding":
        ids = K.Input((None,), dtype="int32", name="ids")
        return [ids], K.layers.Embedding(VOCAB, FEATURES, mask_zero=True, name="embedding")(ids), None
    x = K.Input((None, FEATURES), name="x")
    m = K.Input((None,), dtype="bool", name="m")
    return [x, m], x, m


def make_feeds(source: str, mask: np.ndarray, seed: int, state_sizes=()) -> list:
    """Model inputs for a mask [B, T]: x zero at padded steps (Masking), ids 0 at padded steps
    (Embedding), or random x and the bool mask itself (explicit mask). Then random states."""
    rng = np.random.default_rng(seed)
    batch, time = mask.shape
    if source == "embedding":
        ids = rng.integers(1, VOCAB, size=(batch, time)).astype(np.int32)
        arrays = [np.where(mask, ids, 0).astype(np.int32)]
    else:
        x = rng.standard_normal((batch, time, FEATURES)).astype(np.float32)
        if source == "masking":
            arrays = [np.where(mask[:, :, None], x, 0.0).astype(np.float32)]
        else:
            arrays = [x, mask.copy()]
    arrays += [rng.standard_normal((batch, size)).astype(np.float32) for size in state_sizes]
    return arrays


def flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return [leaf for item in out for leaf in flatten(item)]
    return [out]


# -- the covering design ----------------------------------------------------------------------

FACTORS = dict(variant=tuple(VARIANTS), direction=("forward", "backward", "bidirectional"),
               source=("masking", "embedding", "input"), return_sequences=(False, True),
               return_state=(False, True), initial_state=(False, True), merge_mode=(NOT_BIDI,) + MERGE_MODES)
CORE = ("variant", "direction", "source", "return_sequences", "return_state", "initial_state")
MERGE_PARTNERS = ("return_sequences", "return_state")


def valid(row: dict) -> bool:
    return (row["direction"] == "bidirectional") == (row["merge_mode"] != NOT_BIDI)


def required_pairs() -> set:
    """Every pair of values of two core options, and every merge mode with every value of
    return_sequences and of return_state."""
    pairs = {((a, va), (b, vb)) for i, a in enumerate(CORE) for b in CORE[i + 1:]
             for va in FACTORS[a] for vb in FACTORS[b]}
    pairs |= {((p, vp), ("merge_mode", m)) for p in MERGE_PARTNERS for vp in FACTORS[p] for m in MERGE_MODES}
    return pairs


def row_pairs(row: dict) -> set:
    names = list(FACTORS)
    return {((a, row[a]), (b, row[b])) for i, a in enumerate(names) for b in names[i + 1:]}


def design() -> list:
    """A small deterministic covering design (greedy), as MaskCases."""
    candidates = [row for row in (dict(zip(FACTORS, values)) for values in itertools.product(*FACTORS.values()))
                  if valid(row)]
    uncovered, rows = required_pairs(), []
    while uncovered:
        best = max(candidates, key=lambda row: len(row_pairs(row) & uncovered))
        assert row_pairs(best) & uncovered, "the required pairs cannot be covered"
        rows.append(best)
        uncovered -= row_pairs(best)
    return [MaskCase(**row) for row in rows]


CASES = design()


# -- stacks -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StackCase:
    """Two or three masked layers; the mask reaches every layer by propagation."""

    variant: str

    @property
    def id(self) -> str:
        return "stack-" + self.variant

    @property
    def source(self) -> str:
        return {"emb-bigru-lstm": "embedding", "input-rnn_back-lstm": "input",
                "masking-lstm-birnn-gru_back": "masking"}[self.variant]

    @property
    def input_names(self) -> list:
        return {"embedding": ["ids"], "input": ["x", "m"], "masking": ["x"]}[self.source]

    @property
    def output_count(self) -> int:
        return {"emb-bigru-lstm": 1, "input-rnn_back-lstm": 3, "masking-lstm-birnn-gru_back": 2}[self.variant]

    def expected_nodes(self) -> list:
        back = ("forward", "reverse")
        return {
            "emb-bigru-lstm": [("GRU", ("bidirectional",), {"linear_before_reset": 1}), ("LSTM", ("forward",), {})],
            "input-rnn_back-lstm": [("RNN", back, {}), ("LSTM", ("forward",), {})],
            "masking-lstm-birnn-gru_back": [("LSTM", ("forward",), {}), ("RNN", ("bidirectional",), {}),
                                            ("GRU", back, {"linear_before_reset": 0})],
        }[self.variant]

    def expected_loops(self) -> list:
        return {
            "emb-bigru-lstm": [("uut_bi", "GRU", "forward"), ("uut_bi", "GRU", "backward"),
                               ("uut_lstm", "LSTM", "forward")],
            "input-rnn_back-lstm": [("uut_simple_rnn", "SimpleRNN", "backward"), ("uut_lstm", "LSTM", "forward")],
            "masking-lstm-birnn-gru_back": [("uut_lstm", "LSTM", "forward"),
                                            ("uut_bi", "SimpleRNN", "forward"),
                                            ("uut_bi", "SimpleRNN", "backward"),
                                            ("uut_gru", "GRU", "backward")],
        }[self.variant]

    def build(self, flavor: str):
        K = parity.keras_module(flavor)
        L = K.layers
        inputs, x, mask = masked_inputs(K, self.source)
        if self.variant == "emb-bigru-lstm":
            y = L.Bidirectional(L.GRU(UNITS, return_sequences=True, name="uut_gru"), name="uut_bi")(x)
            outputs = [L.LSTM(UNITS, name="uut_lstm")(y)]
        elif self.variant == "input-rnn_back-lstm":
            # go_backwards: the sequence comes out reversed while the propagated mask is not
            y = L.SimpleRNN(UNITS, go_backwards=True, return_sequences=True, name="uut_simple_rnn")(x, mask=mask)
            outputs = flatten(L.LSTM(UNITS, return_sequences=True, return_state=True, name="uut_lstm")(y))
        else:
            y = L.LSTM(UNITS, return_sequences=True, name="uut_lstm")(x)
            y = L.Bidirectional(L.SimpleRNN(UNITS, return_sequences=True, name="uut_simple_rnn"),
                                merge_mode="sum", name="uut_bi")(y)
            outputs = flatten(L.GRU(UNITS, reset_after=False, go_backwards=True, return_state=True,
                                    name="uut_gru")(y))
        return K.Model(inputs if len(inputs) > 1 else inputs[0], outputs, name="masked_stack")

    def feeds(self, mask: np.ndarray, seed: int) -> list:
        return make_feeds(self.source, mask, seed)

    def unmasked_by_keras(self, flavor: str) -> frozenset:
        """Layers Keras itself runs without the mask: Keras 3 before 3.6 or so does not propagate a
        mask passed as ``mask=`` past the layer it was passed to (the conversion follows Keras)."""
        if self.variant == "input-rnn_back-lstm" and not propagates_explicit_mask(flavor):
            return frozenset({"uut_lstm"})
        return frozenset()


_PROPAGATES: dict = {}


def propagates_explicit_mask(flavor: str) -> bool:
    """Whether this Keras gives a recurrent layer's output the mask passed to it as ``mask=``."""
    if flavor not in _PROPAGATES:
        K = parity.keras_module(flavor)
        x, m = K.Input((None, 2)), K.Input((None,), dtype="bool")
        y = K.layers.SimpleRNN(1, return_sequences=True)(x, mask=m)
        _PROPAGATES[flavor] = getattr(y, "_keras_mask", None) is not None
    return _PROPAGATES[flavor]


STACKS = (StackCase("emb-bigru-lstm"), StackCase("input-rnn_back-lstm"), StackCase("masking-lstm-birnn-gru_back"))


# -- building, converting, checking -----------------------------------------------------------

def seed_of(flavor: str, case) -> int:
    return zlib.crc32(f"masking/{flavor}/{case.id}".encode())


def build(flavor: str, case):
    model = case.build(flavor)
    parity.randomize_weights(model, seed_of(flavor, case))
    return model


def converted(flavor: str, case) -> parity.Converted:
    return parity.converted_with(flavor, case, build)


_POST_PADDED: dict = {}


def converted_post_padded(flavor: str, case):
    """The same Keras model as :func:`converted`, converted with ``assume_post_padded=True``."""
    key = (flavor, case)
    if key not in _POST_PADDED:
        from tf2onnx_rnn import convert_keras

        model = converted(flavor, case).model
        try:
            _POST_PADDED[key] = (convert_keras(model, assume_post_padded=True), None)
        except Exception as error:  # noqa: BLE001 - reported by every test of the case
            _POST_PADDED[key] = (None, error)
    proto, error = _POST_PADDED[key]
    if error is not None:
        raise AssertionError(f"converting {flavor} {case.id} with assume_post_padded=True failed: "
                             f"{type(error).__name__}: {error}") from error
    return proto




def describe(node) -> str:
    return f"{node.op_type}({helpers.direction_of(node)}) {node.name}"


def structure_problems(proto, case, unmasked: frozenset = frozenset()) -> list:
    """Native nodes as expected (one per Keras layer), no Loop/Scan, computed sequence_lens (none
    for the nodes of ``unmasked`` layers, which Keras runs without the mask)."""
    problems = []
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    if loops:
        problems.append(f"Loop/Scan nodes left: {[(n.op_type, n.name) for n in loops]}")
    recurrent = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    unmatched = list(recurrent)
    for op, directions, attrs in case.expected_nodes():
        match = next((n for n in unmatched if n.op_type == op and helpers.direction_of(n) in directions
                      and all(helpers.attribute(n, k) == v for k, v in attrs.items())), None)
        if match is None:
            problems.append(f"no native {op} node with direction in {directions} and {attrs}")
        else:
            unmatched.remove(match)
    if unmatched:
        problems.append(f"unexpected native nodes: {[describe(n) for n in unmatched]}")
    if len(recurrent) != len(case.expected_nodes()) or unmatched:
        problems.append(f"native nodes: {[describe(n) for n in recurrent]}, expected "
                        f"{[(op, d) for op, d, _ in case.expected_nodes()]}")
    for node in recurrent:
        if not any(node.name.startswith(layer) for layer in unmasked):
            problems += sequence_lens_problems(proto, node)
        elif len(node.input) > 4 and node.input[4]:
            problems.append(f"{describe(node)} has a sequence_lens input, but Keras runs the layer unmasked")
    return problems


def sequence_lens_problems(proto, node) -> list:
    """``sequence_lens`` (input 4) is set, computed by graph nodes from a model input."""
    if len(node.input) <= 4 or not node.input[4]:
        return [f"{describe(node)} has no sequence_lens input: {list(node.input)}"]
    name = node.input[4]
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    graph_inputs = {i.name for i in graph.input} - initializers
    producers = {out: n for n in graph.node for out in n.output}
    if name in initializers:
        return [f"{describe(node)}'s sequence_lens {name!r} is an initializer"]
    producer = producers.get(name)
    if producer is None:
        return [f"{describe(node)}'s sequence_lens {name!r} is not computed by a node"]
    if producer.op_type == "Constant":
        return [f"{describe(node)}'s sequence_lens {name!r} is a Constant"]
    seen, pending, reached = set(), [name], set()
    while pending:
        tensor = pending.pop()
        if tensor in seen or not tensor:
            continue
        seen.add(tensor)
        if tensor in graph_inputs:
            reached.add(tensor)
        elif tensor in producers:
            pending.extend(producers[tensor].input)
    if not reached:
        return [f"{describe(node)}'s sequence_lens {name!r} does not depend on any model input"]
    return []


def report_problems(proto, case, post_padded_assumed: bool = False, unmasked: frozenset = frozenset()) -> list:
    """One fused report entry per expected loop, each with its mask source named (no mask for
    ``unmasked`` layers)."""
    from tf2onnx_rnn import report_of

    report = report_of(proto)
    if report is None:
        return ["no conversion report in the model's metadata"]
    problems = []
    outcomes = list(report.outcomes)
    if len(outcomes) != len(case.expected_loops()):
        problems.append(f"{len(outcomes)} report entries, expected {len(case.expected_loops())}")
    recurrent_names = {n.name: n for n in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)}
    for layer, kind, direction in case.expected_loops():
        match = next((o for o in outcomes if layer in o.layer and o.kind == kind and o.direction == direction), None)
        if match is None:
            problems.append(f"no report entry for {layer} ({kind}, {direction})")
            continue
        outcomes.remove(match)
        if not match.fused:
            problems.append(f"{match.layer} stayed a Loop: {match.reason} (at {match.where})")
            continue
        if match.became != ONNX_OP[kind]:
            problems.append(f"{match.layer} became {match.became}, expected {ONNX_OP[kind]}")
        if match.node not in recurrent_names:
            problems.append(f"{match.layer}'s report names node {match.node!r}, not a native node of the graph")
        if match.layer in unmasked:
            if match.mask:
                problems.append(f"{match.layer}'s report names a mask {match.mask!r} Keras does not apply")
            continue
        if not match.mask:
            problems.append(f"{match.layer}'s report entry has no mask field")
        elif SOURCE_IN_REPORT[case.source] not in match.mask:
            problems.append(f"{match.layer}'s mask field {match.mask!r} does not name "
                            f"{SOURCE_IN_REPORT[case.source]!r}")
        if post_padded_assumed and "post-padded" not in match.mask.lower():
            problems.append(f"{match.layer}'s mask field {match.mask!r} does not say post-padding is assumed")
    return problems


def parity_problems(proto, model, case, seed: int, masks) -> list:
    """onnxruntime against ``model(inputs, training=False)`` on every output, per round."""
    problems = []
    graph_inputs = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    if sorted(graph_inputs) != sorted(case.input_names):
        return problems + [f"ONNX inputs {graph_inputs}, expected {case.input_names}"]
    if len(proto.graph.output) != case.output_count:
        problems.append(f"ONNX has {len(proto.graph.output)} outputs, expected {case.output_count}")
    try:
        session = helpers.ort_session(proto)
    except Exception as error:  # noqa: BLE001
        return problems + [f"onnxruntime cannot load the model: {type(error).__name__}: {error}"]
    for index, (label, mask) in enumerate(masks):
        arrays = case.feeds(mask, seed + 1 + index)
        expected = parity.keras_outputs(model, arrays)
        if len(expected) != case.output_count:
            problems.append(f"{label}: Keras gives {len(expected)} outputs, expected {case.output_count}")
        try:
            actual = parity.run_onnx(session, case.input_names, arrays)
        except Exception as error:  # noqa: BLE001
            problems.append(f"{label}: onnxruntime failed: {type(error).__name__}: {str(error)[:300]}")
            continue
        problems += parity.output_problems(label, [o.name for o in proto.graph.output], expected, actual,
                                           parity.TOLERANCE)[0]
    return problems


def fail_with(problems: list, proto, flavor: str, case) -> None:
    if problems:
        pytest.fail(f"{flavor} {case.id}:\n- " + "\n- ".join(problems) + "\n" + parity.report_table(proto),
                    pytrace=False)


# -- 1. the design itself -----------------------------------------------------------------------

def test_design_covers_every_required_pair():
    """Every required pair of factor values is in some case; every case is valid, with a unique id."""
    covered = set().union(*(row_pairs({name: getattr(case, name) for name in FACTORS}) for case in CASES))
    assert required_pairs() <= covered
    assert len({case.id for case in CASES}) == len(CASES), "duplicate cases"
    assert all(valid({name: getattr(case, name) for name in FACTORS}) for case in CASES)


def test_design_meets_the_brief():
    """Each kind meets each direction and each mask source; merge modes concat, sum and None;
    initial states with return_state one-directional and Bidirectional; return_sequences both ways."""
    for variant, direction, source in itertools.product(VARIANTS, FACTORS["direction"], FACTORS["source"]):
        assert any(c.variant == variant and c.direction == direction for c in CASES), (variant, direction)
        assert any(c.variant == variant and c.source == source for c in CASES), (variant, source)
    assert {"concat", "sum", "none"} <= {c.merge_mode for c in CASES}
    for bidirectional in (False, True):
        assert any(c.initial_state and c.return_state and c.bidirectional == bidirectional for c in CASES)
    for value in (False, True):
        assert any(c.return_sequences == value for c in CASES)


def test_rounds_mix_every_row_kind():
    """Each padded length has full, post-padded, pre-padded, holed and empty rows; the rounds for
    assume_post_padded have post-padded rows only."""
    for (_, mask), time in zip(rounds()[:2], TIMES):
        assert mask.shape == (len(ROW_KINDS), time)
        kept = [np.flatnonzero(row) for row in mask]
        assert any(len(k) == time for k in kept), "no full row"
        assert any(0 < len(k) < time and k[0] == 0 and k[-1] == len(k) - 1 for k in kept), "no post-padded row"
        assert any(0 < len(k) < time and k[-1] == time - 1 and k[0] == time - len(k) for k in kept), "no pre-padded"
        assert any(len(k) and k[0] == 0 and k[-1] == time - 1 and len(k) < time for k in kept), "no holed row"
        assert any(len(k) == 0 for k in kept), "no empty row"
    for _, mask in post_padded_rounds():
        for row in mask:
            kept = np.flatnonzero(row)
            assert len(kept) and np.array_equal(kept, np.arange(len(kept))), "not post-padded"


def test_feeds_follow_the_mask_convention():
    mask = rounds()[0][1]
    x, = make_feeds("masking", mask, 0)
    assert np.all((np.abs(x).sum(-1) != 0) == mask), "Masking: padded steps must be all-zero vectors"
    ids, = make_feeds("embedding", mask, 0)
    assert np.all((ids != 0) == mask) and ids.max() < VOCAB and ids.dtype == np.int32
    x, m = make_feeds("input", mask, 0)
    assert m.dtype == bool and np.all(m == mask) and np.all(x != 0)


# -- 1. single masked layers ------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in CASES])
def test_masked_layer(flavor: str, case: MaskCase):
    entry = converted(flavor, case)
    proto = entry.proto
    problems = structure_problems(proto, case) + report_problems(proto, case)
    problems += parity_problems(proto, entry.model, case, seed_of(flavor, case), rounds())
    fail_with(problems, proto, flavor, case)


# -- 2. masked stacks -------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in STACKS])
def test_masked_stack(flavor: str, case: StackCase):
    entry = converted(flavor, case)
    proto = entry.proto
    unmasked = case.unmasked_by_keras(flavor)
    problems = structure_problems(proto, case, unmasked) + report_problems(proto, case, unmasked=unmasked)
    problems += parity_problems(proto, entry.model, case, seed_of(flavor, case), rounds())
    fail_with(problems, proto, flavor, case)


@pytest.mark.parametrize("case", [
    MaskCase("LSTM", "forward", "masking", return_sequences=True, return_state=True, initial_state=True,
             keras3_implicit=True),
    MaskCase("GRU_reset_after", "bidirectional", "embedding", return_sequences=True, initial_state=True,
             merge_mode="concat", keras3_implicit=True),
], ids=lambda case: case.id)
@parity.only_keras3
def test_keras3_implicit_mask_with_initial_state_is_ignored_like_keras(case: MaskCase):
    """Keras 3 ignores the implicit mask when initial_state is passed: the conversion must
    follow Keras (the layer is fused without a mask) and match it on padded rows."""
    from tf2onnx_rnn import report_of

    flavor = "keras3"
    entry = converted(flavor, case)
    proto = entry.proto
    problems = []
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    if loops:
        problems.append(f"Loop/Scan nodes left: {[(n.op_type, n.name) for n in loops]}")
    recurrent = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    if [n.op_type for n in recurrent] != [ONNX_OP[case.kind]]:
        problems.append(f"native nodes {[describe(n) for n in recurrent]}, expected one {ONNX_OP[case.kind]}")
    report = report_of(proto)
    if report is None or not report.outcomes or report.loops:
        problems.append("the layer is not reported as fused")
    elif any(o.mask for o in report.outcomes):
        problems.append(f"the report names a mask Keras 3 does not apply: {[o.mask for o in report.outcomes]}")
    problems += parity_problems(proto, entry.model, case, seed_of(flavor, case), rounds()[:2])
    fail_with(problems, proto, flavor, case)


# -- 3. assume_post_padded=True ---------------------------------------------------------------

POST_PADDED_CASES = (
    MaskCase("LSTM", "forward", "masking", return_sequences=True, return_state=True),
    MaskCase("GRU_reset_after", "bidirectional", "embedding", return_sequences=True, merge_mode="concat"),
    MaskCase("SimpleRNN", "backward", "input", return_sequences=True, return_state=True, initial_state=True),
    MaskCase("GRU_reset_before", "backward", "masking"),
    StackCase("emb-bigru-lstm"),
)


@pytest.mark.parametrize("flavor, case",
                         [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in POST_PADDED_CASES])
def test_assume_post_padded(flavor: str, case):
    entry = converted(flavor, case)
    proto = converted_post_padded(flavor, case)
    problems = structure_problems(proto, case) + report_problems(proto, case, post_padded_assumed=True)
    # every node, If branches included: the default form keeps its compaction in branches
    default_size, lean_size = len(list(helpers.all_nodes(entry.proto))), len(list(helpers.all_nodes(proto)))
    if not lean_size < default_size:
        problems.append(f"assume_post_padded=True gives {lean_size} nodes, the default {default_size}: "
                        "expected fewer")
    problems += parity_problems(proto, entry.model, case, seed_of(flavor, case) + 100, post_padded_rounds())
    fail_with(problems, proto, flavor, case)


@pytest.mark.parametrize("flavor, case",
                         [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in POST_PADDED_CASES[:3]])
def test_assume_post_padded_empty_row(flavor: str, case):
    """A row with no kept step is post-padded too (its kept steps, none, come first)."""
    entry = converted(flavor, case)
    proto = converted_post_padded(flavor, case)
    masks = [(f"T={t} post-padded lengths [{t}, 0, 2]", np.stack([np.arange(t) < n for n in (t, 0, 2)]))
             for t in TIMES]
    fail_with(parity_problems(proto, entry.model, case, seed_of(flavor, case) + 200, masks), proto, flavor, case)
