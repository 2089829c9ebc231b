"""Parity of Keras recurrent layers converted with a FIXED input signature.

Users exporting for an embedded runtime or a phone fix the batch (often to 1) and sometimes
the time: ``convert_keras(model, input_signature=[tf.TensorSpec((1, None, F))])``, or a
SavedModel exported from a fixed-signature ``tf.function``. tf2onnx then propagates static
shapes, and its own rewriters reshape the loop bodies before the matchers read them (``Gemm``
fusion with or without a bias, folded ``Squeeze``/``Reshape`` of batch-1 tensors, constant
trip counts). Every layer must still become one native node, exact against Keras.

The matrix: both Keras flavors x four signatures (batch 1 with fixed and with dynamic time, a
fixed batch of 3 with fixed time, a dynamic batch with fixed time) x two models, and the masked
model at batch 1 with one step per call:

- ``plain``: LSTM, GRU and SimpleRNN, each once in one direction and once inside
  ``Bidirectional``, side by side on the same input;
- ``masked``: the same six kinds of layer behind a ``Masking`` layer, fed batches whose rows
  are full, post-padded, pre-padded, holed, padded at both ends, single-step and empty (a
  batch of one takes them one round at a time).

Both GRU modes (``reset_after`` True and False), ``go_backwards``, ``return_sequences`` and
``return_state`` are spread over the layers. Each model is converted through the API
(``convert_keras(model, input_signature=...)``) and through a SavedModel exported with the
same fixed signature (``convert_saved_model``), and a few cases through the CLI, whose ``--inputs``
fixes a SavedModel exported with a dynamic signature; a few also with ``target="onnxruntime"`` (every
SimpleRNN direction a ``Scan``, the other layers their nodes). One test per (road, flavor, signature, model)
checks, and reports together: one native node per Keras layer (a Bidirectional = one
``bidirectional`` node), no Loop/Scan anywhere, every recurrent loop in the report fused into
the node it names, masked nodes fed a ``sequence_lens`` computed from the model input, and
onnxruntime against ``model(x, training=False)`` on every output at every round.

Beside the matrix, the op forms tf2onnx leaves for "x times a weight" (MatMul, Gemm with a bias,
alpha, beta, transB, another product as C, batch-1 Squeezes, column blocks, biases folded to
``[1, N]`` or ``[B, N]``) are read on hand-built graphs and must give one and the same affine form,
including the ones Keras does not produce today.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import parity
from parity import FEATURES, ONNX_OP, UNITS
from test_parity_masking import ROW_KINDS, mask_batch, sequence_lens_problems

DYNAMIC_TIMES = (6, 9)  # time lengths fed where the signature leaves time dynamic
DYNAMIC_BATCH = len(ROW_KINDS)  # batch fed where the signature leaves the batch dynamic


# -- the layers of the two models -----------------------------------------------------------------

@dataclass(frozen=True)
class Branch:
    """One recurrent layer of a model, reading the model's (masked) input."""

    kind: str  # LSTM, GRU, SimpleRNN
    name: str  # the recurrent layer's name (inside Bidirectional: the wrapped layer's)
    bidirectional: bool = False
    merge_mode: str = "concat"  # Bidirectional only
    reset_after: Optional[bool] = None  # GRU only
    go_backwards: bool = False
    return_sequences: bool = False
    return_state: bool = False

    def layer(self, K):
        kwargs = dict(return_sequences=self.return_sequences, return_state=self.return_state,
                      go_backwards=self.go_backwards)
        if self.reset_after is not None:
            kwargs["reset_after"] = self.reset_after
        layer = getattr(K.layers, self.kind)(UNITS, name=self.name, **kwargs)
        if self.bidirectional:
            layer = K.layers.Bidirectional(layer, merge_mode=self.merge_mode, name=self.name + "_bi")
        return layer

    @property
    def directions(self) -> tuple:
        """The directions the report must list for this layer's loops."""
        if self.bidirectional:
            return ("backward", "forward")
        return ("backward",) if self.go_backwards else ("forward",)

    @property
    def node_directions(self) -> tuple:
        """The ``direction`` attributes its one native node may have."""
        if self.bidirectional:
            return ("bidirectional",)
        return ("forward", "reverse") if self.go_backwards else ("forward",)


