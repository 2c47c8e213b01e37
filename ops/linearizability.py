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
call and per return); at a tie a call sorts before a return, so the two ops count as
concurrent (the permissive reading of a clock too coarse to order them).

Long histories (issue 11). An indeterminate write stays open to the end of the run, so
every later op is concurrent with it and the cache must tell apart every subset of
them placed so far: a soak's thousands of them blew any step budget. Two exact levers
make such histories decidable; exact means the answer is the same as the plain search
would give with unlimited steps (the tests compare both on small histories):

1. Reductions (`reduce_kv`, per key, before the search). Soundness (never accept a
   non-linearizable history) holds for each because the reduced history H' is
   linearizable only if H is; completeness (never reject a linearizable one) because H
   linearizable implies H' is.
   a. An indeterminate get is dropped. H' -> H: put it last; it accepts any state and
      never returned, so nothing must follow it. H -> H': gets change no state.
   b. An indeterminate write (put or append) W of value v is dropped when no
      determinate get observed v: its output is not v (a partition of puts and gets:
      a register) or does not contain v (a partition with appends, string values).
      H' -> H: put W last in H''s order; it is legal (writes always are) and nothing
      must follow an op that never returned. H -> H': take H's order without W; the
      ops between W and the next put all see a state that is v or contains v (appends
      only extend it), so none of them is a determinate get; dropping W changes no
      state anything reads, and real time holds in a sub-order. This covers the final
      reads after the heal too: if W took effect and was the newest value then, those
      reads return v and W is kept; if no read returns v, W either never took effect,
      or was overwritten before any read saw it, and both look exactly like W placed
      after everything. Several such W: drop them one at a time (each drop leaves the
      others unobserved).
   c. In a register partition (no appends), an indeterminate put W of value v that no
      other put writes (v not None, the initial state) and that some determinate get
      returned, is closed: it becomes determinate with a return time of the earliest
      return r of those gets (kept open when r <= W's call: the search then finds the
      read before the write). H' -> H: H' only adds real-time constraints. H -> H':
      in H's order W precedes every get returning v (only W writes v), so any op
      called after r (after such a get returned) follows that get, hence W.
   Reads pin the writes they observed; what nobody observed cannot be told apart from
   a write that never happened. Determinate writes are never dropped: a completed
   write no one read is exactly what a stale read is judged against.
2. Segments (`check_partition`). A cut is a point of the event order where no op is
   open: every op before it returned before any op after it was called, so every
   linearization is one of the ops before, then one of the ops after. The search
   runs segment by segment from the set of states the previous segments can end in
   (all of them, through every order its cache admits; the last segment needs just
   one), so backtracking never re-enters a finished segment and the cache holds one
   segment's ops. The history is linearizable iff the last segment completes from
   some state; when a segment completes from none, no linearization exists of the
   ops up to its end (reported as `unlinearizable_until`). With the reductions, the
   open-to-the-end writes that prevented cuts are gone (dropped or closed).

