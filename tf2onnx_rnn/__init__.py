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

# Installed, rewriters/ is mapped into this package (setup.cfg's package_dir). Imported straight
# from a source checkout (say, `python -m tf2onnx_rnn.convert` run in the checkout, which puts the
# checkout first on sys.path), it sits beside this package instead: look there too.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
if (not _os.path.isdir(_os.path.join(_HERE, "rewriters"))
        and _os.path.isfile(_os.path.join(_HERE, _os.pardir, "rewriters", "__init__.py"))):
    __path__.append(_os.path.dirname(_HERE))
from .api import convert_keras, convert_saved_model, keras_input_signature, report_of
from .errors import ConversionError, VerificationError
from .report import METADATA_KEY, ConversionReport, LoopOutcome

__version__ = "0.1.0"

__all__ = [
    "ConversionError", "ConversionReport", "VerificationError", "LoopOutcome", "METADATA_KEY", "convert_keras",
    "convert_saved_model", "keras_input_signature", "report_of", "__version__",
]
