"""Python API: convert Keras models, SavedModels, TFLite files and frozen graphs with recurrent layers
fused into native nodes.

Every entry point takes one road (:func:`run`). A *source* (:mod:`.sources`: a Keras model traced
in inference mode, a Keras file, a SavedModel signature, a TFLite file, a frozen graph) is frozen
into a graph def (a TFLite file is read by tf2onnx itself); tf2onnx
converts it with the recurrent rewriter (:mod:`.translate`); the report is reconciled with the
written graph and stored; onnxruntime must load the model (:mod:`.probes`); it is verified when
asked; and it is saved atomically (:mod:`.output`). The CLI (``tf2onnx_rnn.convert``) only
parses, prints, and spells the API's parameter names as its flags.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Optional

import onnx

from .consumers import consumers_of
from .cudnn_reference import checked_source
from .dim_names import name_dimensions
from .errors import ConversionError, VerificationError, first_line, param, raised_by_library
from .isolation import check_survives
from .lowering import lower_for_runtime
from .options import PORTABLE, Options, check_tolerance
from .output import LARGE_MODEL_KEY, check_output_path, save_model
from .probes import check_loadable, fits_in_protobuf, stamp_ir_version
from .reconcile import reconcile, recurrent_loops, unrolled_layers
from .report import LOOP, SCAN, STEPS, ConversionReport
from .rewriters.runtimes import BY_KEY, RUNTIMES
from .runtime_check import verify_in_runtime
from .shape_check import check_output_shapes
from .sources import Frozen, Source
from .sources.graph_def import Checkpoint, GraphDefFile
from .sources.keras_model import KerasModel, keras_input_signature
from .sources.saved_model import SavedModel
from .sources.tflite import TFLite
from .sources.time_distributed import refuse_mistraced
from .training import training_form
from .translate import to_onnx

logger = logging.getLogger("tf2onnx_rnn")

KERAS_KINDS = ("keras_model", "keras_file")  # sources whose inputs' axis 0 is Keras's batch

__all__ = ["Conversion", "VerificationFailed", "convert_checkpoint", "convert_graph_def", "convert_keras",
           "convert_saved_model", "convert_tflite", "keras_input_signature", "report_of", "run"]


@dataclass
class Conversion:
    """The result of :func:`run`: the model, its report and, when asked, its verification."""

    model_proto: onnx.ModelProto
    report: ConversionReport
    verification: Optional[object] = None  # a verify.VerificationResult
    runtime_verification: Optional[object] = None  # the same in the target's runtime (runtime_check), if it ran
    written: list = field(default_factory=list)  # the files written: the model, and its external data if any
    # cuDNN ops read as Keras's masked layers (op -> rewriters.outcome.KerasMaskReading): where TensorFlow
    # cannot run them, the checks' reference computes them so (cudnn_reference)
    keras_masks: dict = field(default_factory=dict)


class VerificationFailed(VerificationError):
    """Verification failed: ``result`` holds the per-output checks, ``conversion`` what was converted
    (and not written)."""

    what = "verification"

    def __init__(self, result, conversion: Optional[Conversion]):
        super().__init__(f"verification failed: {result.reason()}\n{result.table()}")
        self.result, self.conversion = result, conversion


# -- public entry points -----------------------------------------------------------------------
def convert_keras(model, input_signature=None, opset: Optional[int] = None, output_path: Optional[str] = None,
                  verify: bool = False, tolerance: float = 1e-4, assume_post_padded: bool = False,
                  safe_mode: bool = True, calibration=None, **options) -> onnx.ModelProto:
    """Convert a Keras model (Keras 3, tf_keras, or TensorFlow 2.15's Keras 2) to ONNX, with
    recurrent layers as native nodes.

    ``input_signature`` (tf.TensorSpecs) defaults to the model's inputs with a dynamic batch; a
    signature that contradicts the model raises :class:`ConversionError`. Other keyword
    arguments: ``check_shapes`` (default True: without ``verify``, the outputs' shapes are checked
    against the model's on small random inputs), ``continue_on_error``, ``large_model``, ``rename_inputs``,
    ``rename_outputs``,
    ``inputs``, ``streaming``, ``state_defaults`` (a streamed state input of a fixed batch carries the
    layer's start, its stored state or zeros, as an initializer a feed overrides; False leaves it
    required, as OpenVINO and tract need to feed it; by default True but for ``target="portable"``)
    and tf2onnx's ``target``, ``extra_opset``, ``inputs_as_nchw``, ``outputs_as_nchw``,
    ``shape_override``, ``custom_ops``, ``custom_op_handlers``, ``custom_rewriter``, ``optimizers``.
    With ``verify=True`` the ONNX model is run in onnxruntime against the Keras model on seeded random
    inputs and :class:`VerificationError` is raised beyond ``tolerance``. Masked layers are exact for any mask;
    ``assume_post_padded=True`` emits a leaner graph that is exact only when every row's kept steps
    come first (post-padding).
    ``target="portable"`` (beside or instead of tf2onnx's targets) gives masked layers no computed
    ``sequence_lens``, for runtimes that take it only as a constant (tract), exact wherever the
    report does not say otherwise. ``target="onnxruntime"`` computes SimpleRNN layers as an input
    MatMul and a ``Scan`` (onnxruntime's fastest form of them from batch 1 to 64; the default's
    native ``RNN`` node is what OpenVINO, tract, onnx2torch and training want).
    The report is logged and stored in the model's metadata. Verification calls the model only
    when its traced call reaches nothing outside TensorFlow (no file writes, prints, Python or
    network ops), unless ``safe_mode=False``.
    ``quantize="weights"`` stores the weights in int8 (float compute), ``quantize="dynamic"`` computes LSTM and
    Dense layers with onnxruntime's integer kernels too, ``quantize="static"`` writes QDQ (each layer's input on
    an int8 scale calibrated on ``calibration``, which it needs; recurrent states float); each layer only as far
    as ``calibration`` (an array, a dict of input name -> array, or a list of them; without it, seeded random
    inputs) keeps every output within ``max_error`` (relative to its largest magnitude; default 0.01) of the
    float model, and ``verify`` then compares with the source on that data within the same budget
    (:mod:`.quantization`).
    """
    options = Options.of(opset=opset, assume_post_padded=assume_post_padded, **options)
    conversion = run(KerasModel(model, input_signature, safe_mode), output_path=output_path, verify=verify,
                     tolerance=tolerance, options=options, calibration=calibration)
    return conversion.model_proto


def convert_saved_model(path: str, output_path: Optional[str] = None, opset: Optional[int] = None,
                        signature_def: Optional[str] = None, tag: Optional[str] = None,
                        verify: bool = False, tolerance: float = 1e-4, assume_post_padded: bool = False,
                        concrete_function: Optional[int] = None, safe_mode: bool = True, calibration=None,
                        **options) -> onnx.ModelProto:
    """Convert a SavedModel directory; like :func:`convert_keras`, for the CLI's ``--saved-model``.
    A SavedModel is a program: unless ``safe_mode=False``, it is not loaded when its initializers
    reach outside TensorFlow (file writes, prints, Python or network ops), nor verified when its
    signature does."""
    options = Options.of(opset=opset, assume_post_padded=assume_post_padded, **options)
    conversion = run(SavedModel(path, signature_def, tag, concrete_function, safe_mode), output_path=output_path,
                     verify=verify, tolerance=tolerance, options=options, calibration=calibration)
    return conversion.model_proto


def convert_tflite(path: str, output_path: Optional[str] = None, opset: Optional[int] = None,
                   verify: bool = False, tolerance: float = 1e-4, drop_cell_clip: bool = False,
                   dequantize: bool = False, calibration=None, **options) -> onnx.ModelProto:
    """Convert a TFLite file; like :func:`convert_saved_model`, for the CLI's ``--tflite``. Its ``WHILE``
    loops and fused ``UNIDIRECTIONAL_SEQUENCE_LSTM`` ops become native nodes; verification compares
    with the TFLite interpreter. A fused LSTM that clips its cell state where the clip can act is
    refused unless ``drop_cell_clip=True`` (the model then equals the Keras layer, which never clips); a
    layer whose kernels quantize their inputs at run time (dynamic-range quantization) stays tf2onnx's
    Loop unless ``dequantize=True`` (native nodes computing in float with the stored weights); each
    row of the report says what its layer computes otherwise than the file. With ``quantize`` such a file's
    int8 weights are read as stored and kept in int8, on their own scales."""
    options = Options.of(opset=opset, **options)
    dequantize = dequantize or options.quantize is not None  # its int8 weights read as stored, and kept in int8
    conversion = run(TFLite(path, drop_cell_clip, dequantize), output_path=output_path, verify=verify,
                     tolerance=tolerance, options=options, calibration=calibration)
    return conversion.model_proto


def convert_graph_def(path: str, inputs, outputs, output_path: Optional[str] = None, opset: Optional[int] = None,
                      verify: bool = False, tolerance: float = 1e-4, safe_mode: bool = True, calibration=None,
                      **options) -> onnx.ModelProto:
    """Convert a frozen GraphDef file (``.pb``); like :func:`convert_saved_model`, for the CLI's
    ``--graphdef``. ``inputs``: its input tensors, names (``["x:0"]``) or name -> shape to fix one;
    ``outputs``: the tensors to convert. Its functional while-loops stay loops for the rewriter
    (TF1-style lowering is skipped); verification runs the graph in TensorFlow, refused with
    ``safe_mode`` when it holds ops reaching outside TensorFlow."""
    return _convert_graph(GraphDefFile(path, outputs, safe_mode), inputs, output_path, opset, verify, tolerance,
                          calibration, options)


def convert_checkpoint(path: str, inputs, outputs, output_path: Optional[str] = None, opset: Optional[int] = None,
                       verify: bool = False, tolerance: float = 1e-4, safe_mode: bool = True, calibration=None,
                       **options) -> onnx.ModelProto:
    """Convert a TF1 checkpoint from its meta graph (``model.meta`` beside its variables); like
    :func:`convert_graph_def`, for the CLI's ``--checkpoint``. With ``safe_mode``, the checkpoint is
    restored only when its restore op keeps to reading the checkpoint."""
    return _convert_graph(Checkpoint(path, outputs, safe_mode), inputs, output_path, opset, verify, tolerance,
                          calibration, options)


def _convert_graph(source: Source, inputs, output_path, opset, verify, tolerance, calibration,
                   options) -> onnx.ModelProto:
    if inputs is not None and not isinstance(inputs, dict):
        inputs = {name: None for name in ([inputs] if isinstance(inputs, str) else inputs)}
    options = Options.of(opset=opset, inputs=inputs, **options)
    return run(source, output_path=output_path, verify=verify, tolerance=tolerance, options=options,
               calibration=calibration).model_proto


def report_of(model_proto: onnx.ModelProto) -> Optional[ConversionReport]:
    """The conversion report stored in a model this package converted."""
    return ConversionReport.of_model(model_proto)


# -- the one conversion path ---------------------------------------------------------------------
def run(source: Source, *, output_path: Optional[str] = None, verify: bool = False, tolerance: float = 1e-4,
        options: Options = Options(), calibration=None) -> Conversion:
    """The one conversion road: source -> frozen graph -> tf2onnx with the rewriter -> reconciled
    report -> loadable check -> verification (or the output shape check) -> quantization within its budget
    (``options.quantize``, on ``calibration``; then verified against the source on that data, within the budget,
    and not the float conversion first) -> dynamic dimensions named
    (:mod:`.dim_names`, from what the check measured) -> atomic save. Raises :class:`ConversionError` for
    bad input and :class:`VerificationError` when verification fails (nothing is written then)."""
    check_tolerance(tolerance)
    if calibration is not None and not options.quantize:
        raise ConversionError(f"{param('calibration')} is data to quantize with: give {param('quantize')} too")
    if calibration is None and options.quantize == "static":
        raise ConversionError(f"{param('quantize')} 'static' fixes each input's int8 scale from data: give "
                              f"{param('calibration')} (inputs the model will see)")
    source.check()
    if output_path:
        check_output_path(output_path)
    options = source.prepared(options)
    frozen = freeze(source, options)
    conversion = convert(frozen, options)
    in_memory = fits_in_protobuf(conversion.model_proto)
    checked = checked_source(source, frozen, conversion.keras_masks)  # cuDNN ops with no GPU: CPU ops for them
    if verify and not options.quantize:  # a quantized model is verified against the source within its budget
        if not in_memory:  # verification runs the model from memory, which protobuf caps at 2 GB
            raise ConversionError(f"{param('verify')} cannot run a model over 2 GB (protobuf's limit for a model "
                                  f"held in memory); convert without {param('verify')}: the written model is still "
                                  "checked to load in onnxruntime")
        ran = _verified(conversion, checked, options.runtime, tolerance)
        what = (f"outputs verified against {conversion.verification.reference} at input shapes "
                + "; ".join(conversion.verification.input_shapes) + (f"; {ran}" if ran is not None else ""))
        measured = conversion.verification.measured
    elif not options.check_shapes:
        what, measured = "output shapes not checked (the check was turned off)", []
    elif not in_memory:
        what = "output shapes not checked: the model is over 2 GB, which onnxruntime cannot run from memory"
        measured = []
    else:
        what, measured = check_output_shapes(checked, conversion)
    if options.quantize:
        what = _quantized(conversion, checked, calibration, options, verify, what, frozen.weight_owners)
    conversion.report.checked = what
    states = [name for o in conversion.report.outcomes for name in o.state_inputs if name]
    conversion.report.dimensions = name_dimensions(conversion.model_proto, measured, keras=source.kind in KERAS_KINDS,
                                                   state_inputs=states, infer=in_memory)
    logger.info("tf2onnx_rnn: dimensions: %s", conversion.report.dimensions or "none dynamic")
    conversion.report.attach(conversion.model_proto)
    logger.info("tf2onnx_rnn: %s", what)
    if output_path:
        # a model too big to load from memory is loaded from its written files before they replace the output
        conversion.written = save_model(conversion.model_proto, output_path,
                                        check_loads=not in_memory and not options.continue_on_error)
    return conversion


def _quantized(conversion: Conversion, checked, calibration, options: Options, verify: bool, what: str,
               owners) -> str:
    """The converted model quantized within its budget (:mod:`.quantization`), checked as a converted model is,
    and with ``verify`` compared with the source on the calibration data within that budget. Returns what was
    checked, in one line."""
    from .feeds import GIVEN_ROUNDS
    from .quantization import calibration_rounds, quantize

    report = conversion.report
    nodes: dict = {}  # a layer written as a node per direction (the portable form's Bidirectional): each row says which
    for o in report.outcomes:
        if o.node:
            nodes.setdefault(o.layer, set()).add(o.node)
    names = {o.node: o.layer + (f" ({o.direction})" if len(nodes[o.layer]) > 1 and o.direction else "")
             for o in report.outcomes if o.node}
    rows = (options.runtime,) if options.runtime else \
        tuple(row for row in RUNTIMES if row.target == PORTABLE) if options.portable else ()
    try:
        model, report.quantization = quantize(conversion.model_proto, options.quantize, options.max_error,
                                              calibration, names, rows, owners())
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - nothing is written: the float model stands, unquantized
        logger.debug("quantizing raised", exc_info=True)
        raise ConversionError(f"{param('quantize')} {options.quantize!r}: internal error while quantizing: "
                              f"{type(error).__name__}: {first_line(str(error))}; convert without it") from None
    consumers = consumers_of(model, options.runtime, any(o.became == STEPS for o in report.outcomes))
    report.consumers, report.runs_in, report.runtime_notes = consumers.lines, consumers.runs_in, consumers.notes
    report.quantization.notes = [f"{BY_KEY[key].name}: {BY_KEY[key].int8_weights}" for key in report.runs_in
                                 if BY_KEY[key].int8_weights and any(row.int8 for row in report.quantization.layers)]
    if options.quantize == "dynamic" and any(row.precision.startswith("int8 (integer") for row in
                                              report.quantization.layers):
        report.quantization.notes.append("onnxruntime alone computes its integer kernels: for the other runtimes, "
                                         "quantize 'weights' (with the --target the report names for them)")
    report.attach(model)
    if fits_in_protobuf(model):
        check_survives(model, _checked_feeds(model), report.outcomes)
    check_loadable(model, options.continue_on_error)
    conversion.model_proto = model
    if not verify:
        return what + f"; the quantized model's error measured on {report.quantization.data}"
    if not fits_in_protobuf(model):
        raise ConversionError(f"{param('verify')} cannot run a model over 2 GB (protobuf's limit for a model held in "
                              f"memory); convert without {param('verify')}")
    rounds = calibration_rounds(model, calibration) if calibration is not None else None
    token = GIVEN_ROUNDS.set(rounds)
    try:
        ran = _verified(conversion, checked, options.runtime, report.quantization.tolerance)
    finally:
        GIVEN_ROUNDS.reset(token)
    return (f"quantized model verified against {conversion.verification.reference} on {report.quantization.data} "
            f"within {report.quantization.tolerance:.3g}" + (f"; {ran}" if ran is not None else ""))


def _verified(conversion: Conversion, checked, runtime, tolerance: float) -> Optional[str]:
    """Verify ``conversion``'s model against the source within ``tolerance``, and in ``runtime`` (the target's row,
    or None) where it is installed; :class:`VerificationFailed` where either fails. Returns what ran in the
    runtime, in words (None without a runtime)."""
    conversion.verification = checked.verify(conversion.model_proto, tolerance)
    if not conversion.verification.passed:
        raise VerificationFailed(conversion.verification, conversion)
    if runtime is None:
        return None
    conversion.runtime_verification, ran = verify_in_runtime(checked, conversion.model_proto, runtime, tolerance)
    if conversion.runtime_verification is not None and not conversion.runtime_verification.passed:
        raise VerificationFailed(conversion.runtime_verification, conversion)
    return ran


def freeze(source: Source, options: Options) -> Frozen:
    """The source frozen into what tf2onnx converts. TensorFlow's (or tf2onnx's, or Keras's) own failure
    on the model is a :class:`ConversionError` naming the source; a graph holding a layer that
    TensorFlow itself computes wrongly is refused."""
    try:
        frozen = source.freeze(options)
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - only what a library raised on the model
        if not raised_by_library(error):
            raise
        raise ConversionError(f"cannot read the model ({param(source.kind)}): {type(error).__name__}: "
                              f"{first_line(error)}") from error
    if frozen.graph_def is not None:
        refuse_mistraced(frozen.graph_def)
    return frozen


def convert(frozen: Frozen, options: Options) -> Conversion:
    """A frozen graph to a loadable ONNX model with its reconciled report stored in it."""
    model_proto, nchw, findings = to_onnx(frozen, options)
    loops = frozen.loops if frozen.loops is not None else recurrent_loops(frozen.graph_def)
    unrolled = unrolled_layers(frozen.graph_def) if frozen.graph_def is not None else []
    report = reconcile(findings, loops, model_proto, frozen.layer_names, unrolled)
    if options.training:
        report = training_form(model_proto, report)
    report.outcomes = [dataclasses.replace(o, stateful=True) if o.layer in frozen.stateful_layers else o
                       for o in report.outcomes]
    report.outcomes = [_for_its_activations(o, frozen.inexpressible or {}) for o in report.outcomes]
    kinds = frozen.layer_kinds or {}  # a row whose scopes named no kind, or no ConvLSTM's: the Keras layer's class
    report.outcomes = [dataclasses.replace(o, kind=kinds[o.layer]) if o.kind in ("unknown", "ConvLSTM")
                       and o.layer in kinds else o for o in report.outcomes]
    report.nchw_inputs, report.nchw_outputs = (tuple(nchw.get(f"{kind}_as_nchw", ())) for kind in ("inputs", "outputs"))
    if options.streaming:
        check_streamed(report)
    if not options.continue_on_error:
        check_lowered(report, frozen.lowered)
    if options.runtime:  # the form that runtime computes, lowered as far as its row of the table needs
        report = lower_for_runtime(model_proto, options.runtime, report)
    consumers = consumers_of(model_proto, options.runtime, any(o.became == STEPS for o in report.outcomes))
    report.consumers, report.runs_in, report.runtime_notes = consumers.lines, consumers.runs_in, consumers.notes
    stamp_ir_version(model_proto)
    report.attach(model_proto)
    logger.info("tf2onnx_rnn report:\n%s", report.table())
    if fits_in_protobuf(model_proto):  # a larger one is checked from its written files (output.save_model)
        check_survives(model_proto, _checked_feeds(model_proto), report.outcomes)
    check_loadable(model_proto, options.continue_on_error)
    if options.large_model:
        model_proto.metadata_props.add(key=LARGE_MODEL_KEY, value="1")
    return Conversion(model_proto, report, keras_masks=dict(getattr(findings, "keras_masks", {}) or {}))


def _checked_feeds(model_proto: onnx.ModelProto) -> list:
    """The rounds of inputs the checks will give the model (none where its inputs cannot be made: the
    session is still created)."""
    from .feeds import check_feeds

    try:
        return check_feeds(model_proto)
    except ConversionError:  # an input type random inputs cannot be made of: the checks say so themselves
        return []


def _for_its_activations(outcome, inexpressible: dict):
    """A built-in layer written as a Scan because of its activations says so, not what a matcher found
    amiss in the activation's ops."""
    names = inexpressible.get(outcome.layer)
    if not names or outcome.became != SCAN or outcome.reason.startswith("internal error"):
        return outcome
    kept = outcome.reason[outcome.reason.find("; cannot stream"):] if "; cannot stream" in outcome.reason else ""
    return dataclasses.replace(outcome, reason=f"activation {', '.join(names)}: no ONNX recurrent node computes "
                                               f"it{kept}")


def check_lowered(report: ConversionReport, lowered: tuple) -> None:
    """A loop lowered to TF 1.x control flow over TensorLists when its graph was frozen has no ONNX form
    but a fused node: one that stays a Loop is a :class:`ConversionError` naming it and why."""
    stuck = [o for o in report.outcomes if o.became == LOOP and o.loop in lowered]
    if stuck:
        raise ConversionError(f"{stuck[0].layer}: {stuck[0].reason}; a loop frozen lowered to TF1 control flow "
                              "over TensorLists has no other ONNX form: freeze with "
                              "convert_variables_to_constants_v2(..., lower_control_flow=False)")


def check_streamed(report: ConversionReport) -> None:
    """Streaming is all or nothing: every recurrent layer must carry its states in and out, else
    :class:`ConversionError` naming each layer that cannot and why."""
    refused: dict = {}  # (layer, kind, why) -> directions, once per layer however many loops it has
    for o in report.outcomes:
        if o.own_step and not o.state_outputs:  # a Scan whose carried states could not be streamed
            refused.setdefault((o.layer, o.kind, "written as a Scan of its own step, whose states are not streamed "
                                f"(no native node: {o.reason})"), []).append(o.direction)
        elif not o.state_outputs:
            refused.setdefault((o.layer, o.kind, o.reason or f"became {o.became}"), []).append(o.direction)
    if refused:
        layers = "; ".join(f"{layer} ({' '.join([kind] + [d for d in directions if d])}): {why}"
                           for (layer, kind, why), directions in refused.items())
        raise ConversionError(f"cannot stream {len(refused)} recurrent layer(s): {layers}")
