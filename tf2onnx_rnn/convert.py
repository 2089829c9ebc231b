"""Command line: convert a SavedModel or a Keras file, with recurrent layers as native ONNX nodes.

    python -m tf2onnx_rnn.convert --saved-model DIR --output model.onnx [--opset N] [--verify]
    python -m tf2onnx_rnn.convert --keras model.keras --output model.onnx

Flags keep tf2onnx's spellings; where tf2onnx mixes hyphens and underscores both are accepted.
The conversion report (and with ``--verify`` the verification table) goes to stdout.

Exit status: 0 converted (and verified when asked); 1 verification failed; 2 bad input;
3 internal error (a bug: the traceback is printed). Nothing is written unless the exit status is 0.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import traceback
import zipfile
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import onnx

from .api import check_opset
from .errors import ConversionError, VerificationError, first_line as _first_line

EXIT_OK = 0
EXIT_VERIFICATION_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 3

KERAS_EXTENSIONS = (".keras", ".h5", ".hdf5")
HDF5_EXTENSIONS = (".h5", ".hdf5")


class UsageError(Exception):
    """A command line argparse rejects."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's hook: raise instead of printing usage and exiting
        raise UsageError(f"{message} (see --help)")


@dataclass
class Conversion:
    """A converted model and how to check it against its source."""

    model_proto: onnx.ModelProto
    check: Callable  # (model_proto, tolerance) -> VerificationResult


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tf2onnx-rnn", allow_abbrev=False,
        description="Convert a TensorFlow SavedModel or a Keras model to ONNX with tf2onnx, turning "
                    "Keras LSTM, GRU and SimpleRNN layers into native ONNX LSTM/GRU/RNN nodes.",
        epilog="exit status: 0 converted, 1 verification failed, 2 bad input, 3 internal error; "
               "the output file is written only on success.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--saved-model", "--saved_model", dest="saved_model", metavar="DIR",
                        help="a SavedModel directory (tf.saved_model, Keras 3 model.export, tf_keras save)")
    source.add_argument("--keras", metavar="FILE", help="a Keras model file: .keras, or .h5 (Keras 3 or tf_keras)")
    parser.add_argument("--output", required=True, metavar="FILE", help="the ONNX file to write")
    parser.add_argument("--opset", type=int, metavar="N", help="ONNX opset (default: tf2onnx's)")
    parser.add_argument("--signature_def", "--signature-def", dest="signature_def", metavar="NAME",
                        help="the SavedModel signature to convert (default: the first)")
    parser.add_argument("--tag", metavar="TAG", help="the SavedModel meta graph tag (default: serve)")
    parser.add_argument("--verify", action="store_true",
                        help="run the ONNX model in onnxruntime against TensorFlow before writing it")
    parser.add_argument("--tolerance", type=_tolerance, default=1e-4, metavar="FLOAT",
                        help="max abs error --verify accepts (default: %(default)g)")
    parser.add_argument("--assume-post-padded", "--assume_post_padded", dest="assume_post_padded",
                        action="store_true",
                        help="emit the leaner masked-layer graph that is exact only when every row's kept "
                             "steps come first (post-padding); the default is exact for any mask")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's log")
    return parser


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
    for name in ("tensorflow", "tf2onnx", "absl"):
        logging.getLogger(name).setLevel(logging.INFO if debug else logging.ERROR)
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


# -- checks that need no TensorFlow ------------------------------------------------------------
def check_arguments(args: argparse.Namespace) -> None:
    """Reject bad input early, before the slow imports and the conversion."""
    check_output(args.output)
    if args.saved_model is not None:
        check_saved_model_path(args.saved_model)
    else:
        check_keras_path(args.keras)
        if args.signature_def is not None or args.tag is not None:
            raise ConversionError("--signature_def and --tag apply to --saved-model only")


