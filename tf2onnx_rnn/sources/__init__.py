"""Model sources: each turns what the user gives into a frozen TensorFlow graph tf2onnx converts.

One module per source (a live Keras model, a Keras file, a SavedModel directory, a TFLite file,
frozen graphs). Every source
is a :class:`Source`: checked before TensorFlow's slow import (:meth:`Source.check`), frozen with
tf2onnx's own loaders (:meth:`Source.freeze`) into a :class:`Frozen` graph, and run against the
converted model when verification is asked (:meth:`Source.verify`). :func:`choose` picks the one
source a set of arguments names (the command line's road). Loading policy (what may run while a
file is read, which Keras backend) lives with the sources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import ConversionError, param
from ..rewriters.description import Approximations

TRUST = param("safe_mode=False")  # the opt-in to run what a model carries, as each front door spells it


@dataclass
class Frozen:
    """A frozen TensorFlow graph and what tf2onnx needs to convert it."""

    graph_def: object
    name: str
    input_names: list
    output_names: list
    tensors_to_rename: dict
    initialized_tables: Optional[dict] = None
    layer_names: Callable[[str], Optional[str]] = lambda loop: None  # loop op name -> Keras layer
    shape_override: Optional[dict] = None
    stateful_layers: tuple = ()  # report names of Keras stateful=True recurrent layers
    # report name of a Keras LSTM, GRU or SimpleRNN -> the activations of it no ONNX recurrent node computes
    inexpressible: Optional[dict] = None
    layer_kinds: Optional[dict] = None  # report name of a Keras recurrent layer -> its class's name
    # -> {keras_layers.weight_key of a Keras matrix weight: its layer's name}, called only where a quantization names
    # its layers
    weight_owners: Callable[[], dict] = dict
    traced: Optional[object] = None  # a Keras model's traced call (graph def, functions included): what it runs
    tflite_path: Optional[str] = None  # a TFLite file (then ``graph_def`` is None): tf2onnx reads it itself
    loops: Optional[list] = None  # the recurrent loops, when the source finds them (else read from graph_def)
    fused_ops: Optional[dict] = None  # TFLite fused recurrent ops: node name -> its FusedLayout
    allowed: Approximations = Approximations()  # what the user lets the model compute otherwise than the source
    lowered: tuple = ()  # loops lowered to TF 1.x control flow over TensorLists when the graph was frozen


class Source:
    """A model to convert. ``options`` names the source options (``signature_def``...) it takes."""

    kind = ""  # the API parameter that gives this source (keras_model, saved_model...)
    options: tuple = ()

    def check(self) -> None:
        """Checks that need no TensorFlow (the file is there and of the right format)."""

    def prepared(self, options):
        """The conversion options as this source needs them (a stateful Keras model streams)."""
        return options

    def freeze(self, options) -> Frozen:
        raise NotImplementedError

    def verify(self, model_proto, tolerance: float, values: bool = True):
        """The converted model against this source on seeded random inputs (a VerificationResult);
        ``values=False`` compares the outputs' shapes and dtypes only. Raises :class:`ConversionError`
        where the source may not be run (``safe_mode``)."""
        raise NotImplementedError


def choose(**given) -> Source:
    """The one source the arguments name (``keras_model``, ``keras_file``, ``saved_model``, ``tflite``,
    ``graphdef``, ``checkpoint``), built with
    the source options given beside it (None: not given). A source option the chosen source does not
    take, or options that exclude each other, are a :class:`ConversionError`."""
    from .graph_def import Checkpoint, GraphDefFile
    from .keras_file import KerasFile
    from .keras_model import KerasModel
    from .saved_model import SavedModel
    from .tflite import TFLite

    kinds = {"keras_model": KerasModel, "keras_file": KerasFile, "saved_model": SavedModel, "tflite": TFLite,
             "graphdef": GraphDefFile, "checkpoint": Checkpoint}
    named = [kind for kind in kinds if given.get(kind) is not None]
    if len(named) != 1:
        raise ConversionError(f"give one source: {', '.join(param(kind) for kind in kinds)}")
    (kind,) = named
    cls = kinds[kind]
    options = {key: value for key, value in given.items() if key not in kinds and value is not None}
    for key in options:
        if key not in cls.options:
            takers = [param(other) for other, source in kinds.items() if key in source.options]
            raise ConversionError(f"{param(key)} applies to {' and '.join(takers) or 'no source'} only")
    return cls(given[kind], **options)


def check_input_shape(name: str, got: list, want: Optional[list], given_by: str) -> None:
    """Raise :class:`ConversionError` unless shape ``got`` fits the model's ``want`` (None = dynamic
    dimension; ``want`` None = unknown rank): same rank, and equal wherever both are fixed."""
    if want is None:
        return
    if len(got) != len(want):
        raise ConversionError(f"input {name}: {given_by} has rank {len(got)} {got}, "
                              f"the model takes rank {len(want)} {want}")
    for axis, (g, w) in enumerate(zip(got, want)):
        if g is not None and w is not None and g != w:
            raise ConversionError(f"input {name}: dimension {axis} is {g} in {given_by}, "
                                  f"the model's is {w} (shape {want})")


def resolve_names(names, tensors: list, option: str, kind: str, *renamings: dict) -> list:
    """The graph tensor each name stands for: a tensor's graph name (with or without ``:0``) or a
    name a renaming gives it (the last renaming gives its name in the ONNX model). An unknown name
    is a :class:`ConversionError` naming the model's ``kind`` (inputs or outputs) and the parameter
    ``option`` that gave it."""
    by_alias = {}
    for tensor in tensors:
        aliases = [tensor, tensor.split(":")[0]] + [renaming[tensor] for renaming in renamings if tensor in renaming]
        for alias in aliases:
            by_alias.setdefault(alias, tensor)
    unknown = [name for name in names if name not in by_alias]
    if unknown:
        known = [renamings[-1].get(t, t) if renamings else t for t in tensors]
        raise ConversionError(f"unknown name {unknown[0]!r} in {param(option)}; the model's {kind} are: "
                              f"{', '.join(known)}")
    return [by_alias[name] for name in names]


def placeholder_shapes(graph_def) -> dict:
    """Graph tensor ("name:0") -> shape (None = dynamic dimension) of each placeholder of known rank."""
    shapes = {}
    for node in graph_def.node:
        if node.op != "Placeholder" or "shape" not in node.attr or node.attr["shape"].shape.unknown_rank:
            continue
        shapes[node.name + ":0"] = [None if d.size < 0 else int(d.size) for d in node.attr["shape"].shape.dim]
    return shapes
