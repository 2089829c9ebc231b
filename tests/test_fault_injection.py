"""Fault injection: every function of the rewriter package, made to raise, still gives an exact model
and a report that tells the truth.

The targets are found by introspection, so new code is covered without editing this file: every
module of ``tf2onnx_rnn.rewriters`` (walked with pkgutil), every module-level function defined
in it, and for every class defined in it every function, staticmethod, classmethod and property
getter written in that module (code inherited from ``enum`` is not the package's own), and the
``__init__`` that ``dataclass`` generates for each dataclass defined in it (the conversion's own setup
constructs some of them: a fault there is contained like any other; the ``__eq__``, ``__hash__`` and
``__repr__`` it generates are not). Each test makes one target raise ``RuntimeError`` wherever it is referenced
(a function imported by name into another module, or held in a module-level table, is replaced
there too) and converts one small model that exercises matching, pairing, masks and emission:
``Masking -> Bidirectional(LSTM) -> GRU -> SimpleRNN``, every weight random. The model is built,
traced and frozen once (the faults are in the rewriters, which run after freezing); every test
runs the rest of ``convert_keras`` on it.

For every target:
- ``convert_keras`` completes: no exception leaves it (``ConversionError`` neither: the fault is
  ours, not the user's);
- onnxruntime matches ``model(x, training=False)`` within 1e-5 on a batch whose rows are full,
  post-padded, pre-padded, holed and empty, and on batches of its full and post-padded rows and of
  its full row (the default form's lean branches);
- the report agrees with the graph: one row per recurrent loop of the model, naming the same
  Keras layer as the unfaulted conversion; the rows that stay ``Loop`` are exactly the ``Loop``
  nodes of the graph (tf2onnx names one ``<while name>_loop``); a fused row names a node of its
  op type that exists; the summary counts what is left and never says "nothing to fuse" while a
  Loop remains;
- a loop the unfaulted conversion fuses and the fault left a ``Loop`` has a row whose reason
  starts with "internal error", and a WARNING naming its layer was logged; a row that says
  "internal error" is a ``Loop``.
Code only a target runs (``RUN_ONLY_WITH``: ``emit.kernels`` with target onnxruntime, whose
SimpleRNN then becomes a Scan; the portable form's mask and state variants and its scattered mask
arithmetic with target portable)
is tested converting with that target. The Scan form's code (``scan``) runs only for loops no cell
module claims: its targets convert ``Masking -> RNN(a layer-normalised Elman cell) ->
SimpleRNN(gelu)`` instead, at opset 17, where each loop is a Scan of its own step unfaulted; with the
fault, a loop left a Loop must be exact and reported as a Loop. The lowering for a runtime target
(``lower``) runs only for a fixed signature: its targets convert the main model with one, for TVM (each node
written out as its steps) and for rknn (each masked layer its own step, the mask as floats); a fault there
is a one-line refusal naming the internal error, or a model still exact. A target the unfaulted conversion
never calls (traced with ``sys.monitoring``; ``sys.setprofile`` before Python 3.12) cannot change it: its test
is skipped, saying so (the conversion is deterministic, and the unfaulted one is checked by
``test_unfaulted_*``). Conversions here skip the output shape check: the batch's rows differ from its steps,
so a wrong axis fails the comparison with Keras.

Keras 3 runs every target, tf_keras a deterministic sample of them (every tenth).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import inspect
import logging
import pkgutil
import sys
import textwrap
import traceback
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import helpers
import parity
import tf2onnx_rnn
import tf2onnx_rnn.rewriters

FEATURES, UNITS, TIME = 3, 4, 7
TOLERANCE = 1e-5
LOOP_SUFFIX = "_loop"  # tf2onnx names the ONNX Loop of a TensorFlow while-loop <while name>_loop
INTERNAL = "internal error"
TF_KERAS_SAMPLE = 10  # tf_keras runs every tenth target


# -- targets ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One function of the rewriter package: a module-level function (``owner`` None) or a
    member of a class (``kind``: function, staticmethod, classmethod or property)."""

    module: types.ModuleType
    owner: Optional[type]
    attr: str
    kind: str
    guard: bool = False  # the function catches every exception somewhere in its body
    constructor: bool = False  # a dataclass's generated __init__: it may be called by guards themselves
    model: str = ""  # for code only some models run (RUN_ONLY_WITH lists several): the one this test converts

    @property
    def id(self) -> str:
        short = self.module.__name__[len(tf2onnx_rnn.rewriters.__name__) + 1:] or "__init__"
        return ".".join([short] + ([self.owner.__name__] if self.owner else []) + [self.attr]) + \
            (f"[{self.model}]" if self.model else "")


