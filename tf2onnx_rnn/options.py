"""What a conversion is asked to do, whatever its source: every choice a typed field, checked.

:meth:`Options.of` takes the API's keyword arguments, checks what can be checked without the
model (names, targets, opsets, shapes) and refuses unknown ones; :meth:`Options.tf2onnx_options`
assembles tf2onnx's own keyword arguments from the fields, in one place. The variants of the
emitted graph (the mask form, the state wiring) are chosen from these fields once per conversion.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import onnx

from .errors import ConversionError, param
from .probes import check_opset
from .quantization import MAX_ERROR, check_mode
from .rewriters.runtimes import BY_KEY, RUNTIMES, Runtime

PORTABLE = "portable"  # this package's own target: masked layers without a computed sequence_lens
TRAINING = "training"  # and its form for onnxruntime's training API (see tf2onnx_rnn.training)
ONNXRUNTIME = "onnxruntime"  # and onnxruntime's fastest form: SimpleRNN as input MatMul + Scan
# and one per runtime of rewriters.runtimes' table that needs a form of its own (its row's target is its own key):
# the portable form, lowered for that runtime as far as its row needs (rewriters.written.lower), with fixed shapes
RUNTIME_TARGETS = tuple(row.key for row in RUNTIMES if row.target == row.key)
OWN_TARGETS = (PORTABLE, TRAINING, ONNXRUNTIME) + RUNTIME_TARGETS


@dataclass(frozen=True)
class Options:
    """Every choice of a conversion. Each field is the API parameter of the same name, but for
    ``target``, which the API takes as one list: tf2onnx's targets here, :data:`PORTABLE` as
    ``portable``, :data:`TRAINING` as ``training``, :data:`ONNXRUNTIME` as ``onnxruntime``."""

    opset: Optional[int] = None
    assume_post_padded: bool = False  # masked layers: every row's kept steps come first
    portable: bool = False  # masked layers without a computed sequence_lens (target "portable")
    training: bool = False  # the form onnxruntime's training API takes (target "training")
    onnxruntime: bool = False  # SimpleRNN as input MatMul + Scan, faster in onnxruntime (target "onnxruntime")
    runtime: Optional[Runtime] = None  # the runtime target's row (RUNTIME_TARGETS): the form that runtime computes
    streaming: Optional[bool] = None  # recurrent states in and out of the model; None: for stateful models
    # streamed state inputs of a fixed batch default to the source's start (initializers); None: unless the
    # target is portable (OpenVINO and tract read an input with an initializer as that constant)
    state_defaults: Optional[bool] = None
    continue_on_error: bool = False  # write a model even when tf2onnx left ops it could not convert
    check_shapes: bool = True  # without verification, check the outputs' shapes against the source's
    large_model: bool = False  # weights go to a file beside the model (external data)
    rename_inputs: tuple = ()
    rename_outputs: tuple = ()
    inputs: Optional[dict] = None  # input name -> shape (None = dynamic dim), to select/fix inputs
    target: tuple = ()  # tf2onnx's targets
    extra_opset: tuple = ()  # OperatorSetIdProtos
    inputs_as_nchw: tuple = ()
    outputs_as_nchw: tuple = ()
    shape_override: Optional[dict] = None
    custom_ops: Optional[dict] = None
    custom_op_handlers: Optional[dict] = None
    custom_rewriter: tuple = ()
    optimizers: Optional[dict] = None
    quantize: Optional[str] = None  # "weights" or "dynamic" (tf2onnx_rnn.quantization)
    max_error: float = MAX_ERROR  # a quantization's budget: each output's largest error relative to its magnitude

    @property
    def defaults_states(self) -> bool:
        """Whether streamed state inputs carry their defaults: as asked, else unless the target is portable."""
        return self.state_defaults if self.state_defaults is not None else not self.portable

    @classmethod
    def of(cls, **given) -> "Options":
        """Options checked for what can be checked without the model: names, targets, opsets, shapes.
        A single string is one name (or one target) wherever a list of them is taken; None is "not
        given"."""
        known = {f.name for f in dataclasses.fields(cls)} - set(OWN_TARGETS)
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConversionError(f"unknown option {unknown[0]!r}; known: {', '.join(sorted(known))}")
        given = {key: value for key, value in given.items() if value is not None}
        check_opset(given.get("opset"))
        if given.get("streaming", None) not in (None, True, False):
            raise ConversionError(f"{param('streaming')} must be True, False or None (automatic), "
                                  f"got {given['streaming']!r}")
        if given.get("state_defaults", None) not in (None, True, False):
            raise ConversionError(f"{param('state_defaults')} must be True, False or None (automatic), "
                                  f"got {given['state_defaults']!r}")
        for key in ("rename_inputs", "rename_outputs"):
            given[key] = name_list(given.get(key), key, unique=True)
        for key in ("inputs_as_nchw", "outputs_as_nchw"):
            given[key] = name_list(given.get(key), key)
        targets = check_targets(name_list(given.pop("target", ()), "target"))
        if TRAINING in targets and ONNXRUNTIME in targets:
            raise ConversionError(f"{param('target')}: {TRAINING!r} and {ONNXRUNTIME!r} exclude each other (the "
                                  "training kernels need the native RNN node the other replaces)")
        runtimes = [t for t in targets if t in RUNTIME_TARGETS]
        if len(runtimes) > 1 or (runtimes and (TRAINING in targets or ONNXRUNTIME in targets)):
            chosen = runtimes + [t for t in (TRAINING, ONNXRUNTIME) if t in targets]
            raise ConversionError(f"{param('target')}: {chosen[0]!r} and {chosen[1]!r} exclude each other (each "
                                  "writes the form one runtime computes)")
        given["extra_opset"] = tuple(extra_opsets(given.get("extra_opset", ())))
        given["inputs"] = input_shapes(given.get("inputs"))
        given["custom_rewriter"] = tuple(given.get("custom_rewriter", ()))
        check_mode(given.get("quantize"), given.get("max_error"), BY_KEY[runtimes[0]] if runtimes else None,
                   TRAINING in targets)
        return cls(target=tuple(t for t in targets if t not in OWN_TARGETS),
                   portable=PORTABLE in targets or bool(runtimes), runtime=BY_KEY[runtimes[0]] if runtimes else None,
                   training=TRAINING in targets, onnxruntime=ONNXRUNTIME in targets, **given)

    def tf2onnx_options(self) -> dict:
        """tf2onnx's own keyword arguments that these options give as they are (given ones only)."""
        passed = dict(target=list(self.target), extra_opset=list(self.extra_opset),
                      custom_ops=self.custom_ops, custom_op_handlers=self.custom_op_handlers,
                      optimizers=self.optimizers)
        return {key: value for key, value in passed.items() if value}