MODELS = {
    "plain": (
        Branch("LSTM", "fx_lstm", return_sequences=True),
        Branch("GRU", "fx_gru", reset_after=True, return_state=True),
        Branch("SimpleRNN", "fx_simple_rnn", go_backwards=True, return_sequences=True),
        Branch("LSTM", "fxb_lstm", bidirectional=True),
        Branch("GRU", "fxb_gru", bidirectional=True, merge_mode="sum", reset_after=False, return_sequences=True),
        Branch("SimpleRNN", "fxb_simple_rnn", bidirectional=True, return_sequences=True),
    ),
    "masked": (
        Branch("LSTM", "fx_lstm", return_sequences=True, return_state=True),
        Branch("GRU", "fx_gru", reset_after=False, go_backwards=True, return_sequences=True),
        Branch("SimpleRNN", "fx_simple_rnn"),
        Branch("LSTM", "fxb_lstm", bidirectional=True, merge_mode="sum", return_sequences=True),
        Branch("GRU", "fxb_gru", bidirectional=True, reset_after=True),
        Branch("SimpleRNN", "fxb_simple_rnn", bidirectional=True, return_sequences=True),
    ),
}

# (batch, time) of the input signature; None = dynamic
SIGNATURES = ((1, 7), (1, None), (3, 7), (None, 7))


@dataclass(frozen=True)
class Case:
    model: str  # a key of MODELS
    batch: Optional[int]
    time: Optional[int]

    @property
    def id(self) -> str:
        return f"{self.model}-batch{self.batch or 'N'}-time{self.time or 'N'}"

    @property
    def masked(self) -> bool:
        return self.model == "masked"

    @property
    def branches(self) -> tuple:
        return MODELS[self.model]

    def signature(self):
        import tensorflow as tf

        return [tf.TensorSpec((self.batch, self.time, FEATURES), tf.float32, name="x")]

    def rounds(self) -> list:
        """(label, x) per round, all on the same converted model. Masked: x is zero at padded
        steps, and over the rounds every row kind appears at every time length."""
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        times = (self.time,) if self.time else DYNAMIC_TIMES
        batch = self.batch or DYNAMIC_BATCH
        rounds = []
        for time in times:
            if not self.masked:
                rounds.append((f"batch {batch}, time {time}", rng.standard_normal((batch, time, FEATURES))))
                continue
            kinds = list(ROW_KINDS)
            for start in range(0, len(kinds), batch):
                rows = (kinds[start:] + kinds)[:batch]
                mask = mask_batch(rows, time)
                x = rng.standard_normal((batch, time, FEATURES)) * mask[:, :, None]
                rounds.append((f"time {time}, rows {rows}", x))
        return [(label, x.astype(np.float32)) for label, x in rounds]


# plus one step per call, batch 1 (streaming): a one-step sequence reversed is itself, so
# TensorFlow drops a Bidirectional's reversals and only the loop's scope names its direction
CASES = [Case(model, batch, time) for model in MODELS for batch, time in SIGNATURES] + [Case("masked", 1, 1)]


_MODELS: dict = {}


def build(flavor: str, model_name: str):
    """The Keras model (dynamic batch and time, randomized weights), built once per process and
    shared by every signature and both roads: only the conversion's signature differs."""
    key = (flavor, model_name)
    if key not in _MODELS:
        K = parity.keras_module(flavor)
        x = K.Input((None, FEATURES), name="x")
        h = K.layers.Masking(mask_value=0.0, name="masking")(x) if model_name == "masked" else x
        outputs = [leaf for branch in MODELS[model_name] for leaf in flatten(branch.layer(K)(h))]
        model = K.Model(x, outputs, name="fixed_" + model_name)
        parity.randomize_weights(model, zlib.crc32(f"fixed/{flavor}/{model_name}".encode()))
        _MODELS[key] = model
    return _MODELS[key]


def flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return [leaf for item in out for leaf in flatten(item)]
    return [out]


# -- the two roads, each conversion once per process ---------------------------------------------------

@dataclass
class Conversion:
    model: object = None  # the Keras model
    proto: object = None
    output_names: tuple = ()  # ONNX output names in Keras's output order
    error: Optional[BaseException] = None


_CACHE: dict = {}


