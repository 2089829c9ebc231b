"""The readers: what finds a recurrent layer in a graph and describes each direction as a typed ``Pass``.

- a loop body's skeleton (time index, lists, states; masked bodies unmasked): ``skeleton``; a
  loop's match and where the loop sits in the outer graph, to a pass: ``adapt``;
- a loop stepping several cells (``StackedRNNCells``): ``stacked``;
- ``unroll=True`` layers, T copies of a cell: ``chains`` (finding them), ``steps`` (each step
  mapped onto a template), ``step_values`` (a step TensorFlow folded, checked on values) and
  ``unrolled`` (reading them);
- TFLite files: ``tflite_loops`` (``WHILE`` loop bodies) and ``tflite_fused`` (fused recurrent ops).

Readers ask the cell families through the package's registry (``cell_matchers``, ``cell_kinds``);
they never name a kind. Nothing here imports the emitter.
"""
