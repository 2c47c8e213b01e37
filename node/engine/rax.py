"""Rax: redis's radix tree over byte-string keys, node for node.

Streams keep their listpack nodes in a rax keyed by the 16-byte master ID,
and consumer groups keep groups, consumers and PELs in raxes.  XINFO STREAM
prints the tree's `numele` and `numnodes` ("radix-tree-keys" and
"radix-tree-nodes"), so this tree does not merely hold the same keys as
redis's: it splits and merges nodes by the same rules as redis 7.0 `rax.c`
(raxGenericInsert / raxRemove), so both counters match redis exactly after
any sequence of inserts and removes.

Layout
------
A node never stores its own key.  The bytes *leading to* a node are spelled
by the edges above it, and `is_key` says whether that spelled string is a
stored key.  There are two node kinds:

  * branch node (compressed=False): one edge byte per child, sorted;
    `edge[i]` leads to `kids[i]`.  A node with no children is a leaf.
  * compressed node (compressed=True): a run of >= 2 bytes spelled in
    sequence, with exactly one child at the end of the run.

Keys inserted in the order "a", "ab", "abcd", "abxy", "b" give (K = is_key,
the quoted string is the key the node stands for, numnodes == 8):

    head  branch "ab"                                 ("" is not a key)
     |-'a'-> [K "a"] branch "b"
     |        '-'b'-> [K "ab"] branch "cx"
     |                 |-'c'-> branch "d" -'d'-> [K "abcd"] leaf
     |                 '-'x'-> branch "y" -'y'-> [K "abxy"] leaf
     '-'b'-> [K "b"] leaf

A one-byte step is never a compressed node.  "cd" below "ab" started out as
a run ("abcd" was inserted into the childless "ab" node), and inserting
"abxy" split it at its first byte into the branch "cx" plus a one-byte
branch "d" (rax.c ALGO 1).  A run is created whenever a childless node must
spell two or more bytes; e.g. a tree holding only "annibale" is

    head: compressed "annibale" --> leaf [K]            (numnodes == 2)

and adding "annientare" splits the run where the keys diverge (ALGO 1):

    compressed "anni" --> branch "be" --'b'--> compressed "ale"   --> leaf [K]
                                      --'e'--> compressed "ntare" --> leaf [K]
                                                                 (numnodes == 6)

while adding "ann" to the one-key tree splits without a branch (ALGO 2):

    compressed "ann" --> compressed [K]"ibale" --> leaf [K]      (numnodes == 3)

`numnodes` counts every node reachable from the head, head included, and
changes exactly where rax.c allocates or frees a node.  Like rax.c, removal
only re-compresses in the two situations rax.c handles (a single-child node
stops being a key, or a branch drops to one child), so the tree is not always
maximally compressed; that is deliberate, it is what redis reports.

Iterators (`RaxIterator`) hold a path of nodes into the tree.  Any insert of
a new key or any removal invalidates every iterator of that tree: they must
be re-seeked (the stream code removes then `seek(">=", key)` as t_stream.c
does).  Using a stale iterator raises RuntimeError rather than silently
walking detached nodes.  Overwriting the value of an existing key changes no
node and leaves iterators valid (as in rax.c).

Pure module: standard library only, no clock / randomness / I/O.
"""
from bisect import bisect_left

from ..invariant import invariant

# rax.c stores node sizes in 29 bits; runs longer than this are split.
RAX_NODE_MAX_SIZE = (1 << 29) - 1

_NO_KIDS = ()  # shared "no children" marker: saves a list per leaf


class _Node:
    """One rax node.  See the module docstring for the picture."""

    __slots__ = ("edge", "kids", "compressed", "is_key", "value")

    def __init__(self, edge, kids, compressed, is_key=False, value=None):
        # Invariant: bytes.  compressed -> len(edge) >= 2, the run of bytes
        # leading to the single child.  branch -> strictly increasing bytes,
        # len(edge) == len(kids), edge[i] leads to kids[i].
        self.edge = edge
        # Invariant: list of _Node, or _NO_KIDS when there are none.
        # compressed -> exactly one child.
        self.kids = kids
        # Invariant: bool; True only if len(edge) >= 2 and len(kids) == 1.
        self.compressed = compressed
        # Invariant: bool; True iff the bytes spelled from the head to this
        # node are a stored key.  Every non-head leaf is a key.
        self.is_key = is_key
        # Invariant: the key's value if is_key (any object, None allowed),
        # else None.
        self.value = value


