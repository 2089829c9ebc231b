"""Converted models in PyTorch, through onnx2torch 1.5.15 and this directory's recurrent converters.

- Every model of the downstream matrix (``downstream_models.py``: masked models in the portable
  form, unmasked ones in the default and the portable form; Keras 3's, and tf_keras's for the
  matrix's main cases) converts with ``onnx2torch.convert`` and gives Keras's outputs within 1e-4.
  The portable form holds no ``ReverseSequence``, ``Loop`` or ``Scan`` (onnx2torch has no
  converter for them) and writes out every ``CumSum``'s attributes (onnx2torch takes an absent
  ``reverse`` as 1). The default form of the masked models holds ``If`` nodes (its compaction decided
  at run time), which onnx2torch 1.5.15 does not convert: pinned, so that the day it does is seen.
- The converters (``recurrent_converters.py``) on single LSTM, GRU and RNN nodes, against
  onnxruntime within 1e-5: every direction, ``sequence_lens`` (rows full, shorter and empty),
  initial states, peepholes, ``clip``, ``input_forget``, ``linear_before_reset``, activation
  lists with their alphas and betas, layout 1 (onnxruntime's CPU kernels refuse it: the layout-0
  node on transposed inputs is the reference), opsets 1 (GRU-1's default direction), 7, 14 and
  the newest the installed onnx defines (onnxruntime runs the node at opset 14 where it lacks the
  node's own), skipped inputs and outputs, weights given as inputs or computed.
- What onnx2torch 1.5.15 reads otherwise than ONNX, pinned so that the day it changes is seen.

Skipped where torch or onnx2torch is not installed (the main environment); CI runs these in its
training environment (``.ci/training-requirements.txt`` plus onnx2torch), under onnxruntime 1.19.2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch", reason="needs torch and onnx2torch (CI's training environment)")
onnx2torch = pytest.importorskip("onnx2torch", reason="needs torch and onnx2torch (CI's training environment)")

import recurrent_converters  # noqa: E402 - registers the converters

import helpers  # noqa: E402
import parity  # noqa: E402
import runtime_models  # noqa: E402
from downstream_models import (  # noqa: E402
    CASES,
    DEFAULT,
    FLAVOR,
    MATRIX,
    PORTABLE,
    Case,
    consumer_problems,
    converted,
    has_sequence_lens,
)

TOLERANCE = 1e-4  # Keras vs PyTorch
NODE_TOLERANCE = 1e-5  # onnxruntime vs PyTorch, on one node


@pytest.fixture(scope="session")
def downstream_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("downstream-pytorch")


def run_torch(proto: onnx.ModelProto, *inputs: np.ndarray) -> list:
    """``onnx2torch.convert`` of the model, run on the inputs: its outputs as arrays."""
    module = onnx2torch.convert(proto)
    with torch.no_grad():
        result = module(*[torch.from_numpy(array) for array in inputs])
    return [r.numpy() for r in ([result] if isinstance(result, torch.Tensor) else result)]


# -- the matrix ---------------------------------------------------------------------------------

# tf_keras's models too, the matrix's main cases (Keras 3's graphs and tf_keras's differ before conversion)
FLAVORED = [(case, form, FLAVOR) for case, form in MATRIX] + \
    [(case, form, parity.FLAVORS[1]) for case, form in MATRIX if case in CASES]


@pytest.mark.parametrize("case, form, flavor", FLAVORED,
                         ids=[f"{flavor}-{case.id}-{form}" for case, form, flavor in FLAVORED])
def test_runs_in_pytorch(case: Case, form: str, flavor: str, downstream_dir):
    """Within 1e-4 of Keras in PyTorch; the portable form holds nothing onnx2torch lacks or misreads."""
    entry = converted(case, form, downstream_dir, flavor)
    problems = []
    if form == PORTABLE:
        problems += consumer_problems(entry.proto)
        problems += [f"{n.op_type} {n.name}" for n in helpers.nodes_of_types(entry.proto, helpers.LOOP_OPS)]
    try:
        actual = run_torch(entry.proto, entry.x)
        problems += parity.output_problems("PyTorch", [f"output {i}" for i in range(len(entry.expected))],
                                           entry.expected, actual, TOLERANCE)[0]
    except Exception as error:  # noqa: BLE001 - reported with the others
        problems.append(f"onnx2torch failed: {type(error).__name__}: {str(error).splitlines()[0]}")
    assert not problems, f"{case.id}-{form}:\n- " + "\n- ".join(problems)


@pytest.mark.parametrize("flavor", parity.FLAVORS)
@pytest.mark.parametrize("name", runtime_models.MODELS)
@pytest.mark.parametrize("form", runtime_models.FORMS)
def test_where_the_report_names_onnx2torch_pytorch_computes_the_model(form: str, name: str, flavor: str):
    """The claims of the report's "runs in" line for onnx2torch (with these converters for the recurrent
    nodes, which onnx2torch lacks) hold on the runtime tests' models in every form
    (``test_runtime_claims.py`` checks the other runtimes' claims on the same models)."""
    from tf2onnx_rnn import ConversionError, report_of

    x, want, proto = runtime_models.converted(flavor, name, form)
    if isinstance(proto, ConversionError) or "onnx2torch" not in report_of(proto).runs_in:
        pytest.skip("the report does not name onnx2torch")
    problems = parity.output_problems("PyTorch", [f"output {i}" for i in range(len(want))], want,
                                      run_torch(proto, x), TOLERANCE)[0]
    assert not problems, f"{form} {name} ({flavor}):\n- " + "\n- ".join(problems)


@pytest.mark.parametrize("case", [c for c in CASES if c.masked], ids=lambda case: case.id)
def test_default_masked_form_needs_if_which_onnx2torch_lacks(case: Case, downstream_dir):
    """Without the target a masked layer's node takes its computed sequence_lens, and ``If`` nodes decide
    at run time whether a batch needs its compaction (onnxruntime's form of choice: a post-padded batch
    pays nothing for it). onnx2torch 1.5.15 has no ``If`` converter: PyTorch's road is the portable form,
    exact in every test of the matrix above. Fails the day onnx2torch converts ``If``, so that the
    default masked form can join the matrix again."""
    entry = converted(case, DEFAULT, downstream_dir)
    assert any(has_sequence_lens(n) for n in helpers.nodes_of_types(entry.proto, helpers.RECURRENT_OPS))
    assert helpers.nodes_of_types(entry.proto, {"If"}), "the default masked form decides at run time"
    with pytest.raises(Exception, match=r"operation_type='If'"):
        run_torch(entry.proto, entry.x)


# -- the converters on single nodes ---------------------------------------------------------------

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
OUTPUTS = ("Y", "Y_h", "Y_c")
TIME, FEATURES, HIDDEN = 5, 4, 3
NEWEST = "newest"  # the newest opset at which the installed onnx defines the op


@dataclass(frozen=True)
class Node:
    op: str
    direction: str = "forward"
    inputs: tuple = ("B", "initial_h", "initial_c")  # optional inputs given (LSTM-only ones dropped elsewhere)
    lens: Optional[tuple] = (5, 3, 0)  # sequence_lens (one per row), or None
    outputs: tuple = OUTPUTS  # declared outputs ("" skips one)
    attributes: tuple = ()  # (name, value) pairs
    opset: object = 14
    layout: int = 0
    weights: str = "initializers"  # or "inputs", "computed"
    label: str = ""
    reference: dict = field(default_factory=dict, compare=False)  # attributes given to onnxruntime instead

    @property
    def id(self) -> str:
        return "-".join(filter(None, (self.op, self.direction, f"opset{self.opset}", self.label)))

    @property
    def directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def version(self) -> int:
        return max(recurrent_converters.defined_versions(self.op)) if self.opset == NEWEST else self.opset


def _acts(*lists) -> tuple:
    """activations, activation_alpha, activation_beta from (names, alphas, betas), direction by direction."""
    attributes = (("activations", [n for names, _, _ in lists for n in names]),
                  ("activation_alpha", [a for _, alphas, _ in lists for a in alphas]),
                  ("activation_beta", [b for _, _, betas in lists for b in betas]))
    return tuple((name, values) for name, values in attributes if values)


DIRECTIONS = ("forward", "reverse", "bidirectional")
# activation lists, each direction's own, with alphas and betas
LSTM_ACTIVATIONS = _acts((["HardSigmoid", "ScaledTanh", "Elu"], [0.25, 1.5, 0.8], [0.45, 0.7]),
                         (["Sigmoid", "LeakyRelu", "Softsign"], [0.05], []))
GRU_ACTIVATIONS = _acts((["HardSigmoid", "Affine"], [0.3, 0.9], [0.6, 0.1]),
                        (["Sigmoid", "ThresholdedRelu"], [0.1], []))
RNN_ACTIVATIONS = _acts((["Relu"], [], []), (["Softplus"], [], []))
# (onnxruntime 1.19.2's RNN takes the i-th function's alpha and beta at index i, not in order: here
# both functions take both, so the two readings agree)
RNN_PARAMETERS = _acts((["HardSigmoid"], [0.3], [0.6]), (["ScaledTanh"], [1.5], [0.7]))

NODES = [
    *(Node(op, direction, label="states-lens") for op in GATES for direction in DIRECTIONS),
    *(Node(op, opset=opset, lens=None, label="plain") for op in GATES for opset in (7, NEWEST)),
    Node("LSTM", "bidirectional", inputs=("B", "initial_h", "initial_c", "P"), attributes=(("clip", 0.6),),
         label="peepholes-clip"),
    Node("LSTM", "reverse", inputs=("B", "initial_c", "P"), attributes=(("input_forget", 1),), label="input_forget"),
    Node("GRU", "bidirectional", attributes=(("linear_before_reset", 1), ("clip", 0.7)), label="linear_before_reset"),
    Node("GRU", "reverse", inputs=("initial_h",), attributes=(("linear_before_reset", 1),), label="lbr-no-bias"),
    Node("LSTM", "bidirectional", attributes=LSTM_ACTIVATIONS, label="activations"),
    Node("GRU", "bidirectional", attributes=GRU_ACTIVATIONS, label="activations"),
    Node("RNN", "bidirectional", attributes=RNN_ACTIVATIONS, label="activations"),
    Node("RNN", "bidirectional", attributes=RNN_PARAMETERS, label="alphas-betas"),
    # alphas and betas left out: the ONNX operators' defaults, which onnxruntime is given written out
    # (it takes 0 for ThresholdedRelu's and ScaledTanh's, and for Affine's)
    Node("LSTM", attributes=_acts((["HardSigmoid", "ThresholdedRelu", "ScaledTanh"], [], [])), label="default-alphas",
         reference=dict(_acts((["HardSigmoid", "ThresholdedRelu", "ScaledTanh"], [0.2, 1.0, 1.0], [0.5, 1.0])))),
    Node("RNN", "bidirectional", attributes=_acts((["LeakyRelu"], [], []), (["Elu"], [], [])), label="default-alphas",
         reference=dict(_acts((["LeakyRelu"], [0.01], []), (["Elu"], [1.0], [])))),
    Node("LSTM", "bidirectional", opset=NEWEST, layout=1, label="layout1"),
    Node("GRU", opset=14, layout=1, inputs=("B",), lens=None, label="layout1"),
    Node("GRU", opset=1, inputs=("B",), lens=None, label="default-direction"),  # GRU-1's default is "foward"
    # skipped inputs beside skipped outputs (onnx2torch matches a "" input with a "" output)
    Node("LSTM", inputs=("B", "initial_h"), lens=None, outputs=("", "Y_h"), label="Y_h-only"),
    Node("LSTM", "reverse", inputs=("initial_c",), lens=None, outputs=("Y", "", "Y_c"), label="Y-Y_c"),
    Node("GRU", "bidirectional", outputs=("Y",), weights="inputs", label="Y-only-weights-inputs"),
    Node("RNN", "reverse", outputs=("", "Y_h"), weights="computed", label="Y_h-only-weights-computed"),
]


def node_arrays(node: Node) -> dict:
    """Layout-0 arrays of the node's inputs."""
    rng = np.random.default_rng(sum(map(ord, node.id)))
    dirs, width = node.directions, GATES[node.op] * HIDDEN

    def uniform(*shape, scale=0.6):
        return rng.uniform(-scale, scale, shape).astype(np.float32)

    arrays = {"X": uniform(TIME, 3, FEATURES, scale=1.0), "W": uniform(dirs, width, FEATURES),
              "R": uniform(dirs, width, HIDDEN), "B": uniform(dirs, 2 * width),
              "initial_h": uniform(dirs, 3, HIDDEN, scale=1.0), "initial_c": uniform(dirs, 3, HIDDEN, scale=1.0),
              "P": uniform(dirs, 3 * HIDDEN)}
    if node.lens is not None:
        arrays["sequence_lens"] = np.array(node.lens, dtype=np.int32)
    given = ("X", "W", "R", "sequence_lens") + node.inputs
    slots = INPUTS if node.op == "LSTM" else INPUTS[:6]
    return {name: arrays[name] for name in slots if name in given and name in arrays}


def to_layout1(arrays: dict) -> dict:
    return {k: (v.transpose(1, 0, 2).copy() if k in ("X", "initial_h", "initial_c") else v) for k, v in arrays.items()}


def output_shape(node: Node, name: str, layout: int) -> list:
    batch, dirs = 3, node.directions
    if name == "Y":
        return [batch, TIME, dirs, HIDDEN] if layout else [TIME, dirs, batch, HIDDEN]
    return [batch, dirs, HIDDEN] if layout else [dirs, batch, HIDDEN]


def node_model(node: Node, arrays: dict, opset: int, layout: int, attributes: dict) -> onnx.ModelProto:
    """The node alone; each declared output through an ``Add`` of 0 (onnx2torch returns a node's
    whole result for an output it gives the graph); weights as the node says."""
    slots = INPUTS if node.op == "LSTM" else INPUTS[:6]
    node_inputs = [name if name in arrays else "" for name in slots]
    while not node_inputs[-1]:
        node_inputs.pop()
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    nodes, initializers, inputs = [], [zero], []
    for name in filter(None, node_inputs):
        array = arrays[name]
        if name in ("W", "R", "B", "P") and node.weights != "inputs":
            stored = name if node.weights == "initializers" else f"{name}_stored"
            initializers.append(numpy_helper.from_array(array, stored))
            if node.weights == "computed":
                nodes.append(helper.make_node("Add", [stored, "zero"], [name]))
        else:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                        array.shape))
    attributes = {"hidden_size": HIDDEN, **({"layout": layout} if layout else {}), **attributes}
    if node.direction != "forward":
        attributes["direction"] = node.direction
    declared = list(node.outputs[:3 if node.op == "LSTM" else 2])
    nodes.append(helper.make_node(node.op, node_inputs, declared, name="recurrent", **attributes))
    outputs = []
    for name in filter(None, declared):
        nodes.append(helper.make_node("Add", [name, "zero"], [f"{name}_out"]))
        shape = output_shape(node, name, layout)
        outputs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, shape))
    graph = helper.make_graph(nodes, node.id, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=7 if opset < 21 else 10)
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds(model: onnx.ModelProto, arrays: dict) -> list:
    return [arrays[i.name] for i in model.graph.input]


