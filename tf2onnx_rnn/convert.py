"""Command line: convert a SavedModel or a Keras file, with recurrent layers as native ONNX nodes.

    python -m tf2onnx_rnn.convert --saved-model DIR --output model.onnx [--opset N] [--verify]
    python -m tf2onnx_rnn.convert --keras model.keras --output model.onnx

Flags keep tf2onnx's spellings; where tf2onnx mixes hyphens and underscores both are accepted.
The conversion report (and with ``--verify`` the verification table) goes to stdout. This module
parses and prints; every check and the conversion itself are the API's (:func:`api.run`).

Exit status: 0 converted (and verified when asked); 1 verification (or the output shape check) failed;
2 bad input;
3 internal error (a bug: the traceback is printed). Nothing is written unless the exit status is 0.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
import traceback
from typing import Optional, Sequence

from . import api, sources, training
from .errors import ConversionError, first_line, param
from .options import RUNTIME_TARGETS, Options, check_tolerance
from .output import check_output_path, save_model
from .shape_check import ShapeCheckFailed
from .sources.keras_file import use_tensorflow_backend

EXIT_OK = 0
EXIT_VERIFICATION_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 3


class UsageError(Exception):
    """A command line argparse rejects."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's hook: raise instead of printing usage and exiting
        raise UsageError(f"{message} (see --help)")