def converted(road: str, flavor: str, case: Case, tmp_path_factory) -> Conversion:
    key = (road, flavor, case)
    if key not in _CACHE:
        entry = Conversion()
        try:
            entry.model = build(flavor, case.model)
            if road == "api":
                entry.proto, entry.output_names = _through_api(entry.model, case)
            elif road == ONNXRUNTIME_ROAD:
                entry.proto, entry.output_names = _through_api(entry.model, case, target="onnxruntime")
            elif road == "cli":
                entry.proto, entry.output_names = _through_cli(entry.model, flavor, case, tmp_path_factory)
            else:
                directory = tmp_path_factory.mktemp(f"saved-{flavor}-{case.id}")
                entry.proto, entry.output_names = _through_saved_model(entry.model, case, str(directory))
        except Exception as error:  # noqa: BLE001 - reported by the test of the case
            entry.error = error
        _CACHE[key] = entry
    entry = _CACHE[key]
    if entry.error is not None:
        raise AssertionError(f"converting {road} {flavor} {case.id} failed: "
                             f"{type(entry.error).__name__}: {entry.error}") from entry.error
    return entry


ONNXRUNTIME_ROAD = "api, target onnxruntime"


def _through_api(model, case: Case, **options):
    from tf2onnx_rnn import convert_keras

    proto = convert_keras(model, input_signature=case.signature(), **options)
    return proto, tuple(o.name for o in proto.graph.output)


def export(model, signature, directory: str) -> None:
    """Save ``model`` behind a tf.function with ``signature``; outputs keyed ``out_NN`` in Keras's order."""
    import tensorflow as tf

    module = tf.Module()
    module.weights = list(model.weights)  # only the variables: saving the Keras objects is slow

    @tf.function(input_signature=signature)
    def serve(x):
        return {f"out_{i:02d}": y for i, y in enumerate(flatten(model(x, training=False)))}

    module.serve = serve
    tf.saved_model.save(module, directory, signatures={"serving_default": serve.get_concrete_function()})


def _through_saved_model(model, case: Case, directory: str):
    """A SavedModel exported with the case's fixed signature, converted as it is."""
    from tf2onnx_rnn import convert_saved_model

    export(model, case.signature(), directory)
    proto = convert_saved_model(directory)
    return proto, tuple(sorted(o.name for o in proto.graph.output))


def _through_cli(model, flavor: str, case: Case, tmp_path_factory):
    """A SavedModel exported with a dynamic signature, fixed on the command line as tf2onnx users
    type it (``--inputs x:0[1,7,F]``, ``-1`` for a dynamic dimension)."""
    import onnx
    import tensorflow as tf

    from tf2onnx_rnn import convert

    directory = tmp_path_factory.mktemp(f"cli-{flavor}-{case.id}")
    export(model, [tf.TensorSpec((None, None, FEATURES), tf.float32, name="x")], str(directory / "saved"))
    shape = ",".join(str(d if d is not None else -1) for d in (case.batch, case.time, FEATURES))
    output = directory / "model.onnx"
    code = convert.main(["--saved-model", str(directory / "saved"), "--output", str(output),
                         "--inputs", f"x:0[{shape}]"])
    if code != 0:
        raise AssertionError(f"the CLI exited {code}")
    proto = onnx.load(str(output))
    return proto, tuple(sorted(o.name for o in proto.graph.output))


# -- the checks ------------------------------------------------------------------------------------------

def describe(node) -> str:
    return f"{node.op_type}({parity.direction_of(node)}) {node.name}"


def node_problems(proto, case: Case) -> list:
    """One native node per Keras layer, of the layer's op, direction and GRU mode; no Loop/Scan."""
    problems = []
    loops = parity.nodes_of_types(proto, parity.LOOP_OPS)
    if loops:
        problems.append(f"Loop/Scan nodes left: {[(n.op_type, n.name) for n in loops]}")
    native = parity.nodes_of_types(proto, parity.RECURRENT_OPS)
    if len(native) != len(case.branches):
        problems.append(f"{len(native)} native nodes {[describe(n) for n in native]}, "
                        f"expected {len(case.branches)} (one per layer)")
    for node in native:
        if parity.attribute(node, "hidden_size") != UNITS:
            problems.append(f"{describe(node)}: hidden_size {parity.attribute(node, 'hidden_size')}")
        if case.masked:
            problems += sequence_lens_problems(proto, node)
    return problems


