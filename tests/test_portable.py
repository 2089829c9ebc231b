"""The portable target (``target="portable"``, CLI ``--target portable``): masked layers with no
computed ``sequence_lens``, for runtimes that take it only as a constant (tract).

Keras is the oracle, as in test_parity_masking.py, whose cases, batches and checks this module
reuses: every kind (LSTM, GRU with either reset_after, SimpleRNN) meets every direction (forward,
go_backwards, Bidirectional) and every mask source (Masking, Embedding(mask_zero=True), a mask
input), with return_sequences, return_state, initial states and merge modes pairwise, on batches
mixing full, post-padded, pre-padded, holed and empty rows at two time lengths and T=1, in Keras 3
and tf_keras, every weight randomized. Per case:

- onnxruntime matches ``model(inputs, training=False)`` within 1e-5 on every output;
- no Loop/Scan anywhere; every native node runs forward, and a masked Bidirectional layer is two
  of them;
- no native node has a ``sequence_lens`` input, except a masked LSTM whose final cell state c is
  used (``return_state``, streaming): its node keeps the computed ``sequence_lens`` (without it the
  node gives c only after the last step) and the report's mask column says so;
- the report names the mask source and the portable form.

Unmasked layers convert as without the target (where no form writes a lone
``direction="reverse"`` node: tract runs those forward).
The target reaches tf2onnx without ``portable``.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import helpers
import parity
import test_parity_masking as masking
import test_streaming as streaming
import tf2onnx_rnn
from downstream_models import consumer_problems
from helpers import ONNX_OP
from test_parity_masking import MaskCase, StackCase
from tf2onnx_rnn import ConversionError, options, report_of
from tf2onnx_rnn import convert as cli

PORTABLE_FORM = "portable: no sequence_lens"
KEPT_FORM = "kept for the portable target: the final cell state c is used"

# the masking module's covering design, and masked LSTMs whose final cell state is used in each direction
CASES = tuple(masking.CASES) + (
    MaskCase("LSTM", "backward", "input", return_sequences=True, return_state=True),
    MaskCase("LSTM", "bidirectional", "masking", return_state=True, merge_mode="concat"),
)
STACKS = masking.STACKS
POST_PADDED_CASES = (
    MaskCase("GRU_reset_after", "bidirectional", "embedding", return_sequences=True, merge_mode="concat"),
    MaskCase("SimpleRNN", "backward", "input", return_sequences=True, return_state=True, initial_state=True),
    MaskCase("LSTM", "backward", "masking", return_sequences=True),
)


# -- conversions (once per process, like parity.converted) ------------------------------------

_MODELS: dict = {}
_CONVERTED: dict = {}


def keras_model(flavor: str, case):
    """The case's Keras model as test_parity_masking builds it (same weights), built once."""
    key = (flavor, case)
    if key not in _MODELS:
        _MODELS[key] = masking.build(flavor, case)
    return _MODELS[key]


def converted(flavor: str, case, **options) -> parity.Converted:
    """The case's model converted with ``target="portable"`` (and ``options``), once per process;
    a conversion error is re-raised in every test of the case."""
    key = (flavor, case, tuple(sorted(options.items())))
    if key not in _CONVERTED:
        entry = parity.Converted(flavor, case)
        try:
            entry.model = keras_model(flavor, case)
            entry.proto = tf2onnx_rnn.convert_keras(entry.model, target="portable", **options)
        except Exception as error:  # noqa: BLE001 - reported by every test of the case
            entry.error = error
        _CONVERTED[key] = entry
    return _CONVERTED[key].get()


# -- what each case must become ---------------------------------------------------------------

def cell_state_used(case) -> frozenset:
    """The case's layers whose final cell state c the model uses: they keep sequence_lens."""
    if isinstance(case, MaskCase):
        return frozenset({case.layer_name}) if case.kind == "LSTM" and case.return_state else frozenset()
    return frozenset({"uut_lstm"}) if case.variant == "input-rnn_back-lstm" else frozenset()


def expected_nodes(case, flavor: str) -> list:
    """(op, accepted directions, attributes, has sequence_lens) of every native node."""
    if isinstance(case, StackCase):
        unmasked = case.unmasked_by_keras(flavor)
        return [(op, ("forward",), attrs, False) for op, attrs in {
            "emb-bigru-lstm": [("GRU", {"linear_before_reset": 1})] * 2 + [("LSTM", {})],
            "masking-lstm-birnn-gru_back": [("LSTM", {}), ("RNN", {}), ("RNN", {}),
                                            ("GRU", {"linear_before_reset": 0})],
            "input-rnn_back-lstm": [("RNN", {})],
        }[case.variant]] + ([("LSTM", ("forward",), {}, "uut_lstm" not in unmasked)]
                            if case.variant == "input-rnn_back-lstm" else [])
    (op, _, attrs), = case.expected_nodes()
    # a layer whose c is used keeps its sequence_lens; its nodes run forward all the same
    return [(op, ("forward",), attrs, bool(cell_state_used(case)))] * (2 if case.bidirectional else 1)


