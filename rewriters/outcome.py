"""What became of each recurrent loop: the vocabulary the rewriter records and the report prints.

It lives with the rewriters, which import nothing of the package above them; the conversion
report (``tf2onnx_rnn.report``) is built from the :class:`Findings`, each :class:`Outcome` a
row. Data, and one reading of a written node's name (:func:`while_loop_name`, which the report's
reconciliation and the Scan form share): nothing else here runs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import onnx

WHILE_OPS = ("While", "StatelessWhile")  # the TensorFlow ops a recurrent layer's loop is
LOOP_SUFFIX = "_loop"  # tf2onnx names the ONNX Loop of a functional while-loop <while name>_loop

LOOP = "Loop"  # ``became`` of a loop left as tf2onnx's exact Loop
REMOVED = "removed"  # ``became`` of a loop whose outputs nothing used: tf2onnx dropped it
UNROLLED = "unrolled ops"  # ``became`` of an unrolled layer (unroll=True) left as its steps' own ops
STEPS = "steps"  # ``became`` of a layer written out as its steps for a fixed time length (a runtime's target)
SCAN = "Scan"  # ``became`` of a loop written as a Scan (of its own step: ``own_step``; or target onnxruntime's form)


@dataclass(frozen=True)
class Outcome:
    """What became of one recurrent while-loop (or one unrolled layer)."""

    loop: str  # the loop node's name in the TensorFlow graph
    layer: str  # the Keras layer, as far as the graph's scopes tell
    kind: str  # the cell family's Keras name, or what the name suggests when unmatched
    direction: str  # forward / backward; empty when not known
    became: str  # the ONNX op it became, or LOOP, REMOVED, UNROLLED
    node: str = ""  # the ONNX node's name when fused
    reason: str = ""  # why it was not fused
    where: str = ""  # the node at which the matcher stopped
    activations: str = ""
    node_direction: str = ""  # the ONNX node's direction attribute (bidirectional when paired)
    mask: str = ""  # for a masked layer: the mask's source and the graph form emitted
    state_inputs: tuple = ()  # streaming: the graph inputs the layer starts from (h, then c), "" = the model's own
    state_outputs: tuple = ()  # streaming: the graph outputs of the states it ends with
    stateful: bool = False  # a Keras stateful=True layer
    cell_nodes: tuple = ()  # a StackedRNNCells loop: the nodes of the cells below ``node`` (the top cell's)
    unrolled: int = 0  # an unrolled layer (no loop; ``loop`` names its Unpack): its number of steps
    form: str = ""  # how the recurrence is computed when not by ``became``'s native node alone (target onnxruntime)
    own_step: bool = False  # no native node: the loop written as a Scan of its own step (``became`` is SCAN)
    # a masked layer refused as a native node because a runtime target's runtime lacks the mask's ops around one
    # (``reason`` says so): its own step, the mask applied at each step. The conversion's flag, read while lowering
    # for that runtime: not stored in the model's report, nor compared
    masked_own_step: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class KerasMaskReading:
    """A cuDNN op whose lengths are a Keras mask's row counts, read as Keras's masked layer on a CPU: the
    mask (as the graph names it), its time axis, whether masked steps carry the last output (else
    zeros), and whether the op runs over its input reversed within the lengths (go_backwards)."""

    mask: str
    time_axis: int
    carry: bool
    backward: bool


@dataclass
class Findings:
    """Every recurrent loop's outcome the rewriter recorded, and why it could not look at all, if it
    could not."""

    outcomes: list = field(default_factory=list)  # Outcome rows, in the order recorded
    setup_error: str = ""  # why the rewriter could not run at all (an internal error), if it could not
    unrolled_error: str = ""  # why unrolled layers could not even be looked for (an internal error), if so
    no_fallback: set = field(default_factory=set)  # fused ops tf2onnx has no handler for: unread, the model fails
    keras_masks: dict = field(default_factory=dict)  # a cuDNN op -> its KerasMaskReading, where it has one


def while_loop_name(node: onnx.NodeProto) -> str:
    """The TensorFlow while-loop an ONNX Loop or Scan came from: tf2onnx appends ``_loop`` to a
    functional loop's name; a TF 1.x loop's is its body's scope (``rnn/while``)."""
    if node.name.endswith(LOOP_SUFFIX):
        return node.name[:-len(LOOP_SUFFIX)]
    scopes = Counter(inner.name.split("/while/")[0] + "/while" for attribute in node.attribute
                     if attribute.type == onnx.AttributeProto.GRAPH for inner in attribute.g.node
                     if "/while/" in inner.name)
    return scopes.most_common(1)[0][0] if scopes else node.name
