"""``unroll=True`` layers: the chain of cell steps Keras writes into the graph becomes the one native
node a rolled layer gets, exact.

One model per Keras flavor, cell kind and length holds its forms side by side on one input (so one
conversion serves them all). The four kinds at 5 steps and LSTM and GRU at 2 hold every form:
return_sequences or the last output, go_backwards, Bidirectional, a Masking layer (a batch of full,
post-padded, pre-padded, holed and empty rows), return_state with initial states given as model inputs,
and the generic ``RNN(cell, unroll=True)``. The hard_sigmoid models hold the forms that activation
changes (``ACTIVATION_FORMS``: the last output, a sequence, the product of both halves' last steps, a
masked sequence, a masked Bidirectional's last outputs, given states), and the other mask forms
convert the masked forms alone (``MASKED_FORMS``: the unmasked layers are the same in every mask
form). Every weight is random, biases included. For each model:
- onnxruntime gives ``model(x, training=False)`` within 1e-5, every output;
- every pass of every layer has a report row that names its native node and says it was
  unrolled over the model's steps, and the graph keeps no MatMul (no step of any cell is left)
  and no Loop;
- a Bidirectional layer, masked or not, is one bidirectional node, as when it is rolled (Keras
  zeroes a masked unrolled Bidirectional's outputs after stacking them, with the mask in time order
  for the backward half too: its carried outputs must come back in time exactly);
- sequences of two steps (whose first step is the one the others are compared with) and a fixed
  batch of one fuse too, and so do Keras 3's ``hard_sigmoid`` (``relu6(x + 3) / 6``, whose ``+ 3``
  TensorFlow folds into the step's sum, into the last step's differently, and whose ``/ 6`` is the
  step's last product) and tf_keras's;
- the post-padded and portable forms of every masked layer are exact too.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import helpers
import parity
from cells import STANDARD, cell_layer
from cells import UNITS as CELL_UNITS

FEATURES, UNITS = 3, 4
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Variant:
    """A cell kind as a Keras layer: the layer class, its options, and its cell class."""

    kind: str  # LSTM, GRU, SimpleRNN
    options: tuple = ()  # (name, value) pairs

    @property
    def id(self) -> str:
        return self.kind + "".join(f"-{k}={v}" for k, v in self.options)

    @property
    def scope(self) -> str:
        return helpers.SCOPE_NAME[self.kind]

    def layer(self, K, name: str, **kwargs):
        return getattr(K.layers, self.kind)(UNITS, unroll=True, name=f"{self.scope}_{name}", **dict(self.options),
                                            **kwargs)

    def generic(self, K, name: str, **kwargs):
        """``RNN(<kind>Cell(...), unroll=True)``."""
        cell = getattr(K.layers, f"{self.kind}Cell")(UNITS, **dict(self.options))
        return K.layers.RNN(cell, unroll=True, name=f"{self.scope}_{name}", **kwargs)


VARIANTS = (Variant("LSTM"), Variant("GRU"), Variant("GRU", (("reset_after", False),)), Variant("SimpleRNN"))


FORMS = ("seq", "last_backward", "seq_backward", "bi", "bi_mul", "masked_seq", "masked_last_backward",
         "masked_seq_backward", "masked_bi", "masked_bi_last", "states", "generic")
# what hard_sigmoid changes (its "+ 3" folded into the step's sum, into the last step's otherwise; its "/ 6" the
# step's last product): the last output, a sequence, the product of both halves' last steps, a masked sequence,
# a masked Bidirectional's last outputs and given states
ACTIVATION_FORMS = ("seq", "last_backward", "bi_mul", "masked_seq_backward", "masked_bi_last", "states")
# what a mask form changes: the masked layers only (the unmasked ones are the same in every form)
MASKED_FORMS = ("masked_seq", "masked_last_backward", "masked_seq_backward", "masked_bi", "masked_bi_last", "states",
                "generic")
BIDIRECTIONAL = {"bi": 2, "bi_mul": 2, "masked_bi": 2, "masked_bi_last": 2}  # passes per form: the others one


def branches(K, variant: Variant, x, masked, initial, forms=FORMS) -> list:
    """The variant's layer in each of ``forms`` on ``x`` (or the masked ``x``): their outputs."""
    L, scope = K.layers, variant.scope
    make = {
        "seq": lambda: variant.layer(K, "seq", return_sequences=True)(x),
        "last_backward": lambda: variant.layer(K, "last_backward", go_backwards=True)(x),
        "seq_backward": lambda: variant.layer(K, "seq_backward", return_sequences=True, go_backwards=True)(x),
        "bi": lambda: L.Bidirectional(variant.layer(K, "bidi", return_sequences=True), name=f"{scope}_bi")(x),
        # the last outputs multiplied: the product of both halves' last steps is no step of either (each half
        # reads the other's steps, so a last step folded by TensorFlow must be read apart from the product)
        "bi_mul": lambda: L.Bidirectional(variant.layer(K, "bidi_mul"), merge_mode="mul", name=f"{scope}_bi_mul")(x),
        "masked_seq": lambda: variant.layer(K, "masked_seq", return_sequences=True)(masked),
        "masked_last_backward": lambda: variant.layer(K, "masked_last_backward", go_backwards=True)(masked),
        "masked_seq_backward": lambda: variant.layer(K, "masked_seq_backward", return_sequences=True,
                                                     go_backwards=True)(masked),
        "masked_bi": lambda: L.Bidirectional(variant.layer(K, "masked_bidi", return_sequences=True),
                                             name=f"{scope}_masked_bi")(masked),
        "masked_bi_last": lambda: L.Bidirectional(variant.layer(K, "masked_bidi_last"),
                                                  name=f"{scope}_masked_bi_last")(masked),
        "states": lambda: variant.layer(K, "states", return_sequences=True, return_state=True)(
            masked, initial_state=initial),
        "generic": lambda: variant.generic(K, "generic", return_sequences=True)(masked),
    }
    outputs = []
    for form in forms:
        result = make[form]()
        outputs.extend(result if isinstance(result, (list, tuple)) else [result])
    return outputs


