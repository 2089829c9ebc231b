"""tf2onnx-rnn: Keras recurrent layers as native ONNX LSTM/GRU/RNN nodes, on top of tf2onnx."""
import os as _os
import sys as _sys
from importlib.util import find_spec as _find_spec

# TensorFlow is the user's to choose (tensorflow, tensorflow-cpu, tensorflow-macos...), so it is
# not a dependency. Without it nothing here can work: say so in one line, before anything else.
_TENSORFLOW_MISSING = ("tf2onnx-rnn needs TensorFlow 2.15 to 2.21: pip install tensorflow (or tensorflow-cpu), "
                       "or pip install 'tf2onnx-rnn[tensorflow]'")


def _cannot_work(message: str) -> None:
    """Stop with one line: exit status 2 on the command line, ImportError from Python."""
    if _sys.argv and _os.path.basename(_sys.argv[0]) in ("tf2onnx-rnn", "-m"):  # the command line
        print(f"error: {message}", file=_sys.stderr)
        raise SystemExit(2)
    raise ImportError(message)


def _onnx_problem() -> str:
    """Why ``import onnx`` fails in this environment, in one line ("" when it works). onnx 1.19 and
    later need ml_dtypes 0.5 without saying so, and TensorFlow 2.15-2.17 hold ml_dtypes below 0.5."""
    try:
        import onnx  # noqa: F401
    except AttributeError as error:
        if "ml_dtypes" not in str(error):
            raise
        from importlib.metadata import version

        return (f"the installed onnx {version('onnx')} needs ml_dtypes 0.5 or later, this environment has "
                f"ml_dtypes {version('ml_dtypes')} (which your TensorFlow may require): "
                "pip install 'onnx>=1.16,<1.19'")
    return ""


if _find_spec("tensorflow") is None:
    _cannot_work(_TENSORFLOW_MISSING)
_ONNX_PROBLEM = _onnx_problem()
if _ONNX_PROBLEM:
    _cannot_work(_ONNX_PROBLEM)

# Installed (wheel or editable), rewriters/ is tf2onnx_rnn.rewriters (setup.cfg's package_dir).
# Imported straight from a source checkout (say, `python -m tf2onnx_rnn.convert` run in the
# checkout, which puts the checkout first on sys.path), it sits beside this package instead: load
# that one directory as the subpackage, so nothing else of the checkout becomes importable here.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
_BESIDE = _os.path.join(_os.path.dirname(_HERE), "rewriters")
if (not _os.path.isdir(_os.path.join(_HERE, "rewriters")) and "tf2onnx_rnn.rewriters" not in _sys.modules
        and _find_spec("tf2onnx_rnn.rewriters") is None
        and _os.path.isfile(_os.path.join(_BESIDE, "__init__.py"))):
    import importlib.util as _util

    _spec = _util.spec_from_file_location("tf2onnx_rnn.rewriters", _os.path.join(_BESIDE, "__init__.py"),
                                          submodule_search_locations=[_BESIDE])
    _rewriters = _util.module_from_spec(_spec)
    _sys.modules[_spec.name] = _rewriters
    _spec.loader.exec_module(_rewriters)
from .api import (
    convert_checkpoint,
    convert_graph_def,
    convert_keras,
    convert_saved_model,
    convert_tflite,
    keras_input_signature,
    report_of,
)
from .errors import ConversionError, VerificationError
from .report import METADATA_KEY, ConversionReport, LoopOutcome
from .training import trainable_parameters, write_training_artifacts

__version__ = "0.1.0"

__all__ = [
    "ConversionError", "ConversionReport", "VerificationError", "LoopOutcome", "METADATA_KEY", "convert_keras",
    "convert_saved_model", "convert_tflite", "convert_graph_def", "convert_checkpoint", "keras_input_signature",
    "report_of", "trainable_parameters", "write_training_artifacts", "__version__",
]
