"""Property-based parity fuzz (hypothesis): random recurrent Keras models against their conversion.

For Keras 3 (``keras``) and tf_keras, hypothesis draws a model (see :func:`examples`):

- a stack of 1-3 recurrent layers, each LSTM, GRU (``reset_after`` True or False) or SimpleRNN,
  with 1-8 units, optionally inside ``Bidirectional`` (merge mode concat, sum, mul or ave), with
  ``go_backwards``, ``use_bias``, and ``return_sequences`` (forced True for all but the last layer,
  which may also ``return_state``);
- activations ONNX can express (tanh, sigmoid, relu, hard_sigmoid, softsign, linear; recurrent
  activations sigmoid, hard_sigmoid, tanh) and, for about one layer in ten, ``selu``, which ONNX
  cannot express: that layer must then become a Scan of its own step (or stay a Loop), never a node;
- about one layer in six (of every element type) is ``RNN(cell)`` with a hand-written cell of
  ``tests/cells.py``: a near-miss of LSTM, GRU or SimpleRNN (an extra scale or bias, a leaky
  integrator, peepholes, another gate wiring, layer normalisation...), which may be fused only into
  a node that gives Keras's output (else a Scan of its step, or a Loop), or a standard formula
  written by hand, which must be fused (float64 aside, below);
- the element type: float32 (mostly), the ``mixed_float16`` policy or the ``float16`` policy (each
  the global policy while the model is built, layers and cells alike; compared within 3e-2), or float64
  layers and cells, which must stay as they are (onnxruntime's recurrent kernels do not run float64:
  an exact Scan of their step or Loop) with a reason naming the type (or, for a near-miss cell, the
  mismatch its matcher refuses it for, whatever the type); initial states (float32 model inputs) in
  tf_keras only into float32 models (it refuses to feed states of another type; Keras 3 casts them);
- the conversion's target: the default form mostly, else ``portable`` (no computed ``sequence_lens``; a
  masked Bidirectional layer as two forward nodes, no ``reverse`` node) or ``onnxruntime`` (SimpleRNN as
  an input MatMul and one ``Scan`` per direction, each row naming its own);
- for about one Keras 3 example in four, a GPU machine (TensorFlow lists a GPU: ``cudnn_graphs.gpu_machine``),
  its LSTM and GRU layers mostly of Keras's default configuration (which cuDNN takes):
  ``convert_keras`` there must give what it gives on a CPU (the property below); and the model exported there
  (``model.export``: its LSTM and GRU layers cuDNN takes are ``CudnnRNNV3`` ops) converts with
  ``convert_saved_model`` to the same recurrent nodes, no ``Loop``/``Scan`` the first conversion lacks, and
  equals Keras on the CPU on the same rounds (a float64 model excepted: onnxruntime runs no float64
  recurrent node, and no loop is left to compute it otherwise; and a first layer given initial states whose
  last output is the model's, with a mask: Keras's GPU path returns its final state there, which for a row
  with no kept step is the initial state, where its CPU path gives zeros);
- with a fixed time of 2 or more, each layer may be ``unroll=True``: a chain of steps that must
  become the same native node (or, kept, stay as its ops with a reason, never a Loop);
- input features 1-6; no mask, a ``Masking`` layer (padded steps are all-zero vectors), or an
  explicit bool mask input ``m`` passed as ``layer(x, mask=m)``; initial states fed from model
  inputs for the first layer (with ``Masking`` in Keras 3, the upstream mask is sometimes passed
  explicitly: Keras 3 ignores an implicit mask when ``initial_state`` is given, and the
  conversion must follow Keras either way); ``go_backwards`` inside ``Bidirectional`` in
  tf_keras only (Keras 3 refuses it);
- every weight (biases included) seeded normal * 0.3;
- the input signature: dynamic batch and time (the default), or a fixed batch (1-4) and/or a
  fixed time (1-7), as users exporting for embedded runtimes give (``input_signature`` with
  those dimensions; every model input gets the fixed batch, ``x`` and ``m`` the fixed time);
- streaming (separate tests): the same space narrowed to what streams, a round cut into chunks at
  random boundaries, states carried from zeros, chunked against Keras on the whole sequence;
- one or two rounds of inputs on the same converted model, each with batch 1-4, time 1-7 (the
  signature's where it fixes them) and, when masked, one mask row per batch row drawn from
  full / post-padded / pre-padded / holed / empty.

The property, per example: ``onnx.checker.check_model(full_check=True)`` passes; every
recurrent while-loop in the report is either fused into a native node of the graph (``became``
LSTM/GRU/RNN, the layer kind's op) or a Loop with a non-empty reason; each layer has one entry
per direction; each layer whose activations ONNX can express is fused, each ``selu`` layer stays
a Loop, and a model without ``selu`` has no Loop/Scan anywhere (with ``selu``: one Loop node per
kept entry, no Scan); and onnxruntime matches ``model(inputs, training=False)`` on every output
within 1e-4 + 1e-5 x |Keras's value| (numpy's allclose with its default rtol: relu layers may grow to
1e9, where float32 itself rounds by more than 1e-4; NaN fails). An example whose Keras output is not
finite (float32 overflows in Keras itself) is rejected: there is nothing to compare with.
Not failed but counted (hypothesis events, the log): "structure notes", where an exact, fused
conversion uses more native nodes than the README's one node per layer (a Bidirectional layer
as two one-direction nodes). A failure would stop a long run at the first such note.

Environment:

- ``TF2ONNX_RNN_FUZZ_EXAMPLES``: examples per flavor (default 12).
- ``TF2ONNX_RNN_FUZZ_SEED``: unset (default) = derandomized, the same examples on every run
  (what CI runs); an integer = that hypothesis seed; ``random`` = a fresh random run.
- ``TF2ONNX_RNN_FUZZ_LOG``: a file to append one JSON line per example to (flavor, fused and
  Loop counts, max error, seconds, pass/fail), for long runs (see ``FUZZ_RESULTS.md``), each
  preceded by a line with the example alone (``"started": true``), which names it when a runtime
  crashes the process.

A failing example is printed by hypothesis as ``example=Example(...)``; it is plain data, so it
can be replayed outside hypothesis::

    cd tests && python -c "from test_fuzz import *; check_example('keras3', Example(...))"
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import onnx
from hypothesis import HealthCheck, Phase, event, given, note, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

import cells
import cudnn_graphs
import helpers
import parity
from helpers import KINDS, SCOPE_NAME, STATE_COUNT

TOLERANCE = 1e-4
FLOAT16_TOLERANCE = 3e-2  # mixed_float16 and float16: the layers compute in float16
RELATIVE = 1e-5  # and a fraction of Keras's value beside it (numpy's default rtol): float32's rounding of large values
WEIGHT_SCALE = 0.3
EXAMPLES = int(os.environ.get("TF2ONNX_RNN_FUZZ_EXAMPLES", "12"))
SEED = os.environ.get("TF2ONNX_RNN_FUZZ_SEED", "").strip()
LOG = os.environ.get("TF2ONNX_RNN_FUZZ_LOG", "").strip()

ACTIVATIONS = ("tanh", "sigmoid", "relu", "hard_sigmoid", "softsign", "linear")
RECURRENT_ACTIVATIONS = ("sigmoid", "hard_sigmoid", "tanh")
INEXPRESSIBLE = "selu"  # no exact ONNX recurrent activation: the layer must stay a Loop
MERGE_MODES = ("concat", "sum", "mul", "ave")
MASKS = ("none", "masking", "input")
DTYPES = ("float32",) * 4 + ("mixed_float16", "float16", "float64")  # mostly float32
HALF_POLICIES = frozenset({"mixed_float16", "float16"})  # the global policy while the model is built
# the conversion's target: mostly the default form; the portable form (no computed sequence_lens, a masked
# Bidirectional as two forward nodes) and the onnxruntime form (SimpleRNN as an input MatMul + Scan)
TARGETS = (None,) * 4 + ("portable", "onnxruntime")
STANDARD_CELLS = frozenset(cell.name for cell in cells.STANDARD)
ROW_KINDS = ("full", "post", "pre", "holed", "empty")
# what Keras 3 takes cuDNN's kernel for (its defaults): a GPU machine's examples mostly draw these
CUDNN_DEFAULTS = {"LSTM": dict(activation="tanh", recurrent_activation="sigmoid", use_bias=True, unroll=False),
                  "GRU": dict(activation="tanh", recurrent_activation="sigmoid", use_bias=True, reset_after=True,
                              unroll=False)}


# -- the drawn data (plain, repr-able: a printed falsifying example replays as is) -----------------

@dataclass(frozen=True)
class LayerSpec:
    kind: str  # LSTM, GRU, SimpleRNN
    units: int
    activation: str
    recurrent_activation: Optional[str] = None  # LSTM and GRU
    reset_after: Optional[bool] = None  # GRU
    use_bias: bool = True
    go_backwards: bool = False
    return_sequences: bool = False
    merge_mode: Optional[str] = None  # set: wrapped in Bidirectional with this merge mode
    cell: Optional[str] = None  # a hand-written cell of tests/cells.py as RNN(cell) (``kind`` is its family)
    unroll: bool = False  # unroll=True (only with a fixed time of 2 or more)

    @property
    def bidirectional(self) -> bool:
        return self.merge_mode is not None

    @property
    def near_miss(self) -> bool:
        """A hand-written cell that is not a standard formula: fused or not, it must be exact."""
        return self.cell is not None and self.cell not in STANDARD_CELLS

    @property
    def expressible(self) -> bool:
        return INEXPRESSIBLE not in (self.activation, self.recurrent_activation)

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1


@dataclass(frozen=True)
class ModelSpec:
    features: int
    layers: tuple  # of LayerSpec
    mask: str = "none"  # none, masking, input
    initial_state: bool = False  # first layer's initial states from model inputs init_0, init_1, ...
    explicit_upstream_mask: bool = False  # masking + initial_state: pass Masking's mask as mask=
    return_state: bool = False  # last layer
    weight_seed: int = 0
    fixed_batch: Optional[int] = None  # the input signature's batch; None: dynamic
    fixed_time: Optional[int] = None  # the input signature's time; None: dynamic
    dtype: str = "float32"  # float32, mixed_float16 or float16 (the global policy), float64 (the layers' dtype)
    target: Optional[str] = None  # convert_keras's target: None (the default form), portable or onnxruntime
    gpu_machine: bool = False  # Keras 3: converted where TensorFlow lists a GPU, and exported there (cuDNN ops)

    @property
    def expressible(self) -> bool:
        return all(layer.expressible for layer in self.layers)

    def expectation(self, layer: LayerSpec) -> str:
        """What ``layer`` must become: "fused", "kept" (a Loop, or its unrolled ops), or "either"."""
        if self.dtype == "float64":
            return "kept"  # onnxruntime's recurrent kernels do not run float64
        if layer.near_miss:
            return "either"
        if self.two_folded_steps(layer):
            return "either" if layer.expressible else "kept"
        return "fused" if layer.expressible else "kept"

    def own_step(self, layer: LayerSpec) -> bool:
        """Whether the portable form writes ``layer``'s node as a Scan of its own step: its functions are not its
        kind's defaults (tract and onnx.reference compute the defaults whatever a node names, OpenVINO refuses
        HardSigmoid), unless it is a masked LSTM whose final c is read (its node keeps its sequence_lens)."""
        if self.target != "portable":
            return False
        if layer.cell is not None:
            return layer.cell == "standard_linear"
        defaults = layer.activation == "tanh" and layer.recurrent_activation in (None, "sigmoid")
        c_read = layer.kind == "LSTM" and self.mask != "none" and self.return_state and layer is self.layers[-1]
        return not defaults and not c_read

    def two_folded_steps(self, layer: LayerSpec) -> bool:
        """Two unrolled steps at a fixed batch, the first folded with its constant zero states: nothing is
        left to compare it with. The layer may stay for that reason, whatever its type (a float64 layer's
        reason then says so, not its type)."""
        return layer.unroll and self.fixed_time == 2 and self.fixed_batch is not None

    def two_nodes(self, layer: LayerSpec) -> bool:
        """A Bidirectional layer whose halves are two nodes: in the onnxruntime form's Scans (one per
        direction) and, masked, in the portable form (each runs forward over its compacted steps) and unrolled
        with its sequence used (Keras zeroes the output at masked steps after the chain, the node carries it)."""
        masked_apart = self.mask != "none" and (layer.unroll or self.target == "portable")
        return layer.bidirectional and (masked_apart or self.fused_op(layer) == "Scan")

    def fused_op(self, layer: LayerSpec) -> str:
        """What a fused layer's report rows say it became: its native op, or the onnxruntime form's Scan."""
        return "Scan" if self.target == "onnxruntime" and layer.kind == "SimpleRNN" else helpers.ONNX_OP[layer.kind]

    @property
    def tolerance(self) -> float:
        return FLOAT16_TOLERANCE if self.dtype in HALF_POLICIES else TOLERANCE

    def state_sizes(self) -> list:
        first = self.layers[0]
        return [first.units] * (STATE_COUNT[first.kind] * first.directions) if self.initial_state else []

    def input_names(self) -> list:
        return ["x"] + (["m"] if self.mask == "input" else []) + [f"init_{j}" for j in range(len(self.state_sizes()))]

    def input_signature(self) -> Optional[list]:
        """TensorSpecs with the fixed dimensions, or None (the converter's default: dynamic)."""
        if self.fixed_batch is None and self.fixed_time is None:
            return None
        import tensorflow as tf

        batch, time_ = self.fixed_batch, self.fixed_time
        specs = [tf.TensorSpec((batch, time_, self.features), tf.float32, name="x")]
        if self.mask == "input":
            specs.append(tf.TensorSpec((batch, time_), tf.bool, name="m"))
        return specs + [tf.TensorSpec((batch, size), tf.float32, name=f"init_{j}")
                        for j, size in enumerate(self.state_sizes())]


@dataclass(frozen=True)
class Round:
    batch: int
    time: int
    data_seed: int
    rows: Optional[tuple] = None  # masked models: one "1"/"0" string (kept/padded) per batch row

    def mask(self) -> np.ndarray:
        return np.array([[c == "1" for c in row] for row in self.rows], dtype=bool).reshape(self.batch, self.time)


@dataclass(frozen=True)
class Example:
    spec: ModelSpec
    rounds: tuple  # of Round


# -- strategies ---------------------------------------------------------------------------------

@st.composite
def layer_specs(draw, flavor: str, last: bool, with_cells: bool = False, float64: bool = False) -> LayerSpec:
    if with_cells and draw(st.integers(0, 5)) == 5:  # about one layer in six: a hand-written cell
        cell = draw(st.sampled_from(cells.CELLS))
        return LayerSpec(kind=cell.family, units=cells.UNITS, activation="tanh", cell=cell.name,
                         go_backwards=draw(st.booleans()), return_sequences=draw(st.booleans()) if last else True)
    kind = draw(st.sampled_from(KINDS))
    units = draw(st.integers(1, 8))
    activation = draw(st.sampled_from(ACTIVATIONS))
    recurrent = draw(st.sampled_from(RECURRENT_ACTIVATIONS)) if kind != "SimpleRNN" else None
    # about one layer in ten gets an activation ONNX cannot express (shrinks away from it); not a float64
    # layer, whose reason must name its type (the type is checked once the activations are read)
    if not float64 and draw(st.integers(0, 9)) == 9:
        if recurrent is not None and draw(st.booleans()):
            recurrent = INEXPRESSIBLE
        else:
            activation = INEXPRESSIBLE
    merge_mode = draw(st.sampled_from(MERGE_MODES)) if draw(st.booleans()) else None
    return LayerSpec(
        kind=kind, units=units, activation=activation, recurrent_activation=recurrent,
        reset_after=draw(st.booleans()) if kind == "GRU" else None,
        use_bias=draw(st.integers(0, 4)) != 4,  # mostly with bias
        # Keras 3's Bidirectional always makes its backward copy go_backwards=True and refuses a
        # forward layer that goes backwards too; tf_keras swaps the two directions instead
        go_backwards=draw(st.booleans()) if flavor == "tf_keras" or merge_mode is None else False,
        return_sequences=draw(st.booleans()) if last else True,
        merge_mode=merge_mode)


@st.composite
def model_specs(draw, flavor: str) -> ModelSpec:
    depth = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(DTYPES))
    layers = tuple(draw(layer_specs(flavor, last=i == depth - 1, with_cells=True, float64=dtype == "float64"))
                   for i in range(depth))
    mask = draw(st.sampled_from(MASKS))
    # the states are float32 model inputs: tf_keras refuses them for a layer of another type, Keras 3 casts them
    initial_state = draw(st.booleans()) and (dtype == "float32" or flavor == "keras3")
    fixed_time = draw(st.one_of(st.none(), st.integers(1, 7)))
    if fixed_time is not None and fixed_time >= 2:  # unroll=True needs a known number of steps
        layers = tuple(dataclasses.replace(ls, unroll=draw(st.booleans())) for ls in layers)
    gpu_machine = flavor == "keras3" and draw(st.integers(0, 3)) == 3
    if gpu_machine:  # mostly LSTM and GRU layers cuDNN takes (Keras's defaults), which become cuDNN ops there
        layers = tuple(dataclasses.replace(ls, **CUDNN_DEFAULTS[ls.kind])
                       if ls.kind in CUDNN_DEFAULTS and ls.cell is None and draw(st.integers(0, 3)) != 0 else ls
                       for ls in layers)
    return ModelSpec(
        features=draw(st.integers(1, 6)), layers=layers, mask=mask, initial_state=initial_state,
        # Keras 3 only (its implicit mask is dropped when initial_state is given); in tf_keras the
        # mask propagates anyway, and its KerasTensor mask passed as mask= breaks the model
        explicit_upstream_mask=(draw(st.booleans()) if flavor == "keras3" and mask == "masking" and initial_state
                                else False),
        return_state=draw(st.booleans()),
        weight_seed=draw(st.integers(0, 2**32 - 1)),
        fixed_batch=draw(st.one_of(st.none(), st.integers(1, 4))),
        fixed_time=fixed_time, dtype=dtype, target=draw(st.sampled_from(TARGETS)), gpu_machine=gpu_machine)


