"""tf2onnx-rnn: Keras recurrent layers as native ONNX LSTM/GRU/RNN nodes, on top of tf2onnx."""
from .api import ConversionError, convert_keras, convert_saved_model, keras_input_signature, report_of
from .report import METADATA_KEY, ConversionReport, LoopOutcome

__version__ = "0.1.0"

__all__ = [
    "ConversionError", "ConversionReport", "LoopOutcome", "METADATA_KEY", "convert_keras",
    "convert_saved_model", "keras_input_signature", "report_of", "__version__",
]