def package_modules() -> list:
    package = tf2onnx_rnn.rewriters
    return [package] + [importlib.import_module(info.name)
                        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def _written_in(function, module) -> bool:
    """A plain function (or a decorated one, such as a cached function) whose code is in ``module``'s own file."""
    function = inspect.unwrap(function) if callable(function) and hasattr(function, "__wrapped__") else function
    return isinstance(function, types.FunctionType) and function.__code__.co_filename == module.__file__


def _member_function(member):
    """(kind, function) of a class attribute that runs code, else (None, None)."""
    if isinstance(member, staticmethod):
        return "staticmethod", member.__func__
    if isinstance(member, classmethod):
        return "classmethod", member.__func__
    if isinstance(member, property):
        return "property", member.fget
    if isinstance(member, types.FunctionType):
        return "function", member
    return None, None


def _catches_everything(function) -> bool:
    """Whether ``function`` is a guard: it has an ``except Exception`` (or broader) clause."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if any(c is None or (isinstance(c, ast.Name) and c.id in ("Exception", "BaseException")) for c in caught):
                return True
    return False


def _generated_init(cls) -> bool:
    """Whether ``cls`` is a dataclass with the ``__init__`` that ``dataclass`` wrote for it."""
    init = vars(cls).get("__init__")
    return dataclasses.is_dataclass(cls) and isinstance(init, types.FunctionType) and \
        init.__code__.co_filename != sys.modules[cls.__module__].__file__


def discover() -> list:
    targets = []
    for module in package_modules():
        for name, value in vars(module).items():
            if _written_in(value, module):
                targets.append(Target(module, None, name, "function", _catches_everything(value)))
            elif isinstance(value, type) and value.__module__ == module.__name__:
                for attr, member in vars(value).items():
                    kind, function = _member_function(member)
                    if kind is not None and _written_in(function, module):
                        targets.append(Target(module, value, attr, kind, _catches_everything(function)))
                if _generated_init(value):
                    targets.append(Target(module, value, "__init__", "function", constructor=True))
    return targets


TARGETS = discover()


def _raiser(target: Target):
    def injected(*args, **kwargs):
        raise RuntimeError(f"fault injected into {target.id}")

    return injected


_INJECTED_CODE = _raiser(None).__code__  # the code every injected fault raises from


def _references(original) -> list:
    """Every (container, key) of the package's modules that holds ``original``: module attributes
    and the values of module-level dicts (dispatch tables)."""
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "tf2onnx_rnn" or name.startswith("tf2onnx_rnn.")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                found.append((vars(module), attr))
            elif isinstance(value, dict) and not attr.startswith("__"):
                found.extend((value, key) for key, item in list(value.items()) if item is original)
    return found


@contextmanager
def injected(target: Target):
    """``target`` raises RuntimeError wherever it is referenced, until the block ends."""
    fault = _raiser(target)
    undo = []
    if target.owner is None:
        original = vars(target.module)[target.attr]
        for container, key in _references(original):
            undo.append((container, key, container[key]))
            container[key] = fault
    else:
        member = vars(target.owner)[target.attr]
        replacement = {"staticmethod": staticmethod, "classmethod": classmethod,
                       "property": lambda f: property(f, member.fset, member.fdel),
                       "function": lambda f: f}[target.kind](fault)
        setattr(target.owner, target.attr, replacement)
        undo.append((None, target.attr, member))
    try:
        yield
    finally:
        for container, key, value in reversed(undo):
            if container is None:
                setattr(target.owner, key, value)
            else:
                container[key] = value


def test_discovery_finds_every_part_of_the_package():
    """The walk reaches every module and every kind of member (so a missed one is a failure)."""
    ids = {t.id for t in TARGETS}
    modules = {t.module.__name__.rsplit(".", 1)[-1] for t in TARGETS}
    assert {"pipeline", "adapt", "plan", "body", "skeleton", "emitter", "mask_forms", "mask_tensors", "states",
            "rows", "chains", "steps", "unrolled", "stacked", "evaluate", "activations", "description", "equations",
            "lstm", "gru", "simple_rnn"} <= modules
    assert {"pipeline.RecurrentRewriter.__call__", "pipeline.RecurrentRewriter._match_cell",
            "pipeline.make_rewriter", "readers.adapt.build_pass", "emit.plan.plan_nodes",
            "description.CellKind.state_count", "emit.mask_tensors.MaskTensors.lengths",
            "emit.mask_forms.Masks.form_for", "emit.mask_forms.select_masks", "emit.states.select_states",
            "rows.Rows.fused", "cells.evaluate._split", "cells.lstm.match", "cells.lstm.step",
            "__init__.cell_matchers", "outcome.Findings.__init__", "outcome.Outcome.__init__",
            "description.Pass.__init__"} <= ids
    kinds = {t.kind for t in TARGETS}
    assert {"function", "staticmethod", "property"} <= kinds
    assert not [t.id for t in TARGETS if t.id.endswith(("__eq__", "__hash__", "__repr__", "__new__"))]


def test_injection_replaces_every_reference():
    """A function imported by name elsewhere, or held in a table, raises through every road."""
    from tf2onnx_rnn.rewriters import pipeline
    from tf2onnx_rnn.rewriters.cells import evaluate, lstm
    from tf2onnx_rnn.rewriters.readers import adapt

    build_pass = next(t for t in TARGETS if t.id == "readers.adapt.build_pass")
    with injected(build_pass):
        for function in (adapt.build_pass, pipeline.build_pass):
            with pytest.raises(RuntimeError, match="fault injected into readers.adapt.build_pass"):
                function(None, None, None, None)
    assert pipeline.build_pass is adapt.build_pass and adapt.build_pass.__name__ == "build_pass"
    split = next(t for t in TARGETS if t.id == "cells.evaluate._split")
    with injected(split):
        with pytest.raises(RuntimeError, match="cells.evaluate._split"):
            evaluate._OPS["Split"](None, 0, np.zeros(2))
    assert evaluate._OPS["Split"] is evaluate._split
    state_count = next(t for t in TARGETS if t.id == "description.CellKind.state_count")
    with injected(state_count):
        with pytest.raises(RuntimeError):
            _ = lstm.KIND.state_count
    assert lstm.KIND.state_count == 2


# -- the model ------------------------------------------------------------------------------

def build_model(flavor: str, which: str = "main"):
    if which in CUDNN_MODELS:
        return _cudnn_model(which)
    K = parity.keras_module(flavor)
    x = K.Input((None, FEATURES), name="x")
    masked = K.layers.Masking(0.0, name="masking")(x)
    if which == "conv":  # a convolutional recurrence and a backward Scan: siblings, layouts, a full reversal
        frames = K.layers.Reshape((-1, FEATURES, 1), name="frames")(x)
        conv = K.layers.ConvLSTM1D(2, 2, padding="same", return_sequences=True, name="conv_lstm")(frames)
        flat = K.layers.Reshape((-1, FEATURES * 2), name="flat")(conv)
        model = K.Model(x, K.layers.SimpleRNN(UNITS, activation="gelu", go_backwards=True, name="rnn")(flat),
                        name="fault_injection_conv")
        parity.randomize_weights(model, seed=20261127)
        return model
    if which == "scan":  # cells no native node computes: each loop a Scan of its own step
        import scan_cells

        cell = scan_cells._layer_normalised_elman(K, UNITS)
        normalised = K.layers.RNN(cell, return_sequences=True, name="ln_elman")(masked)
        last = K.layers.SimpleRNN(UNITS, activation="gelu", name="rnn")(normalised)
    else:
        both = K.layers.Bidirectional(K.layers.LSTM(UNITS, return_sequences=True, name="lstm"), name="bidi")(masked)
        gru = K.layers.GRU(UNITS, return_sequences=True, name="gru")(both)
        last = K.layers.SimpleRNN(UNITS, name="rnn")(gru)
    model = K.Model(x, last, name="fault_injection")
    parity.randomize_weights(model, seed=20240611)
    return model


# models whose graphs hold cuDNN's ops, whatever the flavor: Keras 3's masked layers as a GPU machine exports them
# (Masking -> Bidirectional(LSTM) -> GRU(go_backwards) -> LSTM, a SavedModel); tf_keras's CuDNNLSTM and CuDNNGRU
# (Bidirectional(CuDNNLSTM) -> CuDNNGRU(go_backwards) returning its state), checked against its canonical twin;
# a TF 1.x graph whose two-layer bidirectional op takes lengths and initial states computed from x
# (cudnn_graphs.computed_lengths_graph), checked against Keras's canonical layers
CUDNN_MODELS = ("gpu_export", "cudnn_layers", "tf1_graph")
# the main model with a fixed signature, converted for a runtime target (rewriters.written.lower writes it for that
# runtime): TVM's lowers each native node to its steps, rknn's each masked layer's own step (its mask as floats)
RUNTIME_MODELS = ("for_tvm", "for_rknn")


def _cudnn_model(which: str):
    """(what the conversion reads: the exported SavedModel's path, or the tf_keras model; the model the outputs
    are checked against, on the CPU)."""
    if which == "tf1_graph":
        import tempfile

        import cudnn_graphs

        path, inputs, outputs, reference = cudnn_graphs.computed_lengths_graph(tempfile.mkdtemp(), seed=5)
        return (path, inputs, outputs), reference
    if which == "gpu_export":
        if not parity.KERAS3:
            pytest.skip("Keras 3 traces cuDNN ops where TensorFlow lists a GPU; `keras` here is Keras 2")
        import keras

        import cudnn_graphs

        x = keras.Input((None, FEATURES), name="x")
        masked = keras.layers.Masking(0.0)(x)
        both = keras.layers.Bidirectional(keras.layers.LSTM(UNITS, return_sequences=True))(masked)
        backward = keras.layers.GRU(UNITS, go_backwards=True, return_sequences=True)(both)
        model = keras.Model(x, keras.layers.LSTM(UNITS)(backward))
        parity.randomize_weights(model, seed=20261127)
        return cudnn_graphs.export_on_gpu_machine(model, "fault_injection"), model
    import tf_keras as K

    from test_cudnn import _canonical_twin, _tf_keras_cudnn

    def build(cudnn: bool):
        def layer(kind, **kwargs):
            if cudnn:
                return _tf_keras_cudnn()[kind](UNITS, **kwargs)
            return getattr(K.layers, kind)(UNITS, recurrent_activation="sigmoid",
                                           **(dict(reset_after=True) if kind == "GRU" else {}), **kwargs)

        x = K.Input((None, FEATURES), name="x")
        both = K.layers.Bidirectional(layer("LSTM", return_sequences=True))(x)
        return K.Model(x, list(layer("GRU", go_backwards=True, return_state=True)(both)))

    model, twin = build(True), build(False)
    parity.randomize_weights(model, seed=20261128)
    _canonical_twin(model, twin)
    return model, twin


def batch() -> np.ndarray:
    """Rows full, post-padded, pre-padded, holed and empty; masked steps are all-zero (Masking)."""
    t = np.arange(TIME)
    mask = np.stack([t >= 0, t < 4, t >= 3, (t != 2) & (t != 3) & (t != 5), t < 0])
    x = np.random.default_rng(5).standard_normal((len(mask), TIME, FEATURES)).astype(np.float32)
    return x * mask[:, :, None]


def batches(which: str = "main") -> list:
    """(label, x): :func:`batch`, then its full and post-padded rows alone and its full row alone: the
    default form's mask arithmetic decides at run time, and these take its lean branches (a model of
    RUNTIME_MODELS takes :func:`batch` alone: its signature is fixed)."""
    x = batch()
    if which in RUNTIME_MODELS:
        return [("rows of every kind", x)]
    return [("rows of every kind", x), ("full and post-padded rows", x[:2]), ("a full row", x[:1])]


@pytest.fixture(scope="module", autouse=True)
def _frozen_once():
    """Trace and freeze each model once, and let tf2onnx read each frozen graph into its own graphs once:
    ``convert_keras`` gets a copy of the frozen graph each time, and tf2onnx a deep copy of the graphs it
    read from it (``graphs_from_tf``, which runs none of this package's code: measured with
    ``sys.setprofile``); everything after that (the rewriters among it) runs as usual."""
    from tf2onnx import tfonnx

    from tf2onnx_rnn.sources import keras_model

    original, frozen = keras_model.freeze_keras, {}
    original_read, read = tfonnx.graphs_from_tf, {}

    def once(model, *args, **kwargs):
        key = (id(model), repr(args), repr(sorted(kwargs.items())))
        if key not in frozen:
            frozen[key] = (model, original(model, *args, **kwargs))  # the model is kept: its id stays its own
        source = frozen[key][1]
        return dataclasses.replace(source, graph_def=copy.deepcopy(source.graph_def))

    def read_once(tf_graph, *args, **kwargs):
        key = (tf_graph.as_graph_def().SerializeToString(deterministic=True), repr(args), repr(sorted(kwargs.items())))
        if key not in read:
            read[key] = original_read(tf_graph, *args, **kwargs)
        return copy.deepcopy(read[key])

    keras_model.freeze_keras, tfonnx.graphs_from_tf = once, read_once
    yield
    keras_model.freeze_keras, tfonnx.graphs_from_tf = original, original_read


_MODELS: dict = {}


def model_and_expected(flavor: str, which: str = "main"):
    """(what the conversion reads, Keras's outputs per batch): a Keras model, or for a model of
    CUDNN_MODELS the SavedModel's path or the model holding cuDNN layers, checked against their CPU twins."""
    if (flavor, which) not in _MODELS:
        model = reference = build_model(flavor, which)
        if which in CUDNN_MODELS:
            model, reference = model
        _MODELS[flavor, which] = (model, [parity.keras_outputs(reference, [x]) for _, x in batches(which)])
    return _MODELS[flavor, which]


def convert(which: str, model, **options):
    """The conversion a test of model ``which`` makes (the output shape check off: see converted_problems)."""
    if which == "gpu_export":
        return tf2onnx_rnn.convert_saved_model(model, check_shapes=False, **options)
    if which == "tf1_graph":
        return tf2onnx_rnn.convert_graph_def(*model, check_shapes=False, rename_inputs=["x"], **options)
    if which in RUNTIME_MODELS:  # its signature fixed to the batch the outputs are checked on
        import tensorflow as tf

        signature = [tf.TensorSpec(batch().shape, tf.float32, name="x")]
        options = {**options, "target": which[len("for_"):], "input_signature": signature}
    return tf2onnx_rnn.convert_keras(model, check_shapes=False, **options)


_BASELINE: dict = {}


QUANTIZED = {"quantize": "static", "calibration": batch(), "max_error": 0.5}
QUANTIZED_TOLERANCE = QUANTIZED["max_error"]  # of the outputs' largest magnitude on the calibration batch


# code that only a target runs: (module, class or function; "" for the whole module) -> its options
# ("model": which model of MODELS converts)
RUN_ONLY_WITH = {
    ("scan", ""): {"model": "scan", "opset": 17},
    ("scan.driver", ""): {"model": "scan", "opset": 17},
    ("scan.constants", ""): {"model": "scan", "opset": 17},
    ("scan.lifting", ""): {"model": "scan", "opset": 17},
    ("scan.regrouping", ""): {"model": "scan", "opset": 17},
    ("written.scope", ""): {"model": "scan", "opset": 17},
    ("scan.lengths", ""): {"model": "scan", "opset": 17},
    ("scan.loop_reading", ""): {"model": "scan", "opset": 17},
    ("scan.hoisting", ""): {"model": "scan", "opset": 17},
    ("scan.folding", ""): {"model": "scan", "opset": 17},
    ("scan.rewrite", ""): {"model": "scan", "opset": 17},
    ("scan.normalisation", ""): {"model": "scan", "opset": 17},
    ("scan.siblings", ""): {"model": "conv"},
    ("scan.layouts", ""): {"model": "conv"},
    ("written.full_reversal", ""): {"model": "conv"},
    ("emit.kernels", ""): {"target": "onnxruntime"},  # what builds a recurrence otherwise than as its node
    ("emit.mask_forms", "PortableMask"): {"target": "portable"},
    ("emit.scattered_mask", ""): {"target": "portable"},
    ("written.gathered_reversal", ""): {"target": "portable"},
    ("emit.states", "ExplicitZeroStates"): {"target": "portable"},
    ("emit.states", "_zero_states"): {"target": "portable"},
    # cuDNN's ops: each target is tested with each model that holds them
    ("readers.cudnn", ""): {"models": CUDNN_MODELS},
    ("readers.cudnn_op", ""): {"models": CUDNN_MODELS},
    ("readers.cudnn_rows", ""): {"models": CUDNN_MODELS},
    ("readers.cudnn_outputs", ""): {"models": CUDNN_MODELS},
    ("readers.cudnn_params", ""): {"models": CUDNN_MODELS},
    # the lowering for a runtime target: each target with each runtime's model
    **{(module, ""): {"models": RUNTIME_MODELS} for module in (
        "lower", "written.builder", "lower.fold", "lower.forward", "lower.steps", "lower.scan_steps",
        "lower.float_masks", "lower.ladder", "lower.op_rungs", "lower.rungs", "lower.per_step")},
    ("obstacles", "masked_own_step"): {"models": RUNTIME_MODELS},
    # int8 forms of the written model: the main model quantized static on its batch (QDQ, int8 weights); a budget
    # every layer fits in, so that each keeps its form
    **{(module, ""): QUANTIZED for module in (
        "written.quantize", "written.quantize.units", "written.quantize.forms", "written.quantize.rounding")},
}


def options_for(target: Optional[Target]) -> dict:
    """The conversion's options: those of the target whose code runs only with it (RUN_ONLY_WITH)."""
    if target is None:
        return {}
    where = target.owner.__name__ if target.owner is not None else target.attr
    for (module, name), options in RUN_ONLY_WITH.items():
        if target.module.__name__.endswith("." + module) and name in ("", where):
            return options
    return {}


def conversion_options(target: Optional[Target]) -> tuple:
    """(the model of MODELS the target's test converts, convert_keras's options)."""
    options = dict(options_for(target))
    options.pop("models", None)
    which = options.pop("model", "main")
    return (target.model or which) if target is not None else which, options


def baseline(flavor: str, target: Optional[Target] = None):
    """The unfaulted conversion's report (per process and options)."""
    return _unfaulted(flavor, target)[0]


def called(flavor: str, target: Optional[Target] = None) -> set:
    """The code objects the unfaulted conversion runs (per process and options)."""
    return _unfaulted(flavor, target)[1]


def _unfaulted(flavor: str, target: Optional[Target]) -> tuple:
    which, options = conversion_options(target)
    key = (flavor, which, repr(sorted(options.items())))
    if key not in _BASELINE:
        model, _ = model_and_expected(flavor, which)
        with code_run() as codes:
            model_proto = convert(which, model, **options)
        _BASELINE[key] = (tf2onnx_rnn.report_of(model_proto), codes)
    return _BASELINE[key]


@contextmanager
def code_run():
    """The set of code objects (Python functions) run inside the block: from Python 3.12 through
    ``sys.monitoring``, each function reported at its first start only (about a fifth of the cost of a
    conversion, where ``sys.setprofile`` sees every call and return and made it several times slower)."""
    codes: set = set()
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        def record(frame, event, arg):
            if event == "call":
                codes.add(frame.f_code)

        previous = sys.getprofile()
        sys.setprofile(record)
        try:
            yield codes
        finally:
            sys.setprofile(previous)
        return
    tool = next(t for t in range(monitoring.PROFILER_ID, 6) if monitoring.get_tool(t) is None)

    def started(code, offset):
        codes.add(code)
        return monitoring.DISABLE  # this code's later starts are not reported

    monitoring.use_tool_id(tool, "fault injection: the code a conversion runs")
    monitoring.register_callback(tool, monitoring.events.PY_START, started)
    monitoring.set_events(tool, monitoring.events.PY_START)
    try:
        yield codes
    finally:
        monitoring.set_events(tool, 0)
        monitoring.register_callback(tool, monitoring.events.PY_START, None)
        monitoring.restart_events()  # what DISABLE turned off is reported again to the next block
        monitoring.free_tool_id(tool)


def target_code(target: Target):
    """The code object a target's fault replaces."""
    member = vars(target.owner)[target.attr] if target.owner is not None else vars(target.module)[target.attr]
    function = _member_function(member)[1] if target.owner is not None else member
    return (inspect.unwrap(function) if hasattr(function, "__wrapped__") else function).__code__


# -- checks -----------------------------------------------------------------------------------

def problems_of(flavor: str, model_proto, warnings: list, target: Optional[Target] = None) -> list:
    """Everything wrong with a conversion: outputs against Keras, and the report against the graph."""
    which = conversion_options(target)[0]
    _, expected = model_and_expected(flavor, which)
    session = parity.ort_session(model_proto)
    names = [o.name for o in session.get_outputs()]
    found = []
    quantized = "quantize" in conversion_options(target)[1]
    tolerance = QUANTIZED_TOLERANCE * max(float(np.max(np.abs(w))) for w in expected[0]) if quantized else TOLERANCE
    for (label, x), wanted in zip(batches(which), expected):
        found += parity.output_problems(label, names, wanted, parity.run_onnx(session, ["x"], [x]), tolerance)[0]
    report = tf2onnx_rnn.report_of(model_proto)
    if report is None:
        return found + ["no report in the model"]
    before = {o.loop: o for o in baseline(flavor, target).outcomes}
    rows = {}
    for o in report.outcomes:
        if o.loop in rows:
            found.append(f"two rows for loop {o.loop}")
        rows[o.loop] = o
    if sorted(rows) != sorted(before):
        found.append(f"report rows are for loops {sorted(rows)}, the model's loops are {sorted(before)}")
    nodes = list(parity.all_nodes(model_proto.graph))
    by_name = {n.name: n for n in nodes}
    computing = {o.node for o in report.outcomes if o.fused and o.became in parity.LOOP_OPS}  # target onnxruntime
    loop_nodes = sorted(n.name for n in nodes if n.op_type in parity.LOOP_OPS and n.name not in computing)
    loop_rows = sorted(o.loop + LOOP_SUFFIX for o in report.outcomes if o.became == "Loop" or o.own_step)
    if loop_rows != loop_nodes:
        found.append(f"rows left as Loop {loop_rows}, Loop nodes in the graph {loop_nodes}")
    if loop_nodes and "nothing to fuse" in report.summary():
        found.append(f"the summary says {report.summary()!r} with {len(loop_nodes)} Loop(s) in the graph")
    if f"{len(report.loops)} left as Loop" not in report.summary():
        found.append(f"the summary {report.summary()!r} miscounts the {len(loop_rows)} Loop row(s)")
    for o in report.outcomes:
        written = by_name.get(o.loop + LOOP_SUFFIX)
        if o.became == "Loop" and (written is None or written.op_type != "Loop") or \
                o.own_step and (written is None or written.op_type != "Scan"):
            found.append(f"{o.layer}: reported as {o.became}, the graph holds its loop as "
                         f"{written.op_type if written is not None else 'nothing'}")
        was = before.get(o.loop)
        if was is not None and o.layer != was.layer:
            found.append(f"loop {o.loop} is reported as layer {o.layer!r}, unfaulted as {was.layer!r}")
        if o.fused:
            node = by_name.get(o.node)
            if node is None or node.op_type != o.became:
                found.append(f"{o.layer}: reported fused into {o.became} node {o.node!r}, which the graph "
                             f"{'holds as ' + node.op_type if node is not None else 'does not hold'}")
        internal = o.reason.startswith(INTERNAL)
        if (o.became == "Loop" or o.own_step) and was is not None and was.fused:
            if not internal:
                found.append(f"{o.layer}: fused unfaulted, a Loop now, but the reason is {o.reason!r}")
            if not any(o.layer in message for message in warnings):
                found.append(f"{o.layer}: stays a Loop through a fault, but no WARNING names it")
        elif internal and not (o.became == "Loop" or o.own_step):
            found.append(f"{o.layer}: became {o.became} but the reason says {o.reason!r}")
    return found


def _rule_drivers() -> set:
    from tf2onnx_rnn.rewriters.written import passes

    return {passes.run.__code__}


_RULE_DRIVERS = _rule_drivers()
_TOOLKIT = {"tf2onnx_rnn.rewriters.written.graph"}


def escapes(target: Target, records: list) -> list:
    """Faults that got past the nearest guard.

    A WARNING logged with a traceback is a fault caught by a last line of defence. The fault must
    have come straight from a function that guard calls itself: a fault deeper down belongs to an
    inner guard, which keeps it to the loop it concerns. Only a fault in a guard itself may reach
    the next guard out, from any depth, and so may one in a dataclass's constructor, which guards
    call too (a row that cannot be built cannot be recorded), and one in the written model's graph toolkit
    (``_TOOLKIT``: the primitives every pass and the report's readers call at any depth), and one under a rule
    of the passes over the written model, from any depth: their driver keeps it to that rule, whose rewrite
    changes the graph only once it is whole; only the injected fault may be caught at all.
    """
    found = []
    for record in records:
        if not record.exc_info or record.exc_info[1] is None:
            continue
        frames = [frame for frame, _ in traceback.walk_tb(record.exc_info[2])]
        path = " -> ".join(getattr(frame.f_code, "co_qualname", frame.f_code.co_name) for frame in frames)
        if frames[-1].f_code is not _INJECTED_CODE:
            found.append(f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]} (not the injected fault) "
                         f"escaped to a last line of defence through {path}")
        elif len(frames) > 2 and not (target.guard or target.constructor or target.module.__name__ in _TOOLKIT) \
                and frames[0].f_code not in _RULE_DRIVERS:
            found.append(f"the fault escaped past the nearest guard, through {path}: {record.getMessage()}")
    return found