def _tolerance(text: str) -> float:
    """A number, checked by the API's own rule at once (before TensorFlow's slow import)."""
    try:
        value = float(text)
        check_tolerance(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    except ConversionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _max_error(text: str) -> float:
    """A quantization's budget: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


_INPUT = re.compile(r"\s*([^\[\],]+?)\s*(?:\[([^\]]*)\])?\s*(?:,|$)")


def _inputs(text: str) -> dict:
    """tf2onnx's ``--inputs`` syntax: ``x:0[1,50,16],mask`` -> {name: shape or None}; -1 or ? is dynamic."""
    shapes, position = {}, 0
    while position < len(text):
        match = _INPUT.match(text, position)
        if match is None or match.end() == position:
            raise argparse.ArgumentTypeError(f"cannot read {text!r}: use name[d0,d1,...],name2[...]")
        name, dims = match.group(1), match.group(2)
        name = name[:-2] if name.endswith(":0") else name
        try:
            shapes[name] = None if dims is None else [
                None if d.strip() in ("-1", "?", "None", "") else int(d) for d in dims.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"a dimension of {name} is not a whole number: [{dims}]") from None
        position = match.end()
    return shapes


def _names(text: str) -> list:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty name in {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tf2onnx-rnn", allow_abbrev=False,
        description="Convert a TensorFlow model (SavedModel, Keras file, TFLite file or frozen graph) to ONNX "
                    "with tf2onnx, turning its Keras LSTM, GRU and SimpleRNN layers and TFLite's fused LSTM into "
                    "native ONNX LSTM/GRU/RNN nodes.",
        epilog="exit status: 0 converted, 1 verification or the output shape check failed, 2 bad input, "
               "3 internal error; "
               "the output file is written only on success.")
    _add_source_flags(parser)
    parser.add_argument("--output", required=True, metavar="FILE", help="the ONNX file to write")
    parser.add_argument("--opset", type=int, metavar="N", help="ONNX opset (default: tf2onnx's, capped at what "
                                                              "the installed onnxruntime runs)")
    parser.add_argument("--signature_def", "--signature-def", dest="signature_def", metavar="NAME",
                        help="the SavedModel signature to convert (default: the first)")
    parser.add_argument("--tag", metavar="TAG", help="the SavedModel meta graph tag (default: serve)")
    parser.add_argument("--concrete_function", "--concrete-function", dest="concrete_function", type=int,
                        metavar="N", help="for a SavedModel without signatures: the index of the tf.function "
                                          "to convert")
    parser.add_argument("--inputs", type=_inputs, metavar="NAME[SHAPE],...",
                        help="fix input shapes, e.g. x:0[1,50,16] (-1 or ? keeps a dimension dynamic); a frozen "
                             "graph's input placeholders, e.g. x:0")
    parser.add_argument("--outputs", type=_names, metavar="NAMES",
                        help="a frozen graph's output tensors (comma-separated), e.g. Identity:0")
    parser.add_argument("--rename-inputs", "--rename_inputs", dest="rename_inputs", type=_names, metavar="NAMES",
                        help="names for the ONNX model's inputs, in the model's order")
    parser.add_argument("--rename-outputs", "--rename_outputs", dest="rename_outputs", type=_names,
                        metavar="NAMES", help="names for the ONNX model's outputs, in the model's order")
    parser.add_argument("--inputs-as-nchw", "--inputs_as_nchw", dest="inputs_as_nchw", type=_names,
                        metavar="NAMES", help="transpose these inputs from NHWC to NCHW")
    parser.add_argument("--outputs-as-nchw", "--outputs_as_nchw", dest="outputs_as_nchw", type=_names,
                        metavar="NAMES", help="transpose these outputs from NHWC to NCHW")
    parser.add_argument("--extra_opset", "--extra-opset", dest="extra_opset", type=_names,
                        metavar="DOMAIN:VERSION", help="extra opsets to import, e.g. com.microsoft:1")
    parser.add_argument("--target", type=_names, metavar="TARGETS",
                        help="tf2onnx's workarounds for a runtime (comma-separated), and portable: masked "
                             "recurrent layers without a computed sequence_lens, for runtimes that take it only "
                             "as a constant (tract), training: the form onnxruntime's training API takes, and "
                             "onnxruntime: SimpleRNN as an input MatMul and a Scan, its fastest form there; "
                             f"{', '.join(RUNTIME_TARGETS)}: the form that runtime computes (fixed shapes: give "
                             "--inputs)")
    parser.add_argument("--large_model", "--large-model", dest="large_model", action="store_true",
                        help="write the weights beside the model (FILE.data): for models over 2 GB")
    parser.add_argument("--continue_on_error", "--continue-on-error", dest="continue_on_error",
                        action="store_true", help="write the model even if TensorFlow ops were left unconverted "
                                                  "(onnxruntime may not load it)")
    parser.add_argument("--runtime-notes", "--runtime_notes", dest="runtime_notes", action="store_true",
                        help="end the report with each runtime's reason, where it does not compute the model as "
                             "written")
    parser.add_argument("--verify", action="store_true",
                        help="run the ONNX model in onnxruntime against TensorFlow before writing it")
    parser.add_argument("--tolerance", type=_tolerance, default=1e-4, metavar="FLOAT",
                        help="max abs error --verify accepts (default: %(default)g)")
    parser.add_argument("--quantize", choices=("weights", "dynamic", "static"),
                        help="int8: 'weights' stores weights in int8 (float compute, every runtime), 'dynamic' "
                             "computes LSTM and Dense layers with onnxruntime's integer kernels too, 'static' writes "
                             "QDQ with each layer's input scale calibrated (needs --calibration); each layer only "
                             "as far as --max-error allows on the calibration data")
    parser.add_argument("--calibration", metavar="FILE.npz",
                        help="data to quantize with: an .npz of one array (the model's one input) or of one array "
                             "per input name (default: seeded random inputs)")
    parser.add_argument("--max-error", "--max_error", dest="max_error", type=_max_error, default=None,
                        metavar="FRACTION", help="a quantization's budget: each output's largest error relative to "
                                                 "its largest magnitude (default: 0.01)")
    parser.add_argument("--no-check-shapes", "--no_check_shapes", dest="check_shapes", action="store_false",
                        help="skip the default check (without --verify) that the ONNX model's output shapes are "
                             "TensorFlow's on two small random inputs")
    parser.add_argument("--assume-post-padded", "--assume_post_padded", dest="assume_post_padded",
                        action="store_true",
                        help="emit the leaner masked-layer graph that is exact only when every row's kept "
                             "steps come first (post-padding); the default is exact for any mask")
    parser.add_argument("--streaming", action="store_true", default=None,
                        help="recurrent states in and out of the model (<layer>/h_in, <layer>/h_out, c_ for "
                             "LSTM), to run a sequence chunk by chunk; automatic for stateful Keras models")
    parser.add_argument("--no-state-defaults", "--no_state_defaults", dest="state_defaults", action="store_false",
                        default=None,
                        help="streamed state inputs stay required, with no default (OpenVINO and tract read an "
                             "input with a default as a constant: to feed states there); the default for "
                             "--target portable")
    parser.add_argument("--no-safe-mode", "--no_safe_mode", dest="safe_mode", action="store_false",
                        help="trust the model: load a Keras file whose Lambda layers carry Python code, load a "
                             "SavedModel whose initializers and verify one whose signature reach outside TensorFlow "
                             "(files, prints, Python, the network)")
    parser.add_argument("--custom-objects", "--custom_objects", dest="custom_objects", type=_names,
                        metavar="FILES_OR_MODULES",
                        help="Python files or modules (comma-separated) defining the custom classes and functions a "
                             "Keras file uses; they are imported, so their code runs")
    _add_tflite_flags(parser)
    _add_training_flags(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's log")
    return parser


def _add_source_flags(parser: argparse.ArgumentParser) -> None:
    """The model to convert: exactly one source."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--saved-model", "--saved_model", dest="saved_model", metavar="DIR",
                        help="a SavedModel directory (tf.saved_model, Keras 3 model.export, tf_keras save)")
    source.add_argument("--keras", metavar="FILE", help="a Keras model file: .keras, or .h5 (Keras 3 or Keras 2)")
    source.add_argument("--tflite", metavar="FILE", help="a TFLite file (.tflite)")
    source.add_argument("--graphdef", metavar="FILE", help="a frozen GraphDef (.pb), with --inputs and --outputs")
    source.add_argument("--checkpoint", metavar="FILE", help="a TF1 checkpoint's meta graph (model.meta), with "
                                                             "--inputs and --outputs")


def _add_tflite_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drop-cell-clip", "--drop_cell_clip", dest="drop_cell_clip", action="store_true",
                        help="TFLite: convert a fused LSTM that clips its cell state (cell_clip) without the clip, "
                             "where the clip could act (the model then equals the Keras layer, which never clips)")
    parser.add_argument("--dequantize", action="store_true",
                        help="TFLite: convert layers whose kernels quantize their inputs at run time (dynamic-range "
                             "quantization) and integer-quantized fused LSTMs to native nodes computing in float "
                             "with the stored weights (outputs then differ from the TFLite interpreter by the "
                             "quantization's error)")


def _add_training_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--training-artifacts", "--training_artifacts", dest="training_artifacts", metavar="DIR",
                        help="convert in the training form (--target training) and write onnxruntime's training "
                             "artifacts into DIR (needs onnxruntime's training build)")
    parser.add_argument("--training-loss", "--training_loss", dest="training_loss", default="mse",
                        choices=("mse", "crossentropy", "bce", "l1"), help="the artifacts' loss (default: mse)")
    parser.add_argument("--training-optimizer", "--training_optimizer", dest="training_optimizer", default="adamw",
                        choices=("adamw", "sgd"), help="the artifacts' optimizer (default: adamw)")


# -- environment -------------------------------------------------------------------------------
def _quiet_logs(debug: bool) -> None:
    """Hush TensorFlow's and tf2onnx's logs (not ours) unless --debug or the user chose a level.

    Level 3 is what tf2onnx's own CLI sets; without it TensorFlow builds with CUDA log an
    ``E`` line on every machine without a GPU. Real failures still surface as exceptions.
    """
    if debug:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    for name in ("tensorflow", "tf2onnx", "absl"):  # what matters reaches the user as our own one line
        logging.getLogger(name).setLevel(logging.INFO if debug else logging.CRITICAL)
    logging.getLogger("tf2onnx_rnn").setLevel(logging.DEBUG if debug else logging.WARNING)


def import_tensorflow(debug: bool) -> None:
    """Import TensorFlow, holding back the lines its C++ side writes to stderr while loading.

    TensorFlow logs those before its log level applies. They are shown after all if the
    import fails, and always with --debug.
    """
    if debug or "tensorflow" in sys.modules:
        import tensorflow  # noqa: F401
        return
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to guard
        import tensorflow  # noqa: F401
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            import tensorflow  # noqa: F401
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))


# -- the run ---------------------------------------------------------------------------------
# the API's parameters the command line names otherwise than by their own name with two dashes
_API_FLAGS = {"keras_file": "--keras", "keras_model": "--keras", "output_path": "--output",
              "safe_mode=False": "--no-safe-mode"}


def flag_of(parser: argparse.ArgumentParser):
    """How the command line spells an API parameter in a message: as the flag that gives it."""
    flags = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    flags.update(_API_FLAGS)
    return lambda name: flags.get(name, name)


def _options(args: argparse.Namespace) -> Options:
    return Options.of(opset=args.opset, assume_post_padded=args.assume_post_padded,
                      continue_on_error=args.continue_on_error, large_model=args.large_model,
                      rename_inputs=args.rename_inputs, rename_outputs=args.rename_outputs,
                      inputs=args.inputs, streaming=args.streaming, state_defaults=args.state_defaults,
                      target=_targets(args),
                      check_shapes=args.check_shapes,
                      extra_opset=args.extra_opset,
                      inputs_as_nchw=args.inputs_as_nchw, outputs_as_nchw=args.outputs_as_nchw,
                      quantize=args.quantize, max_error=args.max_error)


def _targets(args: argparse.Namespace):
    """--target, with the training form when training artifacts are asked for."""
    if not args.training_artifacts:
        return args.target
    return list(args.target or []) + ([] if "training" in (args.target or []) else ["training"])


def _source(args: argparse.Namespace) -> sources.Source:
    """The source the flags name, checked before TensorFlow's slow import (the API's checks)."""
    source = sources.choose(keras_file=args.keras, saved_model=args.saved_model, tflite=args.tflite,
                            graphdef=args.graphdef, checkpoint=args.checkpoint, outputs=args.outputs,
                            signature_def=args.signature_def, tag=args.tag, concrete_function=args.concrete_function,
                            safe_mode=None if args.safe_mode else False, custom_objects=args.custom_objects,
                            drop_cell_clip=args.drop_cell_clip or None,
                            # a quantized TFLite file's int8 weights, read as stored, are what --quantize keeps
                            dequantize=args.dequantize or (bool(args.quantize and args.tflite)) or None)
    source.check()
    return source


def run(args: argparse.Namespace) -> int:
    check_output_path(args.output)
    note = use_tensorflow_backend()  # before anything imports Keras
    if note:
        print(note, file=sys.stderr)
    source = _source(args)
    if args.training_artifacts:
        training.training_build()  # before converting: nothing is written without it
    calibration = read_calibration(args.calibration) if args.calibration else None
    import_tensorflow(args.debug)
    options = _options(args)
    try:
        conversion = api.run(source, output_path=None if args.training_artifacts else args.output,
                             verify=args.verify, tolerance=args.tolerance, options=options, calibration=calibration)
    except (api.VerificationFailed, ShapeCheckFailed) as failure:
        print(failure.conversion.report.table(args.runtime_notes))
        print(failure.result.table())
        _error(f"{failure.what} failed: {verified_summary(failure.result)}")
        print(f"{args.output} was not written")
        return EXIT_VERIFICATION_FAILED
    print(conversion.report.table(args.runtime_notes))
    if conversion.verification is not None:
        print(conversion.verification.table())
    if conversion.runtime_verification is not None:
        print(conversion.runtime_verification.table())
    if args.training_artifacts:  # the artifacts first: the model is written only when they are
        written = training.write_training_artifacts(conversion.model_proto, args.training_artifacts,
                                                    loss=args.training_loss, optimizer=args.training_optimizer)
        conversion.written = save_model(conversion.model_proto, args.output, check_loads=False)
        print("wrote training artifacts " + ", ".join(os.path.basename(f) for f in written))
    print("wrote " + " and ".join(conversion.written))
    return EXIT_OK


def read_calibration(path: str):
    """An .npz of calibration data, read without running anything it holds (no pickled objects): its one
    array, or input name -> array."""
    import numpy as np

    if not os.path.isfile(path):
        raise ConversionError(f"{param('calibration')} file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (ValueError, OSError, EOFError) as error:
        raise ConversionError(f"{param('calibration')} {path} is not an .npz of arrays: {first_line(error)}") from None
    if not arrays:
        raise ConversionError(f"{param('calibration')} {path} holds no array")
    return next(iter(arrays.values())) if len(arrays) == 1 else arrays


def verified_summary(result) -> str:
    """One line saying what failed verification first and why: an output's NaN/Inf mismatch, shape,
    dtype or max abs error against the tolerance, or a difference of the models as a whole."""
    return result.reason() or "no output was compared"


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``tf2onnx-rnn`` command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        _error(str(error))
        return EXIT_BAD_INPUT
    _quiet_logs(args.debug)
    try:
        return run(args)
    except ConversionError as error:
        if args.debug:
            traceback.print_exc()
        _error(first_line(error.spelled(flag_of(parser))))
        return getattr(error, "exit_code", EXIT_BAD_INPUT)
    except Exception as error:  # a bug, ours or a library's: show it in full
        traceback.print_exc()
        _error(f"internal error: {type(error).__name__}: {first_line(error)}")
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