The step budget stays (per partition, over all its segments): a history whose search
exceeds it raises CheckBudgetExceeded, an unknown answer, not a "no".
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Optional

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

    States must be hashable (they go in the search cache). `reduce` rewrites one
    partition into one with the same answer that is cheaper to search (see 1. above).
    """

    init: Callable[[], Hashable]
    step: Callable[[Hashable, Op], tuple[bool, Hashable]]
    partition: Callable[[list[Op]], Iterable[list[Op]]] = field(default=lambda ops: [ops])
    reduce: Callable[[list[Op]], list[Op]] = field(default=lambda ops: ops)


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


def reduce_kv(ops: list[Op]) -> list[Op]:
    """The reductions a, b and c of the module docstring, for one key's ops of KV_MODEL
    (initial state None). Returns new Op objects where it changes one; `ops` is untouched."""
    has_appends = any(op.kind == "append" for op in ops)
    outputs = [op.output for op in ops if op.kind == "get" and not op.indeterminate]
    first_read: dict = {}        # value -> earliest return of a determinate get that returned it
    if not has_appends:
        for op in ops:
            if op.kind == "get" and not op.indeterminate:
                first_read[op.output] = min(first_read.get(op.output, INFINITY), op.ret)
    writers = collections.Counter(op.value for op in ops if op.kind == "put")
    reduced = []
    for op in ops:
        if not op.indeterminate:
            reduced.append(op)
        elif op.kind == "get":
            continue                                                       # a
        elif has_appends:
            if not isinstance(op.value, str) or any(isinstance(out, str) and op.value in out for out in outputs):
                reduced.append(op)
            # else: b (no determinate get's state contains it)
        elif op.value not in first_read:
            continue                                                       # b
        elif op.value is not None and writers[op.value] == 1 and first_read[op.value] > op.call:
            reduced.append(dataclasses.replace(op, ret=first_read[op.value], indeterminate=False))   # c
        else:
            reduced.append(op)
    return reduced


KV_MODEL = Model(init=lambda: None, step=_kv_step, partition=_by_key, reduce=reduce_kv)


class _Node:
    __slots__ = ("op", "id", "is_call", "match", "prev", "next")

    def __init__(self, op, id_, is_call):
        self.op, self.id, self.is_call = op, id_, is_call
        self.match = self.prev = self.next = None


def _event_order(ops: list[Op]) -> list:
    """(time, 0 call | 1 return, op index), sorted: at a tie calls first (concurrent);
    indeterminate returns (+infinity) last, after every determinate event."""
    events = []
    for i, op in enumerate(ops):
        if not op.ret > op.call:
            raise ValueError(f"op {op} returns before it is called")
        events.append((op.call, 0, i))
        events.append((op.ret, 1, i))
    events.sort()
    return events


def _linked_events(ops: list[Op]) -> _Node:
    calls = [_Node(op, i, True) for i, op in enumerate(ops)]
    returns = [_Node(op, i, False) for i, op in enumerate(ops)]
    for call, ret in zip(calls, returns):
        call.match = ret
    head = _Node(None, -1, False)
    prev = head
    for _, is_ret, i in _event_order(ops):
        node = returns[i] if is_ret else calls[i]
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


class _Budget:
    """Search steps over one partition (all its segments and start states)."""

    def __init__(self, max_steps: int, what: str):
        self.max_steps, self.what, self.steps = max_steps, what, 0

    def spend(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise CheckBudgetExceeded(f"{self.what}, {self.steps} steps")


def segments(ops: list[Op]) -> list[list[Op]]:
    """`ops` cut where no op is open (see 2. in the module docstring), in event order."""
    cut, open_ops, current = [], 0, []
    for _, is_ret, i in _event_order(ops):
        if is_ret:
            open_ops -= 1
            if open_ops == 0:
                cut.append(current)
                current = []
        else:
            open_ops += 1
            current.append(ops[i])
    return cut


def _search(ops: list[Op], model: Model, starts: Iterable, budget: _Budget, all_ends: bool) -> dict:
    """The states in which a linearization of `ops` from one of `starts` can end (a dict
    used as an ordered set: the search order stays deterministic). With all_ends False,
    stops at the first one found. Wing & Gong with Lowe's cache, shared by the starts:
    a (linearized set, state) pair seen from one start has nothing new from another."""
    head = _linked_events(ops)
    cache: set = set()
    ends: dict = {}
    for start in starts:
        state, linearized, stack = start, 0, []
        entry = head.next
        while True:
            if head.next is None:            # every op linearized
                ends[state] = None
                if not all_ends:
                    return ends
            elif entry.is_call:
                budget.spend()
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
                continue
            else:
                budget.spend()               # a return whose call cannot be linearized yet
            # backtrack (a dead end, or every order through here wanted)
            if not stack:
                break                        # the list is whole again for the next start
            entry, state = stack.pop()
            linearized &= ~(1 << entry.id)
            _unlift(entry)
            entry = entry.next
    return ends


@dataclass
class Verdict:
    """One partition's answer, and what the search went through to reach it."""
    linearizable: bool
    ops: int                 # in the partition
    searched: int            # after the model's reductions
    segments: int
    steps: int
    unlinearizable_until: Optional[float] = None   # no linearization of the ops up to here


def check_partition(ops: list[Op], model: Model = KV_MODEL, max_steps: int = 2_000_000,
                    reduce: bool = True, split: bool = True) -> Verdict:
    """One partition (one key). reduce=False, split=False is the plain search (the
    checker before issue 11), kept to compare against.

    Raises CheckBudgetExceeded when the search needs more than `max_steps`.
    """
    searched = model.reduce(list(ops)) if reduce else list(ops)
    parts = segments(searched) if split else [searched]
    budget = _Budget(max_steps, f"{len(ops)} ops ({len(searched)} after reductions, {len(parts)} segments)")
    states: Iterable = [model.init()]
    for k, part in enumerate(parts):
        states = _search(part, model, states, budget, all_ends=k < len(parts) - 1)
        if not states:
            until = max(op.ret if op.ret != INFINITY else op.call for op in part)
            return Verdict(False, len(ops), len(searched), len(parts), budget.steps, until)
    return Verdict(True, len(ops), len(searched), len(parts), budget.steps)


def check(ops: list[Op], model: Model = KV_MODEL, max_steps: int = 2_000_000) -> tuple[bool, Any]:
    """(True, None) if linearizable, else (False, the first offending partition's ops).

    Raises CheckBudgetExceeded when a partition needs more than `max_steps`.
    """
    for part in model.partition(list(ops)):
        if not check_partition(part, model, max_steps).linearizable:
            return False, part
    return True, None