def converted_problems(flavor: str, target: Target, caplog) -> list:
    which, options = conversion_options(target)
    model, _ = model_and_expected(flavor, which)
    baseline(flavor, target)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tf2onnx_rnn"):
        try:
            # the output shape check is off: the batch's rows (5) differ from its steps (7), so a wrong
            # axis fails the comparison with Keras below
            model_proto = convert(which, model, **options)
        except tf2onnx_rnn.ConversionError as error:
            if (which in CUDNN_MODELS + RUNTIME_MODELS or "quantize" in options) and INTERNAL in str(error) \
                    and "\n" not in str(error):
                return []  # a fused op no fallback computes, a runtime's form or a quantization: refused in one
                # line naming the fault, nothing written
            return [f"the conversion raised {type(error).__name__}: {error}"]
        except Exception as error:  # noqa: BLE001 - any exception is the failure being tested for
            return [f"the conversion raised {type(error).__name__}: {error}"]
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    problems = escapes(target, records) + problems_of(flavor, model_proto, [r.getMessage() for r in records],
                                                      target)
    return problems + (["report:\n" + parity.report_table(model_proto)] if problems else [])


def test_unfaulted_conversion_fuses_every_loop():
    """The reference the faults are judged against: every loop fused, exact, the report true."""
    flavor = parity.FLAVORS[0]
    report = baseline(flavor)
    assert len(report.outcomes) == 4 and all(o.fused for o in report.outcomes), report.table()
    assert [o.layer for o in report.outcomes] == ["bidi", "bidi", "gru", "rnn"], report.table()


