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
============ =================================== ===========================================

Erfc is computed in float32 for every input type (onnxruntime's Erf has no float64 kernel), so
float64 inputs get float32 accuracy; Expm1 runs in float64 for float64 (relative error about
4e-16). Erfc(NaN) is whatever onnxruntime's Erf gives: NaN in 1.31, 1.0 in some older releases.

Complex tensors. onnxruntime computes on complex tensors with hardly any op, so a complex tensor of
shape S is carried as a real one of shape S + [2], real and imaginary parts: ONNX DFT's layout (the
pair layout). RFFT puts its spectrum in it; Mul, ExpandDims, Pad, Shape, Real, Imag and IRFFT take
it, a complex constant operand converted. An RFFT whose spectrum reaches any other op (``Conj``, a
complex ``Add``...) or a graph output is refused in one line naming the op: the op would be handed
the pair layout as if it were complex. RFFT and IRFFT compute in float64 whatever the type: TF's
lengths (``fft_length``, a tensor in the LMU) are taken at run time, the signal cropped or padded to
it, the spectrum to ``length // 2 + 1`` entries; IRFFT ignores the imaginary parts of the 0th and
(even lengths) the middle entry, as TF does, and scales by ``1 / length``. onnxruntime's float32 DFT
is off by up to 2e-6 of the largest magnitude at lengths that are not powers of two, and its inverse
DFT by 4e-8 even in float64, hence float64 and a forward DFT for IRFFT; the matrix form reduces
``k * n mod length`` in int64 before the angle, so no angle exceeds 2 pi. Opset 20 made DFT's axis an
input (it was an attribute): both are written (tf2onnx 1.17 writes opsets up to 18).

Why MinGRU needs the last three rows (mingru-keras 0.1.3 on Keras 3.15). Keras's TensorFlow
``associative_scan`` resolves the scan axis as ``tf.where(axis >= 0, axis, tf.rank(a) + axis)``,
which ``tf.get_static_value`` cannot evaluate, so the axis stays a tensor and is captured by the
``tf.cond`` that interleaves each level's results. Grappler folds it to a constant outside, but in
the branch functions it is an argument, and tf2onnx converts the branch functions on their own,
before the graph that calls them: its GatherV2 and ConcatV2 refuse the non-constant axis (leaving a
Gather and a Concat with three inputs, which onnxruntime rejects). The If has no output rank either
(TensorFlow's has none: the interleave reshapes to a shape computed from that axis), so at even
time lengths tf2onnx's StridedSlice refuses the scan's ``[..., 2::2, :]`` of it: it needs the rank
to place the specs after an ellipsis. That is the "could not convert: StridedSlice" a MinGRU model
reports; no StridedSlice form fails on a tensor of known rank. The model's output keeps no rank in
the ONNX graph (onnxruntime runs it; the ONNX checker wants a shape on a graph output): the output's
shape can be given with ``shape_override`` until the Keras source takes it from the model. Reshapes
to computed shapes here carry no ``allowzero=1``: tf2onnx's reshape optimizer rewrites computed
shapes into constants whose 0 means "the input's dim" whatever ``allowzero`` says, so a tensor with
a zero-size dimension may come out with another shape (nothing else differs).

Registration goes through tf2onnx's own registry (``tf2onnx.handler.tf_op``), so tf2onnx
picks these handlers by opset like its own. :func:`ensure_registered` is idempotent and never
replaces a handler tf2onnx already has for an op: a missing op's handler is registered only where
tf2onnx has none (a later tf2onnx that adds one wins), and a case of the second table is put in
front of each of tf2onnx's handlers of its op, which still convert every node the case does not
take. TensorFlow and tf2onnx are imported only when it is called.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

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
    return {"Erfc": _Erfc, "Expm1": _Expm1, "Bucketize": _Bucketize, "IRFFT": _IRFFT, "Real": _Real, "Imag": _Imag}


def _wrappers() -> dict:
    """The narrow cases tf2onnx's own handler of an op cannot convert, by TF op name: each class's
    ``applies(ctx, node)`` picks its case, ``convert(ctx, node)`` converts it; tf2onnx's handler
    converts every other node of the op."""
    return {"RFFT": _RFFT, "Mul": _ComplexMul, "ExpandDims": _ComplexExpandDims, "Pad": _ComplexPad,
            "Shape": _ComplexShape, "GatherV2": _GatherAtRuntimeAxis, "ConcatV2": _ConcatAtRuntimeAxis,
            "StridedSlice": _StridedSliceOfUnknownRank}


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


# -- what the handlers share (tf2onnx and onnx are imported only when a handler runs) ---------------
def _cast(ctx, name, to):
    return ctx.make_node("Cast", [name], attr={"to": to}).output[0]


def _scalar(ctx, value, onnx_dtype, hint):
    from tf2onnx import utils

    array = np.array(value, dtype=utils.map_onnx_to_numpy_type(onnx_dtype))
    return ctx.make_const(utils.make_name(hint), array).output[0]


def _replace(ctx, node, op_type, inputs, attr=None, dtypes=None, shapes=None):
    """Replace ``node`` by one ``op_type`` node with the same name and outputs (with the node's
    output types and shapes unless given)."""
    shapes = node.output_shapes if shapes is None else shapes
    dtypes = node.output_dtypes if dtypes is None else dtypes
    ctx.remove_node(node.name)
    return ctx.make_node(op_type, inputs, attr=attr or {}, name=node.name, outputs=node.output,
                         shapes=shapes, dtypes=dtypes)


def _float_input(ctx, node, allowed):
    """The node's input, cast to float32 unless its type is in ``allowed``; and that type."""
    from onnx import TensorProto
    from tf2onnx import utils

    x = node.input[0]
    dtype = ctx.get_dtype(x)
    utils.make_sure(dtype in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16),
                    "%s: unsupported input type %s", node.type, dtype)
    if dtype in allowed:
        return x, dtype
    return _cast(ctx, x, TensorProto.FLOAT), TensorProto.FLOAT


