"""Keras's convolutional LSTMs (ConvLSTM1D, 2D, 3D) as lean Scans, exact.

No ONNX recurrent node convolves; the Scan form's general rules make the step lean: the input's four gate
convolutions run once over every step as one ``Conv`` (time folded into the batch, the filters
concatenated), the four recurrent ones are one ``Conv`` per step, and the states are carried channels-first,
so no step transposes anything. Each option Keras has (padding, strides, dilation, both data formats, no
bias, other activations, sequences and states returned, go_backwards, Bidirectional in every merge mode,
stacks, masks, fixed signatures, mixed_float16 and float16), in Keras 3 and tf_keras: equal to Keras in
onnxruntime (dynamic batch and time, a batch unlike the time length, batch 1), no Loop, no per-step
Transpose, no ``ReverseSequence`` and no backwards Scan; every float32 model also in OpenVINO (f32) and
tract. Stateful and streamed layers carry their states in and out, chunk by chunk as Keras calls them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import helpers
import parity
from test_parity_masking import ROW_KINDS as ROWS
from test_parity_masking import mask_batch
from tf2onnx_rnn import report_of

ROUNDS = ((5, 7), (1, 6), (3, 2))  # (batch, time): batch unlike time, batch 1, batch longer than time
RELATIVE = 1e-5


@dataclass(frozen=True)
class Case:
    name: str
    layer: str  # ConvLSTM1D, ConvLSTM2D, ConvLSTM3D
    frame: tuple  # one step's input shape
    options: tuple = ()  # (key, value) pairs for the layer
    wrap: str = ""  # "", "bidirectional-<merge mode>", "stack"
    masked: bool = False  # a mask= input (rows full, post-padded, pre-padded, holed, empty)
    fixed: tuple = ()  # (batch, time) of a fixed signature
    policy: str = ""  # a dtype policy while the model is built
    scans: int = 1

    @property
    def id(self) -> str:
        return self.name


_SAME = (("padding", "same"),)
CASES = (
    Case("1d", "ConvLSTM1D", (7, 3), _SAME + (("return_sequences", True),)),
    Case("1d-valid-backwards", "ConvLSTM1D", (7, 3), (("padding", "valid"), ("go_backwards", True))),
    Case("2d", "ConvLSTM2D", (6, 5, 3), _SAME),
    Case("2d-strided-valid", "ConvLSTM2D", (9, 7, 2),
         (("padding", "valid"), ("strides", 2), ("kernel_size", (3, 2)), ("return_sequences", True))),
    Case("2d-dilated-no-bias-relu", "ConvLSTM2D", (6, 5, 3), _SAME + (
        ("dilation_rate", 2), ("use_bias", False), ("activation", "relu"), ("recurrent_activation", "hard_sigmoid"))),
    Case("2d-gelu-states", "ConvLSTM2D", (6, 5, 3), _SAME + (
        ("activation", "gelu"), ("return_sequences", True), ("return_state", True))),
    Case("2d-backwards-states", "ConvLSTM2D", (6, 5, 3), _SAME + (("go_backwards", True), ("return_state", True))),
    Case("2d-channels-first", "ConvLSTM2D", (3, 6, 5), _SAME + (("data_format", "channels_first"),)),
    *(Case(f"2d-bidirectional-{mode}", "ConvLSTM2D", (6, 5, 3), _SAME + (("return_sequences", True),),
           wrap=f"bidirectional-{mode}", scans=2) for mode in ("concat", "sum", "mul", "ave", "none")),
    Case("2d-stack", "ConvLSTM2D", (6, 5, 3), _SAME, wrap="stack", scans=2),
    Case("2d-masked", "ConvLSTM2D", (6, 5, 3), _SAME + (("return_sequences", True),), masked=True),
    Case("2d-fixed", "ConvLSTM2D", (6, 5, 3), _SAME + (("return_sequences", True),), fixed=(2, 4)),
    Case("2d-mixed-float16", "ConvLSTM2D", (6, 5, 3), _SAME, policy="mixed_float16"),
    Case("2d-float16", "ConvLSTM2D", (6, 5, 3), _SAME + (("return_sequences", True),), policy="float16"),
    Case("3d", "ConvLSTM3D", (4, 5, 3, 2), (("filters", 2),) + _SAME + (("return_sequences", True),)),
    Case("3d-bidirectional", "ConvLSTM3D", (4, 5, 3, 2), (("filters", 2),) + _SAME, wrap="bidirectional-concat",
         scans=2),
)
PARAMS = [pytest.param(flavor, case, id=f"{case.id}-{flavor}") for case in CASES for flavor in parity.FLAVORS]


def _build(flavor: str, case: Case):
    K = parity.keras_module(flavor)
    if case.policy:
        K.mixed_precision.set_global_policy(case.policy)
    try:
        options = {"filters": 4, "kernel_size": 3, **dict(case.options)}
        make = getattr(K.layers, case.layer)
        batch, time = case.fixed or (None, None)
        x = K.Input((time,) + case.frame, batch_size=batch, name="x")
        inputs = [x]
        if case.wrap.startswith("bidirectional"):
            mode = case.wrap.split("-", 1)[1]
            out = K.layers.Bidirectional(make(**options), merge_mode=None if mode == "none" else mode)(x)
        elif case.wrap == "stack":
            h = make(**{**options, "return_sequences": True})(x)
            out = make(**{**options, "filters": 3, "go_backwards": True})(h)
        elif case.masked:
            mask = K.Input((None,), dtype="bool", name="mask")
            inputs.append(mask)
            out = make(**options)(x, mask=mask)
        else:
            out = make(**options)(x)
        model = K.Model(inputs if len(inputs) > 1 else x, out)
    finally:
        if case.policy:
            K.mixed_precision.set_global_policy("float32")
    parity.randomize_weights(model, 11, scale=0.3)
    return model


def _entry(flavor: str, case: Case):
    """The case converted once per process; skipped where Keras itself cannot build or run it here."""
    try:
        return parity.converted_with(flavor, case, _build)
    except AssertionError as error:
        cause = error.__cause__
        if cause is not None and _keras_cannot(cause):
            pytest.skip(f"{flavor} cannot run {case.id} on this machine: {str(cause).splitlines()[0][:160]}")
        raise


def _keras_cannot(error: BaseException) -> bool:
    """Keras's own refusals on a CPU machine (a channels-first convolution in tf_keras: TensorFlow has no
    NCHW Conv2D kernel for the CPU; a mask tf_keras's ConvLSTM does not take)."""
    text = str(error)
    return ("NHWC" in text or "channels_first" in text or "data_format" in text or "mask" in text.lower()) and \
        "tf2onnx" not in text


