"""Writing a converted model: atomically, and with its weights beside it when it is large.

The files are written in a temporary directory beside the target and renamed over it, so an
existing file survives any failure. A large model (converted with ``large_model``) keeps every
tensor of :data:`EXTERNAL_DATA_THRESHOLD` bytes or more in ``<output>.data``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Sequence

import onnx

from .errors import ConversionError, first_line, param
from .probes import fits_in_protobuf

LARGE_MODEL_KEY = "tf2onnx_rnn.large_model"


def check_output_path(path: str) -> None:
    """Raise :class:`ConversionError` unless ``path`` can be written (before converting anything)."""
    if os.path.isdir(path):
        raise ConversionError(f"{param('output_path')} is a directory, not a file: {path}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConversionError(f"output directory does not exist: {directory}")
    try:  # a real probe: os.access says yes to root even where writing fails
        with tempfile.TemporaryFile(prefix=".tf2onnx_rnn-probe-", dir=directory):
            pass
    except OSError as error:
        raise ConversionError(f"output directory is not writable: {directory} ({error.strerror})") from None


EXTERNAL_DATA_THRESHOLD = 1024  # bytes: a large model's tensors of this size and more go to <output>.data


def save_model(model_proto: onnx.ModelProto, output_path: str, check_loads: bool = False) -> list:
    """Write atomically: the files are written in a temporary directory beside the target, then
    renamed over it. A large model (converted with ``large_model=True``) keeps every tensor of
    1 KB or more in ``<output>.data`` beside the model, which names it relatively; ``model_proto``
    is left as it is. With ``check_loads`` onnxruntime must load the written files before they
    replace anything. Returns the paths written."""
    check_output_path(output_path)
    directory = os.path.dirname(os.path.abspath(output_path))
    large = any(p.key == LARGE_MODEL_KEY for p in model_proto.metadata_props)
    if not large and not fits_in_protobuf(model_proto):
        raise ConversionError("the model is over 2 GB, protobuf's limit for one file: convert it with "
                              f"{param('large_model')}")
    staging = tempfile.mkdtemp(prefix=".tf2onnx_rnn-", dir=directory)
    name = os.path.basename(output_path)
    staged, staged_data = os.path.join(staging, name), os.path.join(staging, name + ".data")
    try:
        if large:
            _write_with_external_data(model_proto, staged, staged_data, name + ".data")
        else:
            with open(staged, "wb") as stream:
                stream.write(model_proto.SerializeToString())
        if check_loads:
            _check_file_loads(staged)
        written = []
        if os.path.exists(staged_data):
            os.replace(staged_data, output_path + ".data")
            written.append(output_path + ".data")
        os.replace(staged, output_path)
        return [output_path] + written
    except OSError as error:
        raise ConversionError(f"cannot write {output_path}: {error.strerror or error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_file_loads(path: str) -> None:
    import onnxruntime as ort

    from .isolation import check_survives

    check_survives(None, [], model_path=path)  # a crash there ends a child, not this process
    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own kinds
        raise ConversionError(f"onnxruntime cannot load the converted model: {first_line(error)}") from error


def _write_with_external_data(model_proto: onnx.ModelProto, model_file: str, data_file: str, location: str) -> None:
    """Write ``model_proto`` to ``model_file`` with each tensor of :data:`EXTERNAL_DATA_THRESHOLD`
    bytes or more (subgraphs and Constant attributes included) stored in ``data_file``, named
    ``location`` in the model. No data file when no tensor is that large.

    The model written is a copy in which those tensors hold no data, built field by field, so
    the weights are never held twice in memory and the caller's model is not changed.
    """
    data = None

    def external(tensor, into) -> bool:
        nonlocal data
        if (tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data")
                or len(tensor.raw_data) < EXTERNAL_DATA_THRESHOLD):
            return False
        if data is None:
            data = open(data_file, "wb")  # noqa: SIM115 - closed below
        raw = tensor.raw_data
        offset = data.tell()
        data.write(raw)
        _copy_fields(tensor, into, external=None, skip=("raw_data",))
        into.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            into.external_data.add(key=key, value=value)
        return True

    skeleton = onnx.ModelProto()
    try:
        _copy_fields(model_proto, skeleton, external)
    finally:
        if data is not None:
            data.close()
    with open(model_file, "wb") as stream:
        stream.write(skeleton.SerializeToString())


def _copy_fields(source, target, external, skip: Sequence[str] = ()) -> None:
    """Copy the protobuf message ``source`` into ``target`` field by field; each TensorProto is
    first offered to ``external(tensor, into)``, which fills ``into`` itself when it returns True."""
    for descriptor, value in source.ListFields():
        if descriptor.name in skip:
            continue
        repeated = (descriptor.is_repeated if hasattr(descriptor, "is_repeated")
                    else descriptor.label == descriptor.LABEL_REPEATED)
        if descriptor.message_type is None:
            if repeated:
                getattr(target, descriptor.name).extend(value)
            else:
                setattr(target, descriptor.name, value)
            continue
        for item in (value if repeated else [value]):
            into = getattr(target, descriptor.name).add() if repeated else getattr(target, descriptor.name)
            into.SetInParent()
            if external is not None and isinstance(item, onnx.TensorProto) and external(item, into):
                continue
            _copy_fields(item, into, external)