def onnxruntime_reference(node: Node, arrays: dict) -> list:
    """onnxruntime's outputs: the node at layout 0 (transposed back for layout 1), at opset 14
    where onnxruntime lacks the node's own (opsets 1 and 3; newer than it knows)."""
    opset = node.version()
    opset = opset if 7 <= opset <= 14 else 14
    attributes = {**dict(node.attributes), **node.reference}
    model = node_model(node, arrays, opset, 0, attributes)
    session = helpers.ort_session(model)
    results = session.run(None, dict(zip([i.name for i in model.graph.input], feeds(model, arrays))))
    names = [n for n in node.outputs if n]
    if node.op == "RNN" and "Y_h" in names and node.lens is not None:
        # onnxruntime 1.19.2's RNN (not its LSTM or GRU) leaves a length-0 row's Y_h unset in the
        # forward direction and at the initial state in the reverse one; 1.32 gives 0 like its
        # LSTM and GRU
        results[names.index("Y_h")][:, np.array(node.lens) == 0] = 0.0
    if node.layout == 1:
        results = [r.transpose(2, 0, 1, 3) if name == "Y" else r.transpose(1, 0, 2) for name, r in zip(names, results)]
    return results


@pytest.mark.parametrize("node", NODES, ids=lambda node: node.id)
def test_converter_against_onnxruntime(node: Node):
    """The node converted to PyTorch gives onnxruntime's outputs within 1e-5, each declared one."""
    arrays = node_arrays(node)
    expected = onnxruntime_reference(node, arrays)
    given = to_layout1(arrays) if node.layout == 1 else arrays
    model = node_model(node, given, node.version(), node.layout, dict(node.attributes))
    actual = run_torch(model, *feeds(model, given))
    names = [n for n in node.outputs if n]
    problems = parity.output_problems(node.id, names, expected, actual, NODE_TOLERANCE)[0]
    assert not problems, "\n".join(problems)


