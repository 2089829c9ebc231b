"""tf2onnx's conversion of a frozen graph, with the recurrent rewriter plugged into it.

The rewriter is built with the variants chosen for the conversion (the mask form, the state
wiring) and handed to tf2onnx through its ``custom_rewriter`` hook; input/output renames and
NHWC <-> NCHW transposes are resolved against the frozen graph's names first, so a bad name is
refused before anything is converted.
"""
from __future__ import annotations

import dataclasses
import logging
import warnings

import onnx

from .errors import ConversionError, first_line
from .options import Options
from .rewriters.outcome import Findings
from .sources import Frozen
from .tf2onnx_call import check_nchw, io_ranks, tf2onnx_arguments, tf2onnx_conversion

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

    kwargs, nchw = tf2onnx_arguments(frozen, options)
    import tensorflow as tf

    row = options.runtime  # what the handlers must not write for it
    lacks = (row.lacks | (frozenset() if row.float64 else {"float64"})) if row else frozenset()
    with tf.device("/cpu:0"), handlers.lacking(lacks):
        try:
            with warnings.catch_warnings():  # its TFLite reader builds TensorFlow's deprecated interpreter
                warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
                model_proto = tf2onnx_conversion(frozen.graph_def, rewriters, large_model=options.large_model,
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
    check_nchw(io_ranks(model_proto), nchw)
    _written_model_passes(model_proto, findings, options)
    return model_proto, nchw, findings


def _written_model_passes(model_proto: onnx.ModelProto, findings: Findings, options: Options) -> None:
    """What is done to the model tf2onnx wrote (``rewriters.written.passes``); a failure to even import them
    leaves the model as tf2onnx wrote it, exact, and says so."""
    try:
        from .rewriters.written.passes import Form, after_conversion
    except Exception as error:  # noqa: BLE001 - the model stays as written, exact
        logger.warning("the written model stays as tf2onnx wrote it: internal error importing its passes: %s: %s",
                       type(error).__name__, error, exc_info=True)
        return
    try:
        after_conversion(model_proto, findings, Form(portable=options.portable, streaming=bool(options.streaming),
                                                     state_defaults=options.defaults_states, row=options.runtime))
    except Exception as error:  # noqa: BLE001 - each pass leaves the model exact, run or not
        logger.warning("the passes over the written model stopped: internal error: %s: %s", type(error).__name__,
                       error, exc_info=True)


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