def _finish(ctx, node, op_type, inputs, compute_dtype):
    """Replace ``node`` by ``op_type(inputs)``, cast back to the node's type if needed."""
    out_dtype = node.output_dtypes[0]
    if compute_dtype == out_dtype:
        _replace(ctx, node, op_type, inputs)
    else:
        result = ctx.make_node(op_type, inputs).output[0]
        _replace(ctx, node, "Cast", [result], attr={"to": out_dtype})


# -- the handlers --------------------------------------------------------------------------------
class _Erfc:
    """erfc(x) = 1 - erf(x), computed in float32 (onnxruntime's Erf is float32 only)."""

    @classmethod
    def version_9(cls, ctx, node, **kwargs):
        from onnx import TensorProto

        x, dtype = _float_input(ctx, node, allowed=(TensorProto.FLOAT,))
        erf = ctx.make_node("Erf", [x]).output[0]
        _finish(ctx, node, "Sub", [_scalar(ctx, 1.0, dtype, "erfc_one"), erf], dtype)


class _Expm1:
    """exp(x) - 1 without cancellation near 0 (W. Kahan's method).

    With ``u = exp(x)`` rounded, ``(u - 1) * (x / log(u))`` is accurate to a few ulps
    whenever ``u != 1``; where ``u == 1``, ``expm1(x) == x`` to working precision. For
    ``|x| > 0.5`` plain ``u - 1`` is as accurate and also right at overflow (``u = inf``)
    and underflow (``u = 0``), where the quotient is not.
    """

    @classmethod
    def version_11(cls, ctx, node, **kwargs):  # Equal on floating types: opset 11
        from onnx import TensorProto

        x, dtype = _float_input(ctx, node, allowed=(TensorProto.FLOAT, TensorProto.DOUBLE))
        one = _scalar(ctx, 1.0, dtype, "expm1_one")
        u = ctx.make_node("Exp", [x]).output[0]
        u_minus_1 = ctx.make_node("Sub", [u, one]).output[0]
        ratio = ctx.make_node("Div", [x, ctx.make_node("Log", [u]).output[0]]).output[0]
        kahan = ctx.make_node("Mul", [u_minus_1, ratio]).output[0]
        u_is_one = ctx.make_node("Equal", [u, one]).output[0]
        small = ctx.make_node("Where", [u_is_one, x, kahan]).output[0]
        abs_x = ctx.make_node("Abs", [x]).output[0]
        large = ctx.make_node("Greater", [abs_x, _scalar(ctx, 0.5, dtype, "expm1_half")]).output[0]
        _finish(ctx, node, "Where", [large, u_minus_1, small], dtype)