class Rax:
    """A radix tree mapping bytes -> object with rax.c's node accounting."""

    __slots__ = ("_head", "numele", "numnodes", "_version")

    def __init__(self):
        # Invariant: the head exists for the tree's whole life; it is the node
        # for the empty key and is never freed (rax.c replaces it, we mutate
        # it in place, which counts the same).
        self._head = _Node(b"", _NO_KIDS, False)
        # Invariant: number of nodes with is_key set.
        self.numele = 0
        # Invariant: number of nodes reachable from _head, head included.
        self.numnodes = 1
        # Invariant: bumped on every change of the set of keys; iterators
        # compare it to detect that they went stale.
        self._version = 0

    def __len__(self) -> int:
        return self.numele

    def __repr__(self) -> str:
        return "Rax(numele=%d, numnodes=%d)" % (self.numele, self.numnodes)

    # -- lookup ---------------------------------------------------------------

    def find(self, key: bytes, default=None):
        """The value stored at `key`, or `default` if the key is absent."""
        node = self._head
        i = 0
        n = len(key)
        while i < n:
            edge = node.edge
            if node.compressed:
                # A key ending inside a run is absent: only node boundaries
                # can hold keys.
                if not key.startswith(edge, i):
                    return default
                i += len(edge)
                node = node.kids[0]
            else:
                j = edge.find(key[i])
                if j < 0:
                    return default
                i += 1
                node = node.kids[j]
        if node.is_key:
            return node.value
        return default

    def __contains__(self, key: bytes) -> bool:
        return self.find(key, _ABSENT) is not _ABSENT

    def _walk(self, key, stack=None):
        """rax.c raxLowWalk: follow `key` as far as the tree spells it.

        Returns (i, node, j): `i` bytes of key were matched and the walk
        stopped at `node`; if node is compressed, `j` is how many of its run
        bytes matched (0 means the walk stopped exactly at the node).  When
        `stack` is a list, the nodes passed through (not `node`) are pushed.
        """
        node = self._head
        i = 0
        n = len(key)
        while i < n:
            edge = node.edge
            if node.compressed:
                if key.startswith(edge, i):
                    if stack is not None:
                        stack.append(node)
                    i += len(edge)
                    node = node.kids[0]
                    continue
                j = 0
                limit = min(len(edge), n - i)
                while j < limit and edge[j] == key[i + j]:
                    j += 1
                return i + j, node, j
            j = edge.find(key[i])
            if j < 0:
                return i, node, 0
            if stack is not None:
                stack.append(node)
            i += 1
            node = node.kids[j]
        return i, node, 0

    # -- insertion --------------------------------------------------------------

    def insert(self, key: bytes, value=None) -> bool:
        """Store `value` at `key`.  True if the key is new, False if an
        existing value was overwritten (rax.c raxInsert)."""
        return self._insert(key, value, True)

    def try_insert(self, key: bytes, value=None) -> bool:
        """Store `value` only if `key` is absent; True if it was stored
        (rax.c raxTryInsert)."""
        return self._insert(key, value, False)

    def _insert(self, key, value, overwrite):
        if type(key) is not bytes:
            key = bytes(key)  # edges are sliced out of the key: keep them immutable
        n = len(key)
        i, h, j = self._walk(key)
        if i == n and (not h.compressed or j == 0):
            # The key's node already exists: it only needs the key flag.
            if h.is_key:
                if overwrite:
                    h.value = value
                return False
            h.is_key = True
            h.value = value
            self.numele += 1
            self._version += 1
            return True
        self._version += 1
        if h.compressed:
            edge = h.edge
            nxt = h.kids[0]
            if i != n:
                # ALGO 1: the key diverges at run byte j.  The run becomes
                # [trimmed edge[:j]] -> split branch on edge[j] -> [postfix
                # edge[j+1:]] -> nxt; empty parts are not created.  The key's
                # own byte is then added to the split branch below.
                postfix_len = len(edge) - j - 1
                if postfix_len:
                    postfix = _Node(edge[j + 1:], [nxt], postfix_len > 1)
                    self.numnodes += 1
                else:
                    postfix = nxt
                if j == 0:
                    # The split branch replaces h and inherits its key flag.
                    h.edge = edge[:1]
                    h.kids = [postfix]
                    h.compressed = False
                else:
                    split = _Node(edge[j:j + 1], [postfix], False)
                    self.numnodes += 1
                    h.edge = edge[:j]
                    h.kids = [split]
                    h.compressed = j > 1
                    h = split
            else:
                # ALGO 2: the key ends inside the run, at byte j > 0.  Cut the
                # run in two; the second half's node is the new key.
                postfix_len = len(edge) - j
                postfix = _Node(edge[j:], [nxt], postfix_len > 1, True, value)
                self.numnodes += 1
                h.edge = edge[:j]
                h.kids = [postfix]
                h.compressed = j > 1
                self.numele += 1
                return True
        # Spell the rest of the key below h: a childless node takes the whole
        # remainder as one run (if >= 2 bytes), otherwise one branch byte.
        while i < n:
            child = _Node(b"", _NO_KIDS, False)
            if not h.kids and n - i > 1:
                run = key[i:i + RAX_NODE_MAX_SIZE]
                h.edge = run
                h.kids = [child]
                h.compressed = True
                i += len(run)
            else:
                invariant(not h.compressed, "rax: adding a branch byte to a compressed node")
                c = key[i]
                edge = h.edge
                pos = bisect_left(edge, c)
                h.edge = edge[:pos] + key[i:i + 1] + edge[pos:]
                if h.kids:
                    h.kids.insert(pos, child)
                else:
                    h.kids = [child]
                i += 1
            self.numnodes += 1
            h = child
        h.is_key = True
        h.value = value
        self.numele += 1
        return True

    # -- removal ----------------------------------------------------------------

    def remove(self, key: bytes):
        """Delete `key`.  Returns (True, old value) or (False, None)."""
        stack = []
        i, h, j = self._walk(key, stack)
        if i != len(key) or (h.compressed and j != 0) or not h.is_key:
            return False, None
        old = h.value
        h.is_key = False
        h.value = None
        self.numele -= 1
        self._version += 1

        try_compress = False
        if not h.edge:
            # A leaf lost its key: free it and every ancestor that only
            # existed to lead to it (non-key, single child), stopping at a key,
            # a branch with other children, or the head.
            head = self._head
            child = None
            while h is not head:
                child = h
                self.numnodes -= 1
                h = stack.pop()
                if h.is_key or (not h.compressed and len(h.edge) != 1):
                    break
            if child is not None:
                _unlink_child(h, child)
                if len(h.edge) == 1 and not h.is_key:
                    try_compress = True
        elif len(h.edge) == 1:
            # A single-child branch stopped being a key: it may merge.
            try_compress = True

        if try_compress:
            # Climb to the highest ancestor that could be part of one run.
            while stack:
                parent = stack[-1]
                if parent.is_key or (not parent.compressed and len(parent.edge) != 1):
                    break
                stack.pop()
                h = parent
            start = h
            chain = [start]
            size = len(start.edge)
            node = start
            while node.edge:
                node = node.kids[-1]
                if node.is_key or (not node.compressed and len(node.edge) != 1):
                    break
                if size + len(node.edge) > RAX_NODE_MAX_SIZE:
                    break
                chain.append(node)
                size += len(node.edge)
            if len(chain) > 1:
                # rax.c allocates one new run node and frees the chain; start
                # becomes that node in place.
                end = chain[-1].kids[-1]
                start.edge = b"".join([c.edge for c in chain])
                start.kids = [end]
                start.compressed = True
                self.numnodes += 1 - len(chain)
        return True, old

    # -- ordered access -------------------------------------------------------------

    def first(self):
        """(key, value) of the smallest key, or None if the tree is empty."""
        node = self._head
        parts = []
        while not node.is_key:
            if not node.kids:
                return None
            parts.append(node.edge if node.compressed else node.edge[:1])
            node = node.kids[0]
        return b"".join(parts), node.value

    def last(self):
        """(key, value) of the largest key, or None if the tree is empty."""
        node = self._head
        parts = []
        while node.kids:
            parts.append(node.edge if node.compressed else node.edge[-1:])
            node = node.kids[-1]
        if not node.is_key:
            return None
        return b"".join(parts), node.value

    def items(self, start=None, reverse=False):
        """Generate (key, value) in key order (descending if `reverse`).

        `start` is an inclusive bound: keys >= start going forward, <= start
        in reverse.  The tree must not gain or lose keys meanwhile
        (RuntimeError on the next step if it does)."""
        it = RaxIterator(self)
        if start is None:
            found = it.seek("$" if reverse else "^")
        else:
            found = it.seek("<=" if reverse else ">=", start)
        if not found:
            return
        step = it.prev if reverse else it.next
        while step():
            yield it.key, it.data

    def __iter__(self):
        """Keys in ascending order."""
        for key, _ in self.items():
            yield key

    def iterator(self) -> "RaxIterator":
        """A new iterator; call seek() before next()/prev()."""
        return RaxIterator(self)

    # -- verification -----------------------------------------------------------------

    def check(self) -> None:
        """Walk the whole tree and verify every structural invariant and both
        counters.  O(n); meant for tests and debugging."""
        nodes = 0
        keys = 0
        todo = [self._head]
        while todo:
            node = todo.pop()
            nodes += 1
            keys += node.is_key
            edge, kids = node.edge, node.kids
            invariant(type(edge) is bytes, "rax: edge must be bytes")
            if node.compressed:
                invariant(len(edge) >= 2 and len(kids) == 1, "rax: compressed node shape")
            else:
                invariant(len(edge) == len(kids), "rax: branch edge/kids length")
                invariant(all(edge[k] < edge[k + 1] for k in range(len(edge) - 1)),
                          "rax: branch bytes must be strictly increasing")
            invariant(kids is _NO_KIDS or (type(kids) is list and kids),
                      "rax: empty children are the shared marker")
            if not kids and node is not self._head:
                invariant(node.is_key, "rax: a non-head leaf must be a key")
            if not node.is_key:
                invariant(node.value is None, "rax: non-key node holds a value")
            todo.extend(kids)
        invariant(nodes == self.numnodes, "rax: numnodes %d != %d reachable" % (self.numnodes, nodes))
        invariant(keys == self.numele, "rax: numele %d != %d keys" % (self.numele, keys))