def passes_in(forms) -> int:
    """Native passes of the layers in ``forms``: two per Bidirectional."""
    return sum(BIDIRECTIONAL.get(form, 1) for form in forms)


@dataclass(frozen=True)
class Case:
    variant: Variant
    time: int
    forms: tuple = FORMS

    @property
    def id(self) -> str:
        return f"{self.variant.id}-T{self.time}" + ("-masked" if self.forms == MASKED_FORMS else "")


def build(flavor: str, case: Case):
    K = parity.keras_module(flavor)
    x = K.Input((case.time, FEATURES), name="x")
    states = helpers.STATE_NAMES[case.variant.kind]
    initial = [K.Input((UNITS,), name=f"init_{s}") for s in states]
    masked = K.layers.Masking(0.0, name="masking")(x)
    outputs = branches(K, case.variant, x, masked, initial, case.forms)
    model = K.Model([x] + initial, outputs, name="unrolled")
    parity.randomize_weights(model, zlib.crc32(f"{flavor}/{case.id}".encode()))
    return model


def batch(case: Case, seed: int) -> list:
    """Rows: full, post-padded, pre-padded, holed, empty, full (the padding rows are zeros, which
    the Masking layer masks)."""
    rng = np.random.default_rng(seed)
    time = case.time
    x = rng.standard_normal((6, time, FEATURES)).astype(np.float32)
    x[1, time - 1:] = 0  # post-padded
    x[2, :1] = 0  # pre-padded
    x[3, time // 2] = 0  # a hole (for two steps: the second one)
    x[4] = 0  # empty
    states = [rng.standard_normal((6, UNITS)).astype(np.float32) for _ in helpers.STATE_NAMES[case.variant.kind]]
    return [x] + states


HARD_SIGMOID = (Variant("SimpleRNN", (("activation", "hard_sigmoid"),)),
                Variant("LSTM", (("recurrent_activation", "hard_sigmoid"),)),
                Variant("LSTM", (("activation", "hard_sigmoid"),)),
                Variant("GRU", (("recurrent_activation", "hard_sigmoid"), ("activation", "hard_sigmoid"))))
CASES = ([Case(variant, 5) for variant in VARIANTS] + [Case(Variant("LSTM"), 2), Case(Variant("GRU"), 2)]
         + [Case(variant, time, ACTIVATION_FORMS) for variant in HARD_SIGMOID for time in (2, 3, 5)])
PARAMS = [pytest.param(flavor, case, id=f"{case.id}-{flavor}") for case in CASES for flavor in parity.FLAVORS]


def converted(flavor: str, case: Case):
    return parity.converted_with(flavor, case, build)


@pytest.mark.parametrize("flavor, case", PARAMS)
def test_onnx_matches_keras(flavor, case):
    entry = converted(flavor, case)
    arrays = batch(case, 7)
    names = ["x"] + [f"init_{s}" for s in helpers.STATE_NAMES[case.variant.kind]]
    expected = parity.keras_outputs(entry.model, arrays)
    actual = parity.run_onnx(helpers.ort_session(entry.proto), names, arrays)
    problems, error = parity.output_problems(case.id, [o.name for o in entry.proto.graph.output], expected, actual,
                                             TOLERANCE)
    assert not problems, "\n".join(problems) + "\n" + parity.report_table(entry.proto)


@pytest.mark.parametrize("flavor, case", PARAMS)
def test_every_pass_is_one_native_node_and_no_step_is_left(flavor, case):
    from tf2onnx_rnn import report_of

    entry = converted(flavor, case)
    rows = report_of(entry.proto).outcomes
    table = parity.report_table(entry.proto)
    assert len(rows) == passes_in(case.forms), table
    op = helpers.ONNX_OP[case.variant.kind]
    nodes = {n.name: n for n in helpers.all_nodes(entry.proto)}
    for row in rows:
        assert row.became == op and row.unrolled == case.time, table
        assert row.node in nodes and nodes[row.node].op_type == op, table
    ops = helpers.op_counts(entry.proto)
    assert not ops["MatMul"] and not any(ops[o] for o in helpers.LOOP_OPS), f"{dict(ops)}\n{table}"
    assert f"unrolled, {case.time} steps" in table
    by_layer: dict = {}
    for row in rows:
        by_layer.setdefault(row.layer, []).append(row)
    bidirectional = [layer for layer in by_layer if layer.endswith(("_bi", "_bi_last"))]
    assert len(bidirectional) == len({"bi", "masked_bi", "masked_bi_last"} & set(case.forms)), table
    for layer in bidirectional:  # one bidirectional node, as the rolled layer
        pair = by_layer[layer]
        assert len(pair) == 2 and pair[0].node == pair[1].node, table
        assert {r.node_direction for r in pair} == {"bidirectional"}, table


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_fixed_batch_of_one(flavor):
    """A batch-1 signature (as embedded exports use) fuses and matches too."""
    import tensorflow as tf

    from tf2onnx_rnn import convert_keras, report_of

    case = Case(Variant("LSTM"), 5)
    model = build(flavor, case)
    signature = [tf.TensorSpec((1, case.time, FEATURES), tf.float32, name="x")] + [
        tf.TensorSpec((1, UNITS), tf.float32, name=f"init_{s}") for s in helpers.STATE_NAMES["LSTM"]]
    proto = convert_keras(model, input_signature=signature)
    rows = report_of(proto).outcomes
    assert rows and all(r.became == "LSTM" for r in rows), parity.report_table(proto)
    assert not helpers.op_counts(proto)["MatMul"]
    session = helpers.ort_session(proto)
    names = [i.name for i in session.get_inputs()]
    for row in range(6):
        arrays = [a[row:row + 1] for a in batch(case, 11)]
        expected = parity.keras_outputs(model, arrays)
        actual = parity.run_onnx(session, names, arrays)
        problems, _ = parity.output_problems(f"row {row}", [o.name for o in proto.graph.output], expected, actual,
                                             TOLERANCE)
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("given_states", [False, True], ids=["zero-states", "given-states"])
@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("cell", STANDARD, ids=[c.name for c in STANDARD])
def test_a_hand_written_cell_whose_steps_tensorflow_folded_at_a_fixed_batch(cell, flavor, batch_size, given_states):
    """A hand-written standard cell (``tanh(x W + h U + b)``: the bias added last) at a fixed batch, with
    one feature and a Dense after it (the fuzz's find): TensorFlow folds ``x W + h U`` into one Gemm, the
    bias added after it, which belongs to the pre-activation, not to the activation (a constant per
    unit); and, given its initial states, folds the first step's ``h0 U + b`` into one Gemm instead, so
    that step is no copy of the others and is checked on its values from the states it reads (not from
    zeros). Either way the layer becomes its native node, exact, at batch 1 and 3."""
    import tensorflow as tf

    from tf2onnx_rnn import convert_keras, report_of

    K = parity.keras_module(flavor)
    time, features, count = 6, 1, cell.states if given_states else 0
    x = K.Input((time, features), name="x")
    states = [K.Input((CELL_UNITS,), name=f"init_{i}") for i in range(count)]
    layer = K.layers.RNN(cell_layer(K, cell, CELL_UNITS), unroll=True, return_sequences=True, name=cell.layer_name)
    sequence = layer(x, initial_state=states) if states else layer(x)
    model = K.Model([x] + states if states else x, K.layers.Dense(2, name="dense")(sequence))
    parity.randomize_weights(model, zlib.crc32(f"{flavor}/{cell.name}/{batch_size}/{count}".encode()))
    signature = [tf.TensorSpec((batch_size, time, features), tf.float32, name="x")] + [
        tf.TensorSpec((batch_size, CELL_UNITS), tf.float32, name=f"init_{i}") for i in range(count)]
    proto = convert_keras(model, input_signature=signature)
    table = parity.report_table(proto)
    assert [(r.became, r.unrolled) for r in report_of(proto).outcomes] == [(cell.standard, time)], table
    ops = helpers.op_counts(proto)
    # one MatMul, the Dense's: no step of the cell is left
    assert (ops["MatMul"], ops["Gemm"]) == (1, 0) and not any(ops[o] for o in helpers.LOOP_OPS), dict(ops)
    rng = np.random.default_rng(batch_size)
    arrays = [rng.standard_normal((batch_size, time, features)).astype(np.float32)] + [
        rng.standard_normal((batch_size, CELL_UNITS)).astype(np.float32) for _ in states]
    expected = parity.keras_outputs(model, arrays)
    actual = parity.run_onnx(helpers.ort_session(proto), ["x"] + [f"init_{i}" for i in range(count)], arrays)
    problems, _ = parity.output_problems(cell.name, [o.name for o in proto.graph.output], expected, actual, TOLERANCE)
    assert not problems, "\n".join(problems) + "\n" + table


@pytest.mark.parametrize("broken", ["finding", "setup"])
def test_a_rewriter_that_cannot_look_for_unrolled_layers_still_reports_them(monkeypatch, broken):
    """A fault while looking for unrolled layers (or while setting up the rewriter) leaves them as
    their exact ops, and the report still lists them, with the fault, never "nothing to fuse"."""
    from tf2onnx_rnn import convert_keras, report_of
    from tf2onnx_rnn.rewriters import pipeline

    def fail(*args, **kwargs):
        raise RuntimeError("injected")

    if broken == "finding":
        monkeypatch.setattr(pipeline, "find_chains", fail)
    else:
        monkeypatch.setattr(pipeline.RecurrentRewriter, "__init__", fail)
    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((4, FEATURES), name="x")
    model = K.Model(x, K.layers.LSTM(UNITS, unroll=True, name="lstm")(x))
    parity.randomize_weights(model, 5)
    proto = convert_keras(model)
    report = report_of(proto)
    assert [row.became for row in report.outcomes] == ["unrolled ops"], report.table()
    stage = "finding unrolled layers" if broken == "finding" else "setting up the rewriter"
    assert report.outcomes[0].reason.startswith(f"internal error while {stage}"), report.table()
    assert "nothing to fuse" not in report.summary()
    arrays = batch(Case(Variant("LSTM"), 4), 3)[:1]
    (actual,) = helpers.ort_session(proto).run(None, {"x": arrays[0]})
    np.testing.assert_allclose(actual, parity.keras_outputs(model, arrays)[0], rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_an_unrolled_stack_of_cells_stays_as_its_ops_with_the_reason(flavor):
    """RNN(StackedRNNCells([...]), unroll=True) is not fused (unroll=False is): its steps stay as they
    are, exact, and the report says so."""
    from tf2onnx_rnn import convert_keras, report_of

    K = parity.keras_module(flavor)
    x = K.Input((4, FEATURES), name="x")
    cells = K.layers.StackedRNNCells([K.layers.LSTMCell(UNITS), K.layers.GRUCell(3)])
    model = K.Model(x, K.layers.RNN(cells, unroll=True, return_sequences=True, name="stack")(x))
    parity.randomize_weights(model, 9)
    proto = convert_keras(model)
    rows = report_of(proto).outcomes
    assert [row.became for row in rows] == ["unrolled ops"], parity.report_table(proto)
    assert "StackedRNNCells" in rows[0].reason and not helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    arrays = batch(Case(Variant("LSTM"), 4), 3)[:1]
    (actual,) = helpers.ort_session(proto).run(None, {"x": arrays[0]})
    np.testing.assert_allclose(actual, parity.keras_outputs(model, arrays)[0], rtol=0, atol=TOLERANCE)


MASK_FORMS = {"post-padded": dict(assume_post_padded=True), "portable": dict(target="portable")}


@functools.lru_cache(maxsize=None)
def _built(flavor: str, case: Case):
    """The case's model, built once per process (each mask form converts it)."""
    return build(flavor, case)


@pytest.mark.parametrize("form", MASK_FORMS)
@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_other_mask_forms_of_unrolled_layers(variant, flavor, form):
    """The leaner post-padded graph (fed rows whose kept steps come first: full, post-padded, empty)
    and the portable one (any rows) are exact for every masked unrolled form, Bidirectional included."""
    from tf2onnx_rnn import convert_keras, report_of

    case = Case(variant, 5, MASKED_FORMS)
    model = _built(flavor, case)
    proto = convert_keras(model, **MASK_FORMS[form])
    arrays = batch(case, 13)
    if form == "post-padded":
        arrays = [a[[0, 1, 4, 5]] for a in arrays]
    names = ["x"] + [f"init_{s}" for s in helpers.STATE_NAMES[variant.kind]]
    expected = parity.keras_outputs(model, arrays)
    actual = parity.run_onnx(helpers.ort_session(proto), names, arrays)
    problems, _ = parity.output_problems(f"{case.id}-{form}", [o.name for o in proto.graph.output], expected, actual,
                                         TOLERANCE)
    assert not problems, "\n".join(problems) + "\n" + parity.report_table(proto)
    rows = report_of(proto).outcomes
    assert len(rows) == passes_in(case.forms) and all(r.unrolled == case.time for r in rows), \
        parity.report_table(proto)
    assert not any(helpers.op_counts(proto)[o] for o in helpers.LOOP_OPS)