class _Bucketize:
    """Bucket index = how many boundaries ``b`` have ``not (x < b)``.

    TF finds the index with ``upper_bound`` over the sorted float boundaries, comparing
    ``x < b`` in ``x``'s type promoted with float (integers compare as float32, doubles
    against the boundaries widened to double); the count reproduces that, NaN included.
    """

    @classmethod
    def version_13(cls, ctx, node, **kwargs):  # Unsqueeze and ReduceSum take axes as inputs
        import onnx
        from onnx import TensorProto
        from tf2onnx import utils
        from tf2onnx.graph_builder import GraphBuilder

        x = node.input[0]
        dtype = ctx.get_dtype(x)
        if dtype != TensorProto.DOUBLE:
            if dtype != TensorProto.FLOAT:
                x = _cast(ctx, x, TensorProto.FLOAT)
            dtype = TensorProto.FLOAT
        boundaries = np.array(node.get_attr_value("boundaries") or [], dtype=np.float32)
        if not boundaries.size:  # one bucket; onnxruntime mis-shapes a sum over an empty axis
            shape = ctx.make_node("Shape", [x]).output[0]
            zero = onnx.helper.make_tensor("zero", TensorProto.INT32, [1], [0])
            _replace(ctx, node, "ConstantOfShape", [shape], attr={"value": zero})
            return
        bounds = ctx.make_const(utils.make_name("bucketize_boundaries"),
                                boundaries.astype(utils.map_onnx_to_numpy_type(dtype))).output[0]
        column = GraphBuilder(ctx).make_unsqueeze({"data": x, "axes": [-1]})
        below = ctx.make_node("Less", [column, bounds]).output[0]
        at_or_above = ctx.make_node("Not", [below]).output[0]
        counts = _cast(ctx, at_or_above, TensorProto.INT32)
        axes = ctx.make_const(utils.make_name("bucketize_axes"), np.array([-1], dtype=np.int64)).output[0]
        _replace(ctx, node, "ReduceSum", [counts, axes], attr={"keepdims": 0})


# -- building blocks for the handlers below (all opset 13 and later) ----------------------------------
_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)


def _op(ctx, op_type, inputs, **attr):
    """One new node's first output."""
    return ctx.make_node(op_type, inputs, attr=attr).output[0]


def _ints(ctx, values):
    """An int64 constant (a scalar for a scalar ``values``)."""
    from tf2onnx import utils

    return ctx.make_const(utils.make_name("const"), np.array(values, dtype=np.int64)).output[0]


def _reals(ctx, values, onnx_dtype):
    from tf2onnx import utils

    return ctx.make_const(utils.make_name("const"),
                          np.array(values, dtype=utils.map_onnx_to_numpy_type(onnx_dtype))).output[0]


def _dims(ctx, shape, start, end=_INT64_MAX):
    """``shape[start:end]`` of an int64 shape vector; ``start``/``end`` ints or int64 [1] tensors."""
    as_input = [_ints(ctx, [v]) if isinstance(v, int) else v for v in (start, end)]
    return _op(ctx, "Slice", [shape] + as_input)


def _product(ctx, dims):
    """The product of an int64 vector's entries as [1] (1 for an empty one)."""
    return _op(ctx, "ReduceProd", [_op(ctx, "Concat", [_ints(ctx, [1]), dims], axis=0)], keepdims=1)


def _as_scalar(ctx, vector):
    return _op(ctx, "Reshape", [vector, _ints(ctx, [])])


def _reshape(ctx, x, shape):
    """Reshape to a computed shape. Not ``allowzero=1``: tf2onnx's reshape optimizer rewrites computed
    shapes into constants whose 0 means "the input's dim", whatever ``allowzero`` says, so a tensor with
    a zero-size dim may come out with another shape (nothing else differs)."""
    return _op(ctx, "Reshape", [x, shape])


def _runtime_axis(ctx, axis, shape):
    """A TF axis tensor resolved against ``shape``'s rank (negative counts from the back), int64 [1]."""
    from onnx import TensorProto

    axis = _op(ctx, "Reshape", [_cast(ctx, axis, TensorProto.INT64), _ints(ctx, [1])])
    from_back = _op(ctx, "Add", [axis, _op(ctx, "Shape", [shape])])
    return _op(ctx, "Where", [_op(ctx, "Less", [axis, _ints(ctx, [0])]), from_back, axis])


def _is_const(ctx, name) -> bool:
    producer = ctx.get_node_by_output(name)
    return producer is not None and producer.is_const()


# -- complex tensors, in the pair layout (shape S + [2]: see the module docstring) --------------------
_COMPLEX_CONSUMERS = ("ExpandDims", "IRFFT", "Imag", "Mul", "Pad", "Real", "Shape")


def _part_type(onnx_dtype):
    """The real type of a complex type's parts; None for a type that is not complex."""
    from onnx import TensorProto

    return {TensorProto.COMPLEX64: TensorProto.FLOAT, TensorProto.COMPLEX128: TensorProto.DOUBLE}.get(onnx_dtype)


