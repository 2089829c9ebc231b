"""tf2onnx's conversion of a frozen graph, with the recurrent rewriter plugged into it.

The rewriter is built with the variants chosen for the conversion (the mask form, the state
wiring) and handed to tf2onnx through its ``custom_rewriter`` hook; input/output renames and
NHWC <-> NCHW transposes are resolved against the frozen graph's names first, so a bad name is
refused before anything is converted.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from typing import Sequence

import onnx

from .errors import ConversionError, first_line, param
from .lean_tf2onnx import lean_passes, shared_parents
from .options import Options
from .probes import default_opset
from .rewriters.outcome import LOOP, SCAN, STEPS, Findings
from .rewriters.runtimes import Runtime
from .sources import Frozen, placeholder_shapes, resolve_names

logger = logging.getLogger("tf2onnx_rnn")


def to_onnx(frozen: Frozen, options: Options) -> tuple:
    """Convert ``frozen`` with tf2onnx and the rewriter: (the model, option -> the inputs or outputs it
    transposes between NHWC and NCHW, by their names in the model, the :class:`Findings` in which the
    rewriter recorded what became of each loop). A failure of tf2onnx itself on the graph is a
    :class:`ConversionError`."""
    from . import handlers

    handlers.ensure_registered()
    runs: list = []  # the findings of each run of tf2onnx's conversion: the last one's rewriter made the graph

    def rewriters() -> list:
        """The custom rewriters of one run of tf2onnx's conversion, ours made afresh with findings of its own."""
        rewriter, findings = _rewriter(frozen, options)
        runs.append(findings)
        return ([rewriter] if rewriter else []) + list(options.custom_rewriter)

    kwargs, nchw = _tf2onnx_arguments(frozen, options)
    import tensorflow as tf

    row = options.runtime  # what the handlers must not write for it
    lacks = (row.lacks | (frozenset() if row.float64 else {"float64"})) if row else frozenset()
    with tf.device("/cpu:0"), handlers.lacking(lacks):
        try:
            with warnings.catch_warnings():  # its TFLite reader builds TensorFlow's deprecated interpreter
                warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
                model_proto = _tf2onnx_conversion(frozen.graph_def, rewriters, large_model=options.large_model,
                                                  **kwargs)
        except ConversionError:
            raise
        except Exception as error:  # tf2onnx's own failure on this graph (say, a type its onnx cannot hold)
            if runs:
                _check_fused_ops(frozen, runs[-1])
            raise ConversionError(f"tf2onnx cannot convert this model: {type(error).__name__}: "
                                  f"{first_line(error)}") from error
    findings = runs[-1]
    _check_fused_ops(frozen, findings)
    _check_nchw(_io_ranks(model_proto), nchw)
    _written_model_passes(model_proto, findings, options)
    return model_proto, nchw, findings