@st.composite
def mask_rows(draw, time: int) -> str:
    """One row's mask as a "1"/"0" string, of a drawn kind."""
    kind = draw(st.sampled_from(ROW_KINDS))
    t = np.arange(time)
    if kind == "full":
        row = t >= 0
    elif kind == "empty":
        row = t < 0
    elif kind in ("post", "pre"):
        kept = draw(st.integers(1, max(1, time - 1)))
        row = t < kept if kind == "post" else t >= time - kept
    else:  # holed: both ends kept, at least one hole between (when time allows), the rest drawn
        row = np.array(draw(st.lists(st.booleans(), min_size=time, max_size=time)), dtype=bool)
        if time >= 3:
            row[0] = row[-1] = True
            row[draw(st.integers(1, time - 2))] = False
    return "".join("1" if kept else "0" for kept in row)


@st.composite
def rounds_for(draw, spec: ModelSpec) -> Round:
    batch = spec.fixed_batch if spec.fixed_batch is not None else draw(st.integers(1, 4))
    time = spec.fixed_time if spec.fixed_time is not None else draw(st.integers(1, 7))
    rows = tuple(draw(mask_rows(time)) for _ in range(batch)) if spec.mask != "none" else None
    return Round(batch=batch, time=time, data_seed=draw(st.integers(0, 2**16)), rows=rows)