def report_problems(proto, case: Case) -> list:
    """Every loop reported, fused into a node of its layer's op and direction; a Bidirectional's
    two loops name the same bidirectional node."""
    from tf2onnx_rnn import report_of

    report = report_of(proto)
    if report is None:
        return ["no conversion report in the model's metadata"]
    nodes = {n.name: n for n in parity.nodes_of_types(proto, parity.RECURRENT_OPS)}
    expected = sum(len(branch.directions) for branch in case.branches)
    problems = []
    if len(report.outcomes) != expected:
        problems.append(f"{len(report.outcomes)} report entries, expected {expected}")
    for branch in case.branches:
        entries = [o for o in report.outcomes if branch.name in o.layer]
        where = f"layer {branch.name}"
        unfused = [f"{o.layer}: {o.reason} (at {o.where})" for o in entries if not o.fused]
        if unfused:
            problems.append(f"{where} stayed a Loop: {unfused}")
            continue
        if tuple(sorted(o.direction for o in entries)) != branch.directions:
            problems.append(f"{where}: report directions {sorted(o.direction for o in entries)}, "
                            f"expected {list(branch.directions)}")
        named = {o.node for o in entries}
        node = nodes.get(next(iter(named))) if len(named) == 1 else None
        if node is None:
            problems.append(f"{where}: report names nodes {sorted(named)}, expected one native node")
            continue
        if node.op_type != ONNX_OP[branch.kind] or any(o.became != node.op_type for o in entries):
            problems.append(f"{where}: became {[o.became for o in entries]} in {describe(node)}, "
                            f"expected {ONNX_OP[branch.kind]}")
        if parity.direction_of(node) not in branch.node_directions:
            problems.append(f"{where}: {describe(node)}, expected direction in {branch.node_directions}")
        if branch.reset_after is not None and parity.attribute(node, "linear_before_reset") != int(branch.reset_after):
            problems.append(f"{where}: linear_before_reset {parity.attribute(node, 'linear_before_reset')}, "
                            f"Keras reset_after={branch.reset_after}")
    return problems


def parity_problems(entry: Conversion, case: Case) -> list:
    """onnxruntime, one run per round at the signature's batch, against Keras. Keras runs once per
    time length on all of that length's rounds stacked along the batch (the rows of a batch are
    independent), which keeps the eager Keras calls few."""
    problems = []
    session = parity.ort_session(entry.proto)
    rounds = case.rounds()
    for time in sorted({x.shape[1] for _, x in rounds}):
        same_time = [(label, x) for label, x in rounds if x.shape[1] == time]
        stacked = parity.keras_outputs(entry.model, [np.concatenate([x for _, x in same_time])])
        start = 0
        for label, x in same_time:
            expected = [output[start:start + len(x)] for output in stacked]
            start += len(x)
            actual = session.run(list(entry.output_names), {"x": x})
            problems += parity.output_problems(label, list(entry.output_names), expected, actual,
                                               parity.TOLERANCE)[0]
    return problems


def check(entry: Conversion, road: str, flavor: str, case: Case) -> None:
    proto = entry.proto
    problems = node_problems(proto, case) + report_problems(proto, case) + parity_problems(entry, case)
    if problems:
        pytest.fail(f"{road} {flavor} {case.id}:\n- " + "\n- ".join(problems) + "\n" + parity.report_table(proto),
                    pytrace=False)


# -- one reading of "x times a weight", whatever op form tf2onnx left ------------------------------------

_X, _H = "x:0", "h:0"
_RNG = np.random.default_rng(1)
_W = _RNG.standard_normal((3, 8)).astype(np.float32)
_R = _RNG.standard_normal((2, 8)).astype(np.float32)
_B = _RNG.standard_normal((8,)).astype(np.float32)

@dataclass(frozen=True)
class ProductForm:
    """Nodes (op, inputs, output, attributes) over x [batch, 3] and h [batch, 2] that compute the
    columns of ``x @ W + h @ R + b`` from ``first_column`` on as ``read``."""

    nodes: tuple
    constants: dict
    read: str = "pre:0"
    first_column: int = 0
    batch: int = 1


