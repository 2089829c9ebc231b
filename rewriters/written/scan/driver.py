"""The Scan pass: each recurrent Loop of the written model that no cell module claimed, read as a
per-step map (:mod:`.loop_reading`) and replaced by the Scan of its step (:mod:`.rewrite`); then what the
Loop needed and the Scan does not is tidied away, the states are streamed where asked (:mod:`.streaming`),
and each loop's report row says what became of it. A loop whose rewrite fails is restored as it was.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional

import onnx

from ...description import NoMatch
from ...outcome import LOOP, SCAN, Findings, while_loop_name
from ..graph import attribute, opset_of, set_nodes, subgraphs
from ..scope import Scope, TypeTable
from .inferred_types import InferredTypes
from .layouts import composed
from .lengths import Lengths
from .live_graph import LiveScope
from .loop_reading import paddings, read_loop, read_scan
from .rewrite import Written, write_scan
from .streaming import stream_states

logger = logging.getLogger("tf2onnx_rnn")

def scan_loops(model: onnx.ModelProto, findings: Findings, streaming: bool = False) -> list:
    """Rewrite every recurrent Loop of ``model`` that stays a Loop in ``findings`` as a Scan where it is
    a per-step map, updating its row; the :class:`Written` rewrites. With ``streaming``, each Scan's
    carried states become model inputs and outputs (:mod:`.streaming`), where they can."""
    rows = {row.loop: index for index, row in enumerate(findings.outcomes) if row.became == LOOP}
    if not rows:
        return []
    opset = opset_of(model)
    written = []
    candidates = [(n.name, n.op_type) for n in model.graph.node if n.op_type in ("Loop", "Scan")]
    scope = inferred = None  # the graph's index, kept up to date by the edits made through it; its types
    for name, op in candidates:
        node = next(n for n in model.graph.node if n.name == name and n.op_type == op)
        loop = while_loop_name(node)
        if loop not in rows:  # a Scan already written, or a loop no row is about
            continue
        index = rows[loop]
        row = findings.outcomes[index]
        # a rewrite that fails part way leaves the graph as it was: it changes the graph's nodes (never one
        # in place) and adds initializers (never changes one), so the nodes and the initializers' count
        # restore it
        before = list(model.graph.node)
        initializers = len(model.graph.initializer)
        try:
            if inferred is None:
                scope = LiveScope(model.graph)
                inferred = InferredTypes(model, scope)
            types = inferred.table(node)  # this loop's body, not its siblings' (the scope read again first)
            loop_map = (read_loop if op == "Loop" else read_scan)(node, scope, types)
            fed = [found for found in map(scope.producer, node.input) if found is not None]  # its trip count, test
            done = write_scan(node, loop_map, scope, types, opset, every_final=streaming)
            scanned = dataclasses.replace(row, became=SCAN, node=done.loop, own_step=True,
                                          direction=_direction(loop_map, scope), reason=_reason(row),
                                          form=f"a Scan of the loop's own step ({_hoisted_text(done, loop_map)})")
            if streaming:
                scanned = _streamed(done, scanned, scope, types)
        except NoMatch as no_match:
            _restore(model.graph, before, initializers)
            if scope is not None:
                scope.stale = True
            findings.outcomes[index] = dataclasses.replace(
                row, reason=f"{row.reason}; not a Scan either: {no_match.reason}",
                where=row.where or no_match.node)
            continue
        except Exception as error:  # noqa: BLE001 - the loop stays as it was, the row says why
            _restore(model.graph, before, initializers)
            if scope is not None:
                scope.stale = True
            logger.debug("writing the Scan form of %s raised", row.layer, exc_info=True)
            logger.warning("%s: internal error while writing the Scan form: %s: %s", row.layer,
                           type(error).__name__, error)
            findings.outcomes[index] = dataclasses.replace(
                row, reason=f"{row.reason}; internal error while writing the Scan form: {type(error).__name__}")
            continue
        written.append(done)
        findings.outcomes[index] = scanned
        logger.info("%s: %s -> ONNX Scan (%s)", row.layer, row.kind, scanned.form)
        _tidy(scope, types, loop_map, fed, set(done.around))
    return written


def _restore(graph: onnx.GraphProto, before: list, initializers: int) -> None:
    kept = [onnx.NodeProto.FromString(node.SerializeToString()) for node in before]
    set_nodes(graph, kept)
    del graph.initializer[initializers:]


def unnamed_step_dims(model: onnx.ModelProto) -> int:
    """Clear the symbolic dimension names a Scan's step declares (tf2onnx's own Scans of TF 1.x loops
    carry its ``unk__`` names): tract unifies a name in a step with the one outside and refuses the
    Scan when they meet fixed sizes. The Scans this package writes declare none. Returns how many
    names were cleared."""
    cleared = 0
    for node in model.graph.node:
        if node.op_type != "Scan":
            continue
        for held in node.attribute:
            if held.type != onnx.AttributeProto.GRAPH:
                continue
            body = held.g
            for value in list(body.input) + list(body.output) + list(body.value_info):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.HasField("dim_param"):
                        dim.ClearField("dim_param")
                        cleared += 1
    return cleared


def scan_outputs_apart(model: onnx.ModelProto) -> int:
    """Give each scanned output of a Scan's step that the step also reads (a state made from it) an
    ``Identity`` of its own: tract 0.23 refuses such a Scan ('outputs[0].rank ==
    inputs[0].rank + 1', measured on a hand-built step; a CfC's step writes its output into its state).
    Returns how many."""
    apart = 0
    for node in model.graph.node:
        if node.op_type != "Scan":
            continue
        scanned = len(node.input) - next(a.i for a in node.attribute if a.name == "num_scan_inputs")
        body = next(a.g for a in node.attribute if a.name == "body")
        read = {name for inner in body.node for name in inner.input} | {v.name for v in body.input}
        for value in body.output[scanned:]:
            if value.name in read:
                own = f"{value.name}_scanned"
                body.node.append(onnx.helper.make_node("Identity", [value.name], [own], name=own))
                value.name = own
                apart += 1
    return apart


def _tidy(scope: LiveScope, types: TypeTable, loop_map, fed: list, around: set) -> None:
    """What the Loop needed and the Scan does not: its outputs' padding, its trip count and condition
    (``fed``: the nodes that made the Loop's inputs, and what made theirs, removed where nothing reads them
    now), its counter's constants; and a transpose written next to the Scan (``around``) and one beside it made
    one. The Scan is written and exact either way: a fault here only leaves them."""
    try:
        scope.refresh()  # the Scan in place of the Loop
        padding = _bypass_padding(scope, types, loop_map)
        _remove_unused(scope, padding + fed)
        readers = _remove_unused(scope, *_composed_transposes(scope, around))
        _drop_unused_initializers(scope, readers)
    except Exception as error:  # noqa: BLE001 - see above
        scope.stale = True  # an edit may have been made and not entered
        logger.debug("tidying after the Scan form raised", exc_info=True)
        logger.warning("internal error while tidying after the Scan form: %s: %s", type(error).__name__, error)


def _composed_transposes(scope: LiveScope, around: set) -> tuple:
    """Each Transpose named in ``around`` and a Transpose it reads, or that alone reads it, made one (the one
    read takes the composed perm; the other is left unread). Returns the nodes left unread, and their names."""
    scope.refresh()
    unread = {}
    for node in sorted((scope.named[name] for name in around if name in scope.named), key=scope.key):
        if node.op_type != "Transpose" or node.name in unread:
            continue
        before = scope.producer(node.input[0])
        readers = scope.readers.get(node.output[0], [])
        if before is not None and before.op_type == "Transpose" and before.name not in unread and \
                len(scope.readers.get(before.output[0], [])) == 1 and before.output[0] not in scope.graph_outputs:
            first, second = node, before
        elif len(readers) == 1 and readers[0].op_type == "Transpose" and readers[0].name not in unread and \
                node.output[0] not in scope.graph_outputs:
            first, second = readers[0], node
        else:
            continue
        inner, outer = list(attribute(second, "perm") or ()), list(attribute(first, "perm") or ())
        if not inner or len(inner) != len(outer):
            continue
        perm = composed(inner, outer)
        del first.input[:]
        first.input.append(second.input[0])
        for attr in first.attribute:
            if attr.name == "perm":
                attr.ints[:] = perm
        scope.reread(first)
        unread[second.name] = second
    return list(unread.values()), set(unread)


def _drop_unused_initializers(scope: LiveScope, read_by: Callable[[str], int]) -> None:
    """Initializers only the Loop read (its counter's start, its step): nothing reads them now
    (``read_by``: how many nodes read a tensor)."""
    graph = scope.graph
    used = {o.name for o in graph.output} | {i.name for i in graph.input}
    unread = {name for name in scope.initializers if read_by(name) <= 0 and name not in used}
    if unread:
        scope.drop_initializers(unread)


def _streamed(done: Written, row, scope: Scope, types: TypeTable):
    """``row`` with its Scan's states streamed in and out, or saying why they cannot be (the conversion
    then refuses to stream, naming the layer)."""
    try:
        state_inputs, state_outputs = stream_states(done, row, scope, types)
    except NoMatch as no_match:
        return dataclasses.replace(row, reason=f"{row.reason}; {no_match.reason}")
    return dataclasses.replace(row, state_inputs=state_inputs, state_outputs=state_outputs)


def _reason(row) -> str:
    """Why no native node computes the layer: the matchers' reason, or for a convolutional one, that."""
    if row.kind.startswith("ConvLSTM"):
        return "a convolution in each step: no ONNX recurrent node computes one"
    return row.reason


