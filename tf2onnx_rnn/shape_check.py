"""The check every conversion makes by default: the converted model's output shapes against its source's.

A wrong axis is the conversion error that hides best: a model whose output follows the batch size
where the source's follows the time length is right wherever the two are equal, which is where a
quick test looks. So unless verification is asked (which compares values too) or the check is
turned off (``check_shapes=False``), the converted model and its source run on the verification's
two rounds of seeded random inputs, every dynamic dimension at a size of its own in each round, and
each output's shape and dtype must be the source's. The values are not compared.

The source runs under the same rules as verification (a model that would reach outside TensorFlow
is not run unless trusted); where it may not run, or fails on the random inputs, the check is
skipped and the report says why. Cost: the source's call and onnxruntime's, twice, on inputs of a
few rows and steps.
"""
from __future__ import annotations

from .errors import ConversionError, VerificationError, first_line


class ShapeCheckFailed(VerificationError):
    """An output of the converted model has another shape or dtype than the source's: ``result`` holds
    every output's check, ``conversion`` what was converted (and not written)."""

    what = "the output shape check"

    def __init__(self, result, conversion):
        super().__init__(f"{self.what} failed: {result.reason()}: the converted model computes this output "
                         "otherwise than its source (nothing was written)\n" + result.table())
        self.result, self.conversion = result, conversion


def check_output_shapes(source, conversion) -> tuple:
    """Run the check on ``conversion`` (an api.Conversion): (one line saying what was checked, or why it
    was skipped; the rounds measured, as :attr:`verify.VerificationResult.measured`, empty when skipped).
    Raise :class:`ShapeCheckFailed` when an output's shape or dtype differs."""
    try:
        result = source.verify(conversion.model_proto, 0.0, values=False)
    except ConversionError as refusal:  # the source may not be run (safe mode)
        return f"output shapes not checked: {first_line(refusal)}", []
    if result.reference_failed or not result.onnx_loaded:  # the latter: kept with continue_on_error
        return f"output shapes not checked: {result.problem}", []
    if not result.passed:
        raise ShapeCheckFailed(result, conversion)
    rounds = "; ".join(result.input_shapes)
    return f"output shapes checked against {result.reference} at input shapes {rounds}", result.measured
