"""Verification: run the TensorFlow model and the ONNX model on the same seeded random inputs.

Dynamic dimensions are exercised at two sizes, so a model that is only right for the traced
length or batch fails. The result lists the max abs error per output against a tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import onnx

from .errors import ConversionError, VerificationError
from .inputs import random_inputs

# (batch size, size of every other dynamic dimension) for each verification round
ROUNDS = ((2, 5), (3, 9))


@dataclass
class OutputCheck:
    name: str
    max_abs_error: float
    passed: bool


@dataclass
class VerificationResult:
    tolerance: float
    checks: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def table(self) -> str:
        lines = [f"verification (tolerance {self.tolerance:g}):"]
        for check in self.checks:
            lines.append(f"  {check.name}: max abs error {check.max_abs_error:.3g} "
                         f"{'ok' if check.passed else 'FAILED'}")
        return "\n".join(lines)

    def raise_for_failure(self) -> "VerificationResult":
        if not self.passed:
            raise VerificationError(self.table())
        return self


def onnx_input_specs(model_proto: onnx.ModelProto) -> list:
    """(name, shape with None for dynamic dims, numpy dtype) of each graph input."""
    initializers = {i.name for i in model_proto.graph.initializer}
    specs = []
    for value in model_proto.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        specs.append((value.name, shape, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    return specs


def _session(model_proto: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def compare(reference: Callable[[list], Sequence[np.ndarray]], model_proto: onnx.ModelProto,
            tolerance: float = 1e-4, seed: int = 0, inputs: Optional[list] = None) -> VerificationResult:
    """Compare ``reference(arrays)`` (outputs in ONNX output order) with onnxruntime."""
    session = _session(model_proto)
    specs = onnx_input_specs(model_proto)
    names = [o.name for o in session.get_outputs()]
    worst = dict.fromkeys(names, 0.0)
    batches = [inputs] if inputs is not None else [
        random_inputs(specs, seed + i, {0: batch, **{axis: other for axis in range(1, 8)}})
        for i, (batch, other) in enumerate(ROUNDS)]
    for arrays in batches:
        expected = [np.asarray(e) for e in reference(arrays)]
        actual = session.run(None, {name: a for (name, _, _), a in zip(specs, arrays)})
        if len(expected) != len(actual):
            raise VerificationError(f"the TensorFlow model gives {len(expected)} outputs, ONNX {len(actual)}")
        for name, e, a in zip(names, expected, actual):
            if e.shape != a.shape:
                worst[name] = float("inf")
                continue
            error = float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))) if e.size else 0.0
            worst[name] = max(worst[name], error)
    return VerificationResult(tolerance, [OutputCheck(n, worst[n], worst[n] <= tolerance) for n in names])


def verify_keras(model, model_proto: onnx.ModelProto, tolerance: float = 1e-4, seed: int = 0,
                 inputs: Optional[list] = None) -> VerificationResult:
    """Compare a Keras model (``model(x, training=False)``) with its conversion."""

    def reference(arrays):
        outputs = model(arrays if len(arrays) > 1 else arrays[0], training=False)
        if isinstance(outputs, dict):
            return [outputs[o.name] for o in model_proto.graph.output]
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        return [np.asarray(o) for o in outputs]

    return compare(reference, model_proto, tolerance, seed, inputs)


def verify_saved_model(path: str, model_proto: onnx.ModelProto, signature_def: Optional[str] = None,
                       tag: Optional[str] = None, tolerance: float = 1e-4, seed: int = 0) -> VerificationResult:
    """Compare a SavedModel's serving signature with its conversion, matching outputs by name."""
    import tensorflow as tf

    loaded = tf.saved_model.load(path, tags=[tag] if tag else None)
    signatures = dict(loaded.signatures)
    if not signatures:
        raise ConversionError(f"the SavedModel {path} has no signatures to verify against")
    key = signature_def or ("serving_default" if "serving_default" in signatures else sorted(signatures)[0])
    function = signatures[key]
    arg_names = list(function.structured_input_signature[1].keys())
    onnx_names = [name for name, _, _ in onnx_input_specs(model_proto)]
    output_names = [o.name for o in model_proto.graph.output]

    def reference(arrays):
        by_name = dict(zip(onnx_names, arrays))
        feeds = {arg: tf.constant(by_name.get(arg, by_name.get(arg + ":0", arrays[i])))
                 for i, arg in enumerate(arg_names)}
        results = function(**feeds)
        return [results[name.split(":")[0]].numpy() for name in output_names]

    return compare(reference, model_proto, tolerance, seed)