_KEEPS_ORDER = frozenset({"Transpose", "Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze"})


def _direction(loop_map, scope: Scope) -> str:
    """``backward`` where a sequence the loop steps through is its input reversed in time (Keras's
    ``go_backwards``, a Bidirectional's backward layer: a ``ReverseSequence``, or a ``Slice`` with a
    negative step, through ops that keep the order of the steps), else ``forward``."""
    for read in loop_map.reads:
        name = read.sequence
        for _ in range(16):
            node = scope.producer(scope.resolve(name))
            if node is None:
                break
            if node.op_type == "ReverseSequence":
                return "backward"
            if node.op_type == "Slice" and len(node.input) > 4 and node.input[4]:
                steps = scope.constant(node.input[4])
                if steps is not None and (steps < 0).any():
                    return "backward"
            if node.op_type not in _KEEPS_ORDER:
                break
            name = node.input[0]
    return "forward"


def _hoisted_text(done: Written, loop_map) -> str:
    states = f"{done.states} state(s), {done.sequences} scanned input(s)"
    if loop_map.longest_of:
        states += (f", every step of the sequence (the loop ended at the longest row of {loop_map.longest_of}; "
                   "past each row's length its steps keep the states and stack zeros)")
    text = states + (f", {done.hoisted} node(s) of input-only work run once over the sequence" if done.hoisted else "")
    if done.lifted:
        text += f" (its {', '.join(f'{count} {op}' for op, count in sorted(done.lifted.items()))} among them)"
    if done.merged:
        text += f", {done.merged} product(s) merged into a sibling's node (their weights concatenated)"
    if done.laid_out:
        text += f", {done.laid_out} state(s) carried in the layout their step reads (no Transpose per step)"
    if done.normalisations:
        text += f", {done.normalisations} layer normalisation(s) as one node each"
    if done.unfused_normalisations:
        text += (f", {done.unfused_normalisations} layer normalisation(s) left as a dozen nodes each: opset 17 "
                 "and later make each one LayerNormalization node (--opset 17)")
    return text