@st.composite
def examples(draw, flavor: str) -> Example:
    spec = draw(model_specs(flavor))
    return Example(spec, tuple(draw(st.lists(rounds_for(spec), min_size=1, max_size=2))))


# -- building and feeding -----------------------------------------------------------------------

def layer_name(index: int, layer: LayerSpec) -> str:
    return f"fz{index}_{SCOPE_NAME[layer.kind]}"


LAYER_INDEX = re.compile(r"fz(\d+)_")  # the report names fz<i>_<kind> (or forward_/backward_ fz<i>_...)


def flatten(out) -> list:
    if isinstance(out, (list, tuple)):
        return [leaf for item in out for leaf in flatten(item)]
    return [out]


def build_model(flavor: str, spec: ModelSpec):
    K = parity.keras_module(flavor)
    if spec.dtype not in HALF_POLICIES:
        return _build_model(K, spec)
    previous = K.mixed_precision.global_policy()
    K.mixed_precision.set_global_policy(spec.dtype)
    try:
        return _build_model(K, spec)
    finally:
        K.mixed_precision.set_global_policy(previous)


def _build_model(K, spec: ModelSpec):
    L = K.layers
    time_ = spec.fixed_time if any(ls.unroll for ls in spec.layers) else None  # unrolling needs the time
    x = K.Input((time_, spec.features), name="x")
    inputs, h, mask = [x], x, None
    if spec.mask == "masking":
        h = L.Masking(mask_value=0.0, name="fz_masking")(x)
    elif spec.mask == "input":
        mask = K.Input((time_,), dtype="bool", name="m")
        inputs.append(mask)
    outputs = []
    for index, ls in enumerate(spec.layers):
        last = index == len(spec.layers) - 1
        kwargs = dict(go_backwards=ls.go_backwards, return_sequences=ls.return_sequences,
                      return_state=last and spec.return_state, unroll=ls.unroll)
        if spec.dtype == "float64":
            kwargs["dtype"] = "float64"
        if ls.cell is not None:
            cell = next(c for c in cells.CELLS if c.name == ls.cell)
            layer = L.RNN(cells.cell_layer(K, cell, ls.units, **({"dtype": "float64"} if "dtype" in kwargs else {})),
                          name=layer_name(index, ls), **kwargs)
        else:
            kwargs.update(activation=ls.activation, use_bias=ls.use_bias)
            if ls.recurrent_activation is not None:
                kwargs["recurrent_activation"] = ls.recurrent_activation
            if ls.reset_after is not None:
                kwargs["reset_after"] = ls.reset_after
            layer = getattr(L, ls.kind)(ls.units, name=layer_name(index, ls), **kwargs)
        if ls.bidirectional:
            layer = L.Bidirectional(layer, merge_mode=ls.merge_mode, name=f"fz{index}_bi")
        call = {}
        if index == 0:
            if mask is not None:
                call["mask"] = mask
            elif spec.explicit_upstream_mask:
                call["mask"] = h._keras_mask
            if spec.initial_state:
                states = [K.Input((size,), name=f"init_{j}") for j, size in enumerate(spec.state_sizes())]
                inputs += states
                call["initial_state"] = states
        out = layer(h, **call)
        if last:
            outputs = flatten(out)
        else:
            h = out
    model = K.Model(inputs if len(inputs) > 1 else inputs[0], outputs if len(outputs) > 1 else outputs[0],
                    name="fuzz")
    parity.randomize_weights(model, spec.weight_seed, scale=WEIGHT_SCALE)
    return model