_PAIRS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> its pair-layout tensors


def _mark_pair(ctx, name) -> None:
    _PAIRS.setdefault(ctx, set()).add(name)


def _takes_pairs(ctx, inputs) -> bool:
    """Whether one of ``inputs`` is in the pair layout (a handler here made it). tf2onnx keeps no TF
    type attribute on a node, and a pair's type is its parts' real type, so they are marked."""
    pairs = _PAIRS.get(ctx, ())
    return any(name in pairs for name in inputs)


def _pair_shape(ctx, name):
    shape = ctx.get_shape(name)
    return None if shape is None else list(shape) + [2]


def _pair_operand(ctx, node, name):
    """Complex input ``name`` of ``node`` in the pair layout, and its parts' type: as a handler here
    made it, or a complex constant converted; any other complex tensor is refused."""
    from tf2onnx import utils

    dtype = ctx.get_dtype(name)
    if _takes_pairs(ctx, [name]):
        return name, dtype
    part = _part_type(dtype)
    producer = ctx.get_node_by_output(name)
    utils.make_sure(part is not None and producer is not None and producer.is_const(),
                    "%s %s: complex input %s comes from %s; only RFFT's spectrum and constants have an ONNX form "
                    "here", node.type, node.name, name, producer.type if producer is not None else "outside")
    value = producer.get_tensor_value(as_list=False)
    pair = np.stack([value.real, value.imag], axis=-1).astype(utils.map_onnx_to_numpy_type(part))
    return ctx.make_const(utils.make_name(producer.name + "_pair"), pair).output[0], part


def _parts(ctx, pair):
    """(real, imaginary) of a pair-layout tensor."""
    return tuple(_op(ctx, "Gather", [pair, _ints(ctx, i)], axis=-1) for i in (0, 1))


def _replace_with_pair(ctx, node, real, imag, part):
    shape = _pair_shape(ctx, node.output[0])
    axes = _ints(ctx, [-1])
    halves = [_op(ctx, "Unsqueeze", [half, axes]) for half in (real, imag)]
    _replace(ctx, node, "Concat", halves, {"axis": -1}, dtypes=[part], shapes=[shape])
    _mark_pair(ctx, node.output[0])


def _check_complex_region(ctx, rfft):
    """Refuse an RFFT whose spectrum reaches (through complex tensors) an op not in
    ``_COMPLEX_CONSUMERS`` or a graph output: it would be handed the pair layout unknowingly."""
    from tf2onnx import utils

    seen, todo = set(), [rfft.output[0]]
    while todo:
        name = todo.pop()
        utils.make_sure(name not in ctx.outputs, "RFFT %s: its complex result %s is a graph output, which ONNX "
                        "(onnxruntime) cannot give as complex", rfft.name, name)
        for consumer in ctx.find_output_consumers(name):
            utils.make_sure(consumer.type in _COMPLEX_CONSUMERS,
                            "RFFT %s: its complex result reaches %s %s, which has no complex form here (only %s)",
                            rfft.name, consumer.type, consumer.name, ", ".join(_COMPLEX_CONSUMERS))
            for out in consumer.output:
                if _part_type(ctx.get_dtype(out)) is not None and out not in seen:
                    seen.add(out)
                    todo.append(out)


def _fft_length(ctx, node):
    """The node's ``fft_length`` (input 1, one entry) as int64 [1]."""
    from onnx import TensorProto

    if _is_const(ctx, node.input[1]):
        return _ints(ctx, np.ravel(ctx.get_tensor_value(node.input[1], as_list=False)).astype(np.int64)[:1])
    return _op(ctx, "Reshape", [_cast(ctx, node.input[1], TensorProto.INT64), _ints(ctx, [1])])


def _in_double(ctx, name):
    from onnx import TensorProto

    return name if ctx.get_dtype(name) == TensorProto.DOUBLE else _cast(ctx, name, TensorProto.DOUBLE)


def _dft(ctx, x, length=None, **attr):
    """ONNX DFT along axis -2 (an attribute until opset 19, an input from 20)."""
    inputs = [x, "" if length is None else _as_scalar(ctx, length)]
    if ctx.opset >= 20:
        inputs.append(_ints(ctx, -2))
    else:
        attr["axis"] = -2
    while inputs[-1] == "":
        inputs.pop()
    return _op(ctx, "DFT", inputs, **attr)