def test_the_single_node_cases_cover_what_the_docstring_lists():
    """So that an edit of ``NODES`` loses none of it."""
    attributes = {name for node in NODES for name, _ in node.attributes}
    assert {"clip", "input_forget", "linear_before_reset", "activations", "activation_alpha"} <= attributes
    assert {n.direction for n in NODES} == {"forward", "reverse", "bidirectional"}
    assert {n.layout for n in NODES} == {0, 1} and {n.weights for n in NODES} == {"initializers", "inputs", "computed"}
    assert {v for n in NODES for v in n.lens or ()} == {0, 3, 5}
    assert any("P" in n.inputs for n in NODES) and any("" in n.outputs for n in NODES)
    assert {n.version() for n in NODES} >= {1, 7, 14, max(recurrent_converters.defined_versions("LSTM"))}


def test_every_version_the_installed_onnx_defines_is_registered():
    """onnx2torch looks a converter up under the operator's since_version at the model's opset."""
    from onnx2torch.node_converters.registry import get_converter

    for op in GATES:
        for version in recurrent_converters.defined_versions(op):
            assert get_converter(op, version) is recurrent_converters.convert_node, (op, version)
    recurrent_converters.register()  # a second registration leaves the registry as it is


def test_a_bidirectional_node_needs_both_directions_activations():
    """As in onnxruntime: a bidirectional GRU listing one direction's functions is refused."""
    node = Node("GRU", "bidirectional", attributes=(("activations", ["Sigmoid", "Tanh"]),))
    arrays = node_arrays(node)
    with pytest.raises(ValueError, match="expected 4 activations, got 2"):
        onnx2torch.convert(node_model(node, arrays, 14, 0, dict(node.attributes)))


