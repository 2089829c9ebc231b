"""tf2onnx-rnn: Keras recurrent layers as native ONNX LSTM/GRU/RNN nodes, on top of tf2onnx."""
import os as _os
import sys as _sys
from importlib.util import find_spec as _find_spec

# TensorFlow is the user's to choose (tensorflow, tensorflow-cpu, tensorflow-macos...), so it is
# not a dependency. Without it nothing here can work: say so in one line, before anything else.
_TENSORFLOW_MISSING = ("tf2onnx-rnn needs TensorFlow 2.15 to 2.21: pip install tensorflow (or tensorflow-cpu), "
                       "or pip install 'tf2onnx-rnn[tensorflow]'")
if _find_spec("tensorflow") is None:
    if _sys.argv and _os.path.basename(_sys.argv[0]) in ("tf2onnx-rnn", "-m"):  # the command line
        print(f"error: {_TENSORFLOW_MISSING}", file=_sys.stderr)
        raise SystemExit(2)
    raise ImportError(_TENSORFLOW_MISSING)

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
from .api import convert_keras, convert_saved_model, keras_input_signature, report_of
from .errors import ConversionError, VerificationError
from .report import METADATA_KEY, ConversionReport, LoopOutcome

__version__ = "0.1.0"

__all__ = [
    "ConversionError", "ConversionReport", "VerificationError", "LoopOutcome", "METADATA_KEY", "convert_keras",
    "convert_saved_model", "keras_input_signature", "report_of", "__version__",
]