def make_feeds(spec: ModelSpec, rnd: Round) -> list:
    """Arrays in the model's input order (``spec.input_names()``)."""
    rng = np.random.default_rng(rnd.data_seed)
    x = rng.standard_normal((rnd.batch, rnd.time, spec.features)).astype(np.float32)
    arrays = [x]
    if spec.mask == "masking":
        x[~rnd.mask()] = 0.0  # padded steps are all-zero vectors; kept ones are never all zero
    elif spec.mask == "input":
        arrays.append(rnd.mask())
    arrays += [rng.standard_normal((rnd.batch, size)).astype(np.float32) for size in spec.state_sizes()]
    return arrays


# -- the property -------------------------------------------------------------------------------



def structure_problems(spec: ModelSpec, proto: onnx.ModelProto) -> tuple:
    """(problems, notes, stats) for the report and the graph's nodes.

    Problems break the property; a Bidirectional layer must be one ``bidirectional`` node and
    there must be one native node per fused layer. Notes ("<tag>: <details>") are kept for
    shortfalls that leave the conversion exact; they are counted and logged, not failed."""
    from tf2onnx_rnn import report_of

    problems, notes = [], []
    report = report_of(proto)
    if report is None:
        return ["no conversion report in the model's metadata"], [], {}
    outcomes = list(report.outcomes)
    nodes = {n.name: n for n in helpers.all_nodes(proto.graph)}
    native = helpers.nodes_of_types(proto, helpers.RECURRENT_OPS)
    loops = helpers.nodes_of_types(proto, helpers.LOOP_OPS)
    stats = dict(loops=len(outcomes), fused=sum(o.fused for o in outcomes),
                 kept=sum(not o.fused for o in outcomes), native_nodes=len(native), loop_nodes=len(loops))

    # every entry: fused into an existing native node, or a Loop with a reason
    for o in outcomes:
        if o.own_step and o.became == "Scan" and spec.target == "portable":
            if getattr(nodes.get(o.node), "op_type", None) != "Scan":
                problems.append(f"{o.layer}: a Scan of its own step names node {o.node!r}, not a Scan")
        elif o.fused:
            node = nodes.get(o.node)
            if o.became not in helpers.RECURRENT_OPS | ({"Scan"} if spec.target == "onnxruntime" else set()):
                problems.append(f"{o.layer}: became {o.became!r}, neither a native op nor Loop")
            elif node is None or node.op_type != o.became:
                problems.append(f"{o.layer}: became {o.became} but names node {o.node!r}, not such a node")
        elif not o.reason.strip():
            problems.append(f"{o.layer}: stays a Loop without a reason")
        elif o.reason.startswith("internal error"):
            problems.append(f"{o.layer}: {o.reason}")

    # per layer: the expected number of entries, fused iff its activations are expressible
    by_layer: dict = {}
    for o in outcomes:
        found = LAYER_INDEX.search(o.layer)
        if found is None or int(found.group(1)) >= len(spec.layers):
            problems.append(f"report entry for an unknown layer {o.layer!r}")
            continue
        by_layer.setdefault(int(found.group(1)), []).append(o)
    fused_nodes = 0
    fused_scans = set()  # the onnxruntime form's SimpleRNN Scans, one per direction
    for index, ls in enumerate(spec.layers):
        entries = by_layer.get(index, [])
        name = layer_name(index, ls)
        expectation = spec.expectation(ls)
        if len(entries) != ls.directions:
            problems.append(f"{name}: {len(entries)} report entries, expected {ls.directions}")
        # an unrolled masked Bidirectional carries the output at masked steps (Keras zeroes it after
        # the chain): when its sequence is used, its halves cannot share one node
        two_nodes = spec.two_nodes(ls)
        if bool(entries) and all(o.fused for o in entries):
            if spec.fused_op(ls) == "Scan":
                fused_scans.update(o.node for o in entries)
            else:
                fused_nodes += len({o.node for o in entries}) if two_nodes else 1
        kept_as = "unrolled ops" if ls.unroll else "Scan"  # a loop no native node computes: a Scan of its step
        for o in entries:
            own_scan = spec.own_step(ls) and o.own_step and o.became == "Scan"  # a node the portable form's
            # runtimes do not compute: a Scan of the node's own step
            if not o.fused and o.became != kept_as and not (kept_as == "Scan" and o.became == "Loop") \
                    and not own_scan:
                problems.append(f"{o.layer}: became {o.became!r}, expected {kept_as} (or fused)")
            if o.fused and o.became != spec.fused_op(ls):
                problems.append(f"{o.layer}: became {o.became}, expected {spec.fused_op(ls)}")
            if o.fused and o.unrolled != (spec.fixed_time if ls.unroll else 0):
                problems.append(f"{o.layer}: reported {o.unrolled} unrolled steps")
        if expectation == "fused":
            unfused = [f"{o.layer}: {o.reason}" for o in entries if not o.fused
                       and not (spec.own_step(ls) and o.own_step and o.became == "Scan")]
            if spec.own_step(ls) and any(o.fused for o in entries):
                problems.append(f"{name}: a native node in the portable form, with functions its runtimes lack")
            if unfused:
                cell = f"{ls.cell or ls.activation}/{ls.recurrent_activation}"
                problems.append(f"{name} ({cell}) was not fused: {unfused}")
            if ls.bidirectional and not two_nodes and len(entries) == 2 and all(o.fused for o in entries):
                node = nodes.get(entries[0].node)
                if entries[0].node != entries[1].node or node is None or helpers.direction_of(node) != "bidirectional":
                    count = len({o.node for o in entries})
                    problems.append(f"Bidirectional as two nodes: {name}: Bidirectional became {count} nodes, "
                                    f"not one bidirectional node: {[(o.node, o.node_direction) for o in entries]}")
        elif expectation == "kept":
            fused = [o.layer for o in entries if o.fused]
            if fused:
                problems.append(f"{name} ({spec.dtype}, {ls.activation}) must stay as it is but was fused: {fused}")
            named = all("float64" in o.reason for o in entries)
            # a near-miss cell no native node computes in any type is refused for its formula, which is read
            # before its type is looked at: its reason is that mismatch ("not a GRU cell: ..."), true in float64
            refused = ls.near_miss and all(o.reason.startswith(f"not a {ls.kind} cell") for o in entries)
            # an unrolled chain is read before its type is looked at: its reason may be the chain's (a float64
            # chain's ops are not float32's: tf2onnx folds them otherwise), kept as its ops either way
            if spec.dtype == "float64" and not named and not refused and not ls.unroll:
                reasons = [o.reason for o in entries]
                problems.append(f"{name}: a float64 layer's reason does not name the type: {reasons}")

    if len(native) != fused_nodes:
        problems.append(f"more native nodes than layers: {len(native)} native recurrent nodes "
                        f"{[(n.op_type, helpers.direction_of(n)) for n in native]}, expected {fused_nodes}")
    if spec.target == "portable":  # tract runs a reverse node forward
        reverse = [n.name for n in native if helpers.direction_of(n) == "reverse"]
        if reverse:
            problems.append(f"portable form with reverse nodes: {reverse}")
    form_scans = [n for n in loops if n.name in fused_scans and n.op_type == "Scan"]
    if len(form_scans) != len(fused_scans):
        problems.append(f"onnxruntime form: rows name Scans {sorted(fused_scans)}, the graph has "
                        f"{[n.name for n in form_scans]}")
    loops = [n for n in loops if n.name not in fused_scans]
    loop_rows = sum(o.became == "Loop" or o.own_step for o in outcomes)
    own_scans = {o.node for o in outcomes if o.own_step and o.became == "Scan" and spec.target == "portable"}
    if all(spec.expectation(ls) == "fused" for ls in spec.layers) and [n for n in loops if n.name not in own_scans]:
        problems.append(f"Loop/Scan nodes left: {[(n.op_type, n.name) for n in loops]}")
    scans = [n.name for n in loops if n.op_type == "Scan" and n.name not in {o.node for o in outcomes}]
    if scans:
        problems.append(f"Scan nodes: {scans}")
    if len(loops) != loop_rows:
        problems.append(f"{loop_rows} loop(s) reported kept as Loop, the graph has {len(loops)} Loop node(s)")
    return problems, notes, stats