def test_a_skipped_output_feeds_no_skipped_input():
    """onnx2torch resolves a skipped input to a node's skipped output: a Slice reading the
    LSTM's Y_h with its axes skipped gets the None the module gives for the skipped Y, as
    onnxruntime reads it (no axes)."""
    node = Node("LSTM", inputs=("B",), lens=None, outputs=("", "Y_h"))
    arrays = node_arrays(node)
    model = node_model(node, arrays, 14, 0, {})
    bounds = {"starts": [0, 2], "ends": [1, np.iinfo(np.int64).min], "steps": [1, -1]}
    model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in bounds.items())
    model.graph.node.append(helper.make_node("Slice", ["Y_h", "starts", "ends", "", "steps"], ["sliced"]))
    model.graph.output.append(helper.make_tensor_value_info("sliced", TensorProto.FLOAT, [1, 3, HIDDEN]))
    expected = helpers.ort_session(model).run(None, {"X": arrays["X"]})
    problems = parity.output_problems("Y_h, sliced", ["Y_h", "sliced"], expected, run_torch(model, arrays["X"]),
                                      NODE_TOLERANCE)[0]
    assert not problems, problems


def test_gru_1_reads_its_misspelt_default_direction_as_forward():
    """GRU-1's schema gives ``direction`` the default "foward": written out, it runs forward."""
    node = Node("GRU", opset=1, inputs=("B",), lens=None)
    arrays = node_arrays(node)
    forward = run_torch(node_model(node, arrays, 1, 0, {}), arrays["X"])
    misspelt = run_torch(node_model(node, arrays, 1, 0, {"direction": "foward"}), arrays["X"])
    assert len(forward) == len(misspelt) == 2
    assert all(np.array_equal(a, b) for a, b in zip(forward, misspelt))


