"""tf2onnx's steps that would take time out of proportion to the model, with what they compute unchanged.

**Inlining a while-loop's condition.** tf2onnx's ``While`` handler inlines the loop's condition into
the graph holding it (``onnx_opset/controlflow.py``, ``inline_subgraph``), first making a deep copy of
the condition's graph. That graph refers to the graph holding it (``parent_graph``), and ``copy.deepcopy`` follows the
reference: each loop copies the whole model, every node and weight, only to throw the copy away. A
model of N loops tf2onnx leaves as loops (those no native node computes, which become Scans) took time
in N squared: a stack of 32 such layers converted in 25 s against 3.7 s for 8 (measured).

:func:`shared_parents` makes that copy keep the holding graphs as they are, by reference (the copy's
nodes are moved into the holding graph right after, as tf2onnx does; its lookups of outer tensors read
the same graphs), and afterwards forgets what the copy registered in them (which graph reads which
outer tensor: the copy is gone once inlined). The loop's nodes and the model tf2onnx writes are the same.
Having moved the condition's nodes, tf2onnx then rebuilds the holding graph's indexes over all its nodes
(``reset_nodes`` of its nodes and the new ones), once per loop: with 32 such layers that took 0.7 s against
0.01 s for 8 (measured, the model's graph holding some 2000 nodes while its loops are converted). The
indexes are kept up to date node by node as the graph changes (tf2onnx's own ``make_node`` and ``remove_node``
do so), and the rebuild only drops what no node reads or makes any more; so :func:`shared_parents` has the
new nodes entered in the indexes instead, as ``append_node`` enters one: the same nodes in the same order,
and every lookup tf2onnx makes finds what it found (a reader it lists is one whose inputs name the tensor).

**Its optimizers' passes.** After each optimizer pass tf2onnx rebuilds the protobuf of every node, and
of every subgraph (``update_proto``: each loop body made into a ``GraphProto`` anew, 36 times for
its default passes) and counts every node for a log line. The optimizers read and change the graph's
own objects, never those protobufs, and the model is built from the objects at the end; so
:func:`lean_passes` leaves both out between passes and keeps the rest of each pass (its optimization,
then the unused nodes removed). The graph computes the same; equal duplicates may keep other names
(a body's nodes are no longer sorted between passes). With 32 loops left to tf2onnx the optimizers took
3.8 s against 0.7 s for 8 (measured).

**Its identity optimizer.** Removing an ``Identity`` not at a graph's output, tf2onnx renames its output
in the nodes it passes, and it passes every node of the graph: each is registered as a reader of the
Identity's input and checked, so a graph of N layers' Identities took time in N squared and its readers'
index grew to every node for each such input. :func:`lean_passes` passes the nodes that read the
Identity's output, from the graph's own index of readers (the one tf2onnx's renaming reads when given
none); the subgraphs reading it are renamed as tf2onnx does. At 32 loops left to tf2onnx it took 0.30 s
against 0.02 s for 8 (measured), and the passes after it read the bloated index.

**Its transpose optimizer's push through a node of several inputs** (``Concat``, ``Add``, ...). To move a
``Transpose`` past such a node, tf2onnx first gives every input that is no such transpose a pair of
transposes that cancel, and only then checks that the transposes already there are read by that node alone;
where one is read elsewhere too, it gives up and leaves the pair. A later pass cancels the pair, and the
optimizers' rounds end; but where a transpose of the pair only moves axes of size 1 (a batch of 1), its
``post_optimize_action`` makes it a ``Reshape``, which no pass cancels: each round leaves one more pair and the
rounds never end (a Keras model concatenating its input with two stacked LSTMs' sequences, at a fixed batch
of 1: more than 15 minutes, stopped; 2 s at a batch of 3). :func:`lean_passes` checks first, and gives up
before anything is added: where tf2onnx would push, it pushes as before.

**The rounds.** tf2onnx runs its optimizers round after round until one round changes nothing, without a
bound. :func:`lean_passes` stops a conversion whose optimizers still change the graph after :data:`ROUNDS`
rounds with a :class:`~.errors.ConversionError` naming the stage and the optimizers still at work
(the suite's models settle in at most a handful).
"""
from __future__ import annotations

import contextlib
import copy
import functools

from .errors import ConversionError

ROUNDS = 50  # tf2onnx's optimizers' rounds allowed before the conversion is stopped


class _Copier:
    """The ``copy`` module as tf2onnx's control-flow handlers see it while :func:`shared_parents` is on: a
    graph's deep copy keeps the graphs above it, and each copy made is remembered."""

    def __init__(self):
        self.made: list = []

    def deepcopy(self, value, memo=None):
        memo = {} if memo is None else memo
        parent = getattr(value, "parent_graph", None)
        while parent is not None:  # the holding graphs stay themselves in the copy
            memo[id(parent)] = parent
            parent = getattr(parent, "parent_graph", None)
        made = copy.deepcopy(value, memo)
        if hasattr(made, "parent_graph"):
            self.made.append(made)
        return made

    def __getattr__(self, name):  # the rest of the module, as it is
        return getattr(copy, name)

    def forget(self) -> None:
        """Remove each copy made from the registers of the graphs above it (which graph reads an outer
        tensor): tf2onnx registered it there while inlining, and the copy is gone."""
        for made in self.made:
            parent = made.parent_graph
            while parent is not None:
                for graphs in parent._input_to_graph.values():  # pylint: disable=protected-access
                    graphs.pop(id(made), None)
                parent = parent.parent_graph
        self.made.clear()