def parity_problems(spec: ModelSpec, model, proto: onnx.ModelProto, rounds) -> tuple:
    """(problems, max abs error over every round and output)."""
    problems, worst = [], 0.0
    initializers = {t.name for t in proto.graph.initializer}
    graph_inputs = [i.name for i in proto.graph.input if i.name not in initializers]
    if sorted(graph_inputs) != sorted(spec.input_names()):
        return [f"ONNX inputs {graph_inputs}, expected {spec.input_names()}"], float("nan")
    session = helpers.ort_session(proto)
    for index, rnd in enumerate(rounds):
        label = f"round {index} (batch {rnd.batch}, time {rnd.time}, rows {rnd.rows})"
        arrays = make_feeds(spec, rnd)
        expected = parity.keras_outputs(model, arrays)
        if not all(np.all(np.isfinite(value)) for value in expected):
            # Keras's own values overflow (relu layers that grow without bound): nothing to compare with
            reject()
        actual = parity.run_onnx(session, spec.input_names(), arrays)
        found, error = parity.output_problems(label, [o.name for o in proto.graph.output], expected, actual,
                                              spec.tolerance, relative=RELATIVE)
        problems += found
        worst = max(worst, error) if error == error else float("nan")
    return problems, worst


def check_example(flavor: str, example: Example) -> dict:
    """Build, convert and check one example; raises AssertionError listing every problem.
    Returns the example's statistics."""
    from tf2onnx_rnn import convert_keras

    spec = example.spec
    started = time.perf_counter()
    record = dict(flavor=flavor, ok=False, expressible=spec.expressible, layers=len(spec.layers), mask=spec.mask,
                  signature=(spec.fixed_batch, spec.fixed_time), target=spec.target)
    if LOG:  # first the example alone: a run the process does not survive (a runtime's crash) still names it
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(dict(flavor=flavor, started=True, example=asdict(example))) + "\n")
    try:
        model = build_model(flavor, spec)
        with cudnn_graphs.gpu_machine() if spec.gpu_machine else contextlib.nullcontext():
            proto = convert_keras(model, input_signature=spec.input_signature(), target=spec.target)
        problems = []
        try:
            onnx.checker.check_model(proto, full_check=True)
        except Exception as error:  # noqa: BLE001 - reported with the rest
            problems.append(f"onnx.checker.check_model(full_check=True): {type(error).__name__}: {error}")
        structural, notes, stats = structure_problems(spec, proto)
        record.update(stats, notes=notes)
        problems += structural
        numeric, worst = parity_problems(spec, model, proto, example.rounds)
        record["max_abs_error"] = worst
        problems += numeric
        if spec.gpu_machine:
            problems += exported_on_a_gpu_machine(spec, model, proto, example.rounds, record)
        if problems:
            raise AssertionError(f"{flavor} {example}:\n- " + "\n- ".join(problems) + "\n"
                                 + parity.report_table(proto))
        record["ok"] = True
    except UnsatisfiedAssumption:
        record["rejected"] = True
        raise
    except Exception as error:
        record["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
        raise
    finally:
        record["seconds"] = round(time.perf_counter() - started, 3)
        if LOG:
            with open(LOG, "a", encoding="utf-8") as log:
                log.write(json.dumps(dict(record, example=asdict(example))) + "\n")
    return record


def exported_on_a_gpu_machine(spec: ModelSpec, model, proto: onnx.ModelProto, rounds, record: dict) -> list:
    """Problems of the model exported on a GPU machine and converted from its SavedModel, against the
    conversion of the live model (``proto``) and Keras on the CPU (see the module's docstring)."""
    from tf2onnx_rnn import convert_saved_model

    first = spec.layers[0]
    if spec.dtype == "float64" or (spec.initial_state and len(spec.layers) == 1 and not first.return_sequences
                                   and spec.mask != "none"):
        return []
    import tensorflow as tf

    path = cudnn_graphs.export_on_gpu_machine(model, f"fuzz-{spec.weight_seed}-{time.perf_counter_ns()}")
    if not cudnn_graphs.cudnn_ops(tf.saved_model.load(path).signatures["serve"].graph.as_graph_def()):
        return []
    record["cudnn_ops"] = True
    exported = convert_saved_model(path, target=spec.target)
    problems = []

    def recurrent(graph) -> list:
        nodes = helpers.nodes_of_types(graph, helpers.RECURRENT_OPS)
        return sorted((n.op_type, helpers.direction_of(n)) for n in nodes)

    if recurrent(exported) != recurrent(proto):
        problems.append(f"exported on a GPU machine: recurrent nodes {recurrent(exported)}, the live model's "
                        f"{recurrent(proto)}")
    if len(helpers.nodes_of_types(exported, helpers.LOOP_OPS)) > len(helpers.nodes_of_types(proto, helpers.LOOP_OPS)):
        problems.append("exported on a GPU machine: more Loop/Scan nodes than the live model's conversion")
    numeric, _ = parity_problems(spec, model, exported, rounds)
    return problems + [f"exported on a GPU machine: {problem}" for problem in numeric]


# -- settings and the tests ---------------------------------------------------------------------

def fuzz(test):
    """Apply the fuzz settings: derandomized unless TF2ONNX_RNN_FUZZ_SEED says otherwise."""
    test = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not SEED,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
                    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example, HealthCheck.filter_too_much),
                    print_blob=False)(test)
    if SEED and SEED.lower() != "random":
        test = seed(int(SEED))(test)
    return test