@pytest.mark.parametrize("which", CUDNN_MODELS)
def test_unfaulted_cudnn_models_fuse_every_op(which: str):
    """The references of the cuDNN readers' faults: every op a native node, exact."""
    target = dataclasses.replace(next(t for t in TARGETS if t.module.__name__.endswith(".readers.cudnn")), model=which)
    model, expected = model_and_expected(parity.FLAVORS[0], which)
    report = baseline(parity.FLAVORS[0], target)
    assert report.outcomes and all(o.fused for o in report.outcomes), report.table()
    assert not problems_of(parity.FLAVORS[0], convert(which, model), [], target)


def test_unfaulted_scan_model_is_all_scans():
    """The Scan form's reference: each loop a Scan of its own step, the normalisation one node."""
    scan_target = next(t for t in TARGETS if t.module.__name__.endswith(".scan.normalisation"))
    assert conversion_options(scan_target)[0] == "scan"
    report = baseline(parity.FLAVORS[0], scan_target)
    assert [(o.layer, o.became, o.own_step) for o in report.outcomes] == \
        [("ln_elman", "Scan", True), ("rnn", "Scan", True)], report.table()
    assert "1 layer normalisation(s) as one node" in report.outcomes[0].form, report.table()


def test_unfaulted_conv_model_is_lean_scans():
    """The reference of the sibling, layout and reversal passes' faults: a ConvLSTM1D whose step holds one
    Conv and no Transpose, and a backward gelu SimpleRNN over its input reversed by a Slice."""
    conv_target = next(t for t in TARGETS if t.module.__name__.endswith(".scan.layouts"))
    assert conversion_options(conv_target)[0] == "conv"
    report = baseline(parity.FLAVORS[0], conv_target)
    assert [(o.layer, o.kind, o.direction, o.became) for o in report.outcomes] == \
        [("conv_lstm", "ConvLSTM1D", "forward", "Scan"), ("rnn", "SimpleRNN", "backward", "Scan")], report.table()
    model, _ = model_and_expected(parity.FLAVORS[0], "conv")
    model_proto = convert("conv", model)
    assert not problems_of(parity.FLAVORS[0], model_proto, [], conv_target)
    ops = helpers.op_counts(model_proto)
    assert not ops["ReverseSequence"] and ops["Slice"], ops
    scan = next(n for n in model_proto.graph.node if n.op_type == "Scan" and "conv_lstm" in n.name)
    body = helpers.op_counts(helpers.attribute(scan, "body"))
    assert body["Conv"] == 1 and not body["Transpose"], body


