"""What each runtime a converted model is deployed to computes of the forms this package writes: one table.

A :class:`Runtime` is a row: which recurrent ops it computes and in which directions, which of their
inputs, outputs and attributes it reads as ONNX defines them, whether it takes ``Scan``, ``If`` and
``Loop``, which other ops of the written forms it lacks, what it does with a ``Slice`` of step -1 and
whether it compiles static shapes only. Every fact was measured against the runtime by single-op
probes and by running converted models (docs/downstream.md gives versions and how); ``silent`` marks
a fact where the runtime gives a wrong result without an error.

Two readers use the table and nothing else decides by a runtime's name: :func:`obstacles` says why a
written model is not computed as ONNX defines it by a runtime (the report's "runs in" section), and
the lowering (:mod:`.lower`) asks a row which rung each layer must stand on (native node, forward
nodes with a reversal, a Scan, or its steps written out for a fixed time length). A new runtime is a
row here and its tests.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from .description import RECURRENT_NODES

RECURRENT_OPS = tuple(RECURRENT_NODES)
FORWARD, REVERSE, BIDIRECTIONAL = "forward", "reverse", "bidirectional"
ALL_DIRECTIONS = frozenset({FORWARD, REVERSE, BIDIRECTIONAL})
# ONNX input and output slots of LSTM/GRU/RNN, named once
SEQUENCE_LENS, INITIAL_H, INITIAL_C, PEEPHOLES = 4, 5, 6, 7
Y, Y_H, Y_C = 0, 1, 2


class Kind(str, enum.Enum):
    """What an obstacle is about: the kinds a lowering rung answers and a target's form removes."""

    OP = "op"  # an op it has no lowering or layer for (or a GRU of linear_before_reset=0)
    DIRECTION = "direction"  # a recurrent node's direction
    ACTIVATIONS = "activations"  # a recurrent node's functions
    SEQUENCE_LENS = "sequence_lens"
    PEEPHOLES = "peepholes"
    Y_H = "y_h"  # how a recurrent node's outputs are read
    INITIAL_STATES = "initial_states"  # a recurrent node's initial states, not given
    GIVEN_STATES = "given_states"  # a recurrent node's initial states, given
    SCAN = "scan"
    SHAPE = "shape"  # a Squeeze of a tensor of unknown shape
    IF = "if"
    GEMM = "gemm"
    BATCHED = "batched"  # a Conv over several images at once
    EMPTY = "empty"  # a Concat of an empty constant
    SLICE = "slice"  # a Slice with step -1
    SPLIT = "split"  # a Split without sizes
    PAD = "pad"  # a Pad without a mode
    GATHER = "gather"
    REDUCE = "reduce"  # a ReduceSum or ReduceMean of one axis given as an input
    REVERSAL = "reversal"  # ReverseSequence
    BOOL = "bool"  # the mask's bool arithmetic
    FLOAT64 = "float64"
    INPUTS = "inputs"  # the model's inputs: dynamic dimensions
    RANK = "rank"  # the model's inputs: their rank
    INTEGER = "integer"  # the model's inputs: integer ones
    BATCH = "batch"  # the model's inputs: a batch over 1

    def __str__(self) -> str:
        return self.value


MODEL_KINDS = frozenset({Kind.INPUTS, Kind.RANK, Kind.INTEGER, Kind.BATCH})  # about the whole model, not a node


# ONNX's own activation functions of each recurrent op, one direction's (the spec's defaults)
DEFAULT_ACTIVATIONS = {op: node.default_activations for op, node in RECURRENT_NODES.items()}


@dataclass(frozen=True)
class Activations:
    """What a runtime computes of a recurrent node's ``activations`` (with their alpha and beta): only the
    functions named in ``computes`` (None: every one), or, ``defaults_only``, only the op's default list (it
    reads none: any other list is computed as the defaults). ``silent``: whether a list it does not compute comes
    out wrong without an error (True), is refused (False), or the names that come out wrong silently (the rest
    refused). ``per_direction``: whether a bidirectional node's directions may list functions of their own (else
    both are computed with the first direction's, silently)."""

    computes: Optional[frozenset] = None
    defaults_only: bool = False
    silent: object = True
    per_direction: bool = True


_KERNEL = frozenset({"Sigmoid", "Tanh", "Relu"})