def test_one_converted_module_takes_any_lengths():
    """sequence_lens is read when the module runs, not when it is converted: one module, two sets
    of lengths, each as in onnxruntime."""
    node = Node("LSTM", "bidirectional")
    arrays = node_arrays(node)
    model = node_model(node, arrays, 14, 0, {})
    module, session = onnx2torch.convert(model), helpers.ort_session(model)
    names = [i.name for i in model.graph.input]
    assert "sequence_lens" in names
    for lens in ([5, 3, 0], [1, 5, 4]):
        fed = dict(arrays, sequence_lens=np.array(lens, np.int32))
        expected = session.run(None, {name: fed[name] for name in names})
        with torch.no_grad():
            actual = [r.numpy() for r in module(*[torch.from_numpy(fed[name]) for name in names])]
        problems = parity.output_problems(str(lens), OUTPUTS, expected, actual, NODE_TOLERANCE)[0]
        assert not problems, problems


# -- onnx2torch 1.5.15 ---------------------------------------------------------------------------

def _one_node(node: onnx.NodeProto, shape, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_onnx2torch_takes_an_absent_cumsum_reverse_as_1():
    """onnx2torch 1.5.15 reads ``reverse`` with a default of 1 (ONNX's is 0), which is why the
    portable form writes every CumSum's attributes out. Fails the day it reads ONNX's default."""
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    x = np.array([1, 2, 3], np.float32)
    absent = _one_node(helper.make_node("CumSum", ["x", "axis"], ["y"]), [3], [axis])
    written = _one_node(helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=0, reverse=0), [3], [axis])
    assert helpers.ort_session(absent).run(None, {"x": x})[0].tolist() == [1, 3, 6]
    assert run_torch(written, x)[0].tolist() == [1, 3, 6]
    assert run_torch(absent, x)[0].tolist() == [6, 5, 3]


def test_onnx2torch_has_no_reverse_sequence():
    """Why the portable form reverses rows with Gather and Slice. Fails the day onnx2torch has one."""
    lens = numpy_helper.from_array(np.array([2, 3], np.int64), "lens")
    model = _one_node(helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=0, time_axis=1),
                      [2, 3], [lens])
    with pytest.raises(NotImplementedError, match="ReverseSequence"):
        onnx2torch.convert(model)