def name_list(names, option: str, unique: bool = False) -> tuple:
    """Names given as one string (one name) or a sequence of them; empty or repeated names are refused."""
    if names is None:
        return ()
    names = (names,) if isinstance(names, str) else tuple(names)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConversionError(f"{param(option)}: every name must be a non-empty string, got {name!r}")
    if unique:
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConversionError(f"{param(option)} gives the name {repeated[0]!r} more than once")
    return names


def known_targets() -> tuple:
    """The ``target`` values: tf2onnx's workarounds for particular runtimes, and this package's own,
    which tf2onnx never sees: :data:`PORTABLE` (masked recurrent layers without a computed
    ``sequence_lens``, for runtimes that take it only as a constant, such as tract) and
    :data:`TRAINING` (the form onnxruntime's training API takes) and :data:`ONNXRUNTIME` (SimpleRNN
    as an input MatMul and a Scan, onnxruntime's fastest form of it), and one per runtime that needs a
    form of its own (:data:`RUNTIME_TARGETS`: IREE, TVM, ncnn, rknn)."""
    from tf2onnx import constants

    return tuple(constants.POSSIBLE_TARGETS) + OWN_TARGETS


def check_targets(targets: Sequence[str]) -> list:
    """``targets`` as a list; raise :class:`ConversionError` for a value not in :func:`known_targets`."""
    known = known_targets()
    for target in targets:
        if target not in known:
            raise ConversionError(f"unknown {param('target')} {target!r}; known: {', '.join(known)}")
    return list(targets)


# domains tf2onnx imports itself: the default one at opset, and ai.onnx.ml
_OWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def extra_opsets(opsets) -> list:
    """``extra_opset`` as OperatorSetIdProtos: each given as one, or as a ``domain:version`` string.

    The domains tf2onnx imports itself (the default one, ai.onnx.ml) and a domain given twice are
    refused: the model would import them twice.
    """
    if isinstance(opsets, (str, onnx.OperatorSetIdProto)):
        opsets = [opsets]
    result, seen = [], set()
    for item in opsets:
        item = _opset_id(item)
        if item.domain in _OWN_DOMAINS:
            raise ConversionError(f"{param('extra_opset')} cannot import {item.domain or 'the default domain'!r}: "
                                  f"tf2onnx imports it itself (set the default domain's version with {param('opset')})")
        if item.version < 1:
            raise ConversionError(f"{param('extra_opset')} {item.domain}:{item.version}: the version must be 1 or more")
        if item.domain in seen:
            raise ConversionError(f"{param('extra_opset')} gives the domain {item.domain!r} more than once")
        seen.add(item.domain)
        result.append(item)
    return result


def _opset_id(item) -> onnx.OperatorSetIdProto:
    if isinstance(item, str):
        domain, _, version = item.strip().rpartition(":")
        if not domain or not version.strip().isdigit():
            raise ConversionError(f"{param('extra_opset')} {item!r} is not domain:version (e.g. com.microsoft:1)")
        return onnx.helper.make_opsetid(domain.strip(), int(version))
    if not isinstance(item, onnx.OperatorSetIdProto):
        raise ConversionError(f"{param('extra_opset')} takes domain:version strings or "
                              f"onnx.helper.make_opsetid(...), got {item!r}")
    return item


def input_shapes(inputs) -> Optional[dict]:
    """``inputs`` (name -> shape, or None to keep the model's) with every dimension checked:
    a positive size, or -1/None for a dynamic one."""
    if inputs is None:
        return None
    if not isinstance(inputs, dict):
        raise ConversionError(f"{param('inputs')} takes a dict of input name -> shape, got {inputs!r}")
    checked = {}
    for name, shape in inputs.items():
        checked[name] = None if shape is None else [_dimension(name, shape, d) for d in shape]
    return checked


def _dimension(name: str, shape, d) -> Optional[int]:
    if d is None or (isinstance(d, (int, np.integer)) and int(d) == -1):
        return None
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and int(d) > 0:
        return int(d)
    raise ConversionError(f"{param('inputs')} {name}{list(shape)}: a dimension must be a positive size "
                          f"or -1 (dynamic), got {d!r}")


def check_tolerance(tolerance) -> None:
    """The verification tolerance: a finite number >= 0."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not math.isfinite(tolerance) \
            or tolerance < 0:
        raise ConversionError(f"{param('tolerance')} must be a finite number >= 0, got {tolerance!r}")
