"""RFFT, IRFFT and the complex values between them (keras-lmu's ``LMUFeedforward``; the table in
:mod:`tf2onnx_rnn.handlers`).

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
DFT by 4e-8 even in float64, hence float64 (float32 for a target whose runtime has none: ncnn) and a forward
DFT for IRFFT; the matrix form reduces
``k * n mod length`` in int64 before the angle, so no angle exceeds 2 pi. Opset 20 made DFT's axis an
input (it was an attribute): both are written (tf2onnx 1.17 writes opsets up to 18).
"""
from __future__ import annotations

import weakref

import numpy as np

from .common import _as_scalar, _cast, _dims, _ints, _is_const, _op, _reals, _replace, _reshape

# -- complex tensors, in the pair layout (shape S + [2]: see the docstring above) --------------------
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


def _work() -> int:
    """The type the transforms compute in: float64, or float32 where the target's runtime has no float64
    (ncnn: pnnx leaves a Cast to it as an op ncnn does not load)."""
    from onnx import TensorProto

    from . import LACKING

    return TensorProto.FLOAT if "float64" in LACKING.get() else TensorProto.DOUBLE


def _in_work(ctx, name):
    return name if ctx.get_dtype(name) == _work() else _cast(ctx, name, _work())


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


def _dft_written(ctx) -> bool:
    """Whether the transforms are ONNX DFTs (opset 17 on, unless the target's runtime has none) or products
    with cos/sin matrices."""
    from . import LACKING

    return ctx.opset >= 17 and "DFT" not in LACKING.get()


def _twiddle_angles(ctx, rows, cols, length):
    """2 pi ((r c) mod L) / L for every row index r and column index c, float64 [rows, cols]: the index
    product is reduced exactly in int64 first, so no angle is larger than 2 pi."""

    axes1, axes0 = _ints(ctx, [1]), _ints(ctx, [0])
    turns = _op(ctx, "Mod", [_op(ctx, "Mul", [_op(ctx, "Unsqueeze", [rows, axes1]),
                                              _op(ctx, "Unsqueeze", [cols, axes0])]), length])
    scaled = _op(ctx, "Mul", [_cast(ctx, turns, _work()), _reals(ctx, 2 * np.pi, _work())])
    return _op(ctx, "Div", [scaled, _cast(ctx, length, _work())])


def _indices(ctx, count):
    """0, 1, ..., count - 1 (``count`` int64 [1])."""
    return _op(ctx, "Range", [_ints(ctx, 0), _as_scalar(ctx, count), _ints(ctx, 1)])


def _rfft_spectrum(ctx, x, length):
    """The one-sided spectrum of float64 signal ``x`` (last axis; cropped or zero-padded to ``length``),
    in the pair layout [..., length // 2 + 1, 2]."""

    if _dft_written(ctx):
        signal = _op(ctx, "Unsqueeze", [x, _ints(ctx, [-1])])
        return _dft(ctx, signal, length, onesided=1)
    # y[k] = sum over n < min(N, L) of x[n] (cos - i sin)(2 pi k n / L): one MatMul with a [N, 2 * half]
    # matrix whose columns interleave the real and imaginary parts, rows n >= L zero (the crop)
    shape = _op(ctx, "Shape", [x])
    count = _dims(ctx, shape, -1)
    half = _op(ctx, "Add", [_op(ctx, "Div", [length, _ints(ctx, [2])]), _ints(ctx, [1])])
    rows = _indices(ctx, count)
    angles = _twiddle_angles(ctx, rows, _indices(ctx, half), length)
    inside = _cast(ctx, _op(ctx, "Less", [_op(ctx, "Unsqueeze", [rows, _ints(ctx, [1])]), length]), _work())
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
    from onnx import helper

    shape = _op(ctx, "Shape", [spectrum])
    count = _dims(ctx, shape, -2, -1)
    half = _op(ctx, "Add", [_op(ctx, "Div", [length, _ints(ctx, [2])]), _ints(ctx, [1])])
    if _dft_written(ctx):
        # the whole Hermitian spectrum Y = [X[0..half), conj(X[(L-1)//2 .. 1])] goes through a forward DFT
        # conjugated: x = Re(DFT(conj Y)) / L (onnxruntime's forward DFT is the exact one in float64)
        kept = _op(ctx, "Slice", [spectrum, _ints(ctx, [0]), half, _ints(ctx, [-2])])
        missing = _op(ctx, "Max", [_op(ctx, "Sub", [half, count]), _ints(ctx, [0])])
        zero = helper.make_tensor("zero", _work(), [1], [0.0])
        zeros = _op(ctx, "ConstantOfShape", [_op(ctx, "Concat", [_dims(ctx, shape, 0, -2), missing, _ints(ctx, [2])],
                                                 axis=0)], value=zero)
        first = _op(ctx, "Concat", [kept, zeros], axis=-2)
        conjugate = _op(ctx, "Mul", [first, _reals(ctx, [1.0, -1.0], _work())])
        mirrored = _op(ctx, "Div", [_op(ctx, "Sub", [length, _ints(ctx, [1])]), _ints(ctx, [2])])
        rest = _op(ctx, "Slice", [first, mirrored, _ints(ctx, [0]), _ints(ctx, [-2]), _ints(ctx, [-1])])
        transform = _dft(ctx, _op(ctx, "Concat", [conjugate, rest], axis=-2))
        real = _op(ctx, "Gather", [transform, _ints(ctx, 0)], axis=-1)
        return _op(ctx, "Div", [real, _cast(ctx, length, _work())])
    # x[n] = sum over k < half of w[k] (Re X[k] cos - Im X[k] sin)(2 pi k n / L) / L, w = 1 at k = 0 and
    # 2k = L (their imaginary parts not used), 2 elsewhere: one MatMul of the interleaved spectrum
    rows = _indices(ctx, count)
    angles = _twiddle_angles(ctx, rows, _indices(ctx, length), length)
    edge = _op(ctx, "Or", [_op(ctx, "Equal", [rows, _ints(ctx, 0)]),
                           _op(ctx, "Equal", [_op(ctx, "Mul", [rows, _ints(ctx, 2)]), length])])
    one, two, none = (_reals(ctx, v, _work()) for v in (1.0, 2.0, 0.0))
    weight = _op(ctx, "Where", [_op(ctx, "Less", [rows, half]), _op(ctx, "Where", [edge, one, two]), none])
    weight = _op(ctx, "Div", [weight, _cast(ctx, length, _work())])
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

    if dtype == _work():
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
        spectrum = _rfft_spectrum(ctx, _in_work(ctx, node.input[0]), _fft_length(ctx, node))
        _finish_in(ctx, node, spectrum, part, dtypes=[part], shapes=[_pair_shape(ctx, node.output[0])])
        _mark_pair(ctx, node.output[0])


class _IRFFT:
    """TF's IRFFT (one-sided spectrum in, real signal out), in float64 whatever the type."""

    @classmethod
    def version_13(cls, ctx, node, **kwargs):
        spectrum, _ = _pair_operand(ctx, node, node.input[0])
        signal = _irfft_signal(ctx, _in_work(ctx, spectrum), _fft_length(ctx, node))
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