def _twiddle_angles(ctx, rows, cols, length):
    """2 pi ((r c) mod L) / L for every row index r and column index c, float64 [rows, cols]: the index
    product is reduced exactly in int64 first, so no angle is larger than 2 pi."""
    from onnx import TensorProto

    axes1, axes0 = _ints(ctx, [1]), _ints(ctx, [0])
    turns = _op(ctx, "Mod", [_op(ctx, "Mul", [_op(ctx, "Unsqueeze", [rows, axes1]),
                                              _op(ctx, "Unsqueeze", [cols, axes0])]), length])
    scaled = _op(ctx, "Mul", [_cast(ctx, turns, TensorProto.DOUBLE), _reals(ctx, 2 * np.pi, TensorProto.DOUBLE)])
    return _op(ctx, "Div", [scaled, _cast(ctx, length, TensorProto.DOUBLE)])


def _indices(ctx, count):
    """0, 1, ..., count - 1 (``count`` int64 [1])."""
    return _op(ctx, "Range", [_ints(ctx, 0), _as_scalar(ctx, count), _ints(ctx, 1)])


def _rfft_spectrum(ctx, x, length):
    """The one-sided spectrum of float64 signal ``x`` (last axis; cropped or zero-padded to ``length``),
    in the pair layout [..., length // 2 + 1, 2]."""
    from onnx import TensorProto

    if ctx.opset >= 17:
        signal = _op(ctx, "Unsqueeze", [x, _ints(ctx, [-1])])
        return _dft(ctx, signal, length, onesided=1)
    # y[k] = sum over n < min(N, L) of x[n] (cos - i sin)(2 pi k n / L): one MatMul with a [N, 2 * half]
    # matrix whose columns interleave the real and imaginary parts, rows n >= L zero (the crop)
    shape = _op(ctx, "Shape", [x])
    count = _dims(ctx, shape, -1)
    half = _op(ctx, "Add", [_op(ctx, "Div", [length, _ints(ctx, [2])]), _ints(ctx, [1])])
    rows = _indices(ctx, count)
    angles = _twiddle_angles(ctx, rows, _indices(ctx, half), length)
    inside = _cast(ctx, _op(ctx, "Less", [_op(ctx, "Unsqueeze", [rows, _ints(ctx, [1])]), length]), TensorProto.DOUBLE)
    cosines = _op(ctx, "Mul", [_op(ctx, "Cos", [angles]), inside])
    sines = _op(ctx, "Mul", [_op(ctx, "Neg", [_op(ctx, "Sin", [angles])]), inside])
    axes = _ints(ctx, [-1])
    columns = _op(ctx, "Concat", [_op(ctx, "Unsqueeze", [cosines, axes]), _op(ctx, "Unsqueeze", [sines, axes])],
                  axis=-1)
    matrix = _reshape(ctx, columns, _op(ctx, "Concat", [count, _op(ctx, "Mul", [half, _ints(ctx, [2])])], axis=0))
    product = _op(ctx, "MatMul", [x, matrix])
    return _reshape(ctx, product, _op(ctx, "Concat", [_dims(ctx, shape, 0, -1), half, _ints(ctx, [2])], axis=0))