def lower_for_runtime(model_proto: onnx.ModelProto, row: Runtime, report):
    """The written model lowered for the runtime of ``row`` (its row of ``rewriters.runtimes``, whose key is
    the target; ``rewriters.written.lower``: each layer only as far as that row needs), and ``report`` saying how each
    layer is computed there; its inputs must have fixed shapes where the runtime compiles fixed shapes only,
    and what the runtime still cannot compute is a :class:`ConversionError` naming the runtime, the layer
    and why."""
    from .rewriters.obstacles import batched_input

    target = row.key
    constants = {t.name for t in model_proto.graph.initializer}
    dynamic = [i for i in model_proto.graph.input if row.static_shapes and i.name not in constants
               and not all(d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)]
    if dynamic:
        shape = ",".join(str(d.dim_value) if d.HasField("dim_value") else "?"
                         for d in dynamic[0].type.tensor_type.shape.dim)
        raise ConversionError(f"{param('target')} {target}: {row.name} compiles fixed shapes only, and input "
                              f"{dynamic[0].name} is [{shape}]: give every input a fixed shape with "
                              f"{param('inputs')} (for example \"{dynamic[0].name}[2,12,8]\")")
    batched = batched_input(model_proto) if row.batch_one else None
    if batched is not None:
        dims = [d.dim_value for d in batched.type.tensor_type.shape.dim]
        raise ConversionError(f"{param('target')} {target}: {row.name} computes one batch row at a time, and input "
                              f"{batched.name} is {dims}: give it batch size 1 with {param('inputs')} (for example "
                              f"\"{batched.name}[{','.join(['1'] + [str(d) for d in dims[1:]])}]\")")
    try:
        lowered = _lowered(model_proto, row, report)
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - nothing is written: the runtime would not compute the model
        logger.debug("lowering for %s raised", row.name, exc_info=True)
        raise ConversionError(f"{param('target')} {target}: internal error while writing the model for {row.name}: "
                              f"{type(error).__name__}: {first_line(str(error))}") from None
    _after_lowering(model_proto)
    rows = []
    scans = {n.name for n in model_proto.graph.node if n.op_type == "Scan"}
    for o in report.outcomes:
        form = lowered.forms.get(o.node)
        if form is None:
            rows.append(o)
        elif lowered.nodes[o.node] in scans and not o.own_step:  # its node's kernel, not its cell, was the trouble
            rows.append(dataclasses.replace(o, became=SCAN, node=lowered.nodes[o.node], own_step=True,
                                            form=f"for {row.name}: {form}",
                                            reason=f"{row.name} does not compute its {o.became} node as written"))
        elif lowered.nodes[o.node]:
            rows.append(dataclasses.replace(o, node=lowered.nodes[o.node], form=f"for {row.name}: {form}"))
        else:
            rows.append(dataclasses.replace(o, became=STEPS, node="", own_step=False,
                                            form=f"{o.became} {form} for {row.name}"))
    report.outcomes = rows
    return report


def _lowered(model_proto: onnx.ModelProto, row: Runtime, report):
    """``model_proto`` lowered for ``row``'s runtime, or the :class:`ConversionError` saying what it cannot
    compute (and why a layer is not in the form the runtime's target writes, where the report says)."""
    from .rewriters.written.lower import lower_for

    target = row.key
    masked = [o for o in report.outcomes if o.mask or o.masked_own_step]  # a masked layer, native or its own step
    if row.masks and masked:
        raise ConversionError(f"{param('target')} {target}: {row.name} cannot compute {masked[0].layer}: {row.masks}")
    lowered = lower_for(model_proto, row)
    if lowered.left:
        first = sorted(lowered.left, key=lambda o: not o.silent)[0]
        outcome = next((o for o in report.outcomes if o.node and first.node.startswith(o.node.replace("/", "_"))
                        or o.node == first.node or o.loop and first.node.startswith(o.loop)), None)
        layer = "the model" if first.kind in ("inputs", "rank", "integer") else outcome.layer if outcome else first.node
        stays = f" ({outcome.layer} is {outcome.became}: {outcome.reason})" if outcome and outcome.reason and \
            (outcome.became == LOOP or outcome.own_step) else ""
        errors = "".join(f" ({why})" for why in lowered.errors if why not in first.why)
        raise ConversionError(f"{param('target')} {target}: {row.name} cannot compute {layer}: it {first.why}"
                              f"{stays}{errors}")
    return lowered


def _written_model_passes(model_proto: onnx.ModelProto, findings: Findings, options: Options) -> None:
    """What is done to the model tf2onnx wrote (``rewriters.written.passes``); a failure to even import them
    leaves the model as tf2onnx wrote it, exact, and says so."""
    try:
        from .rewriters.written.passes import Form, after_conversion
    except Exception as error:  # noqa: BLE001 - the model stays as written, exact
        logger.warning("the written model stays as tf2onnx wrote it: internal error importing its passes: %s: %s",
                       type(error).__name__, error, exc_info=True)
        return
    after_conversion(model_proto, findings, Form(portable=options.portable, streaming=bool(options.streaming),
                                                 state_defaults=options.defaults_states, target=bool(options.runtime)))


def _after_lowering(model_proto: onnx.ModelProto) -> None:
    """The passes that follow a lowering (its Scans project their inputs as the steps did not)."""
    from .rewriters.written.passes import AFTER_LOWERING, run

    run(model_proto, AFTER_LOWERING)


