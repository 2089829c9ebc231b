"""The model's graph as the Scan pass changes it, loop after loop, its index kept up to date by the pass's own
edits.

The pass reads the graph through a :class:`.graph_index.Scope` (each tensor's producer and readers, the
initializers), read again after each change. Reading every node again for each loop, a few times over (and
walking back from each loop through every layer below it), made the pass's time grow with the square of the
model's loops: a stack of 32 Scan-form layers spent 0.8 s CPU there against 0.04 s for 8 (measured).
:class:`LiveScope` reads every node once; then each edit the pass makes through it (a node replaced by
several, nodes removed or appended, a node changed in place and re-read, initializers added or removed) is
recorded, and entered in the index at the next :meth:`~LiveScope.refresh`. Between two refreshes the pass
reads the index as it stood at the first, as it read a rebuilt one, and a refresh gives the index a rebuild
gives: each tensor's readers in the graph's order (each node keeps a key of its place; a node written in
another's place takes keys after that one's), its producer, what each node reads. Where an edit cannot be
entered so (a tensor two nodes make), and after :attr:`~LiveScope.stale` is set (a loop's rewrite undone,
its nodes copied back; an edit that failed part way), the refresh reads every node again.

What changed since :meth:`~LiveScope.changes` last asked (the nodes added or changed, the tensors no node makes
any more, the initializers added or removed) is what :mod:`.inferred_types` infers again.
"""
from __future__ import annotations

from typing import Iterable

import onnx

from ..scope import Scope