def _unlink_child(parent, child):
    """rax.c raxRemoveChild: drop `child` from `parent` (in place)."""
    if parent.compressed:
        # A run without its child is just a childless node.
        parent.edge = b""
        parent.kids = _NO_KIDS
        parent.compressed = False
        return
    kids = parent.kids
    for pos, kid in enumerate(kids):
        if kid is child:
            break
    else:
        invariant(False, "rax: child not found in parent")
    parent.edge = parent.edge[:pos] + parent.edge[pos + 1:]
    del kids[pos]
    if not kids:
        parent.kids = _NO_KIDS


_ABSENT = object()  # find() sentinel for "no such key" (None is a valid value)

_READY, _JUST_SEEKED, _EOF = 0, 1, 2


class RaxIterator:
    """rax.c raxIterator: seek, then step with next()/prev().

    After a successful seek the first next() *or* prev() returns True with
    `key`/`data` set to the sought element itself; later calls move one key
    forward/backward.  Once a step runs off either end the iterator stays at
    EOF until seeked again.  Adding or removing keys in the tree makes the
    iterator stale: next()/prev() then raise RuntimeError until seek().
    """

    __slots__ = ("_rax", "_stack", "_node", "_buf", "_state", "_version", "key", "data")

    def __init__(self, rax: Rax):
        self._rax = rax
        # Invariant: the ancestors of _node, head first (empty when _node is
        # the head).
        self._stack = []
        # Invariant: the node of the current position; its spelled key is _buf.
        self._node = rax._head
        # Invariant: bytes spelled from the head to _node along _stack.
        self._buf = bytearray()
        # Invariant: _READY, _JUST_SEEKED or _EOF; an unseeked iterator is EOF.
        self._state = _EOF
        # Invariant: rax._version at the last seek.
        self._version = rax._version
        # Invariant: the current key / value after a step returned True.
        self.key = b""
        self.data = None

    # -- movement primitives; each leaves _node/_stack/_buf consistent --------

    def _down(self, node, pos):
        """Step from `node` into its child at `pos` (0 for compressed)."""
        self._stack.append(node)
        if node.compressed:
            self._buf += node.edge
        else:
            self._buf.append(node.edge[pos])
        self._node = node.kids[pos]

    def _first_key_here(self) -> bool:
        """Move to the smallest key at or below the current node."""
        node = self._node
        while not node.is_key:
            if not node.kids:
                return False  # only an empty tree's head
            self._down(node, 0)
            node = self._node
        return True

    def _last_key_here(self) -> bool:
        """Move to the largest key at or below the current node."""
        node = self._node
        while node.kids:
            self._down(node, len(node.kids) - 1)
            node = self._node
        return node.is_key

    def _up_next(self) -> bool:
        """Move to the smallest key after the whole subtree of the current node."""
        stack, buf = self._stack, self._buf
        while stack:
            parent = stack.pop()
            if parent.compressed:
                del buf[-len(parent.edge):]
            else:
                pos = parent.edge.find(buf.pop()) + 1
                if pos < len(parent.kids):
                    self._down(parent, pos)
                    return self._first_key_here()
        return False

    def _up_prev(self) -> bool:
        """Move to the largest key before the current node (and its subtree)."""
        stack, buf = self._stack, self._buf
        while stack:
            parent = stack.pop()
            if parent.compressed:
                del buf[-len(parent.edge):]
            else:
                pos = parent.edge.find(buf.pop())
                if pos > 0:
                    self._down(parent, pos - 1)
                    return self._last_key_here()
            if parent.is_key:
                # A key sorts before everything below it.
                self._node = parent
                return True
        return False

    def _step_next(self) -> bool:
        node = self._node
        if node.kids:
            self._down(node, 0)
            return self._first_key_here()
        return self._up_next()

    # -- public -----------------------------------------------------------------

    def seek(self, op: str, key: bytes = b"") -> bool:
        """Position on the first element satisfying `op` relative to `key`:
        "^" first, "$" last, "==" exact, ">=", ">", "<=", "<".  Returns False
        (and the iterator is at EOF) when no element matches."""
        rax = self._rax
        self._version = rax._version
        self._stack = []
        self._buf = bytearray()
        self._node = rax._head
        if op == "^":
            found = self._first_key_here()
        elif op == "$":
            found = self._last_key_here()
        elif op in _SEEK_OPS:
            found = self._seek_compare(op, key)
        else:
            raise ValueError("rax seek: unknown operator %r" % (op,))
        if found:
            invariant(self._node.is_key, "rax seek landed on a non-key node")
            self._state = _JUST_SEEKED
            self.key = bytes(self._buf)
            self.data = self._node.value
        else:
            self._state = _EOF
        return found

    def _seek_compare(self, op, key) -> bool:
        forward = op[0] == ">"
        n = len(key)
        i = 0
        node = self._node
        while True:
            self._node = node
            if i == n:
                # `node` spells exactly `key`.
                if op == "==":
                    return node.is_key
                if op == ">=":
                    return self._first_key_here()
                if op == ">":
                    return self._step_next()
                if op == "<=" and node.is_key:
                    return True
                return self._up_prev()
            edge = node.edge
            if node.compressed:
                part = key[i:i + len(edge)]
                if part == edge:
                    self._down(node, 0)
                    node = self._node
                    i += len(edge)
                    continue
                # The run leaves `key` here: everything below it is on one
                # side of `key`.  pos = how many children sort below `key`.
                pos = 0 if edge > part else 1
            else:
                c = key[i]
                pos = edge.find(c)
                if pos >= 0:
                    self._down(node, pos)
                    node = self._node
                    i += 1
                    continue
                pos = bisect_left(edge, c)
            # Children [0, pos) hold only keys < `key`, children [pos, end)
            # only keys > `key`; `node`'s own key, a proper prefix of `key`,
            # is smaller too.
            if op == "==":
                return False
            if forward:
                if pos < len(node.kids):
                    self._down(node, pos)
                    return self._first_key_here()
                return self._up_next()
            if pos > 0:
                self._down(node, pos - 1)
                return self._last_key_here()
            return node.is_key or self._up_prev()

    def _check_fresh(self):
        if self._version != self._rax._version:
            raise RuntimeError("rax iterator used after the tree changed: seek() it again")

    def next(self) -> bool:
        """Advance to the next key (see the class docstring)."""
        return self._step(self._step_next)

    def prev(self) -> bool:
        """Step back to the previous key (see the class docstring)."""
        return self._step(self._up_prev)

    def _step(self, move) -> bool:
        # After a seek the sought element is yielded first (rax.c semantics); then `move`
        # walks the tree one key forward or back, or the iterator reaches EOF.
        state = self._state
        if state == _EOF:
            return False
        self._check_fresh()
        if state == _JUST_SEEKED:
            self._state = _READY
            return True
        if move():
            self.key = bytes(self._buf)
            self.data = self._node.value
            return True
        self._state = _EOF
        return False


_SEEK_OPS = frozenset(("==", ">=", ">", "<=", "<"))
