"""The Scan pass: each recurrent Loop of the written model that no cell module claimed, read as a
per-step map (:mod:`.loop_reading`) and replaced by the Scan of its step (:mod:`.rewrite`); then what the
Loop needed and the Scan does not is tidied away, the states are streamed where asked (:mod:`.streaming`),
and each loop's report row says what became of it. A loop whose rewrite fails is restored as it was.
"""
from __future__ import annotations

import dataclasses
import logging

import onnx

from ..description import NoMatch
from ..outcome import LOOP, SCAN, Findings, while_loop_name
from .graph_index import Scope, TypeTable, attribute, reads, subgraphs, upstream
from .layouts import composed
from .lengths import Lengths
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
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    written = []
    candidates = [(n.name, n.op_type) for n in model.graph.node if n.op_type in ("Loop", "Scan")]
    held_reads: dict = {}  # what the graph's index read of nodes holding subgraphs, for the next loop's
    # index: a loop's rewrite changes its own neighbourhood, the other nodes stay the same objects
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
            types = TypeTable(model, within=name)  # this loop's body, not its siblings'
            scope = Scope(model.graph, held_reads=held_reads)
            loop_map = (read_loop if op == "Loop" else read_scan)(node, scope, types)
            computed = {n.name for n in upstream(node.input, scope.producer)[1].values()}  # its trip count, test
            done = write_scan(node, loop_map, scope, types, opset, every_final=streaming)
            scanned = dataclasses.replace(row, became=SCAN, node=done.loop, own_step=True,
                                          direction=_direction(loop_map, scope), reason=_reason(row),
                                          form=f"a Scan of the loop's own step ({_hoisted_text(done, loop_map)})")
            if streaming:
                scanned = _streamed(done, scanned, scope, types)
        except NoMatch as no_match:
            _restore(model.graph, before, initializers)
            findings.outcomes[index] = dataclasses.replace(
                row, reason=f"{row.reason}; not a Scan either: {no_match.reason}",
                where=row.where or no_match.node)
            continue
        except Exception as error:  # noqa: BLE001 - the loop stays as it was, the row says why
            _restore(model.graph, before, initializers)
            logger.debug("writing the Scan form of %s raised", row.layer, exc_info=True)
            logger.warning("%s: internal error while writing the Scan form: %s: %s", row.layer,
                           type(error).__name__, error)
            findings.outcomes[index] = dataclasses.replace(
                row, reason=f"{row.reason}; internal error while writing the Scan form: {type(error).__name__}")
            continue
        written.append(done)
        findings.outcomes[index] = scanned
        logger.info("%s: %s -> ONNX Scan (%s)", row.layer, row.kind, scanned.form)
        _tidy(model.graph, scope, types, loop_map, computed, set(done.around))
    return written


def _restore(graph: onnx.GraphProto, before: list, initializers: int) -> None:
    kept = [onnx.NodeProto.FromString(node.SerializeToString()) for node in before]
    del graph.node[:]
    graph.node.extend(kept)
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


def _tidy(graph: onnx.GraphProto, scope: Scope, types: TypeTable, loop_map, computed: set, around: set) -> None:
    """What the Loop needed and the Scan does not: its outputs' padding, its trip count and condition
    (``computed``: the nodes that computed the Loop's inputs, removed where nothing reads them now), its
    counter's constants; and a transpose written next to the Scan (``around``) and one beside it made one.
    The Scan is written and exact either way: a fault here only leaves them."""
    try:
        scope.refresh()  # the Scan in place of the Loop
        padding = _bypass_padding(scope, types, loop_map)
        _remove_unused(scope, padding | computed)
        readers = _remove_unused(scope, _composed_transposes(scope, around))
        _drop_unused_initializers(graph, readers)
    except Exception as error:  # noqa: BLE001 - see above
        logger.debug("tidying after the Scan form raised", exc_info=True)
        logger.warning("internal error while tidying after the Scan form: %s: %s", type(error).__name__, error)


def _composed_transposes(scope: Scope, around: set) -> set:
    """Each Transpose named in ``around`` and a Transpose it reads, or that alone reads it, made one (the one
    read takes the composed perm; the other is left unread). Returns the names of the nodes left unread."""
    scope.refresh()
    unread = set()
    for node in list(scope.graph.node):
        if node.name not in around or node.op_type != "Transpose" or node.name in unread:
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
        unread.add(second.name)
    return unread


def _drop_unused_initializers(graph: onnx.GraphProto, readers: dict) -> None:
    """Initializers only the Loop read (its counter's start, its step): nothing reads them now
    (``readers``: how many nodes read each tensor)."""
    used = {o.name for o in graph.output} | {i.name for i in graph.input}
    kept = [t for t in graph.initializer if readers.get(t.name, 0) > 0 or t.name in used]
    if len(kept) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


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


def _bypass_padding(scope: Scope, types: TypeTable, loop_map) -> set:
    """The zeros a Loop's stacked outputs were padded with up to the list's reserved length: none for a
    Scan whose steps are that length (the padding Concat is bypassed). Returns the nodes of the padding,
    to be removed where nothing reads them now."""
    lengths = Lengths(scope, types)
    candidates = set()
    for _, final in loop_map.step_outputs:
        for reader in paddings(scope, final, loop_map.steps, lengths):
            if reader.output[0] in scope.graph_outputs:
                continue
            _rename_reads(scope.graph, reader.output[0], final)
            scope.forget_reads()  # a subgraph may have read it
            candidates.add(reader.name)
            candidates |= _ancestor_nodes(scope, reader)
    return candidates


def _ancestor_nodes(scope: Scope, node: onnx.NodeProto) -> set:
    return {found.name for found in upstream(node.input, scope.producer)[1].values()}


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        if old in node.input:
            node.input[:] = [new if name == old else name for name in node.input]
        for sub in subgraphs(node):
            _rename_reads(sub, old, new)


def _remove_unused(scope: Scope, candidates: set) -> dict:
    """Remove the ``candidates`` nothing reads any more, until none is left to remove: the graph's readers
    counted once, then each removal lowers the counts of what the removed node read (a chain of dead nodes
    goes in one pass over the graph, not one per link). Returns how many nodes read each tensor after."""
    scope.refresh()
    readers = {name: len(nodes) for name, nodes in scope.readers.items()}
    by_name = {n.name: n for n in scope.graph.node if n.name in candidates}
    gone: set = set()
    pending = list(by_name)
    while pending:
        name = pending.pop()
        node = by_name[name]
        if name in gone or any(readers.get(o, 0) or o in scope.graph_outputs for o in node.output):
            continue
        gone.add(name)
        for read in reads(node):
            readers[read] = readers.get(read, 0) - 1
            producer = scope.producers.get(read)
            if producer is not None and producer.name in by_name and producer.name not in gone:
                pending.append(producer.name)
    for position in reversed(range(len(scope.graph.node))):  # in place: the others stay the same objects
        if scope.graph.node[position].name in gone:
            del scope.graph.node[position]
    return readers
