"""The list type: a quicklist, i.e. a Python list of listpack nodes.

    ListValue
    +-- nodes:  [lp0, lp1, ..., lpN]   bytearray listpacks (listpack.py), head first
    +-- counts: [c0,  c1,  ..., cN]    element count of each node
    +-- length: sum(counts)
    +-- fill:   list-max-listpack-size when the list was made (node size rule)

    Invariant: no node is empty; counts[i] == lp_length(nodes[i]);
               length == sum(counts) > 0 for any list stored in a keyspace.
    Invariant: every node obeys the fill rule after each command, except a node
               holding a single element too large for any node (redis stores
               those alone too).

Elements go in as client bytes and come out as the same bytes: listpack stores
canonical integers as integers and `lp_get_bytes` spells them back identically.
The fill rule is redis 7.0's (quicklist.c `_quicklistNodeAllowInsert`):
fill < 0 caps a node's bytes at 4/8/16/32/64 KiB for -1..-5; fill >= 0 caps
its element count at `fill` and its bytes at 8 KiB (SIZE_SAFETY_LIMIT). Node
boundaries never show in replies; they only shape the dump (dump.py writes
the nodes as they are).
"""
from ..invariant import invariant
from .keyspace import register_type
from .listpack import (
    LP_HDR_SIZE,
    lp_append,
    lp_append_many,
    lp_bytes,
    lp_decode_all,
    lp_delete,
    lp_delete_range,
    lp_encode,
    lp_first,
    lp_get_bytes,
    lp_insert,
    lp_last,
    lp_length,
    lp_new,
    lp_replace,
    lp_seek,
)

_OPTIMIZATION_LEVEL = (4096, 8192, 16384, 32768, 65536)   # bytes for fill -1..-5
SIZE_SAFETY_LIMIT = 8192
FILL_MAX = 1 << 15


def clamp_fill(fill: int) -> int:
    """quicklistSetFill: fill is kept within -5 .. 2**15."""
    return max(-5, min(FILL_MAX, fill))


def _as_bytes(v) -> bytes:
    return b"%d" % v if v.__class__ is int else v


def node_fits(fill: int, new_bytes: int, new_count: int) -> bool:
    """May a node grow to `new_bytes` bytes / `new_count` elements under `fill`?"""
    if fill < 0:
        return new_bytes <= _OPTIMIZATION_LEVEL[-fill - 1]
    return new_bytes <= SIZE_SAFETY_LIMIT and new_count <= fill


