"""Pattern-matching rewriters that turn Keras recurrent while-loops into ONNX LSTM/GRU/RNN nodes.

Installed as ``tf2onnx_rnn.rewriters``. One module per cell family (``lstm``, ``gru``,
``simple_rnn``), each with a ``KIND`` and a ``match(view, skeleton)`` function; a new cell kind
is a new module added to :data:`CELL_MATCHERS`.
"""
from . import gru, lstm, simple_rnn

CELL_MATCHERS = (lstm, gru, simple_rnn)

__all__ = ["CELL_MATCHERS"]