def _inputs(case: Case, batch: int, time: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, time) + case.frame).astype(np.float32)
    if not case.masked:
        return [x]
    kinds = [ROWS[i % len(ROWS)] for i in range(batch)]
    return [x, mask_batch(kinds, time).astype(bool)]


def _keras(flavor: str, case: Case, model, arrays: list) -> list:
    """The model's own outputs; where TensorFlow has no kernel for a channels-first convolution on this
    machine's CPU, those of its channels-last twin (the same weights: Keras lays them out alike in both
    formats) on the transposed input, transposed back."""
    try:
        return _called(model, arrays)
    except Exception as error:  # noqa: BLE001 - only Keras's own CPU refusal is answered below
        if dict(case.options).get("data_format") != "channels_first" or not _keras_cannot(error):
            raise
    options = tuple((k, "channels_last" if k == "data_format" else v) for k, v in case.options)
    twin = _build(flavor, Case(case.name + "-twin", case.layer, case.frame[1:] + case.frame[:1], options,
                               case.wrap, case.masked, case.fixed, case.policy, case.scans))
    twin.set_weights(model.get_weights())
    x = arrays[0]
    outs = _called(twin, [np.moveaxis(x, 2, -1)] + list(arrays[1:]))
    return [np.ascontiguousarray(np.moveaxis(o, -1, 2 if o.ndim == x.ndim else 1)) for o in outs]


