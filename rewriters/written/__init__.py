"""What is done to the ONNX model once tf2onnx has written it, on one small graph toolkit.

- the toolkit: :mod:`.graph` (producers and readers, subgraphs, attributes, constants, shapes, the opset,
  the sweep), :mod:`.scope` (a graph indexed and changed through its index, types), :mod:`.builder` (the node
  builder: a rewrite is built whole before the graph changes);
- :mod:`.passes`: the passes every written model goes through, as rules run by one guarded driver;
- :mod:`.scan`: the Scan form of the loops no native node computes;
- :mod:`.lower`: a written model lowered for one runtime of the table, down the rungs of :mod:`.lower.rungs`.

Nothing here knows a runtime by its name: a runtime is its row of :mod:`..runtimes`.
"""