def describe(node) -> str:
    return f"{node.op_type}({helpers.direction_of(node)}) {node.name}"


def has_sequence_lens(node) -> bool:
    return len(node.input) > 4 and bool(node.input[4])


def structure_problems(proto, case, flavor: str) -> list:
    problems = consumer_problems(proto)
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    if loops:
        problems.append(f"Loop/Scan nodes left: {[(n.op_type, n.name) for n in loops]}")
    recurrent = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    unmatched = list(recurrent)
    expected = expected_nodes(case, flavor)
    for op, directions, attrs, lengths in expected:
        match = next((n for n in unmatched if n.op_type == op and helpers.direction_of(n) in directions
                      and has_sequence_lens(n) == lengths
                      and all(helpers.attribute(n, k) == v for k, v in attrs.items())), None)
        if match is None:
            problems.append(f"no native {op} node with direction in {directions}, {attrs} and "
                            f"{'a' if lengths else 'no'} sequence_lens")
            continue
        unmatched.remove(match)
        if lengths:
            problems += masking.sequence_lens_problems(proto, match)
    if unmatched:
        problems.append(f"unexpected native nodes: {[describe(n) for n in unmatched]} (all: "
                        f"{[describe(n) for n in recurrent]})")
    return problems


def report_form_problems(proto, case, flavor: str) -> list:
    """Every masked row names its form: portable, or sequence_lens kept with the reason."""
    unmasked = case.unmasked_by_keras(flavor) if isinstance(case, StackCase) else frozenset()
    kept = cell_state_used(case)
    problems = []
    for outcome in report_of(proto).outcomes:
        if any(outcome.layer.startswith(layer) for layer in unmasked):
            continue
        # a Bidirectional's rows are named after the wrapper: its layer is the case's own
        layer_kept = any(outcome.layer.startswith(layer) for layer in kept) or (
            isinstance(case, MaskCase) and case.bidirectional and bool(kept))
        want = KEPT_FORM if layer_kept else PORTABLE_FORM
        if want not in outcome.mask:
            problems.append(f"{outcome.layer} ({outcome.direction}): mask column {outcome.mask!r} lacks {want!r}")
        if isinstance(case, MaskCase) and case.bidirectional and "two forward nodes" not in outcome.mask:
            problems.append(f"{outcome.layer}: mask column {outcome.mask!r} does not say two forward nodes")
    # the two directions of a portable Bidirectional name their own forward node each
    nodes = {n.name: n for n in helpers.all_nodes(proto)}
    split = [o for o in report_of(proto).outcomes if "two forward nodes" in o.mask]
    for outcome in split:
        node = nodes.get(outcome.node)
        if node is None or helpers.direction_of(node) != "forward" or outcome.node_direction != "forward":
            problems.append(f"{outcome.layer} ({outcome.direction}): names {outcome.node!r} "
                            f"({outcome.node_direction}), not a forward node of its own")
    if len({o.node for o in split}) != len(split):
        problems.append(f"two directions name one node: {[(o.direction, o.node) for o in split]}")
    return problems


def check(flavor: str, case, masks, seed_offset: int = 0, **options) -> None:
    entry = converted(flavor, case, **options)
    proto = entry.proto
    unmasked = case.unmasked_by_keras(flavor) if isinstance(case, StackCase) else frozenset()
    problems = structure_problems(proto, case, flavor)
    problems += masking.report_problems(proto, case, unmasked=unmasked,
                                        post_padded_assumed=bool(options.get("assume_post_padded")))
    problems += report_form_problems(proto, case, flavor)
    problems += masking.parity_problems(proto, entry.model, case, masking.seed_of(flavor, case) + seed_offset, masks)
    masking.fail_with(problems, proto, flavor, case)


# -- parity -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in CASES])
def test_portable_masked_layer(flavor: str, case: MaskCase):
    check(flavor, case, masking.rounds())


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in STACKS])
def test_portable_masked_stack(flavor: str, case: StackCase):
    check(flavor, case, masking.rounds())


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}")
                                          for f in parity.FLAVORS for c in POST_PADDED_CASES])
def test_portable_with_post_padding_assumed(flavor: str, case: MaskCase):
    """``assume_post_padded`` too: exact on post-padded rows, empty ones included."""
    masks = masking.post_padded_rounds() + [
        (f"T={t} post-padded lengths [{t}, 0, 2]", np.stack([np.arange(t) < n for n in (t, 0, 2)]))
        for t in masking.TIMES]
    check(flavor, case, masks, seed_offset=100, assume_post_padded=True)