def _called(model, arrays: list) -> list:
    out = model(arrays if len(arrays) > 1 else arrays[0], training=False)
    return [np.asarray(o, np.float32) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _rounds(case: Case) -> tuple:
    return (case.fixed,) if case.fixed else ROUNDS


@pytest.mark.parametrize("flavor, case", PARAMS)
def test_equals_keras_in_onnxruntime(flavor, case):
    entry = _entry(flavor, case)
    session = helpers.ort_session(entry.proto)
    names = [i.name for i in session.get_inputs()]
    tolerance = 1e-2 if case.policy else RELATIVE
    for index, (batch, time) in enumerate(_rounds(case)):
        arrays = _inputs(case, batch, time, seed=index)
        want = _keras(flavor, case, entry.model, arrays)
        got = session.run(None, dict(zip(names, arrays)))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, f"{(batch, time)}: {g.shape} != {w.shape}"
            error = float(np.max(np.abs(g.astype(np.float32) - w) / np.maximum(np.abs(w), 1.0)))
            assert error <= tolerance, f"{(batch, time)}: {error:.3g}\n{parity.report_table(entry.proto)}"


@pytest.mark.parametrize("flavor, case", PARAMS)
def test_is_a_lean_scan(flavor, case):
    """No Loop; one Scan per layer direction; each step one Conv (the four gates' recurrent ones: the
    input's run once over every step, as one Conv per Scan) and no Transpose (a mask's tile too); no
    ReverseSequence and no Scan running backwards; the report's rows say ConvLSTM, their direction, and
    what was hoisted."""
    entry = _entry(flavor, case)
    ops = helpers.op_counts(entry.proto)
    table = parity.report_table(entry.proto)
    assert not ops["Loop"], table
    scans = [n for n in entry.proto.graph.node if n.op_type == "Scan"]
    assert len(scans) == case.scans, table
    assert ops["ReverseSequence"] == 0, table
    for scan in scans:
        for name in ("scan_input_directions", "scan_output_directions"):
            assert not any(helpers.attribute(scan, name) or ()), f"{scan.name} runs backwards"
        body = helpers.op_counts(helpers.attribute(scan, "body"))
        assert body["Conv"] == 1, f"{scan.name}: {dict(body)}"
        assert body["Transpose"] == 0, f"{scan.name}: {dict(body)}"
    # the input's four convolutions: one Conv over every step (time folded into the batch by a Reshape);
    # Keras may convolve once more outside the loop (tf_keras its zero initial state, Keras 3 a masked
    # layer's first step)
    producer = {out: n for n in entry.proto.graph.node for out in n.output}
    weights = {t.name: t for t in entry.proto.graph.initializer}
    folded = [n for n in entry.proto.graph.node if n.op_type == "Conv" and n.input[0] in producer
              and producer[n.input[0]].op_type == "Reshape"]
    assert len(folded) == case.scans, f"input convolutions over every step: {len(folded)}\n{table}"
    filters = dict(case.options).get("filters", 4)
    gates = {4 * filters, 4 * 3} if case.wrap == "stack" else {4 * filters}  # a stack's second layer has 3
    made = {int(weights[conv.input[1]].dims[0]) for conv in folded if conv.input[1] in weights}
    assert made == gates, f"the four gates' input filters as one Conv: {made} != {gates}"
    report = report_of(entry.proto)
    rows = report.scans
    assert len(rows) == case.scans and not report.loops, report.table()
    assert {row.kind for row in rows} == {case.layer}, report.table()
    backwards = case.wrap.startswith("bidirectional") or dict(case.options).get("go_backwards", False)
    want = ({"forward", "backward"} if case.wrap.startswith("bidirectional") else
            {"forward", "backward"} if case.wrap == "stack" else {"backward" if backwards else "forward"})
    assert {row.direction for row in rows} == want, report.table()
    for row in rows:
        assert "1 Conv among them" in row.form and "convolution" in row.reason, report.table()


_DOWNSTREAM = [pytest.param(flavor, case, id=f"{case.id}-{flavor}") for case in CASES if not case.policy
               for flavor in parity.FLAVORS]


@pytest.mark.parametrize("flavor, case", _DOWNSTREAM)
def test_loads_and_equals_keras_in_openvino_and_tract(flavor, case, tmp_path):
    """Every float32 model in OpenVINO (f32) and tract, within 1e-4 of Keras (tract with the shapes fixed:
    it reads a Slice reversing a symbolic time length as 2**62 steps)."""
    openvino = pytest.importorskip("openvino")
    tract = pytest.importorskip("tract")
    entry = _entry(flavor, case)
    path = str(tmp_path / "model.onnx")
    onnx.save(entry.proto, path)
    batch, time = case.fixed or (3, 5)
    arrays = _inputs(case, batch, time, seed=9)
    want = _keras(flavor, case, entry.model, arrays)
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                   "INFERENCE_NUM_THREADS": 1})
    result = compiled(arrays)
    got_openvino = [np.asarray(result[output]) for output in compiled.outputs]
    model = tract.onnx().load(path)
    for index, array in enumerate(arrays):
        kind = "bool" if array.dtype == bool else "f32"
        model.set_input_fact(index, ",".join(str(d) for d in array.shape) + f",{kind}")
    got_tract = [t.to_numpy() for t in model.into_model().into_runnable().run(arrays)]
    for runtime, got in (("OpenVINO", got_openvino), ("tract", got_tract)):
        assert len(got) == len(want), runtime
        for g, w in zip(got, want):
            assert float(np.max(np.abs(g - w))) <= 1e-4, f"{runtime}: {np.max(np.abs(g - w)):.3g}"