class ListValue:
    __slots__ = ("nodes", "counts", "length", "fill")

    def __init__(self, fill: int = -2):
        self.nodes = []          # Invariant: see the module docstring
        self.counts = []
        self.length = 0
        self.fill = clamp_fill(fill)

    def __len__(self):
        return self.length

    # -- building ----------------------------------------------------------
    @classmethod
    def from_nodes(cls, fill: int, nodes) -> "ListValue":
        """A list made of already validated listpack nodes (dump.py)."""
        value = cls(fill)
        for lp in nodes:
            n = lp_length(lp)
            invariant(n > 0, "empty quicklist node")
            value.nodes.append(bytearray(lp))
            value.counts.append(n)
            value.length += n
        return value

    def _fits(self, node: int, ele: bytes) -> bool:
        add = len(lp_encode(ele))
        return node_fits(self.fill, lp_bytes(self.nodes[node]) + add, self.counts[node] + 1)

    def _new_node(self, at: int, elements) -> None:
        lp = lp_new()
        lp_append_many(lp, elements)
        self.nodes.insert(at, lp)
        self.counts.insert(at, len(elements))

    # -- ends ----------------------------------------------------------------
    def push_head(self, ele: bytes) -> None:
        if self.nodes and self._fits(0, ele):
            lp_insert(self.nodes[0], LP_HDR_SIZE, ele, after=False)
            self.counts[0] += 1
        else:
            self._new_node(0, [ele])
        self.length += 1

    def push_tail(self, ele: bytes) -> None:
        if self.nodes and self._fits(-1, ele):
            lp_append(self.nodes[-1], ele)
            self.counts[-1] += 1
        else:
            self._new_node(len(self.nodes), [ele])
        self.length += 1

    def pop_head(self) -> bytes:
        invariant(self.length > 0, "pop from an empty list")
        lp = self.nodes[0]
        p = lp_first(lp)
        ele = lp_get_bytes(lp, p)
        lp_delete(lp, p)
        self._shrunk(0, 1)
        return ele

    def pop_tail(self) -> bytes:
        invariant(self.length > 0, "pop from an empty list")
        lp = self.nodes[-1]
        p = lp_last(lp)
        ele = lp_get_bytes(lp, p)
        lp_delete(lp, p)
        self._shrunk(len(self.nodes) - 1, 1)
        return ele

    def _shrunk(self, node: int, removed: int) -> None:
        self.counts[node] -= removed
        self.length -= removed
        if self.counts[node] == 0:
            del self.nodes[node]
            del self.counts[node]

    # -- positions -----------------------------------------------------------
    def _locate(self, index: int):
        """(node, index within node) of element `index`, 0 <= index < length."""
        invariant(0 <= index < self.length, "list index out of range")
        if index < self.length // 2:
            for node, c in enumerate(self.counts):
                if index < c:
                    return node, index
                index -= c
        else:
            back = self.length - 1 - index
            for node in range(len(self.counts) - 1, -1, -1):
                c = self.counts[node]
                if back < c:
                    return node, c - 1 - back
                back -= c
        invariant(False, "quicklist counts do not add up")

    def normalize(self, index: int):
        """redis index rules: negative counts from the tail; None if out of range."""
        if index < 0:
            index += self.length
        return index if 0 <= index < self.length else None

    def get(self, index: int):
        """Element at `index` (negative from the tail), None if out of range."""
        i = self.normalize(index)
        if i is None:
            return None
        node, k = self._locate(i)
        lp = self.nodes[node]
        return lp_get_bytes(lp, lp_seek(lp, k))

    def replace(self, index: int, ele: bytes) -> bool:
        """LSET: False if out of range."""
        i = self.normalize(index)
        if i is None:
            return False
        node, k = self._locate(i)
        lp = self.nodes[node]
        lp_replace(lp, lp_seek(lp, k), ele)
        self._split_if_needed(node)
        return True

    def insert(self, index: int, ele: bytes, after: bool) -> None:
        """Insert next to element `index` (0 <= index < length)."""
        node, k = self._locate(index)
        lp = self.nodes[node]
        lp_insert(lp, lp_seek(lp, k), ele, after=after)
        self.counts[node] += 1
        self.length += 1
        self._split_if_needed(node)

    def _split_if_needed(self, node: int) -> None:
        """After an insert/replace grew `node` past the fill rule: cut it in two
        (repeatedly, halves first) until every piece fits or holds one element."""
        lp = self.nodes[node]
        if self.counts[node] <= 1 or node_fits(self.fill, lp_bytes(lp), self.counts[node]):
            return
        elements = [_as_bytes(v) for v in lp_decode_all(lp)]
        half = len(elements) // 2
        del self.nodes[node]
        del self.counts[node]
        self._new_node(node, elements[half:])
        self._new_node(node, elements[:half])
        self._split_if_needed(node + 1)
        self._split_if_needed(node)

    # -- ranges --------------------------------------------------------------
    def iter_from(self, index: int, reverse: bool = False):
        """Elements from `index` (0 <= index < length) towards the tail, or
        towards the head when reverse."""
        node, k = self._locate(index)
        if not reverse:
            for n in range(node, len(self.nodes)):
                elements = lp_decode_all(self.nodes[n])
                for v in (elements[k:] if n == node else elements):
                    yield _as_bytes(v)
        else:
            for n in range(node, -1, -1):
                elements = lp_decode_all(self.nodes[n])
                part = elements[:k + 1] if n == node else elements
                for v in reversed(part):
                    yield _as_bytes(v)

    def range(self, start: int, stop: int, reverse: bool = False) -> list:
        """Elements start..stop inclusive (0 <= start <= stop < length);
        reversed (stop first) when reverse."""
        out = []
        want = stop - start + 1
        it = self.iter_from(stop if reverse else start, reverse)
        for ele in it:
            out.append(ele)
            if len(out) == want:
                break
        return out

    def delete_range(self, start: int, count: int) -> None:
        """Delete `count` elements from `start` on (0 <= start, start+count <= length)."""
        invariant(0 <= start and count >= 0 and start + count <= self.length, "bad delete range")
        if count == 0:
            return
        node, k = self._locate(start)
        while count > 0:
            take = min(count, self.counts[node] - k)
            lp_delete_range(self.nodes[node], k, take)
            count -= take
            self.counts[node] -= take
            self.length -= take
            if self.counts[node] == 0:
                del self.nodes[node]
                del self.counts[node]
            else:
                node += 1
            k = 0

    def remove(self, ele: bytes, limit: int, from_tail: bool) -> int:
        """LREM: delete up to `limit` (0 = all) elements equal to `ele`, scanning
        from the head or the tail; returns how many went."""
        removed = 0
        order = range(len(self.nodes) - 1, -1, -1) if from_tail else range(len(self.nodes))
        emptied = []
        for n in order:
            elements = [_as_bytes(v) for v in lp_decode_all(self.nodes[n])]
            positions = range(len(elements) - 1, -1, -1) if from_tail else range(len(elements))
            doomed = []
            for i in positions:
                if limit and removed == limit:
                    break
                if elements[i] == ele:
                    doomed.append(i)
                    removed += 1
            if doomed:
                lp = self.nodes[n]
                for i in sorted(doomed, reverse=True):
                    lp_delete(lp, lp_seek(lp, i))
                self.counts[n] -= len(doomed)
                self.length -= len(doomed)
                if self.counts[n] == 0:
                    emptied.append(n)
            if limit and removed == limit:
                break
        for n in sorted(emptied, reverse=True):
            del self.nodes[n]
            del self.counts[n]
        return removed

    def __iter__(self):
        for lp in self.nodes:
            for v in lp_decode_all(lp):
                yield _as_bytes(v)

    def __eq__(self, other):
        return isinstance(other, ListValue) and list(self) == list(other)

    def check(self) -> None:
        """Verify the structural invariants (tests, dump.py after loading)."""
        invariant(len(self.nodes) == len(self.counts), "nodes and counts differ in length")
        for lp, c in zip(self.nodes, self.counts):
            invariant(c > 0 and lp_length(lp) == c, "node count mismatch")
        invariant(sum(self.counts) == self.length, "list length mismatch")


register_type(ListValue, "list")
