"""The emitter: passes planned into nodes, and the one place that builds ONNX recurrent nodes.

``plan`` groups passes into nodes (a Bidirectional's two directions become one); ``emitter`` builds
them and alone knows ONNX's input slots and output positions. How a mask reaches a node
(``mask_forms``) and how states meet the model (``states``) are variants chosen once per conversion;
``mask_tensors`` builds a mask's arithmetic once (``scattered_mask``: the portable and training forms'),
``bool_masks`` rewrites Keras's mask arithmetic without float casts.
"""
