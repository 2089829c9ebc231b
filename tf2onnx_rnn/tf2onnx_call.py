"""tf2onnx's own conversion of a frozen graph, run as its ``_convert_common`` runs it: its keyword arguments
assembled from the options (renames, NHWC <-> NCHW transposes resolved against the frozen graph's names), its
graph processed with the rewriters plugged in, and its optimizers run without a copy of the graph per pass."""
from __future__ import annotations

import os
from typing import Sequence

import onnx

from .errors import ConversionError, param
from .lean_tf2onnx import lean_passes, shared_parents
from .options import Options
from .probes import default_opset
from .sources import Frozen, placeholder_shapes, resolve_names


def tf2onnx_arguments(frozen: Frozen, options: Options) -> tuple:
    """tf2onnx's keyword arguments for ``frozen``, and the inputs/outputs to transpose (option ->
    their names in the ONNX model)."""
    shape_override = {**(frozen.shape_override or {}), **(options.shape_override or {})}
    renames = dict(frozen.tensors_to_rename or {})
    renames.update(renames_of(frozen.input_names, options.rename_inputs, "inputs", renames))
    renames.update(renames_of(frozen.output_names, options.rename_outputs, "outputs", renames))
    kwargs = dict(name=frozen.name, continue_on_error=True, opset=default_opset(options.opset),
                  tflite_path=frozen.tflite_path, dequantize=frozen.allowed.dequantize,
                  input_names=frozen.input_names, output_names=frozen.output_names, tensors_to_rename=renames,
                  initialized_tables=frozen.initialized_tables, shape_override=shape_override or None,
                  **options.tf2onnx_options())
    nchw = {}  # option -> the names it transposes, as in the ONNX model
    for option, tensors, kind in (("inputs_as_nchw", frozen.input_names, "inputs"),
                                  ("outputs_as_nchw", frozen.output_names, "outputs")):
        names = getattr(options, option)
        if names:
            chosen = resolve_names(names, tensors, option, kind, frozen.tensors_to_rename or {}, renames)
            kwargs[option] = chosen
            nchw[option] = [renames.get(t, t) for t in chosen]
    if "inputs_as_nchw" in nchw and frozen.graph_def is not None:  # tf2onnx fails on an input of unknown rank
        known = {**placeholder_shapes(frozen.graph_def), **shape_override}
        check_nchw({renames.get(t, t): None if known.get(t) is None else len(known[t]) for t in frozen.input_names},
                    {"inputs_as_nchw": nchw["inputs_as_nchw"]})
    return kwargs, nchw


def tf2onnx_conversion(graph_def, rewriters, name: str, large_model: bool = False, custom_ops=None,
                        custom_op_handlers=None, optimizers=None, **kwargs) -> onnx.ModelProto:
    """tf2onnx's conversion of a frozen graph (or of the TFLite file in ``kwargs``): the steps of its
    ``_convert_common``, every tensor kept in the returned model proto, its custom rewriters those
    ``rewriters()`` makes, and its optimizers run as :func:`_optimized` runs them.

    A ``large_model`` graph's big constants are taken out before TensorFlow imports it (a graph def
    over 2 GB cannot be imported) and handed to tf2onnx beside it, as tf2onnx does. tf2onnx's external
    tensor storage is not used: tf2onnx 1.17 fails in it under numpy 2, and ``output.save_model``
    writes the external data file itself.
    """
    import tensorflow as tf
    from tf2onnx.convert import make_default_custom_op_handler
    from tf2onnx.tf_utils import compress_graph_def
    from tf2onnx.tfonnx import process_tf_graph

    if custom_ops:
        custom_op_handlers = dict(custom_op_handlers or {})
        custom_op_handlers.update({op: (make_default_custom_op_handler(domain), [])
                                   for op, domain in custom_ops.items()})
    with tf.Graph().as_default() as tf_graph:
        const_node_values = compress_graph_def(graph_def) if large_model else None
        if not kwargs.get("tflite_path") and not kwargs.get("tfjs_path"):
            tf.import_graph_def(graph_def, name="")

        def processed():
            with shared_parents():  # tf2onnx's While handler copied the whole model per loop
                return process_tf_graph(tf_graph, const_node_values=const_node_values,
                                        custom_op_handlers=custom_op_handlers, custom_rewriter=rewriters(), **kwargs)

        caught = os.environ.get(CATCH_ERRORS, str(not large_model)).upper() == "TRUE"
        return _optimized(processed(), optimizers, caught, processed).make_model(f"converted from {name}")


CATCH_ERRORS = "TF2ONNX_CATCH_ERRORS"  # tf2onnx's switch: "FALSE" raises an optimizer's failure


def _optimized(graph, optimizers, caught: bool, made_again):
    """``graph`` after tf2onnx's optimizers. Caught, a failing optimizer is skipped, as tf2onnx skips it;
    but where tf2onnx deep-copies the graph before every optimizer on every pass (three dozen copies of
    every node and weight, most of a small model's conversion time), the optimizers run here on the graph
    uncaught, and only if one of them fails is the graph made again (``made_again()``: tf2onnx's conversion
    of the same frozen graph, which is deterministic, with rewriters made afresh) and optimized tf2onnx's
    way, the failing optimizer skipped. Either way the graph is the one tf2onnx's optimizers make. Not
    caught (a large model, as tf2onnx does for one), a failure is raised."""
    from tf2onnx import optimizer

    with lean_passes():  # no protobuf of every node and subgraph rebuilt after each pass
        try:
            return optimizer.optimize_graph(graph, catch_errors=False, optimizers=optimizers)
        except ConversionError:  # the optimizers did not settle (lean_tf2onnx.ROUNDS): they would not the second time
            raise
        except Exception:  # noqa: BLE001 - tf2onnx's way, on the graph made again: the failing optimizer skipped, logged
            if not caught:
                raise
    graph = made_again()
    with lean_passes():
        return optimizer.optimize_graph(graph, catch_errors=True, optimizers=optimizers)


def io_ranks(model_proto: onnx.ModelProto) -> dict:
    """Rank (None if unknown) of each graph input and output, by name."""
    return {value.name: (len(value.type.tensor_type.shape.dim) if value.type.tensor_type.HasField("shape") else None)
            for value in list(model_proto.graph.input) + list(model_proto.graph.output)}


def check_nchw(ranks: dict, nchw: dict) -> None:
    """tf2onnx transposes only rank-4 inputs and outputs and skips others with a log line: refuse them."""
    for option, names in nchw.items():
        for name in names:
            if ranks.get(name) != 4:
                rank = "unknown rank" if ranks.get(name) is None else f"rank {ranks[name]}"
                raise ConversionError(f"{param(option)}: {name} has {rank}; NHWC <-> NCHW takes rank 4")


def renames_of(names: list, new_names: Sequence[str], what: str, renames: dict) -> dict:
    if not new_names:
        return {}
    if len(new_names) != len(names):
        shown = ", ".join(renames.get(n, n) for n in names)
        raise ConversionError(f"{param('rename_' + what)} gives {len(new_names)} name(s), the model has "
                              f"{len(names)} {what}: {shown}")
    return dict(zip(names, new_names))
