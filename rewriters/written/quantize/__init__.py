"""int8 forms of the written model: which weights a layer holds (:mod:`.units`), how they are rounded
(:mod:`.rounding`) and the nodes that store or compute them in int8 (:mod:`.forms`).

What is measured to choose them (calibration, the error budget) is the caller's
(``tf2onnx_rnn.quantization``): these modules only read and rewrite the graph, with the wing's toolkit.
"""