class LiveScope(Scope):
    """The main graph's :class:`~.graph_index.Scope`, kept up to date edit by edit."""

    def __init__(self, graph: onnx.GraphProto):
        self.stale = True  # the next refresh reads every node
        self.duplicated = False  # a tensor is made by two nodes: each refresh reads every node
        self._edits: list = []  # (what, the node, tensor or name it concerns) since the last refresh
        self._keys: dict = {}  # id(node) -> the node's place: tuples ordered as the graph's nodes
        self._read: dict = {}  # id(node) -> (node, what it reads) as the index entered it
        self._last = -1  # the first item of the last appended node's key
        self._touched: dict = {}  # id(node) -> node added or re-read since changes() was asked
        self._unmade: set = set()  # tensors whose producer was removed since then
        self._rebuilt = False  # every node read again since then
        self._renamed: set = set()  # initializers added or removed since changes() was asked
        self.named: dict = {}  # node name -> the node (the last of that name)
        super().__init__(graph)

    def refresh(self) -> None:
        if not self.stale and not self.duplicated:
            for what, node in self._edits:
                if self.stale:
                    break
                getattr(self, f"_enter_{what}")(node)
        self._edits.clear()
        if self.stale or self.duplicated:
            self._rebuild()
        self.inputs = {i.name for i in self.graph.input}
        self.graph_outputs = {o.name for o in self.graph.output}

    def changes(self) -> tuple:
        """(whether every node was read again, the nodes added or changed, the tensors no node makes any more
        and the initializers added or removed) since the last call, as the index has entered them."""
        found = (self._rebuilt, list(self._touched.values()),
                 {name for name in self._unmade if name not in self.producers} | self._renamed)
        self._rebuilt = False
        self._touched.clear()
        self._unmade.clear()
        self._renamed.clear()
        return found

    def key(self, node: onnx.NodeProto) -> tuple:
        """``node``'s place in the graph, as the index has entered it: ordered as the graph's nodes."""
        return self._keys[id(node)]

    def holds(self, node: onnx.NodeProto) -> bool:
        found = self._read.get(id(node))
        return found is not None and found[0] is node

    def reads_of(self, node: onnx.NodeProto) -> set:
        found = self._read.get(id(node))
        return found[1] if found is not None and found[0] is node else super().reads_of(node)

    # -- the edits --------------------------------------------------------------------------------
    def replace(self, node: onnx.NodeProto, replacement: list) -> list:
        held = super().replace(node, replacement)
        base = self._keys.get(id(node)) if self.holds(node) else None
        if base is None:
            self.stale = True
            return held
        self._edits.append(("removed", node))
        for offset, new in enumerate(held):
            self._keys[id(new)] = base + (offset,)
            self._edits.append(("added", new))
        return held

    def _position(self, node: onnx.NodeProto) -> int:
        if not self.holds(node):
            return super()._position(node)
        return next(i for i, n in enumerate(list(self.graph.node)) if n is node)

    def remove(self, nodes: list) -> None:
        super().remove(nodes)
        self._edits.extend(("removed", node) for node in nodes)

    def append(self, nodes: list) -> list:
        held = super().append(nodes)
        for new in held:
            self._last += 1
            self._keys[id(new)] = (self._last,)
            self._edits.append(("added", new))
        return held

    def reread(self, node: onnx.NodeProto) -> None:
        self._edits.append(("reread", node))

    def add_initializers(self, tensors: list) -> list:
        held = super().add_initializers(tensors)
        self._edits.extend(("initializer", tensor) for tensor in held)
        return held

    def drop_initializers(self, names: set) -> None:
        super().drop_initializers(names)
        self._edits.extend(("dropped", name) for name in names)

    # -- entering them ----------------------------------------------------------------------------
    def _rebuild(self) -> None:
        self.producers, self.readers, self._keys, self._read, self.named = {}, {}, {}, {}, {}
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.duplicated = False
        for position, node in enumerate(self.graph.node):
            self._keys[id(node)] = (position,)
            self.named[node.name] = node
            names = super().reads_of(node)
            self._read[id(node)] = (node, names)
            for out in node.output:
                if out:
                    self.duplicated |= out in self.producers
                    self.producers[out] = node
            for name in names:
                self.readers.setdefault(name, []).append(node)
        self._last = len(self.graph.node) - 1
        self.stale = False
        self._rebuilt = True
        self._touched.clear()
        self._unmade.clear()
        self._renamed.clear()

    def _enter_added(self, node: onnx.NodeProto) -> None:
        names = super().reads_of(node)
        self._read[id(node)] = (node, names)
        self.named[node.name] = node
        for out in node.output:
            if out and out in self.producers:
                self.stale = True  # two nodes make it: the rebuild says which one the index names
            elif out:
                self.producers[out] = node
        self._insert(node, names)
        self._touched[id(node)] = node

    def _enter_removed(self, node: onnx.NodeProto) -> None:
        if not self.holds(node):
            self.stale = True
            return
        _, names = self._read.pop(id(node))
        self._drop(node, names)
        for out in node.output:
            if out and self.producers.get(out) is node:
                del self.producers[out]
                self._unmade.add(out)
        del self._keys[id(node)]
        self._touched.pop(id(node), None)
        if self.named.get(node.name) is node:
            del self.named[node.name]

    def _enter_reread(self, node: onnx.NodeProto) -> None:
        if not self.holds(node):
            self.stale = True
            return
        _, old = self._read[id(node)]
        names = super().reads_of(node)
        self._read[id(node)] = (node, names)
        self._drop(node, old - names)
        self._insert(node, names - old)
        self._touched[id(node)] = node

    def _enter_initializer(self, tensor: onnx.TensorProto) -> None:
        self.initializers[tensor.name] = tensor
        self._renamed.add(tensor.name)

    def _enter_dropped(self, name: str) -> None:
        self.initializers.pop(name, None)
        self._renamed.add(name)

    def _insert(self, node: onnx.NodeProto, names: Iterable[str]) -> None:
        """``node`` among the readers of ``names``, in the graph's order."""
        key = self._keys[id(node)]
        for name in names:
            found = self.readers.setdefault(name, [])
            position = len(found)
            while position and self._keys[id(found[position - 1])] > key:
                position -= 1
            found.insert(position, node)

    def _drop(self, node: onnx.NodeProto, names: Iterable[str]) -> None:
        for name in names:
            found = self.readers.get(name, [])
            for position, reader in enumerate(found):
                if reader is node:
                    del found[position]
                    break
            if not found:
                self.readers.pop(name, None)