@dataclass(frozen=True)
class Runtime:
    """One runtime's row: what it computes of the ops and attributes this package's forms write."""

    key: str  # its name in targets and reports
    name: str  # as a user knows it, with the version measured
    target: Optional[str]  # the target whose form it computes (None: every form)
    recurrent: dict = field(default_factory=lambda: {op: ALL_DIRECTIONS for op in RECURRENT_OPS})
    # GRU linear_before_reset=0 (Keras's reset_after=False): "exact", "none" (refused), "as 1" (computed as 1, silently)
    gru_linear_before_reset_0: str = "exact"
    reverse_runs_forward: bool = False  # a reverse node is computed forward, silently (it reads no direction)
    activations: dict = field(default_factory=dict)  # op -> its Activations, where it does not compute every list
    reads_y_h: frozenset = frozenset(RECURRENT_OPS)  # ops whose Y_h output may be read
    reads_y_c: bool = True
    initial_states_needed: frozenset = frozenset()  # ops that must be given initial_h (and c)
    all_states_need_initial: frozenset = frozenset()  # ops that must be given them where Y, Y_h and Y_c are read
    sequence_lens: str = "computed"  # "computed", "constant" (refused unless constant), "ignored" (silently)
    peepholes: str = "exact"  # "exact", "wrong" (silently), "none"
    scan: str = "dynamic"  # "dynamic", "static" (dynamic shapes give silently wrong ones), "none"
    scan_squeeze: bool = True  # a Squeeze inside a Scan's step compiles
    # a Scan whose inputs or outputs run backwards (scan_*_directions): "exact", "wrong" (silently), "none"
    scan_backward: str = "exact"
    # a Squeeze of a tensor whose dimensions ONNX's shape inference leaves unknown, in a model of fixed shapes,
    # compiles
    squeezes_unknown: bool = True
    if_unranked: bool = True  # computes an If whose outputs' rank ONNX's shape inference leaves unknown
    float64: bool = True  # computes float64 tensors (a Cast to float64)
    integer_inputs: bool = True  # takes a model with an integer input (an Embedding's ids)
    pad_default_mode: bool = True  # computes a Pad that leaves its mode to ONNX's default ("constant")
    if_shapes: bool = True  # computes an If whose branches compute shapes (Shape and arithmetic on it)
    lacks: frozenset = frozenset()  # op types it has no lowering or layer for
    domains: frozenset = frozenset()  # the op domains it computes besides ONNX's own (onnxruntime's contrib ops)
    # how it computes a layer whose weights are int8 (a Cast and a Mul of an int8 constant) otherwise than in float,
    # by default ("": in float, as ONNX defines it)
    int8_weights: str = ""
    negative_step_slice: str = "exact"  # "exact", "dropped" (silently)
    strided_slice: bool = True  # computes a Slice of a step other than 1 and -1
    rank5_gather: bool = True  # computes a Gather of one index from a tensor of rank 5
    # reduces a ReduceSum or ReduceMean along its one axis given as an input (from opset 13 and 18)
    reduces_one_axis_input: bool = True
    static_shapes: bool = False  # compiles for fixed shapes only
    given_states: bool = True  # maps a recurrent node whose initial states are given
    shared_weights: bool = True  # maps a MatMul whose constant weight other MatMuls read too
    batch_one: bool = False  # computes one batch row at a time (its tensors have no batch axis): a fixed batch of 1
    computed_gemm_bias: bool = True  # computes a Gemm whose C input is not a constant
    computed_conv_weight: bool = True  # computes a Conv whose weight is computed (an int8 weight's Cast and Mul)
    # computes a recurrent node whose weights are computed (int8 ones dequantized) in a model holding QDQ (static
    # quantization's QuantizeLinear)
    qdq_computed_recurrent_weights: bool = True
    qdq_steps: bool = True  # computes a model holding QDQ whose layers are written out as their steps
    own_quantizer: str = ""  # how its own toolchain quantizes a float model, and how well (measured)
    unsized_split: bool = True  # computes a Split whose sizes are not given (equal parts)
    batched_conv: bool = True  # computes a Conv over several images at once (its input's axis 0 over 1)
    empty_concat: bool = True  # computes a Concat one of whose inputs is an empty constant
    max_input_rank: int = 0  # the highest rank of an input it takes (0: any)
    masks: str = ""  # why it computes no masked layer in any form this package writes ("": it computes them)
    # a recurrent node is mapped only where its Y alone is read, squeezed (ncnn): a forward node's by one Squeeze of
    # axis 1, a bidirectional node's by one Transpose(0, 2, 1, 3) and one Reshape to [T, B, 2H]
    y_read_squeezed: bool = False
    # computes a Transpose(1, 0, 2) of a recurrent node's squeezed Y that another recurrent node reads too (a stack
    # whose first layer's sequence is also read batch-major: a skip connection)
    transposes_shared_y: bool = True
    tolerance: float = 1e-4  # relative error its arithmetic allows against the source (float16: more)
    # the nodes of a model of steps written out it compiles in about a minute (measured on a quiet machine,
    # interpolated between the lengths around it: benchmarks/long_sequences.py); more take longer than linearly;
    # 0: not measured
    nodes_in_a_minute: int = 0
    package: str = ""  # the Python package that runs it (verification in the runtime)
    # the obstacles' kinds its target's form removes (None: every one it can, refusing the rest in one line)
    target_removes: Optional[frozenset] = None
    measured: str = ""  # the evidence, for the report and docs


