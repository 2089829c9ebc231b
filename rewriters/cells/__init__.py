"""The cell families and what they read a cell through.

One module per family (``lstm``, ``gru``, ``simple_rnn``): its ``KIND`` (the facts every reader and
the emitter ask for) and ``match(view, skeleton)``. Beside them, what every family shares: the body
view a matcher describes a cell through (``body``; its reading of gate pre-activations as
``x @ W + h @ R + b``: ``affine``), activations named by their values
(``activations``), small subgraphs evaluated with numpy (``evaluate``) and ONNX's recurrent
equations on values (``equations``). Nothing here imports a reader or the emitter.
"""