def test_the_design_meets_the_brief():
    """LSTM, GRU (both reset_after) and SimpleRNN each run forward, go_backwards and Bidirectional,
    with return_sequences both ways and return_state, masked by a Masking layer and by a mask input;
    and a masked LSTM's final cell state is used in every direction."""
    for variant in masking.VARIANTS:
        mine = [c for c in CASES if c.variant == variant]
        assert {c.direction for c in mine} == {"forward", "backward", "bidirectional"}, variant
        assert {c.source for c in mine} >= {"masking", "input"}, variant
    assert {c.return_sequences for c in CASES} == {False, True}
    assert any(c.return_state and c.kind != "LSTM" for c in CASES)
    assert {c.direction for c in CASES if c.kind == "LSTM" and c.return_state} == \
        {"forward", "backward", "bidirectional"}


# -- unrolled layers --------------------------------------------------------------------------

@pytest.mark.parametrize("flavor, kind, bidirectional", [
    pytest.param(f, k, b, id=f"{f}-{k}-{'bi' if b else 'go_backwards'}")
    for f in parity.FLAVORS for k, b in (("GRU", True), ("SimpleRNN", False))])
def test_portable_unrolled_layer(flavor, kind, bidirectional):
    """``unroll=True`` layers (a fixed time length) take the same portable form."""
    K = parity.keras_module(flavor)
    x = K.Input((6, 3), name="x")
    layer = getattr(K.layers, kind)(4, unroll=True, return_sequences=True, go_backwards=not bidirectional)
    layer = K.layers.Bidirectional(layer) if bidirectional else layer
    model = K.Model(x, layer(K.layers.Masking(0.0)(x)))
    parity.randomize_weights(model, 14)
    proto = tf2onnx_rnn.convert_keras(model, target="portable")
    nodes = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    assert [(n.op_type, helpers.direction_of(n)) for n in nodes] == [(ONNX_OP[kind], "forward")] * (2 if bidirectional
                                                                                                   else 1)
    assert not any(map(has_sequence_lens, nodes)) and not helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    assert all(PORTABLE_FORM in o.mask for o in report_of(proto).outcomes)
    batch = np.random.default_rng(6).standard_normal((5, 6, 3)).astype(np.float32)
    batch *= masking.mask_batch(["full", "post", "pre", "holed", "empty"], 6)[:, :, None]
    (got,) = helpers.ort_session(proto).run(None, {"x": batch})
    np.testing.assert_allclose(got, np.asarray(model(batch, training=False)), rtol=0, atol=1e-5)


# -- streaming --------------------------------------------------------------------------------

@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_portable_streams_chunk_by_chunk(flavor):
    """Streaming with the portable target: the masked GRUs and SimpleRNN stream with no
    sequence_lens, the LSTM (whose c is streamed out) keeps it; chunked equals Keras on the whole."""
    model, _ = streaming.build(flavor, "masked-sequences")
    proto = tf2onnx_rnn.convert_keras(model, streaming=True, target="portable")
    lengths = {n.op_type: has_sequence_lens(n) for n in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)}
    assert lengths == {"LSTM": True, "GRU": False, "RNN": False}
    rows = {o.layer: o.mask for o in report_of(proto).outcomes}
    assert KEPT_FORM in rows["lstm"] and all(PORTABLE_FORM in rows[name] for name in ("gru_after", "gru_before", "rnn"))
    x = streaming.sequence("masked-sequences")
    outputs, _ = streaming.run_chunks(proto, x)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), np.asarray(model(x, training=False)),
                               rtol=0, atol=streaming.TOLERANCE)


# -- unmasked layers, options, the command line -----------------------------------------------