_LOOPING = frozenset({"Loop"})
# what the portable form writes otherwise: masks compacted, zero states given, peephole cells as a Scan, reversals
# of computed lengths gathered
_PORTABLE_REMOVES = frozenset({Kind.SEQUENCE_LENS, Kind.INITIAL_STATES, Kind.PEEPHOLES, Kind.REVERSAL})
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})  # static quantization's ops
MASK_BOOLS = frozenset({"Equal", "Not", "Where", "And", "Or", "Less", "Greater", "GreaterOrEqual", "LessOrEqual"})

RUNTIMES = (
    Runtime("onnxruntime", "onnxruntime (CPU, node, web)", None, package="onnxruntime",
            domains=frozenset({"com.microsoft"}),
            measured="every form, Loop, Scan and If included, exact"),
    Runtime("openvino", "OpenVINO 2026.4", "portable", target_removes=_PORTABLE_REMOVES, sequence_lens="ignored",
            peepholes="wrong", activations={op: Activations(_KERNEL, silent=False, per_direction=False)
                                            for op in RECURRENT_OPS},
            transposes_shared_y=False, if_unranked=False, qdq_computed_recurrent_weights=False, qdq_steps=False,
            int8_weights="its CPU plugin quantizes the inputs of a layer whose weights are int8 at run time "
                         "(0.1% of a trained LSTM(128)'s output range off, measured); compile the model with "
                         "{'DYNAMIC_QUANTIZATION_GROUP_SIZE': '0'} for the float compute measured here",
            package="openvino", measured="ignores a computed sequence_lens under dynamic shapes; reads LSTM's P "
                                         "otherwise than ONNX (0.05 off); a recurrent node's activations other than "
                                         "Sigmoid, Tanh and Relu refused ('Unsupported activation function', 'Unknown "
                                         "activation function'), and a bidirectional node computed with the forward "
                                         "direction's, silently (156 single-node probes); a Transpose(1, 0, 2) of "
                                         "a squeezed Y another recurrent node reads too, 1.0 off (hand-built "
                                         "graphs); an If whose outputs' rank shape inference leaves unknown fails "
                                         "to convert (a MinGRU's); in a model holding a QuantizeLinear, an LSTM or "
                                         "GRU whose weights are dequantized int8 ones fails to compile ('expects "
                                         "Constant for port 4'), with float weights it is exact, and stacks of "
                                         "layers written out as their steps (the tvm target's form) fail ('cannot "
                                         "be broadcasted (numpy mode)')"),
    Runtime("tract", "tract 0.23", "portable", target_removes=_PORTABLE_REMOVES,
            recurrent={op: frozenset({FORWARD, BIDIRECTIONAL}) for op in RECURRENT_OPS}, reverse_runs_forward=True,
            sequence_lens="constant", all_states_need_initial=frozenset({"LSTM"}),
            activations={op: Activations(defaults_only=True) for op in RECURRENT_OPS},
            lacks=_LOOPING | {"ReverseSequence"}, package="tract", if_unranked=False,
            measured="takes sequence_lens only as a constant; no Loop, no ReverseSequence; an LSTM whose Y, Y_h "
                     "and Y_c are all read stops without initial states ('Clashing resolution for expression'); "
                     "a recurrent node's activations and direction not read: the default functions, forward, "
                     "silently (156 single-node probes); an If whose outputs' rank shape inference leaves unknown "
                     "fails ('Failed analyse', a MinGRU's)"),
    Runtime("onnx2torch", "PyTorch through onnx2torch 1.5", "portable", target_removes=_PORTABLE_REMOVES,
            sequence_lens="constant", lacks=_LOOPING | _QDQ | {"ReverseSequence", "Scan", "If", "ScatterElements"},
            computed_conv_weight=False,
            measured="no recurrent converter of its own (the tests supply them, without sequence_lens), "
                     "no Loop, Scan, If, ReverseSequence, QuantizeLinear or DequantizeLinear ('Converter is not "
                     "implemented')"),
    Runtime("reference", "ONNX's reference evaluator (onnx.reference)", "portable", target_removes=_PORTABLE_REMOVES,
            sequence_lens="ignored", scan_backward="none", package="onnx.reference",
            activations={"LSTM": Activations(defaults_only=True), "GRU": Activations(defaults_only=True),
                         "RNN": Activations(frozenset({"Tanh", "Affine"}), silent=False, per_direction=False)},
            lacks=_QDQ,
            measured="its LSTM, GRU and RNN take sequence_lens and do not read it; its LSTM and GRU read no "
                     "activations (the defaults, silently), its RNN computes Tanh and Affine and refuses others; a "
                     "Scan running backwards is not implemented; QuantizeLinear and DequantizeLinear only from opset "
                     "19 (onnx 1.23: 'No implementation for operator DequantizeLinear version 15')"),
    Runtime("iree", "IREE 3.13 (llvm-cpu)", "iree",
            recurrent={"LSTM": frozenset({FORWARD, BIDIRECTIONAL}), "GRU": frozenset({FORWARD}),
                       "RNN": frozenset({FORWARD})},
            sequence_lens="ignored", scan="static", scan_squeeze=False, scan_backward="wrong", squeezes_unknown=False,
            if_unranked=False, nodes_in_a_minute=6100,
            lacks=_LOOPING | {"DFT"},
            static_shapes=True, activations={op: Activations(_KERNEL) for op in RECURRENT_OPS}, package="iree.runtime",
            measured="reverse nodes and bidirectional GRU/RNN fail to legalize; GRU/RNN need a static batch; "
                     "sequence_lens silently ignored; a Scan with dynamic dimensions returns a wrong shape, one "
                     "running backwards wrong values (1.1-1.3 off, silently); a "
                     "Squeeze in a Scan's step, or of a tensor whose shape inference leaves a dimension unknown (a "
                     "ConvLSTM2D's last step, padded as tf2onnx pads a loop's outputs), fails to compile "
                     "('tensor.collapse_shape'); an If whose outputs' rank shape inference leaves unknown fails "
                     "to legalize (MinGRU); no Loop, no DFT; a recurrent node's activations "
                     "other than Sigmoid, Tanh and Relu computed as Relu and their alpha and beta not read, silently "
                     "(74 single-node probes: HardSigmoid, LeakyRelu, Affine, ScaledTanh, Elu, Softsign, Softplus, "
                     "ThresholdedRelu)"),
    Runtime("tvm", "Apache TVM 0.27 (Relax, llvm)", "tvm", recurrent={}, scan="none", if_shapes=False,
            nodes_in_a_minute=7900,
            lacks=_LOOPING | {"ReverseSequence", "DFT"}, static_shapes=True, package="tvm",
            measured="Relax's ONNX frontend has no LSTM, GRU, RNN, Scan, Loop, ReverseSequence or DFT converter, "
                     "and fails on an If computing shapes ('ShapeExpr' object has no attribute 'value': MinGRU)"),
    Runtime("ncnn", "ncnn 1.0.20261020 through pnnx 20261020", "ncnn",
            recurrent={"LSTM": frozenset({FORWARD, BIDIRECTIONAL}), "GRU": frozenset({FORWARD, BIDIRECTIONAL}),
                       "RNN": frozenset({FORWARD})}, given_states=False, shared_weights=False,
            batch_one=True, computed_gemm_bias=False, max_input_rank=5, unsized_split=False, batched_conv=False,
            empty_concat=False, float64=False, pad_default_mode=False, integer_inputs=False,
            gru_linear_before_reset_0="as 1", reads_y_h=frozenset(), reads_y_c=False, sequence_lens="none",
            activations={"LSTM": Activations(defaults_only=True, silent=False),
                         "GRU": Activations(defaults_only=True, silent=False),
                         "RNN": Activations(frozenset({"Tanh"}), silent=frozenset({"Relu"}))},
            scan="none", lacks=_LOOPING | MASK_BOOLS | _QDQ | {"ReverseSequence", "If", "ScatterND", "GatherND",
                                                                "CumSum", "GatherElements", "DFT"},
            negative_step_slice="dropped", strided_slice=False, rank5_gather=False, reduces_one_axis_input=False,
            static_shapes=True,
            y_read_squeezed=True,
            package="ncnn", own_quantizer="its ncnn2int8 quantizes the converted model (not measured here)",
            nodes_in_a_minute=16900,
            measured="a forward recurrent node is mapped only when its Y alone is read, by a Squeeze of axis 1, and "
                     "no initial state is given; a bidirectional LSTM or GRU is mapped to ncnn's own bidirectional "
                     "layer only when its Y alone is read, by a Transpose(0, 2, 1, 3) and a Reshape to [T, B, 2H]; a "
                     "bidirectional RNN (its layer does not load) not mapped; GRU linear_before_reset=0 computed as "
                     "1 and an RNN's Relu as Tanh, silently, other activations than the default list not mapped; a "
                     "MatMul whose weight other MatMuls share, or a Gemm whose C is computed, is left unmapped "
                     "(F.linear); its blobs have no batch axis and at most 4 axes beside it (w, h, d, c); pnnx takes "
                     "axis 0 of what a Conv reads and writes for that batch axis: a Conv over several images at once "
                     "(ConvLSTM2D's input convolution over every step) does not load, a Squeeze of that axis is "
                     "dropped, a Concat along it leaves a 5-D output ncnn cannot hold; a Concat of an empty constant "
                     "(the Scan form's padding of a full-length output) does not load at rank 3 and computes garbage "
                     "at rank 5 (pnnx: '5-rank tensor is not supported'); a Slice with step -1 is silently dropped, "
                     "one of another step over 1 left as Tensor.slice, which does not load (a MinGRU's); a Gather of "
                     "one index from a rank-5 tensor left as torch.unbind, which does not load (an LMUFeedforward's "
                     "spectrum without a hidden cell; with one, the same Gathers map: refused in both, as the graphs "
                     "do not tell them apart); a "
                     "ReduceSum (opset 13 on) or ReduceMean (opset 18 on) of one axis given as an input reduces "
                     "nothing, silently (pnnx writes its Reduction without axes: single-node probes at ranks 2-4; "
                     "an LTC cell's sums), of two axes it reduces both; "
                     "a Split without its sizes becomes a Slice without them, which ends the process; no "
                     "GatherElements, Scan, If, Loop, ReverseSequence or the mask's bool ops; a masked layer as its "
                     "own step with its mask as float 0/1 arithmetic computes exactly; a Pad without its mode "
                     "attribute (ONNX's default, constant), a Cast to float64 and a DFT are left as ops ncnn does "
                     "not load (keras-lmu's FFT memory); pnnx runs the model through onnxruntime on arbitrary values "
                     "of an integer input (an Embedding's ids: its Gather fails, 'indices element out of data "
                     "bounds'); from QuantizeLinear and DequantizeLinear pnnx writes a param/bin ncnn cannot load "
                     "(static quantization: ncnn's own ncnn2int8 quantizes)"),
    Runtime("rknn", "rknn-toolkit2 2.5 simulator (rk3588, float16)", "rknn",
            reads_y_h=frozenset({"LSTM", "RNN"}), initial_states_needed=frozenset({"LSTM"}), sequence_lens="none",
            scan="none", lacks=_LOOPING | {"If", "ReverseSequence"} | MASK_BOOLS | _QDQ, static_shapes=True,
            tolerance=2e-2, package="rknn.api", nodes_in_a_minute=500,
            own_quantizer="its build(do_quantization=True) of the rknn target's float model is 4.8-11% of the "
                          "largest logit off on trained LSTM, GRU and SimpleRNN(128) classifiers (w8a8; mmse 37-41%), "
                          "the error growing along the steps; with the recurrent layer kept float16 (hybrid "
                          "quantization) 0.48-3.6% (docs/quantization.md)",
            measured="an LSTM without initial states at batch > 1 and a GRU whose Y_h is read crash its "
                     "converter; If and Loop refused; the mask's bool arithmetic aborts ('Not Support Dtype'); "
                     "a Scan builds too slowly to use; a model of 8 KB whose LSTM and RNN read a QuantizeLinear's "
                     "DequantizeLinear did not build in 15 minutes (static quantization: its own build("
                     "do_quantization=True) quantizes the float model)"),
)
BY_KEY = {runtime.key: runtime for runtime in RUNTIMES}