def _irfft_signal(ctx, spectrum, length):
    """The real signal of length ``length`` whose one-sided spectrum is float64 ``spectrum`` (pair
    layout, [..., M, 2]; its first ``length // 2 + 1`` entries used, zeros after M), as TF's IRFFT:
    the imaginary parts of the 0th and (even length) the middle entry do not count, scale 1 / length."""
    from onnx import TensorProto, helper

    shape = _op(ctx, "Shape", [spectrum])
    count = _dims(ctx, shape, -2, -1)
    half = _op(ctx, "Add", [_op(ctx, "Div", [length, _ints(ctx, [2])]), _ints(ctx, [1])])
    if ctx.opset >= 17:
        # the whole Hermitian spectrum Y = [X[0..half), conj(X[(L-1)//2 .. 1])] goes through a forward DFT
        # conjugated: x = Re(DFT(conj Y)) / L (onnxruntime's forward DFT is the exact one in float64)
        kept = _op(ctx, "Slice", [spectrum, _ints(ctx, [0]), half, _ints(ctx, [-2])])
        missing = _op(ctx, "Max", [_op(ctx, "Sub", [half, count]), _ints(ctx, [0])])
        zero = helper.make_tensor("zero", TensorProto.DOUBLE, [1], [0.0])
        zeros = _op(ctx, "ConstantOfShape", [_op(ctx, "Concat", [_dims(ctx, shape, 0, -2), missing, _ints(ctx, [2])],
                                                 axis=0)], value=zero)
        first = _op(ctx, "Concat", [kept, zeros], axis=-2)
        conjugate = _op(ctx, "Mul", [first, _reals(ctx, [1.0, -1.0], TensorProto.DOUBLE)])
        mirrored = _op(ctx, "Div", [_op(ctx, "Sub", [length, _ints(ctx, [1])]), _ints(ctx, [2])])
        rest = _op(ctx, "Slice", [first, mirrored, _ints(ctx, [0]), _ints(ctx, [-2]), _ints(ctx, [-1])])
        transform = _dft(ctx, _op(ctx, "Concat", [conjugate, rest], axis=-2))
        real = _op(ctx, "Gather", [transform, _ints(ctx, 0)], axis=-1)
        return _op(ctx, "Div", [real, _cast(ctx, length, TensorProto.DOUBLE)])
    # x[n] = sum over k < half of w[k] (Re X[k] cos - Im X[k] sin)(2 pi k n / L) / L, w = 1 at k = 0 and
    # 2k = L (their imaginary parts not used), 2 elsewhere: one MatMul of the interleaved spectrum
    rows = _indices(ctx, count)
    angles = _twiddle_angles(ctx, rows, _indices(ctx, length), length)
    edge = _op(ctx, "Or", [_op(ctx, "Equal", [rows, _ints(ctx, 0)]),
                           _op(ctx, "Equal", [_op(ctx, "Mul", [rows, _ints(ctx, 2)]), length])])
    one, two, none = (_reals(ctx, v, TensorProto.DOUBLE) for v in (1.0, 2.0, 0.0))
    weight = _op(ctx, "Where", [_op(ctx, "Less", [rows, half]), _op(ctx, "Where", [edge, one, two]), none])
    weight = _op(ctx, "Div", [weight, _cast(ctx, length, TensorProto.DOUBLE)])
    sine_weight = _op(ctx, "Where", [edge, none, weight])
    axes1 = _ints(ctx, [1])
    cosines = _op(ctx, "Mul", [_op(ctx, "Cos", [angles]), _op(ctx, "Unsqueeze", [weight, axes1])])
    sines = _op(ctx, "Mul", [_op(ctx, "Neg", [_op(ctx, "Sin", [angles])]), _op(ctx, "Unsqueeze", [sine_weight, axes1])])
    interleaved = _op(ctx, "Concat", [_op(ctx, "Unsqueeze", [cosines, axes1]), _op(ctx, "Unsqueeze", [sines, axes1])],
                      axis=1)
    twice = _op(ctx, "Mul", [count, _ints(ctx, [2])])
    matrix = _reshape(ctx, interleaved, _op(ctx, "Concat", [twice, length], axis=0))
    flat = _reshape(ctx, spectrum, _op(ctx, "Concat", [_dims(ctx, shape, 0, -2), twice], axis=0))
    return _op(ctx, "MatMul", [flat, matrix])


def _finish_in(ctx, node, result, dtype, **replacement):
    """Replace ``node`` by ``result`` cast to ``dtype`` (an Identity if it already is)."""
    from onnx import TensorProto

    if dtype == TensorProto.DOUBLE:
        _replace(ctx, node, "Identity", [result], **replacement)
    else:
        _replace(ctx, node, "Cast", [result], {"to": dtype}, **replacement)


class _RFFT:
    """A spectrum tf2onnx's RFFT cannot take: tf2onnx's takes only one whose every consumer is
    ComplexAbs (a spectrogram's magnitude) with a constant length no longer than the signal."""

    @staticmethod
    def applies(ctx, node):
        consumers = ctx.find_output_consumers(node.output[0])
        return not consumers or any(c.type != "ComplexAbs" for c in consumers)

    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto
        from tf2onnx import utils

        utils.make_sure(ctx.get_dtype(node.input[0]) in (TensorProto.FLOAT, TensorProto.DOUBLE),
                        "RFFT %s: unsupported input type %s", node.name, ctx.get_dtype(node.input[0]))
        _check_complex_region(ctx, node)
        part = _part_type(node.output_dtypes[0])
        spectrum = _rfft_spectrum(ctx, _in_double(ctx, node.input[0]), _fft_length(ctx, node))
        _finish_in(ctx, node, spectrum, part, dtypes=[part], shapes=[_pair_shape(ctx, node.output[0])])
        _mark_pair(ctx, node.output[0])


class _IRFFT:
    """TF's IRFFT (one-sided spectrum in, real signal out), in float64 whatever the type."""

    @classmethod
    def version_13(cls, ctx, node, **kwargs):
        spectrum, _ = _pair_operand(ctx, node, node.input[0])
        signal = _irfft_signal(ctx, _in_double(ctx, spectrum), _fft_length(ctx, node))
        _finish_in(ctx, node, signal, node.output_dtypes[0])