def test_unmasked_layers_are_unchanged_but_reverse_nodes():
    """Unmasked layers convert as by default: a pass that would be a ``direction="reverse"`` node
    (tract runs those forward) runs forward over its input reversed in time, in both forms."""
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 3), name="x")
    y = K.layers.Bidirectional(K.layers.LSTM(4, return_sequences=True))(x)
    y = K.layers.GRU(3, return_sequences=True)(y)
    backward = K.layers.SimpleRNN(2, go_backwards=True, return_sequences=True)(y)  # its steps in step order
    model = K.Model(x, [K.layers.LSTM(2, go_backwards=True, return_state=True)(y)[-1], backward])
    parity.randomize_weights(model, 12)
    default, portable = (tf2onnx_rnn.convert_keras(model, **options) for options in ({}, {"target": "portable"}))

    def nodes(proto):
        return sorted((n.op_type, helpers.direction_of(n))
                      for n in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS))

    expected_nodes = [("GRU", "forward"), ("LSTM", "bidirectional"), ("LSTM", "forward"), ("RNN", "forward")]
    assert nodes(default) == nodes(portable) == expected_nodes
    assert not any(o.mask for o in report_of(portable).outcomes)
    for proto in (default, portable):  # the go_backwards input reversed by a Slice
        assert not consumer_problems(proto), consumer_problems(proto)
    x = np.random.default_rng(4).standard_normal((3, 6, 3)).astype(np.float32)
    expected = [np.asarray(y) for y in model(x, training=False)]
    for proto in (default, portable):
        for got, want in zip(helpers.ort_session(proto).run(None, {"x": x}), expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_portable_is_a_known_target():
    from tf2onnx import constants

    ours = {"portable", "training", "onnxruntime"} | set(options.RUNTIME_TARGETS)
    assert set(options.known_targets()) == set(constants.POSSIBLE_TARGETS) | ours
    assert options.Options.of(target="portable").portable
    assert all(options.Options.of(target=runtime).portable for runtime in options.RUNTIME_TARGETS)
    assert options.Options.of(target=["tensorrt", "portable"]).portable
    assert not options.Options.of(target="tensorrt").portable and not options.Options.of().portable
    with pytest.raises(ConversionError, match="known: .*portable"):
        options.Options.of(target="tract")


def test_tf2onnx_gets_its_own_targets_only(monkeypatch):
    """``portable`` is this package's: tf2onnx is handed the other targets, as given."""
    import tf2onnx.tfonnx

    seen = []
    process_tf_graph = tf2onnx.tfonnx.process_tf_graph

    def spy(*args, **kwargs):
        seen.append(kwargs.get("target"))
        return process_tf_graph(*args, **kwargs)

    monkeypatch.setattr(tf2onnx.tfonnx, "process_tf_graph", spy)
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 3), name="x")
    model = K.Model(x, K.layers.GRU(2)(K.layers.Masking(0.0)(x)))
    proto = tf2onnx_rnn.convert_keras(model, target=["portable", "tensorrt"])
    assert seen == [["tensorrt"]]
    assert not any(has_sequence_lens(n) for n in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS))


def test_command_line_target_portable(tmp_path, capfd):
    """``--target portable`` on the command line: the written model has no sequence_lens, the printed
    report says the form, and it matches Keras on pre-padded and holed rows."""
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 3), name="x")
    y = K.layers.Bidirectional(K.layers.GRU(4, return_sequences=True))(K.layers.Masking(0.0)(x))
    model = K.Model(x, K.layers.LSTM(2)(y))
    parity.randomize_weights(model, 13)
    source, output = tmp_path / "masked.keras", tmp_path / "masked.onnx"
    model.save(str(source))
    assert cli.main(["--keras", str(source), "--output", str(output), "--target", "portable"]) == 0
    out, err = capfd.readouterr()
    assert PORTABLE_FORM in out and not [line for line in err.splitlines() if line.startswith("error:")], err
    proto = onnx.load(str(output))
    nodes = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    assert [n.op_type for n in nodes] == ["GRU", "GRU", "LSTM"] and not any(map(has_sequence_lens, nodes))
    batch = np.random.default_rng(5).standard_normal((4, 7, 3)).astype(np.float32)
    batch *= masking.mask_batch(["pre", "holed", "empty", "full"], 7)[:, :, None]
    (got,) = helpers.ort_session(proto).run(None, {"x": batch})
    np.testing.assert_allclose(got, np.asarray(model(batch, training=False)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_layer_whose_functions_a_portable_runtime_lacks_is_a_scan_of_its_own_step_and_its_row_says_so(flavor):
    """hard_sigmoid gates (OpenVINO's LSTM refuses HardSigmoid; tract computes its default functions
    whatever is written): in the portable form that layer becomes a Scan of its own step, its row says
    Scan (not 'removed'), the plain layer after it stays a native node, and both equal Keras."""
    K = parity.keras_module(flavor)
    x = K.Input((None, 3), name="x")
    y = K.layers.LSTM(4, recurrent_activation="hard_sigmoid", return_sequences=True, name="hard")(x)
    model = K.Model(x, K.layers.GRU(3, name="plain")(y))
    parity.randomize_weights(model, seed=7)
    proto = tf2onnx_rnn.convert_keras(model, target="portable")
    rows = {o.layer: o for o in report_of(proto).outcomes}
    scans = helpers.nodes_of_types(proto, {"Scan"})
    assert rows["hard"].became == "Scan" and rows["hard"].own_step, report_of(proto).table()
    assert [n.name for n in scans] == [rows["hard"].node]
    assert rows["plain"].became == "GRU" and [n.op_type for n in helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
                                              ] == ["GRU"]
    x_ = np.random.default_rng(5).standard_normal((3, 7, 3)).astype(np.float32)
    np.testing.assert_allclose(helpers.ort_session(proto).run(None, {"x": x_})[0],
                               np.asarray(model(x_, training=False)), rtol=0, atol=1e-5)
