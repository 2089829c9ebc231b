"""The mask arithmetic of a masked layer, as written (``rewriters.emit.mask_tensors``): the compaction
scatters each kept step to its rank among its row's kept steps (the restore's own ranks), with no
sort, and the mask read from before Keras's expansion of it to [B, T, 1] (no Unsqueeze undone by a
Squeeze). Exactness for every mask
is the parity tests' (test_parity_masking, test_portable); here a batch of every row kind checks the
graphs asserted on are right too."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import helpers
import parity

FEATURES, UNITS = 3, 4


@pytest.fixture(scope="module")
def masked_model():
    keras = parity.keras_module(parity.FLAVORS[0])
    x = keras.Input((None, FEATURES), name="x")
    model = keras.Model(x, keras.layers.GRU(UNITS, return_sequences=True)(keras.layers.Masking()(x)))
    rng = np.random.default_rng(3)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def _every_row_kind(time: int = 8) -> np.ndarray:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, time, FEATURES)).astype(np.float32)
    x[0, :3] = 0.0  # pre-padded
    x[2, 5:] = 0.0  # post-padded
    x[3, 2:4] = 0.0  # holed
    x[4] = 0.0  # empty (row 1 full)
    return x


def test_the_compaction_scatters_the_kept_ranks(masked_model):
    from tf2onnx_rnn import convert_keras

    proto = convert_keras(masked_model)
    made_by = {output: node for node in helpers.all_nodes(proto) for output in node.output}
    assert not helpers.nodes_of_types(proto, ["TopK"]), helpers.op_types(proto)
    (scatter,) = helpers.nodes_of_types(proto, ["ScatterND"])
    written = made_by[scatter.input[1]]
    assert written.op_type == "Unsqueeze", written
    rows = made_by[written.input[0]]
    assert rows.op_type == "Add" and made_by[rows.input[0]].op_type == "Mul", rows
    position = made_by[made_by[rows.input[0]].input[0]]
    assert position.op_type == "Where", position
    ranks = made_by[position.input[1]]
    assert ranks.op_type == "Sub" and made_by[ranks.input[0]].op_type == "CumSum", ranks
    # the rows' 0 .. B-1 once per graph that gathers rows (the compaction's branch and the restore's:
    # neither runs in the other); the steps 0 .. T-1 and the scatter's canvas once
    ranges = helpers.nodes_of_types(proto, ["Range"])
    assert len(ranges) == 4, helpers.op_types(proto)
    squeezed = [n for n in proto.graph.node if n.op_type == "Squeeze" and made_by.get(n.input[0]) is not None
                and made_by[n.input[0]].op_type == "Unsqueeze"]
    assert not squeezed, [n.name for n in squeezed]
    x = _every_row_kind()
    (got,) = helpers.ort_session(proto).run(None, {"x": x})
    np.testing.assert_allclose(got, np.asarray(masked_model(x, training=False)), rtol=1e-5, atol=1e-6)


def test_the_portable_form_scatters_the_input_and_gathers_the_outputs_once(masked_model):
    """The portable form (no If, no sequence_lens) on Keras's batch-major mask, as laid out: the input's
    steps scattered to their (position, row) once, from the batch-major input (no copy back from
    time-major), and the outputs gathered batch-major from the node's outputs after a zero step, once:
    no Shape, Range or Flatten in the mask's arithmetic, no Transpose of the mask or of the outputs,
    no Where over the outputs. OpenVINO pays per node under dynamic shapes."""
    from tf2onnx_rnn import convert_keras

    proto = convert_keras(masked_model, target="portable")
    made_by = {output: node for node in helpers.all_nodes(proto) for output in node.output}
    (scatter,) = helpers.nodes_of_types(proto, ["ScatterND"])
    assert scatter.input[2] == "x", scatter
    less_one = made_by[scatter.input[1]]  # the kept steps' ranks are their counts through them, less one
    pairs = made_by[less_one.input[0]]
    assert less_one.op_type == "Sub" and pairs.op_type == "Add" and made_by[pairs.input[0]].op_type == "Mul", pairs
    position = made_by[made_by[pairs.input[0]].input[0]]
    assert position.op_type == "Where", position
    assert made_by[position.input[1]].op_type == "CumSum", made_by[position.input[1]]
    last = made_by[proto.graph.output[0].name]
    assert last.op_type == "GatherND", helpers.op_types(proto)
    table = made_by[last.input[0]]  # a zero step before the node's outputs: what a step before any kept one reads
    assert table.op_type == "Pad" and helpers.attribute(table, "mode") in ("constant", b"constant"), table
    pads = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}[table.input[1]]
    assert pads.tolist() == [1, 0, 0, 0, 0, 0], pads
    assert not helpers.nodes_of_types(proto, ["Range", "Flatten", "TopK"]), helpers.op_types(proto)
    assert [n.op_type for n in proto.graph.node].count("Shape") == 1, helpers.op_types(proto)  # the zero states
    transposes = helpers.nodes_of_types(proto, ["Transpose"])
    assert [n.input[0] for n in transposes] == ["x"], helpers.op_types(proto)
    x = _every_row_kind()
    (got,) = helpers.ort_session(proto).run(None, {"x": x})
    np.testing.assert_allclose(got, np.asarray(masked_model(x, training=False)), rtol=1e-5, atol=1e-6)


def test_a_bool_mask_input_is_read_as_it_is():
    """No Cast of a bool to bool on the mask input: OpenVINO folds such a Cast and then names the model's
    input after the Cast's output."""
    from tf2onnx_rnn import convert_keras

    keras = parity.keras_module(parity.FLAVORS[0])
    x, mask = keras.Input((None, FEATURES), name="x"), keras.Input((None,), dtype="bool", name="mask")
    model = keras.Model([x, mask], keras.layers.LSTM(UNITS, return_sequences=True)(x, mask=mask))
    rng = np.random.default_rng(5)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    for target in (None, "portable"):
        proto = convert_keras(model, target=target)
        readers = [n for n in proto.graph.node if "mask" in n.input]
        to_bool = [n for n in readers if n.op_type == "Cast" and helpers.attribute(n, "to") == onnx.TensorProto.BOOL]
        assert readers and not to_bool, [n.op_type for n in readers]
        xv = _every_row_kind()
        kept = np.any(xv != 0.0, axis=-1)
        (got,) = helpers.ort_session(proto).run(None, {"x": xv, "mask": kept})
        np.testing.assert_allclose(got, np.asarray(model([xv, kept], training=False)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("initial_state", [False, True])
def test_a_portable_layers_final_state_reads_the_masks_counts_once(initial_state):
    """A masked layer returning its state in the portable form: a row with no kept step reads zeros from
    the gather, which is where a layer starting at zero keeps it, so no select follows; one given an
    initial state selects it there, on the rows the scatter's own counts find (one ReduceSum of the mask,
    not a second count of its time-major copy). Both on a batch of every row kind. (The mask is a model
    input: Keras 3 passes a Masking layer's mask on to no layer called with an initial state.)"""
    from tf2onnx_rnn import convert_keras

    keras = parity.keras_module(parity.FLAVORS[0])
    x, mask = keras.Input((None, FEATURES), name="x"), keras.Input((None,), dtype="bool", name="mask")
    inputs, call = [x, mask], {"mask": mask}
    if initial_state:
        call["initial_state"] = keras.Input((UNITS,), name="h0")
        inputs.append(call["initial_state"])
    sequence, state = keras.layers.GRU(UNITS, return_sequences=True, return_state=True)(x, **call)
    model = keras.Model(inputs, [sequence, state])
    rng = np.random.default_rng(6)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    proto = convert_keras(model, target="portable")
    ops = helpers.op_types(proto)
    assert ops.count("ReduceSum") == 1 and "ScatterND" in ops, ops
    made_by = {output: node for node in helpers.all_nodes(proto) for output in node.output}
    final = made_by[proto.graph.output[1].name]
    while final.op_type in ("Identity", "Squeeze"):
        final = made_by[final.input[0]]
    assert final.op_type == ("Where" if initial_state else "GatherND"), final
    xv = _every_row_kind()
    feeds = {"x": xv, "mask": np.any(xv != 0.0, axis=-1)}
    if initial_state:
        feeds["h0"] = rng.standard_normal((len(xv), UNITS)).astype(np.float32)
    got = helpers.ort_session(proto).run(None, feeds)
    want = model([feeds[name] for name in ("x", "mask", "h0")[:len(inputs)]], training=False)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6)