PRODUCT_FORMS = {
    "MatMul + AddV2 + BiasAdd (dynamic shapes)": ProductForm(
        (("MatMul", [_X, "W"], "xw", {}), ("MatMul", [_H, "R"], "hr", {}),
         ("AddV2", ["xw", "hr"], "sum", {}), ("BiasAdd", ["sum", "b"], "pre", {})),
        {"W": _W, "R": _R, "b": _B}),
    "Gemm with the bias as C, h @ R added": ProductForm(
        (("Gemm", [_X, "W", "b"], "xw", {}), ("MatMul", [_H, "R"], "hr", {}), ("AddV2", ["xw", "hr"], "pre", {})),
        {"W": _W, "R": _R, "b": _B}),
    "Gemm alpha, transB, beta; a Gemm through a batch-1 Squeeze as C; a folded [1, N] bias": ProductForm(
        (("Gemm", [_X, "W_half", "b_double"], "xw", dict(alpha=2.0, beta=0.5)),
         ("Squeeze", ["xw"], "xw_row", {}),
         ("Gemm", [_H, "R_t", "xw_row"], "pre", dict(transB=1))),
        {"W_half": _W / 2, "R_t": _R.T.copy(), "b_double": (2 * _B)[None]}),
    "a Split column block of a Gemm whose bias was folded to [B, N] by a fixed batch": ProductForm(
        (("Gemm", [_X, "W", "b_rows"], "xw", {}), ("MatMul", [_H, "R"], "hr", {}),
         ("AddV2", ["xw", "hr"], "sum", {}), ("Split", ["axis", "sum"], "pre", dict(num_split=2))),
        {"W": _W, "R": _R, "b_rows": np.stack([_B] * 3), "axis": np.array(-1, np.int32)},
        read="pre:1", first_column=4, batch=3),
}
_SQUEEZED = {"xw_row:0": [8]}  # every other node output is [batch, 8] (or [batch, 8 / parts] split)