def _check_fused_ops(frozen: Frozen, findings: Findings) -> None:
    """A fused recurrent op (TFLite's, TF 1.x's ``BlockLSTM``) the rewriter did not read has no tf2onnx
    handler: the model would not run: its reason is the error."""
    fused = set(frozen.fused_ops or {}) | findings.no_fallback
    refused = [row for row in findings.outcomes if row.reason and row.loop in fused]
    if refused:
        raise ConversionError(f"{refused[0].layer}: {refused[0].reason}")


def _rewriter(frozen: Frozen, options: Options) -> tuple:
    """(the rewriter for the conversion, the :class:`Findings` it records into), or (None, findings
    saying why) when the rewriter package cannot give one: its ``make_rewriter`` guards what it builds,
    this guards importing it and setting it up (the conversion then goes on without fusing, exact, and
    every recurrent loop's row says why)."""
    try:
        from .rewriters.obstacles import masked_own_step
        from .rewriters.pipeline import make_rewriter  # imported late: it imports tf2onnx, hence TensorFlow

        findings = Findings()
        own_step = masked_own_step(options.runtime)  # whether masked layers are their own step there, and why
        return make_rewriter(findings, frozen.layer_names, portable=options.portable,
                             post_padded=options.assume_post_padded, streaming=bool(options.streaming),
                             training=options.training, onnxruntime=options.onnxruntime,
                             fused_ops=frozen.fused_ops, allowed=frozen.allowed,
                             masked_own_step=own_step.needed, own_step_reason=own_step.why), findings
    except Exception as error:  # noqa: BLE001 - the conversion goes on without fusing, exact
        why = f"internal error while setting up the rewriter: {type(error).__name__}: {error}"
        logger.warning("recurrent layers stay Loops: %s", why)
        return None, _findings_of_no_rewriter(why)


def _findings_of_no_rewriter(why: str) -> Findings:
    """Findings with no rows and ``why`` as every loop's reason, made without calling ``Findings``'s own
    ``__init__``: it may be what failed."""
    findings = object.__new__(Findings)
    for spec in dataclasses.fields(Findings):
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        object.__setattr__(findings, spec.name, default)
    findings.setup_error = why
    return findings


def _tf2onnx_arguments(frozen: Frozen, options: Options) -> tuple:
    """tf2onnx's keyword arguments for ``frozen``, and the inputs/outputs to transpose (option ->
    their names in the ONNX model)."""
    shape_override = {**(frozen.shape_override or {}), **(options.shape_override or {})}
    renames = dict(frozen.tensors_to_rename or {})
    renames.update(_renames(frozen.input_names, options.rename_inputs, "inputs", renames))
    renames.update(_renames(frozen.output_names, options.rename_outputs, "outputs", renames))
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
        _check_nchw({renames.get(t, t): None if known.get(t) is None else len(known[t]) for t in frozen.input_names},
                    {"inputs_as_nchw": nchw["inputs_as_nchw"]})
    return kwargs, nchw


def _tf2onnx_conversion(graph_def, rewriters, name: str, large_model: bool = False, custom_ops=None,
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


def _io_ranks(model_proto: onnx.ModelProto) -> dict:
    """Rank (None if unknown) of each graph input and output, by name."""
    return {value.name: (len(value.type.tensor_type.shape.dim) if value.type.tensor_type.HasField("shape") else None)
            for value in list(model_proto.graph.input) + list(model_proto.graph.output)}


def _check_nchw(ranks: dict, nchw: dict) -> None:
    """tf2onnx transposes only rank-4 inputs and outputs and skips others with a log line: refuse them."""
    for option, names in nchw.items():
        for name in names:
            if ranks.get(name) != 4:
                rank = "unknown rank" if ranks.get(name) is None else f"rank {ranks[name]}"
                raise ConversionError(f"{param(option)}: {name} has {rank}; NHWC <-> NCHW takes rank 4")


def _renames(names: list, new_names: Sequence[str], what: str, renames: dict) -> dict:
    if not new_names:
        return {}
    if len(new_names) != len(names):
        shown = ", ".join(renames.get(n, n) for n in names)
        raise ConversionError(f"{param('rename_' + what)} gives {len(new_names)} name(s), the model has "
                              f"{len(names)} {what}: {shown}")
    return dict(zip(names, new_names))