def check_output(path: str) -> None:
    if os.path.isdir(path):
        raise ConversionError(f"--output is a directory, not a file: {path}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConversionError(f"output directory does not exist: {directory}")
    try:  # a real probe: os.access says yes to root even where writing fails
        with tempfile.TemporaryFile(prefix=".tf2onnx_rnn-probe-", dir=directory):
            pass
    except OSError as error:
        raise ConversionError(f"output directory is not writable: {directory} ({error.strerror})") from None


def check_saved_model_path(path: str) -> None:
    if not os.path.exists(path):
        raise ConversionError(f"no such SavedModel directory: {path}")
    if not os.path.isdir(path):
        raise ConversionError(f"--saved-model needs a directory, got a file: {path}"
                              + (" (use --keras for Keras files)" if path.lower().endswith(KERAS_EXTENSIONS)
                                 else ""))


def check_keras_path(path: str) -> None:
    if not os.path.exists(path):
        raise ConversionError(f"no such Keras file: {path}")
    if os.path.isdir(path):
        raise ConversionError(f"--keras needs a .keras or .h5 file, got a directory: {path} "
                              "(use --saved-model for a SavedModel)")
    if not path.lower().endswith(KERAS_EXTENSIONS):
        raise ConversionError(f"--keras needs a .keras or .h5 file, got: {path}")
    if path.lower().endswith(HDF5_EXTENSIONS):
        import h5py

        if not h5py.is_hdf5(path):
            raise ConversionError(f"not an HDF5 file: {path}")
    elif not zipfile.is_zipfile(path):
        raise ConversionError(f"not a .keras model archive (a .keras file is a zip archive): {path}")


# -- loading and converting ------------------------------------------------------------------
def load_keras_model(path: str):
    """Load with Keras 3; an .h5 file Keras 3 cannot read gets a second try with tf_keras."""
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as error:  # Keras raises many kinds for unreadable files
        keras3_error = error
    if not path.lower().endswith(HDF5_EXTENSIONS):
        raise ConversionError(f"cannot load Keras model {path}: {_first_line(keras3_error)}") from keras3_error
    return _load_with_tf_keras(path, keras3_error)


def _load_with_tf_keras(path: str, keras3_error: Exception):
    try:
        import tf_keras
    except ImportError:
        raise ConversionError(f"cannot load Keras model {path} with Keras 3 ({_first_line(keras3_error)}), "
                              "and tf_keras is not installed to try") from keras3_error
    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as error:  # as above
        raise ConversionError(f"cannot load Keras model {path}: Keras 3: {_first_line(keras3_error)}; "
                              f"tf_keras: {_first_line(error)}") from error


def convert_saved_model(args: argparse.Namespace) -> Conversion:
    from . import api
    from .verify import verify_saved_model

    model_proto = api.convert_saved_model(args.saved_model, opset=args.opset, signature_def=args.signature_def,
                                          tag=args.tag, assume_post_padded=args.assume_post_padded)

    def check(proto, tolerance):
        return verify_saved_model(args.saved_model, proto, signature_def=args.signature_def, tag=args.tag,
                                  tolerance=tolerance)

    return Conversion(model_proto, check)


def convert_keras_file(args: argparse.Namespace) -> Conversion:
    from . import api
    from .verify import verify_keras

    model = load_keras_model(args.keras)
    model_proto = api.convert_keras(model, opset=args.opset, assume_post_padded=args.assume_post_padded)
    return Conversion(model_proto, lambda proto, tolerance: verify_keras(model, proto, tolerance=tolerance))


# -- the run ---------------------------------------------------------------------------------
def print_report(model_proto: onnx.ModelProto) -> None:
    from .api import report_of

    report = report_of(model_proto)
    print(report.table() if report is not None else "no conversion report in the model")


def verified(conversion: Conversion, tolerance: float) -> bool:
    """Print the verification table; False (with the reason on stderr) when it fails."""
    try:
        result = conversion.check(conversion.model_proto, tolerance)
    except VerificationError as error:
        _error(f"verification failed: {_first_line(error)}")
        return False
    print(result.table())
    if not result.passed:
        worst = max((check.max_abs_error for check in result.checks), default=float("nan"))
        _error(f"verification failed: max abs error {worst:.3g} exceeds the tolerance {tolerance:g}")
    return result.passed


def save(model_proto: onnx.ModelProto, path: str) -> None:
    from .api import save_model

    try:
        save_model(model_proto, path)
    except OSError as error:
        raise ConversionError(f"cannot write {path}: {error.strerror or error}") from error


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    import_tensorflow(args.debug)
    check_opset(args.opset)
    convert = convert_saved_model if args.saved_model is not None else convert_keras_file
    conversion = convert(args)
    print_report(conversion.model_proto)
    if args.verify and not verified(conversion, args.tolerance):
        print(f"{args.output} was not written")
        return EXIT_VERIFICATION_FAILED
    save(conversion.model_proto, args.output)
    print(f"wrote {args.output}")
    return EXIT_OK


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``tf2onnx-rnn`` command; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        _error(str(error))
        return EXIT_BAD_INPUT
    _quiet_logs(args.debug)
    try:
        return run(args)
    except ConversionError as error:
        if args.debug:
            traceback.print_exc()
        _error(_first_line(error))
        return EXIT_BAD_INPUT
    except Exception as error:  # a bug, ours or a library's: show it in full
        traceback.print_exc()
        _error(f"internal error: {type(error).__name__}: {_first_line(error)}")
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