def body_graph(nodes, constants, batch: int = 1):
    """A tf2onnx graph holding ``nodes`` over inputs x [batch, 3] and h [batch, 2]."""
    from onnx import TensorProto, helper, numpy_helper
    from tf2onnx.graph import Graph

    def tensor(name):
        return name if ":" in name else name + ":0"

    protos = [helper.make_node("Placeholder", [], [_X], name="x"), helper.make_node("Placeholder", [], [_H], name="h")]
    protos += [helper.make_node("Const", [], [tensor(name)], name=name, value=numpy_helper.from_array(value))
               for name, value in constants.items()]
    outputs = {}
    for op, inputs, output, attrs in nodes:
        count = attrs.get("num_split", 1)
        names = [f"{output}:{i}" for i in range(count)]
        protos.append(helper.make_node(op, [tensor(i) for i in inputs], names, name=output, **attrs))
        outputs.update({name: [None, 8 // count] if count > 1 else _SQUEEZED.get(name, [None, 8]) for name in names})
    shapes = {_X: [batch, 3], _H: [batch, 2], **{tensor(n): list(v.shape) for n, v in constants.items()},
              **{name: [batch if d is None else d for d in shape] for name, shape in outputs.items()}}
    return Graph(protos, shapes, {name: TensorProto.FLOAT for name in shapes}, input_names=[_X, _H],
                 output_names=["pre:0", _H], is_subgraph=True)


def no_slots(slot: int):
    """Loop slot values for weight sources; every weight in these graphs is a constant."""
    raise AssertionError(f"a constant weight asked for loop slot {slot}")


@pytest.mark.parametrize("form", list(PRODUCT_FORMS))
def test_every_product_form_reads_as_the_same_affine(form: str):
    from tf2onnx_rnn.rewriters.cells.body import BodyView

    spec = PRODUCT_FORMS[form]
    affine = BodyView(body_graph(spec.nodes, spec.constants, spec.batch)).affine(spec.read, _X, _H, frozenset())
    np.testing.assert_allclose(affine.input_weight(no_slots), _W[:, spec.first_column:], rtol=1e-6)
    np.testing.assert_allclose(affine.recurrent_weight(no_slots), _R[:, spec.first_column:], rtol=1e-6)
    np.testing.assert_allclose(affine.bias()(no_slots), _B[spec.first_column:], rtol=1e-6)


def test_products_that_are_not_x_times_a_weight_are_declined_with_a_reason():
    from tf2onnx_rnn.rewriters.cells.body import BodyView
    from tf2onnx_rnn.rewriters.description import NoMatch

    transposed = body_graph([("Gemm", [_X, "W_t", "b"], "pre", dict(transA=1))], {"W_t": _W, "b": _B})
    with pytest.raises(NoMatch, match="Gemm transposes its varying factor"):
        BodyView(transposed).affine("pre:0", _X, _H, frozenset())
    rows = np.stack([_B, _B + 1, _B])
    uneven = body_graph([("Gemm", [_X, "W", "b_rows"], "pre", {})], {"W": _W, "b_rows": rows}, batch=3)
    bias = BodyView(uneven).affine("pre:0", _X, _H, frozenset()).bias()
    with pytest.raises(NoMatch, match="differs between batch rows"):
        bias(no_slots)


# -- the tests ---------------------------------------------------------------------------------------------

def test_matrix_covers_the_brief():
    """Every kind once in one direction and once Bidirectional per model; both GRU modes; batch 1
    with fixed and dynamic time, a fixed batch above 1, a dynamic batch with fixed time."""
    for branches in MODELS.values():
        assert {(b.kind, b.bidirectional) for b in branches} == {
            (kind, bidi) for kind in ONNX_OP for bidi in (False, True)}
        assert {b.reset_after for b in branches if b.kind == "GRU"} == {False, True}
        assert any(b.go_backwards for b in branches) and any(b.return_state for b in branches)
    assert {(1, 7), (1, None), (None, 7)} <= set(SIGNATURES)
    assert any(batch is not None and batch > 1 and time is not None for batch, time in SIGNATURES)


def test_masked_rounds_mix_every_row_kind():
    """Over a masked case's rounds, each time length meets every row kind, whatever the batch."""
    for case in (c for c in CASES if c.masked):
        rounds = case.rounds()
        for time in ((case.time,) if case.time else DYNAMIC_TIMES):
            xs = [x for _, x in rounds if x.shape[1] == time]
            kept = np.concatenate([np.abs(x).sum(-1) != 0 for x in xs])
            rows = {kind: mask_batch([kind], time)[0] for kind in ROW_KINDS}
            for kind, row in rows.items():
                assert any(np.array_equal(k, row) for k in kept), (case.id, time, kind)
            assert all(x.shape[0] == (case.batch or DYNAMIC_BATCH) for x in xs), case.id


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in CASES])
def test_fixed_signature_through_the_api(flavor: str, case: Case, tmp_path_factory):
    check(converted("api", flavor, case, tmp_path_factory), "api", flavor, case)


# the onnxruntime target (SimpleRNN as an input MatMul + Scan) at batch 1 with dynamic time and with
# one step on the masked model, a fixed batch and time on the plain one
ONNXRUNTIME_CASES = [Case("masked", 1, None), Case("masked", 1, 1), Case("plain", 3, 7)]


@pytest.mark.parametrize("flavor, case",
                         [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in ONNXRUNTIME_CASES])
def test_fixed_signature_with_the_onnxruntime_target(flavor: str, case: Case, tmp_path_factory):
    """Every SimpleRNN direction a Scan, every other layer its native node, no Loop; Keras's outputs."""
    from tf2onnx_rnn import report_of

    entry = converted(ONNXRUNTIME_ROAD, flavor, case, tmp_path_factory)
    problems = parity_problems(entry, case)
    ops = [n.op_type for n in parity.nodes_of_types(entry.proto, parity.LOOP_OPS | parity.RECURRENT_OPS)]
    simple = sum(len(b.directions) for b in case.branches if b.kind == "SimpleRNN")
    others = sorted(ONNX_OP[b.kind] for b in case.branches if b.kind != "SimpleRNN")
    if "Loop" in ops or ops.count("Scan") != simple or sorted(op for op in ops if op != "Scan") != others:
        problems.append(f"nodes {ops}: expected {simple} Scan(s) and {others}")
    rows = report_of(entry.proto).outcomes
    problems += [f"{o.layer}: became {o.became!r} ({o.reason})" for o in rows
                 if o.became != ("Scan" if o.kind == "SimpleRNN" else ONNX_OP[o.kind])]
    if problems:
        pytest.fail(f"{flavor} {case.id}:\n- " + "\n- ".join(problems) + "\n" + parity.report_table(entry.proto),
                    pytrace=False)


# batch 1 with dynamic time on the masked model, a fixed batch and time on the plain one
SAVED_MODEL_CASES = [Case("masked", 1, None), Case("plain", 3, 7)]


@pytest.mark.parametrize("flavor, case",
                         [pytest.param(f, c, id=f"{f}-{c.id}") for f in parity.FLAVORS for c in SAVED_MODEL_CASES])
def test_fixed_signature_through_a_saved_model(flavor: str, case: Case, tmp_path_factory):
    check(converted("saved_model", flavor, case, tmp_path_factory), "saved_model", flavor, case)


# the CLI's --inputs fixes a dynamic SavedModel: batch 1 with fixed time (masked) and with dynamic time
CLI_CASES = [Case("masked", 1, 7), Case("plain", 1, None)]


@pytest.mark.parametrize("flavor, case", [pytest.param(f, c, id=f"{f}-{c.id}")
                                          for f in parity.FLAVORS for c in CLI_CASES])
def test_fixed_signature_through_the_cli(flavor: str, case: Case, tmp_path_factory):
    check(converted("cli", flavor, case, tmp_path_factory), "cli", flavor, case)