class _Real:
    """The real part: entry 0 of the pair axis."""

    @classmethod
    def version_13(cls, ctx, node, **kwargs):
        pair, _ = _pair_operand(ctx, node, node.input[0])
        _replace(ctx, node, "Gather", [pair, _ints(ctx, 0)], {"axis": -1})


class _Imag:
    """The imaginary part: entry 1 of the pair axis."""

    @classmethod
    def version_13(cls, ctx, node, **kwargs):
        pair, _ = _pair_operand(ctx, node, node.input[0])
        _replace(ctx, node, "Gather", [pair, _ints(ctx, 1)], {"axis": -1})


class _ComplexMul:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i, broadcasting as TF does."""

    @staticmethod
    def applies(ctx, node):
        return _takes_pairs(ctx, node.input[:2])

    @staticmethod
    def convert(ctx, node):
        (a, part), (b, _) = (_pair_operand(ctx, node, name) for name in node.input[:2])
        (ar, ai), (br, bi) = _parts(ctx, a), _parts(ctx, b)
        real = _op(ctx, "Sub", [_op(ctx, "Mul", [ar, br]), _op(ctx, "Mul", [ai, bi])])
        imag = _op(ctx, "Add", [_op(ctx, "Mul", [ar, bi]), _op(ctx, "Mul", [ai, br])])
        _replace_with_pair(ctx, node, real, imag, part)


class _ComplexExpandDims:
    """ExpandDims of a complex tensor: a negative axis moves one left past the pair axis."""

    @staticmethod
    def applies(ctx, node):
        return _takes_pairs(ctx, node.input[:1])

    @staticmethod
    def convert(ctx, node):
        from tf2onnx import utils

        utils.make_sure(_is_const(ctx, node.input[1]), "ExpandDims %s: a complex tensor needs a constant axis",
                        node.name)
        axis = int(np.ravel(ctx.get_tensor_value(node.input[1], as_list=False))[0])
        x, part = _pair_operand(ctx, node, node.input[0])
        shape = _pair_shape(ctx, node.output[0])
        _replace(ctx, node, "Unsqueeze", [x, _ints(ctx, [axis if axis >= 0 else axis - 1])], dtypes=[part],
                 shapes=[shape])
        _mark_pair(ctx, node.output[0])


class _ComplexPad:
    """Zero padding of a complex tensor: the pair axis gets no padding."""

    @staticmethod
    def applies(ctx, node):
        return _takes_pairs(ctx, node.input[:1])

    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto
        from tf2onnx import utils

        x, part = _pair_operand(ctx, node, node.input[0])
        paddings = node.input[1]
        none = ctx.make_const(utils.make_name("no_padding"),
                              np.zeros((1, 2), utils.map_onnx_to_numpy_type(ctx.get_dtype(paddings)))).output[0]
        rows = _op(ctx, "Concat", [paddings, none], axis=0)
        pads = _op(ctx, "Reshape", [_op(ctx, "Transpose", [rows], perm=[1, 0]), _ints(ctx, [-1])])
        shape = _pair_shape(ctx, node.output[0])
        _replace(ctx, node, "Pad", [x, _cast(ctx, pads, TensorProto.INT64)], {"mode": "constant"}, dtypes=[part],
                 shapes=[shape])
        _mark_pair(ctx, node.output[0])


class _ComplexShape:
    """The shape of a complex tensor: the pair layout's without its last entry."""

    @staticmethod
    def applies(ctx, node):
        return _takes_pairs(ctx, node.input[:1])

    @staticmethod
    def convert(ctx, node):
        from onnx import TensorProto

        dims = _dims(ctx, _op(ctx, "Shape", [node.input[0]]), 0, -1)
        if node.output_dtypes[0] == TensorProto.INT64:
            _replace(ctx, node, "Identity", [dims])
        else:
            _replace(ctx, node, "Cast", [dims], {"to": node.output_dtypes[0]})


