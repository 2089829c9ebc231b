"""The written model lowered for a runtime target: the lowering's preconditions (fixed shapes, a batch of one
where the row computes one row at a time), its failures as one-line errors naming the runtime, the layer and
why, and the report's rows saying how each layer is computed there."""
from __future__ import annotations

import dataclasses
import logging

import onnx

from .errors import ConversionError, first_line, param
from .rewriters.outcome import LOOP, SCAN, STEPS
from .rewriters.runtimes import MODEL_KINDS, Runtime

logger = logging.getLogger("tf2onnx_rnn")


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
        outcome = _outcome_of(first.node, report.outcomes)
        layer = "the model" if first.kind in MODEL_KINDS else outcome.layer if outcome else first.node
        stays = f" ({outcome.layer} is {outcome.became}: {outcome.reason})" if outcome and outcome.reason and \
            (outcome.became == LOOP or outcome.own_step) else ""
        errors = "".join(f" ({why})" for why in lowered.errors if why not in first.why)
        raise ConversionError(f"{param('target')} {target}: {row.name} cannot compute {layer}: it {first.why}"
                              f"{stays}{errors}")
    return lowered


def _outcome_of(node: str, outcomes: list):
    """The report's row of the layer a node of the lowered model computes: the row whose node it is, or whose
    node or loop its name begins with (a rung names what it writes after the node it replaces), else None."""
    return next((o for o in outcomes if o.node and node.startswith(o.node.replace("/", "_")) or o.node == node
                 or o.loop and node.startswith(o.loop)), None)


def _after_lowering(model_proto: onnx.ModelProto) -> None:
    """The passes that follow a lowering (its Scans project their inputs as the steps did not)."""
    try:
        from .rewriters.written.passes import AFTER_LOWERING, run

        run(model_proto, AFTER_LOWERING)
    except Exception as error:  # noqa: BLE001 - the model stays exact; onnxruntime's check runs in a child
        logger.warning("the passes after the lowering stopped: internal error: %s: %s", type(error).__name__, error,
                       exc_info=True)
