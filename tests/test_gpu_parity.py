"""Every Keras 3 model of the parity suites, exported on a GPU machine, converts to the native nodes its
CPU conversion has, equal to the model on the CPU.

Where TensorFlow lists a GPU (``cudnn_graphs.gpu_machine``), Keras 3 traces each LSTM and GRU layer whose
configuration cuDNN takes as one ``CudnnRNNV3`` op, and ``model.export`` writes that graph: what a user who
trained on a GPU exports. Each model of the parity suites (one-direction layers, structures, masked layers
and stacks) is built as its suite builds it, its weights randomized by the suite's seed, exported so and
converted with ``convert_saved_model`` (checked against the CPU computation its cuDNN ops stand for, as
every conversion is). Then:

- its recurrent nodes (op type and direction) are those of ``convert_keras`` of the same model on the GPU
  machine (which traces the layers' own loops, as on a CPU), and it has no ``Loop`` or ``Scan`` that
  conversion does not;
- onnxruntime equals ``model(x, training=False)`` on the CPU, for both conversions, on the suite's own
  rounds of inputs (for masked models: rows full, post-padded, pre-padded, holed and empty, which a GPU
  runs only right-padded);
- a model with no layer cuDNN takes exports the CPU's graph: it is not converted twice.

Keras files on a GPU machine are loaded and traced as live models are: test_cudnn.py checks them in both
flavors.
"""
from __future__ import annotations

import collections
import zlib

import pytest

import cudnn_graphs
import helpers
import parity
import test_parity_masking as masking
import test_parity_structures as structures

pytestmark = parity.only_keras3

ONE_DIRECTION = [("unidirectional", case) for case in parity.cases()]
STRUCTURES = [("structure", case) for case in structures.ALL_CASES]
MASKED = [("masked", case) for case in masking.CASES + list(masking.STACKS)]
PARAMS = [pytest.param(suite, case, id=f"{suite}-{case.id}") for suite, case in ONE_DIRECTION + STRUCTURES + MASKED]


def _model(suite: str, case):
    if suite == "unidirectional":
        return parity.build_model("keras3", case)
    if suite == "structure":
        return structures.build_structure("keras3", case)
    return masking.build("keras3", case)


def _rounds(suite: str, case) -> list:
    """(label, input arrays, mask or None) per round, as the case's suite makes them."""
    if suite == "unidirectional":
        seed = parity.case_seed("keras3", case)
        return [(f"batch={b}, time={t}", parity.make_inputs(case, b, t, seed + i), None)
                for i, (b, t) in enumerate(parity.ROUNDS)]
    if suite == "structure":
        seed = zlib.crc32(f"keras3/{case.id}".encode())
        return [(f"batch={b}, time={t}", structures.make_arrays(case, b, t, seed + i), None)
                for i, (b, t) in enumerate(structures.ROUNDS)]
    seed = masking.seed_of("keras3", case)
    return [(label, case.feeds(mask, seed + 1 + i), mask) for i, (label, mask) in enumerate(masking.rounds())]


def _as_the_graph_reads(case, arrays: list, mask, expected: list) -> list:
    """Keras's CPU outputs, but where the GPU graph itself reads otherwise: Keras 3's cuDNN path returns a
    one-direction layer's final state as its last output, so a row with no kept step given an initial
    state outputs that state, where the CPU path's carried output is still zeros (the only place the two
    differ; every other output of every row is the CPU's)."""
    if mask is None or not getattr(case, "initial_state", False) or getattr(case, "return_sequences", True) \
            or getattr(case, "direction", "") not in ("forward", "backward"):
        return expected
    empty = ~mask.any(axis=1)
    initial_h = arrays[list(case.input_names).index("init_h")]
    adjusted = [value.copy() for value in expected]
    adjusted[0][empty] = initial_h[empty]
    return adjusted


def _input_names(suite: str, case, model) -> list:
    if suite == "unidirectional":
        return parity.input_names(case)
    if suite == "structure":
        return [spec[0] for spec in case.inputs]
    return list(case.input_names)


def _recurrent(proto) -> collections.Counter:
    return collections.Counter((n.op_type, helpers.direction_of(n)) for n in helpers.nodes_of_types(
        proto, helpers.RECURRENT_OPS))


@pytest.mark.parametrize("suite, case", PARAMS)
def test_exported_on_a_gpu_machine_converts_as_on_a_cpu(suite: str, case, tmp_path):
    from tf2onnx_rnn import convert_keras, convert_saved_model

    model = _model(suite, case)
    with cudnn_graphs.gpu_machine():  # a trace as the export's decides, at a fraction of its cost
        traced = cudnn_graphs.traced(model)
    if not cudnn_graphs.cudnn_ops(traced):
        pytest.skip("no layer of this model is one cuDNN takes: the GPU machine exports the CPU's graph")
    path = cudnn_graphs.export_on_gpu_machine(model, f"{suite}-{case.id}")
    import tensorflow as tf

    graph = tf.saved_model.load(path).signatures["serve"].graph.as_graph_def()
    assert cudnn_graphs.cudnn_ops(graph), "the trace held cuDNN ops, the exported graph holds none"
    proto = convert_saved_model(path)
    with cudnn_graphs.gpu_machine():  # converting the live model there traces the layers' own loops
        reference = convert_keras(model, check_shapes=False)
    problems = []
    if _recurrent(proto) != _recurrent(reference):
        problems.append(f"recurrent nodes {dict(_recurrent(proto))}, the CPU conversion's "
                        f"{dict(_recurrent(reference))}")
    loops = len(helpers.nodes_of_types(proto, helpers.LOOP_OPS))
    if loops > len(helpers.nodes_of_types(reference, helpers.LOOP_OPS)):
        problems.append(f"{loops} Loop/Scan nodes, more than the CPU conversion's")
    names = _input_names(suite, case, model)
    sessions = {"exported": helpers.ort_session(proto), "converted": helpers.ort_session(reference)}
    relative = 1e-5 if getattr(case, "relative", False) else 0.0
    for label, arrays, mask in _rounds(suite, case):
        expected = parity.keras_outputs(model, arrays)
        for which, session in sessions.items():
            want = _as_the_graph_reads(case, arrays, mask, expected) if which == "exported" else expected
            actual = parity.run_onnx(session, names, arrays)
            problems += parity.output_problems(f"{which}, {label}", [o.name for o in proto.graph.output], want,
                                               actual, parity.TOLERANCE, relative)[0]
    assert not problems, "\n".join(problems) + "\n" + parity.report_table(proto)
