"""A linearizability checker for key-value / append histories (Wing & Gong, as Porcupine does it).

A history is a list of `Op`s, each with the client's call and return times and what it
saw. The checker looks for one total order of the operations that (1) respects real
time — if A returned before B was called, A comes first — and (2) is a legal sequential
execution of the model. It is the standard depth-first search with backtracking and a
cache of (set of linearized ops, model state) pairs already explored (Lowe's
improvement), applied per key (P-compositionality: a KV history is linearizable iff
each key's sub-history is).

Indeterminate operations — a write whose client timed out or lost its leader, so the
outcome is unknown — are given a return time of +infinity and accept any output: the
search may place them anywhere after their call, including after everything else,
which is the same as "never took effect".

Times must be unique per event (the simulator hands out a global sequence number per
call and per return), so there are no ties to break.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

INFINITY = float("inf")


@dataclass
class Op:
    client: int
    kind: str            # "get" | "put" | "append"
    key: Hashable
    value: Any = None    # put/append argument
    output: Any = None   # what a get returned (the value, or None for absent)
    call: float = 0      # event time of the call
    ret: float = INFINITY  # event time of the return; INFINITY when indeterminate
    indeterminate: bool = False


@dataclass
class Model:
    """A sequential specification: init state and step(state, op) -> (legal, new_state).

    States must be hashable (they go in the search cache).
    """

    init: Callable[[], Hashable]
    step: Callable[[Hashable, Op], tuple[bool, Hashable]]
    partition: Callable[[list[Op]], Iterable[list[Op]]] = field(default=lambda ops: [ops])


def _kv_step(state, op: Op):
    """Register semantics for put/get; string append semantics for append/get."""
    if op.kind == "get":
        if op.indeterminate:
            return True, state
        return op.output == state, state
    if op.kind == "put":
        return True, op.value
    if op.kind == "append":
        return True, (state or "") + op.value
    raise ValueError(f"unknown op kind {op.kind!r}")


def _by_key(ops: list[Op]):
    keys: dict = {}
    for op in ops:
        keys.setdefault(op.key, []).append(op)
    return keys.values()


KV_MODEL = Model(init=lambda: None, step=_kv_step, partition=_by_key)


class _Node:
    __slots__ = ("op", "id", "is_call", "match", "prev", "next")

    def __init__(self, op, id_, is_call):
        self.op, self.id, self.is_call = op, id_, is_call
        self.match = self.prev = self.next = None


def _linked_events(ops: list[Op]) -> _Node:
    events = []
    for i, op in enumerate(ops):
        if not op.ret > op.call:
            raise ValueError(f"op {op} returns before it is called")
        call, ret = _Node(op, i, True), _Node(op, i, False)
        call.match = ret
        events.append((op.call, 0, call))
        # indeterminate returns sort last, after every determinate event
        events.append((op.ret, 1, ret))
    events.sort(key=lambda e: (e[0], e[1], e[2].id))
    head = _Node(None, -1, False)
    prev = head
    for _, _, node in events:
        prev.next, node.prev = node, prev
        prev = node
    return head


def _lift(call: _Node) -> None:
    """Take a call and its return out of the list (they are linearized)."""
    call.prev.next = call.next
    if call.next is not None:
        call.next.prev = call.prev
    ret = call.match
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(call: _Node) -> None:
    ret = call.match
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    call.prev.next = call
    if call.next is not None:
        call.next.prev = call


class CheckBudgetExceeded(Exception):
    """The search took more steps than allowed: the answer is unknown, not 'no'."""


def _check_partition(ops: list[Op], model: Model, max_steps: int) -> bool:
    head = _linked_events(ops)
    state = model.init()
    linearized = 0
    cache: set = set()
    stack: list = []
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if steps > max_steps:
            raise CheckBudgetExceeded(f"{len(ops)} ops, {steps} steps")
        if entry.is_call:
            legal, new_state = model.step(state, entry.op)
            if legal:
                new_lin = linearized | (1 << entry.id)
                key = (new_lin, new_state)
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state))
                    state, linearized = new_state, new_lin
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            # reached a return whose call cannot be linearized yet: backtrack
            if not stack:
                return False
            entry, state = stack.pop()
            linearized &= ~(1 << entry.id)
            _unlift(entry)
            entry = entry.next
    return True


def check(ops: list[Op], model: Model = KV_MODEL, max_steps: int = 2_000_000) -> tuple[bool, Any]:
    """(True, None) if linearizable, else (False, the first offending partition's ops).

    Raises CheckBudgetExceeded when a partition needs more than `max_steps`.
    """
    for part in model.partition(list(ops)):
        if not _check_partition(part, model, max_steps):
            return False, part
    return True, None