@contextlib.contextmanager
def shared_parents():
    """While a conversion runs: tf2onnx's inlining copies a loop's condition without the model around it."""
    from tf2onnx.onnx_opset import controlflow

    original_copy, original_inline = controlflow.copy, controlflow.inline_subgraph
    copier = _Copier()

    def inline(parent, graph, scope, binding):
        parent.reset_nodes = functools.partial(_appended, parent)  # the instance's, for this call only
        try:
            return original_inline(parent, graph, scope, binding)
        finally:
            del parent.reset_nodes
            copier.forget()

    controlflow.copy, controlflow.inline_subgraph = copier, inline
    try:
        yield
    finally:
        controlflow.copy, controlflow.inline_subgraph = original_copy, original_inline


def _appended(graph, ops: list) -> None:
    """tf2onnx's ``graph.reset_nodes(ops)`` where ``ops`` are the graph's nodes and then new ones (an inlined
    condition's): the new ones entered in the graph's indexes, the others' entries left as they are, and the
    checks the rebuild makes. Any other list is rebuilt as tf2onnx rebuilds it."""
    nodes = graph.get_nodes()
    if ops[:len(nodes)] != nodes:  # Node has no __eq__: the same objects, in the same order
        type(graph).reset_nodes(graph, ops)
        return
    for node in ops[len(nodes):]:
        graph._nodes_by_name[node.name] = node  # pylint: disable=protected-access
        for name in node.output:
            graph._output_to_node_name[name] = node.name  # pylint: disable=protected-access
        for name in node.input:
            graph._register_input_name(name, node)  # pylint: disable=protected-access
    graph._nodes = ops  # pylint: disable=protected-access
    graph.contained_graphs = {name: held for name, held in graph.contained_graphs.items()
                              if name in graph._nodes_by_name}  # pylint: disable=protected-access
    for node in graph.inputs:
        if node not in ops:
            raise ValueError("graph input '" + node.name + "' not exist")
    for name in graph.outputs:
        if name not in graph._output_to_node_name:  # pylint: disable=protected-access
            raise ValueError("graph output '" + name + "' not exist")


@contextlib.contextmanager
def lean_passes():
    """While tf2onnx's optimizers run: each pass without rebuilding every node's and subgraph's protobuf
    after it, or counting the nodes for its log; an Identity's output renamed in its readers only; a
    transpose pushed through a node of several inputs only where it can be; at most :data:`ROUNDS` rounds."""
    from tf2onnx.optimizer.identity_optimizer import IdentityOptimizer
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer

    original = GraphOptimizerBase.optimize
    original_identity = IdentityOptimizer.__dict__["_handle_non_graph_output_identity"]
    original_branches = TransposeOptimizer._handle_node_having_branches  # pylint: disable=protected-access
    changing: dict = {}  # round -> the optimizers that changed the graph in it

    def optimize(self, graph, iteration):
        if iteration >= ROUNDS:
            still = ", ".join(changing.get(iteration - 1, ())) or "one of them"
            raise ConversionError(f"tf2onnx's optimizers did not settle: after {ROUNDS} rounds {still} still "
                                  "changed the graph")
        self.opt_iteration = iteration
        graph = self._optimize(graph)  # pylint: disable=protected-access
        graph.delete_unused_nodes(graph.outputs)
        if self.graph_been_opt:
            changing.setdefault(iteration, []).append(type(self).__name__)
        return graph

    def handle_node_having_branches(self, trans, node):
        return _pushable(self, trans, node) and original_branches(self, trans, node)

    GraphOptimizerBase.optimize = optimize
    IdentityOptimizer._handle_non_graph_output_identity = staticmethod(_removed_identity)  # pylint: disable=protected-access
    TransposeOptimizer._handle_node_having_branches = handle_node_having_branches  # pylint: disable=protected-access
    try:
        yield
    finally:
        GraphOptimizerBase.optimize = original
        IdentityOptimizer._handle_non_graph_output_identity = original_identity  # pylint: disable=protected-access
        TransposeOptimizer._handle_node_having_branches = original_branches  # pylint: disable=protected-access


def _pushable(optimizer, trans, node) -> bool:
    """Whether tf2onnx's transpose optimizer can push ``trans`` through ``node``, a node of several inputs,
    as far as its transposes already there are concerned: each is read by ``node`` alone. (tf2onnx checks
    this only after giving the other inputs pairs of transposes, which it leaves where the check fails.)"""
    from tf2onnx.optimizer.transpose_optimizer import is_tranpose_of_type

    perm = trans.get_attr_value("perm")
    present = [n for n in node.inputs if is_tranpose_of_type(n, perm)]
    return optimizer._nodes_has_single_consumer_node(present)  # pylint: disable=protected-access


def _removed_identity(graph, identity) -> bool:
    """tf2onnx's removal of an Identity whose output is not the graph's, its output renamed in the nodes
    reading it (the graph's index of readers may name nodes since removed or renamed: only those still
    reading it count)."""
    old, new = identity.output[0], identity.input[0]
    named = graph._output_to_consumers.get(old, ())  # pylint: disable=protected-access
    readers = [node for node in map(graph.get_node_by_name, list(named)) if node is not None and old in node.input]
    graph.replace_all_inputs(old, new, ops=readers)
    graph.remove_node(identity.name)
    return True