def _cases():
    for index, target in enumerate(TARGETS):
        models = options_for(target).get("models")
        if models:  # models that are the same whatever the flavor (cuDNN ops, a lowering): once each
            for which in models:
                model_target = dataclasses.replace(target, model=which)
                yield pytest.param(parity.FLAVORS[0], model_target, id=f"{parity.FLAVORS[0]}-{model_target.id}")
            continue
        yield pytest.param(parity.FLAVORS[0], target, id=f"{parity.FLAVORS[0]}-{target.id}")
        if index % TF_KERAS_SAMPLE == 0:
            yield pytest.param("tf_keras", target, id=f"tf_keras-{target.id}")


@pytest.mark.parametrize("flavor, target", list(_cases()))
def test_fault_keeps_the_conversion_exact_and_the_report_true(flavor, target, caplog):
    model_and_expected(flavor, conversion_options(target)[0])
    if target_code(target) not in called(flavor, target):  # built before the fault
        pytest.skip("the unfaulted conversion never calls it: faulted, the conversion is the unfaulted one")
    if target.model in RUNTIME_MODELS[1:]:  # a runtime's lowering: once, with the first model that calls it
        earlier = RUNTIME_MODELS[:RUNTIME_MODELS.index(target.model)]
        if any(target_code(target) in called(flavor, dataclasses.replace(target, model=m)) for m in earlier):
            pytest.skip("the lowering for an earlier runtime's model calls it too: tested with that one")
    with injected(target):
        problems = converted_problems(flavor, target, caplog)
    assert not problems, f"fault in {target.id} ({flavor}):\n" + "\n".join(problems)