def run_property(flavor: str, example: Example) -> None:
    record = check_example(flavor, example)
    event(f"{record['fused']} loop(s) fused, {record['kept']} left as Loop")
    event(f"mask: {example.spec.mask}; {len(example.spec.layers)} layer(s)")
    event(f"element type: {example.spec.dtype}; target: {example.spec.target or 'default'}")
    event("signature: batch " + str(example.spec.fixed_batch or "dynamic") + ", time "
          + str(example.spec.fixed_time or "dynamic"))
    for text in record["notes"]:
        note(f"structure note: {text}")
        event("structure note: " + text.split(":")[0])


@fuzz
@given(example=examples(parity.FLAVORS[0]))
def test_fuzz_keras(example: Example):
    run_property(parity.FLAVORS[0], example)


@fuzz
@given(example=examples("tf_keras"))
def test_fuzz_tf_keras(example: Example):
    run_property("tf_keras", example)


# -- streaming ----------------------------------------------------------------------------------
# The same space, narrowed to what streams (one-direction forward layers ONNX can express, no
# initial_state from the model): a sequence cut at random chunk boundaries, each chunk's state
# outputs fed as the next chunk's state inputs from zeros, must give Keras's outputs on the whole
# sequence (masked rows of every kind included).

@st.composite
def streaming_examples(draw, flavor: str) -> tuple:
    spec = draw(model_specs(flavor))
    layers = tuple(LayerSpec(kind=ls.kind, units=ls.units,
                             activation=ls.activation if ls.activation != INEXPRESSIBLE else "tanh",
                             recurrent_activation=(ls.recurrent_activation if ls.recurrent_activation != INEXPRESSIBLE
                                                   else "sigmoid"),
                             reset_after=ls.reset_after, use_bias=ls.use_bias, return_sequences=ls.return_sequences)
                   for ls in spec.layers)
    spec = ModelSpec(features=spec.features, layers=layers, mask=spec.mask, weight_seed=spec.weight_seed)
    batch, time_ = draw(st.integers(1, 4)), draw(st.integers(2, 9))
    rows = tuple(draw(mask_rows(time_)) for _ in range(batch)) if spec.mask != "none" else None
    cuts = sorted(draw(st.sets(st.integers(1, time_ - 1), min_size=1, max_size=time_ - 1)))
    chunks = tuple(b - a for a, b in zip([0] + cuts, cuts + [time_]))
    return Example(spec, (Round(batch=batch, time=time_, data_seed=draw(st.integers(0, 2**16)), rows=rows),)), chunks