def _bypass_padding(scope: LiveScope, types: TypeTable, loop_map) -> list:
    """The zeros a Loop's stacked outputs were padded with up to the list's reserved length: none for a
    Scan whose steps are that length (the padding Concat is bypassed). Returns the padding Concats, to be
    removed, and what computed their zeros, where nothing reads them now."""
    lengths = Lengths(scope, types)
    found = []
    for _, final in loop_map.step_outputs:
        for reader in paddings(scope, final, loop_map.steps, lengths):
            if reader.output[0] in scope.graph_outputs:
                continue
            _rename_reads(scope, reader.output[0], final)
            found.append(reader)
    return found


def _rename_reads(scope: LiveScope, old: str, new: str) -> None:
    """The nodes reading ``old`` (their subgraphs' nodes included) read ``new`` instead. (A subgraph making a
    tensor of its own under ``old`` is not one of its readers: the names the padding's Concats make are unique.)"""
    for node in list(scope.readers.get(old, [])):
        _renamed(node, old, new)
        scope.reread(node)


def _renamed(node: onnx.NodeProto, old: str, new: str) -> None:
    if old in node.input:
        node.input[:] = [new if name == old else name for name in node.input]
    for sub in subgraphs(node):
        for inner in sub.node:
            _renamed(inner, old, new)


def _remove_unused(scope: LiveScope, seeds: list, within: Optional[set] = None) -> Callable[[str], int]:
    """Remove the ``seeds`` nothing reads any more, and what made what they read where nothing reads it then
    (only nodes named in ``within``, when given), until none is left to remove: each removal lowers the counts
    of readers of what the removed node read (a chain of dead nodes goes in one pass, not one per link). Returns
    how many nodes read a tensor after. (The nodes that can die are those that lost a reader: the seeds, which
    lost theirs to the rewrite, and, in turn, what they read.)"""
    scope.refresh()
    lost: dict = {}  # tensor -> its readers removed here

    def read_by(name: str) -> int:
        return len(scope.readers.get(name, ())) - lost.get(name, 0)

    gone: dict = {}
    pending = list(seeds)
    while pending:
        node = pending.pop()
        if id(node) in gone or not scope.holds(node) or \
                any(read_by(o) or o in scope.graph_outputs for o in node.output):
            continue
        gone[id(node)] = node
        for read in scope.reads_of(node):
            lost[read] = lost.get(read, 0) + 1
            producer = scope.producers.get(read)
            if producer is not None and id(producer) not in gone and (within is None or producer.name in within):
                pending.append(producer)
    scope.remove(list(gone.values()))
    return read_by
