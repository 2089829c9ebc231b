"""The Scan form: recurrent loops no cell module claims, each written as a ``Scan`` of its own step.

tf2onnx writes a recurrent layer's while-loop as a ``Loop`` that reads a row of its input at each
step and carries its states. A loop the cell matchers decline (a cell no ONNX node names) is still
such a per-step map, and a ``Scan`` computes the same: its scanned inputs are the sequences the loop
read row by row, its states the values the loop carried, its outputs what the loop stacked; the work
the step does on its input alone runs once over the whole sequence before it. The rewrite reads the
loop's structure, never its cell: any cell TensorFlow runs takes it.

It runs on the written model (after tf2onnx's optimizers) and updates the rewriter's report rows: a
loop that became a Scan says so and keeps the matchers' reason; one that cannot says why it stays a
Loop. Nothing raised here escapes: a loop whose rewrite fails stays the Loop it was.
"""
from .driver import scan_loops, scan_outputs_apart, unnamed_step_dims
from .rewrite import Written

__all__ = ["Written", "scan_loops", "scan_outputs_apart", "unnamed_step_dims"]