def check_streaming(flavor: str, example: Example, chunks: tuple) -> None:
    from tf2onnx_rnn import convert_keras, report_of

    spec, (rnd,) = example.spec, example.rounds
    model = build_model(flavor, spec)
    proto = convert_keras(model, streaming=True)
    arrays = make_feeds(spec, rnd)
    (whole,) = parity.keras_outputs(model, arrays)
    streamed = {name for row in report_of(proto).outcomes for name in row.state_inputs}
    states = {i.name: np.zeros((rnd.batch, i.type.tensor_type.shape.dim[1].dim_value), np.float32)
              for i in proto.graph.input if i.name in streamed}
    assert len(states) == sum(STATE_COUNT[layer.kind] for layer in spec.layers), sorted(states)
    session = helpers.ort_session(proto)
    names = [o.name for o in session.get_outputs()]
    outputs, start = [], 0
    for size in chunks:
        feeds = dict(zip(spec.input_names(), [a[:, start:start + size] for a in arrays]), **states)
        result = dict(zip(names, session.run(None, feeds)))
        outputs.append(result[names[0]])
        states = {name: result[name[:-len("in")] + "out"] for name in states}
        start += size
    chunked = np.concatenate(outputs, axis=1) if spec.layers[-1].return_sequences else outputs[-1]
    problems, _ = parity.output_problems(f"{chunks} chunks", names[:1], [whole], [chunked], TOLERANCE)
    assert not problems, f"{flavor} {example} chunks {chunks}:\n- " + "\n- ".join(problems) + "\n" + \
        parity.report_table(proto)


@fuzz
@given(drawn=streaming_examples(parity.FLAVORS[0]))
def test_fuzz_streaming_keras(drawn):
    check_streaming(parity.FLAVORS[0], *drawn)


@fuzz
@given(drawn=streaming_examples("tf_keras"))
def test_fuzz_streaming_tf_keras(drawn):
    check_streaming("tf_keras", *drawn)