# -- stateful and streamed --------------------------------------------------------------------------

CHUNKS = (3, 1, 2)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_a_stateful_conv_lstm_streams_as_keras_calls_it(flavor):
    """A ``stateful=True`` ConvLSTM2D converts with its states as inputs (defaulting to Keras's zeros) and
    outputs, Keras's layout; fed chunk by chunk, each chunk's states the last one's, it gives what the
    stateful Keras model gives call by call."""
    from tf2onnx_rnn import convert_keras

    K = parity.keras_module(flavor)
    x = K.Input((None, 6, 5, 3), batch_size=2, name="x")
    layer = K.layers.ConvLSTM2D(4, 3, padding="same", stateful=True, return_sequences=True, name="conv_lstm")
    model = K.Model(x, layer(x))
    parity.randomize_weights(model, 5, scale=0.3)
    model_proto = convert_keras(model)
    (row,) = report_of(model_proto).outcomes
    assert row.state_inputs == ("conv_lstm/h_in", "conv_lstm/c_in"), report_of(model_proto).table()
    assert row.state_outputs == ("conv_lstm/h_out", "conv_lstm/c_out"), report_of(model_proto).table()
    defaults = {t.name: numpy_helper.to_array(t) for t in model_proto.graph.initializer if t.name in row.state_inputs}
    assert set(defaults) == set(row.state_inputs) and all(v.shape == (2, 6, 5, 4) and not v.any()
                                                           for v in defaults.values())
    data = np.random.default_rng(3).standard_normal((2, sum(CHUNKS), 6, 5, 3)).astype(np.float32)
    layer.reset_states()
    # the first chunk takes the defaults
    outputs = helpers.run_in_chunks(model_proto, data, CHUNKS, dict(zip(row.state_inputs, row.state_outputs)), {})
    start = 0
    for size, got in zip(CHUNKS, outputs):  # Keras's successive calls
        want = np.asarray(model(data[:, start:start + size], training=False))
        assert float(np.max(np.abs(got - want))) <= 1e-5, f"chunk at {start}"
        start += size