# -- axes known only when the graph runs ---------------------------------------------------------
class _GatherAtRuntimeAxis:
    """GatherV2 whose axis is a tensor (ONNX Gather's axis is an attribute): ``params`` is viewed as
    [outer, size, inner] around the axis, gathered on its middle axis, and reshaped back."""

    @staticmethod
    def applies(ctx, node):
        return not _is_const(ctx, node.input[2]) and not node.get_attr_value("batch_dims", 0)

    @staticmethod
    def convert(ctx, node):
        params, indices, axis = node.input
        shape = _op(ctx, "Shape", [params])
        at = _runtime_axis(ctx, axis, shape)
        after = _op(ctx, "Add", [at, _ints(ctx, [1])])
        before_dims, after_dims = _dims(ctx, shape, 0, at), _dims(ctx, shape, after)
        blocks = [_product(ctx, before_dims), _dims(ctx, shape, at, after), _product(ctx, after_dims)]
        block = _reshape(ctx, params, _op(ctx, "Concat", blocks, axis=0))
        picked = _op(ctx, "Gather", [block, indices], axis=1)
        out_shape = _op(ctx, "Concat", [before_dims, _op(ctx, "Shape", [indices]), after_dims], axis=0)
        _replace(ctx, node, "Reshape", [picked, out_shape])


class _ConcatAtRuntimeAxis:
    """ConcatV2 whose axis is a tensor (ONNX Concat's axis is an attribute): each value is viewed as
    [outer, rest] (the axis and every one after it flattened), joined on axis 1, reshaped back."""

    @staticmethod
    def applies(ctx, node):
        return not _is_const(ctx, node.input[-1])

    @staticmethod
    def convert(ctx, node):
        values, axis = node.input[:-1], node.input[-1]
        shape = _op(ctx, "Shape", [values[0]])
        at = _runtime_axis(ctx, axis, shape)
        after = _op(ctx, "Add", [at, _ints(ctx, [1])])
        outer = _product(ctx, _dims(ctx, shape, 0, at))
        flat, total = [], None
        for value in values:
            value_shape = _op(ctx, "Shape", [value])
            rest = _product(ctx, _dims(ctx, value_shape, at))
            flat.append(_reshape(ctx, value, _op(ctx, "Concat", [outer, rest], axis=0)))
            size = _dims(ctx, value_shape, at, after)
            total = size if total is None else _op(ctx, "Add", [total, size])
        joined = _op(ctx, "Concat", flat, axis=1)
        out_shape = _op(ctx, "Concat", [_dims(ctx, shape, 0, at), total, _dims(ctx, shape, after)], axis=0)
        _replace(ctx, node, "Reshape", [joined, out_shape])


class _StridedSliceOfUnknownRank:
    """StridedSlice with an ellipsis on a tensor of unknown rank (tf2onnx needs the rank to place the
    specs after the ellipsis): those take negative ONNX axes, the ones before it positive axes."""

    @staticmethod
    def applies(ctx, node):
        return (bool(node.get_attr_value("ellipsis_mask", 0)) and not node.get_attr_value("new_axis_mask", 0)
                and ctx.get_rank(node.input[0]) is None and all(_is_const(ctx, i) for i in node.input[1:4]))

    @staticmethod
    def convert(ctx, node):
        from tf2onnx import utils

        begin, end, strides = (np.ravel(ctx.get_tensor_value(i, as_list=False)).astype(np.int64).tolist()
                               for i in node.input[1:4])
        begin_mask, end_mask, ellipsis_mask, shrink_mask = (
            node.get_attr_value(a, 0) for a in ("begin_mask", "end_mask", "ellipsis_mask", "shrink_axis_mask"))
        count = len(begin)
        ellipsis = (ellipsis_mask & -ellipsis_mask).bit_length() - 1  # TF allows one ellipsis
        axes, starts, ends, steps, squeeze = [], [], [], [], []
        for i in range(count):
            if i == ellipsis:
                continue
            axis = i if i < ellipsis else i - count
            axes.append(axis)
            if shrink_mask >> i & 1:  # TF takes begin[i] alone
                starts.append(begin[i])
                ends.append(begin[i] + 1 if begin[i] != -1 else _INT64_MAX)
                steps.append(1)
                squeeze.append(axis)
                continue
            step = strides[i]
            utils.make_sure(step != 0, "StridedSlice %s: stride 0", node.name)
            starts.append((0 if step > 0 else _INT64_MAX) if begin_mask >> i & 1 else begin[i])
            ends.append((_INT64_MAX if step > 0 else _INT64_MIN) if end_mask >> i & 1 else end[i])
            steps.append(step)
        x = node.input[0]
        if not axes:
            _replace(ctx, node, "Identity", [x])
            return
        inputs = [x, _ints(ctx, starts), _ints(ctx, ends), _ints(ctx, axes), _ints(ctx, steps)]
        if squeeze:
            _replace(ctx, node, "Squeeze", [_op(ctx, "Slice", inputs), _ints(ctx, squeeze)])
        else:
            _replace(ctx, node, "Slice", inputs)
