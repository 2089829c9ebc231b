"""Handlers for TensorFlow ops that Keras layers emit and tf2onnx lacks, or converts only in part.

tf2onnx 1.16 and 1.17 have no handler for these ops, so a model using them converts with the
op left in the graph and does not load in onnxruntime:

========== ===================================== ===========================================
TF op      emitted by                            ONNX form (float32 error against TF)
========== ===================================== ===========================================
Erfc       exact GELU (``activation="gelu"``),   ``1 - Erf(x)``; absolute error <= 2.4e-7,
           Keras 3 and tf_keras on TF 2.21       relative error <= 8e-7 for x <= 1 (the
                                                 tail beyond is absolute only: erfc(4) is
                                                 below float32's spacing at 1)
Expm1      ``celu`` (Keras 3)                    ``Exp(x) - 1`` for ``|x| > 0.5``, else
                                                 Kahan's ``(u - 1) * x / log(u)`` with
                                                 ``u = Exp(x)`` (``x`` where ``u == 1``);
                                                 relative error <= 4e-7 everywhere
Bucketize  ``Discretization``                    count of boundaries ``b`` with ``not x < b``
                                                 (``Less``, ``Not``, ``ReduceSum``): exact,
                                                 NaN included (TF puts it in the last bucket)
IRFFT      ``tf.signal.irfft`` (keras-lmu's      the whole Hermitian spectrum rebuilt, then
           ``LMUFeedforward``)                   (opset 17 on) a forward DFT of its conjugate
                                                 or (opsets 14-16) a MatMul with cos/sin
                                                 weights; error <= 3.3e-7 of the output's
                                                 largest magnitude (float64: 1e-13)
Real, Imag ``tf.math.real``, ``tf.math.imag``    entry 0 or 1 of the pair axis: exact
========== ===================================== ===========================================

For these ops tf2onnx has a handler that refuses one case; the handler here takes that case and
hands every other node of the op to tf2onnx's:

============ =================================== ===========================================
TF op        the case taken                      ONNX form (float32 error against TF)
============ =================================== ===========================================
RFFT         a spectrum not read by ComplexAbs   DFT (``onesided=1``, opset 17 on) or a
             alone (tf2onnx's takes only that,   MatMul with cos/sin weights (opsets 14-16);
             at a constant length):              error <= 2.5e-7 of the spectrum's largest
             ``LMUFeedforward``'s convolution    magnitude (float64: 1e-13)
Mul          a complex operand in the pair       ``(ac - bd, ad + bc)`` in the parts' type,
             layout (below)                      as TF computes complex64 products (0 ulps
                                                 apart on the same operands, measured)
ExpandDims,  a complex operand in the pair       Unsqueeze (a negative axis one further
Pad, Shape   layout                              left), Pad (none on the pair axis), the
                                                 Shape less its last entry: exact
GatherV2,    the axis a tensor (MinGRU's         the operand viewed as [outer, size, inner]
ConcatV2     ``associative_scan``)               around the axis, gathered or joined on a
                                                 fixed axis, reshaped back: exact
StridedSlice an ellipsis, on a tensor whose      Slice with negative axes for the specs after
             rank is unknown (MinGRU)            the ellipsis, then Squeeze: exact
BiasAdd      NCHW, the bias no constant where    the bias reshaped to ``[C, 1, ...]`` for the
             it is added (tf_keras's channels-   value's rank (known, or read at run time):
             first ConvLSTM2D: a loop's step)    exact
Softsign,    float64 (onnxruntime runs the ONNX  elementary float64 ops, as TensorFlow's
Softplus,    ops of these names in float32 only  kernels compute them (Softplus's two
Elu, Selu,   below opset 18; its expansion from  thresholds and a log1p; Elu's and Selu's
LeakyRelu    18 on is inexact)                   ``exp(x) - 1``): within 4 ulps of Keras
============ =================================== ===========================================

Erfc is computed in float32 for every input type (onnxruntime's Erf has no float64 kernel), so
float64 inputs get float32 accuracy; Expm1 runs in float64 for float64 (relative error about
4e-16). Erfc(NaN) is whatever onnxruntime's Erf gives: NaN in 1.31, 1.0 in some older releases.

Registration goes through tf2onnx's own registry (``tf2onnx.handler.tf_op``), so tf2onnx
picks these handlers by opset like its own. :func:`ensure_registered` is idempotent and never
replaces a handler tf2onnx already has for an op: a missing op's handler is registered only where
tf2onnx has none (a later tf2onnx that adds one wins), and a case of the second table is put in
front of each of tf2onnx's handlers of its op, which still convert every node the case does not
take. TensorFlow and tf2onnx are imported only when it is called.

The handlers live by kind: :mod:`.special_functions` (Erfc, Expm1, Bucketize), :mod:`.spectra`
(RFFT, IRFFT and complex values), :mod:`.runtime_axes` (MinGRU's axes), :mod:`.double_activations`
(the float64 activations), with what they share in :mod:`.common`.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading

# ONNX ops the handlers must not write in this conversion: those the target's runtime lacks (a DFT where IREE
# or TVM has none; the handlers then write their opset-14 form), and "float64" where it has no float64
LACKING: contextvars.ContextVar = contextvars.ContextVar("lacking", default=frozenset())


@contextlib.contextmanager
def lacking(ops):
    """While a conversion runs: the handlers write none of ``ops``, where they have another form."""
    token = LACKING.set(frozenset(ops))
    try:
        yield
    finally:
        LACKING.reset(token)


_LOCK = threading.Lock()
_REGISTERED: dict = {}  # op name -> True (ours, or ours in front of tf2onnx's) or False (tf2onnx's alone)


def ensure_registered() -> dict:
    """Register the handlers tf2onnx lacks, and the cases put in front of tf2onnx's handlers; safe
    to call any number of times.

    Returns ``{op: registered}``: True where this package's handler is in use (for a case, in
    front of tf2onnx's), False where tf2onnx already had one and it was left alone (for a case:
    tf2onnx has no handler of the op to put it in front of).
    """
    with _LOCK:
        if not _REGISTERED:
            _register()
        return dict(_REGISTERED)


def _register() -> None:
    import tf2onnx.tfonnx  # noqa: F401 - imports every handler module tf2onnx has
    from tf2onnx import handler

    existing = {name for opsets in handler.tf_op.get_opsets().values() for by_name in opsets for name in by_name}
    for name, cls in _handlers().items():
        ours = name not in existing
        if ours:
            handler.tf_op(name)(cls)
        _REGISTERED[name] = ours
    for name, cls in _wrappers().items():
        _REGISTERED[name] = _wrap(handler.tf_op.get_opsets(), name, cls)


def _handlers() -> dict:
    """The handler classes by TF op name, for ops tf2onnx has no handler for."""
    from .special_functions import _Bucketize, _Erfc, _Expm1
    from .spectra import _IRFFT, _Imag, _Real

    return {"Erfc": _Erfc, "Expm1": _Expm1, "Bucketize": _Bucketize, "IRFFT": _IRFFT, "Real": _Real, "Imag": _Imag}


def _wrappers() -> dict:
    """The narrow cases tf2onnx's own handler of an op cannot convert, by TF op name: each class's
    ``applies(ctx, node)`` picks its case, ``convert(ctx, node)`` converts it; tf2onnx's handler
    converts every other node of the op."""
    from .double_activations import _DoubleElu, _DoubleLeakyRelu, _DoubleSelu, _DoubleSoftplus, _DoubleSoftsign
    from .runtime_axes import _ChannelsFirstBias, _ConcatAtRuntimeAxis, _GatherAtRuntimeAxis, _StridedSliceOfUnknownRank
    from .spectra import _RFFT, _ComplexExpandDims, _ComplexMul, _ComplexPad, _ComplexShape

    return {"RFFT": _RFFT, "Mul": _ComplexMul, "ExpandDims": _ComplexExpandDims, "Pad": _ComplexPad,
            "Shape": _ComplexShape, "GatherV2": _GatherAtRuntimeAxis, "ConcatV2": _ConcatAtRuntimeAxis,
            "StridedSlice": _StridedSliceOfUnknownRank, "Softsign": _DoubleSoftsign, "Softplus": _DoubleSoftplus,
            "Elu": _DoubleElu, "Selu": _DoubleSelu, "LeakyRelu": _DoubleLeakyRelu, "BiasAdd": _ChannelsFirstBias}


def _wrap(opsets: dict, name: str, cls) -> bool:
    """Put ``cls`` in front of every ONNX-domain handler tf2onnx registered for ``name`` (each opset's);
    False when tf2onnx has none (nothing is registered then)."""
    from tf2onnx import constants

    wrapped = False
    for by_name in opsets.get(constants.ONNX_DOMAIN, []):
        if name in by_name:
            theirs, kwargs = by_name[name]
            if getattr(theirs, "tf2onnx_rnn_case", None) is None:
                by_name[name] = (_delegating(cls, theirs), kwargs)
            wrapped = True
    return wrapped


def _delegating(cls, theirs):
    def handle(ctx, node, **kwargs):
        if ctx.opset >= 13 and cls.applies(ctx, node):
            return cls.convert(ctx, node)
        return theirs(ctx, node, **kwargs)

    handle.tf2onnx_rnn_case, handle.theirs = cls, theirs
    return handle