@pytest.mark.parametrize("flavor", parity.FLAVORS)
def test_streaming_a_conv_lstm(flavor):
    """``streaming=True``: a masked ConvLSTM1D chunk by chunk from zeros equals Keras on the whole sequence
    (Keras 3; tf_keras's ConvLSTM takes no mask: unmasked there); a Bidirectional one is refused, naming
    the backward pass."""
    from tf2onnx_rnn import ConversionError, convert_keras

    K = parity.keras_module(flavor)
    x = K.Input((None, 7, 3), name="x")
    masked = flavor == parity.FLAVORS[0]
    h = K.layers.Masking(0.0)(x) if masked else x
    model = K.Model(x, K.layers.ConvLSTM1D(4, 3, padding="same", return_sequences=True, name="conv_lstm")(h))
    parity.randomize_weights(model, 6, scale=0.3)
    model_proto = convert_keras(model, streaming=True)
    (row,) = report_of(model_proto).outcomes
    assert row.became == "Scan" and len(row.state_outputs) >= 2, report_of(model_proto).table()
    dims = {i.name: [d.dim_value or None for d in i.type.tensor_type.shape.dim] for i in model_proto.graph.input}
    data = np.random.default_rng(4).standard_normal((3, sum(CHUNKS), 7, 3)).astype(np.float32)
    if masked:
        data[1, 4:] = 0.0  # a post-padded row
        data[2, 2] = 0.0  # a hole
    states = {name: np.zeros([3] + dims[name][1:], np.float32) for name in row.state_inputs}
    outputs = helpers.run_in_chunks(model_proto, data, CHUNKS, dict(zip(row.state_inputs, row.state_outputs)), states)
    whole = np.asarray(model(data, training=False))
    assert float(np.max(np.abs(np.concatenate(outputs, axis=1) - whole))) <= 1e-5
    both = K.Model(x, K.layers.Bidirectional(K.layers.ConvLSTM1D(2, 3, padding="same"), name="both_ways")(x))
    with pytest.raises(ConversionError, match="cannot stream.*both_ways.*backward pass"):
        convert_keras(both, streaming=True)


def test_a_stateful_conv_lstm_streams_in_openvino_and_tract(tmp_path):
    """The stateful ConvLSTM2D with its state inputs required (``state_defaults=False``: OpenVINO and tract
    take an input with an initializer as that constant), fed chunk by chunk in OpenVINO (f32) and tract:
    Keras's successive calls, within 1e-4."""
    openvino = pytest.importorskip("openvino")
    tract = pytest.importorskip("tract")
    from tf2onnx_rnn import convert_keras

    K = parity.keras_module(parity.FLAVORS[0])
    x = K.Input((None, 6, 5, 3), batch_size=2, name="x")
    layer = K.layers.ConvLSTM2D(4, 3, padding="same", stateful=True, return_sequences=True, name="conv_lstm")
    model = K.Model(x, layer(x))
    parity.randomize_weights(model, 8, scale=0.3)
    model_proto = convert_keras(model, state_defaults=False)
    (row,) = report_of(model_proto).outcomes
    assert not {t.name for t in model_proto.graph.initializer} & set(row.state_inputs)
    path = str(tmp_path / "stateful.onnx")
    onnx.save(model_proto, path)
    data = np.random.default_rng(9).standard_normal((2, sum(CHUNKS), 6, 5, 3)).astype(np.float32)
    layer.reset_states()
    wants, start = [], 0
    for size in CHUNKS:
        wants.append(np.asarray(model(data[:, start:start + size], training=False)))
        start += size
    order = [i.name for i in model_proto.graph.input]
    outputs = [o.name for o in model_proto.graph.output]
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                   "INFERENCE_NUM_THREADS": 1})

    def run_openvino(feeds: dict) -> dict:
        result = compiled([feeds[name] for name in order])
        return {name: np.asarray(result[output]) for name, output in zip(outputs, compiled.outputs)}

    def run_tract(feeds: dict) -> dict:
        model_t = tract.onnx().load(path)
        for index, name in enumerate(order):
            model_t.set_input_fact(index, ",".join(str(d) for d in feeds[name].shape) + ",f32")
        values = model_t.into_model().into_runnable().run([feeds[name] for name in order])
        return {name: value.to_numpy() for name, value in zip(outputs, values)}

    for runtime, run in (("OpenVINO", run_openvino), ("tract", run_tract)):
        states = {name: np.zeros((2, 6, 5, 4), np.float32) for name in row.state_inputs}
        start = 0
        for size, want in zip(CHUNKS, wants):
            result = run({"x": data[:, start:start + size], **states})
            error = float(np.max(np.abs(result[outputs[0]] - want)))
            assert error <= 1e-4, f"{runtime}, chunk at {start}: {error:.3g}"
            states = {name: result[out] for name, out in zip(row.state_inputs, row.state_outputs)}
            start += size
