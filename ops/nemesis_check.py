"""Checkers over a nemesis run's history (Jepsen style): what the clients saw, and the final state.

A history is a list of records (one JSON object per line in history.jsonl):

    {"op": 17, "time": 3.21, "process": "sdk-xadd-0", "type": "invoke", "f": "xadd", "key": "s", "value": "v17"}
    {"op": 17, "time": 3.24, "process": "sdk-xadd-0", "type": "ok", "f": "xadd", "key": "s", "value": "v17",
     "result": "1764130000000-0"}

`op` pairs an invocation with its completion: ok (it happened, `result` holds the reply),
fail (it certainly did not happen) or info (unknown: a timeout, a lost connection,
UNKNOWNOUTCOME). An op with no completion counts as info. `time` is seconds since the
run began on the runner's monotonic clock: real time, the same for every client.
Nemesis records have process "nemesis"; the final drain's record has f "final" and its
value holds what the cluster holds at the end (see `check`).

Every checker returns a list of anomalies {"checker", "kind", "detail"}; zero anomalies
is the only passing run. What a checker cannot decide (a linearizability search over
its step budget) is a note, not an anomaly.
"""
from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass, field
from typing import Any, Optional

from . import linearizability as lin

CHECKERS = ("streams", "id-order", "linearizable", "groups", "lists", "replicas")
MAX_DETAILS = 20            # anomalies kept per checker in the report (the count is exact)
LIN_MAX_STEPS = 2_000_000   # Wing & Gong search budget per register key


@dataclass
class Op:
    """One operation: its invocation and its completion (None: never completed = info)."""
    op: int
    process: str
    f: str
    key: Any
    value: Any
    invoke: float
    complete: float = float("inf")
    type: str = "info"          # ok | fail | info
    result: Any = None
    extra: dict = field(default_factory=dict)


class HistoryError(ValueError):
    """The history is malformed (a completion without its invocation, two invocations of one op)."""


def pair(history: list) -> list:
    """The client operations of a history, in invocation order."""
    ops: dict = {}
    for rec in history:
        if rec.get("process") == "nemesis" or rec.get("f") == "final":
            continue
        n = rec["op"]
        if rec["type"] == "invoke":
            if n in ops:
                raise HistoryError(f"op {n} invoked twice")
            ops[n] = Op(op=n, process=rec["process"], f=rec["f"], key=rec.get("key"), value=rec.get("value"),
                        invoke=rec["time"], extra={k: v for k, v in rec.items() if k not in _BASE})
        else:
            if n not in ops:
                raise HistoryError(f"op {n} completes ({rec['type']}) but was never invoked")
            o = ops[n]
            o.type, o.complete, o.result = rec["type"], rec["time"], rec.get("result")
            if o.type == "info":
                o.extra["gave_up"] = rec["time"]   # when the client stopped waiting (the picture)
                o.complete = float("inf")          # it may take effect at any time later
    return sorted(ops.values(), key=lambda o: (o.invoke, o.op))


_BASE = {"op", "time", "process", "type", "f", "key", "value", "result"}


def final_state(history: list) -> Optional[dict]:
    finals = [r for r in history if r.get("f") == "final"]
    return finals[-1]["value"] if finals else None


def stream_id(s: str) -> tuple:
    ms, _, seq = str(s).partition("-")
    return int(ms), int(seq or 0)


def _anomaly(checker: str, kind: str, **detail) -> dict:
    return {"checker": checker, "kind": kind, "detail": detail}


# -- streams: exactly once, at most once, none invented --------------------------

def check_streams(ops: list, final: dict) -> list:
    """Each ok XADD present exactly once with its id, each info XADD at most once,
    each failed XADD absent, and no entry whose value no client sent."""
    out = []
    sent = {}
    for o in ops:
        if o.f == "xadd":
            sent[(o.key, o.value)] = o
    for key, entries in final.get("streams", {}).items():
        ids_by_value = collections.defaultdict(list)
        for entry_id, value in entries:
            ids_by_value[value].append(entry_id)
        for value, ids in ids_by_value.items():
            o = sent.get((key, value))
            if o is None:
                out.append(_anomaly("streams", "invented", key=key, value=value, ids=ids))
            elif len(ids) > 1:
                out.append(_anomaly("streams", "duplicated", key=key, value=value, ids=ids, type=o.type))
            elif o.type == "fail":
                out.append(_anomaly("streams", "failed-but-present", key=key, value=value, id=ids[0]))
            elif o.type == "ok" and o.result != ids[0]:
                out.append(_anomaly("streams", "wrong-id", key=key, value=value, acked=o.result, stored=ids[0]))
        for (k, value), o in sent.items():
            if k == key and o.type == "ok" and value not in ids_by_value:
                out.append(_anomaly("streams", "lost", key=key, value=value, acked=o.result))
    return out


def check_id_order(ops: list) -> list:
    """Real-time order: if XADD a completed before XADD b was invoked (same key), id(a) < id(b)."""
    out = []
    by_key = collections.defaultdict(list)
    for o in ops:
        if o.f == "xadd" and o.type == "ok":
            by_key[o.key].append(o)
    for key, adds in by_key.items():
        by_complete = sorted(adds, key=lambda o: o.complete)
        i, best = 0, None    # the completed add with the largest id so far
        for b in sorted(adds, key=lambda o: o.invoke):
            while i < len(by_complete) and by_complete[i].complete < b.invoke:
                a = by_complete[i]
                if best is None or stream_id(a.result) > stream_id(best.result):
                    best = a
                i += 1
            if best is not None and stream_id(b.result) <= stream_id(best.result):
                out.append(_anomaly("id-order", "id-not-increasing", key=key, earlier=best.value,
                                    earlier_id=best.result, later=b.value, later_id=b.result))
    return out


# -- linearizable reads on register keys -------------------------------------------

def register_ops(ops: list) -> list:
    """The register keys' ops as the checker's: ok and info writes (info: may land any time
    after the invoke, or never), ok reads (a read that failed or timed out saw nothing)."""
    hist = []
    for o in ops:
        if o.f == "reg-write" and o.type in ("ok", "info"):
            hist.append(lin.Op(client=0, kind="put", key=o.key, value=o.value, call=o.invoke,
                               ret=o.complete if o.type == "ok" else lin.INFINITY,
                               indeterminate=o.type == "info"))
        elif o.f == "reg-read" and o.type == "ok":
            hist.append(lin.Op(client=0, kind="get", key=o.key, output=o.result, call=o.invoke, ret=o.complete))
    return hist


def check_linearizable(ops: list, notes: list, max_steps: int = LIN_MAX_STEPS) -> list:
    """Register keys: reg-write appends a value (XADD), reg-read reads the newest entry
    (XREVRANGE + - COUNT 1, None when empty). Wing & Gong per key (ops/linearizability),
    after its exact reductions (info writes no read saw dropped, the others closed at
    their first read) and cut where no op is open: a soak's keys are decided."""
    out = []
    for part in lin.KV_MODEL.partition(register_ops(ops)):
        try:
            verdict = lin.check_partition(part, max_steps=max_steps)
        except lin.CheckBudgetExceeded as e:
            notes.append(f"linearizable: key {part[0].key!r} not decided ({e})")
            continue
        if not verdict.linearizable:
            # no order of the key's ops up to `until` (runner seconds) is legal: look there
            out.append(_anomaly("linearizable", "not-linearizable", key=part[0].key, ops=len(part),
                                until=verdict.unlinearizable_until))
    return out


# -- consumer groups ----------------------------------------------------------------

def check_groups(ops: list, final: dict) -> list:
    """`>` delivers an entry at most once (claims may deliver again); every PEL entry was
    delivered to its owner; every ok XADD is acked or pending after the drain; delivery
    counts never shrink; no claim of an entry delivered less than min-idle before (by
    replicated time: _check_claim_idle)."""
    out = []
    new_deliveries = collections.defaultdict(list)    # (key, id) -> [op]
    deliveries = collections.defaultdict(list)        # (key, id) -> [op] (new or claimed)
    # Consumers that may hold deliveries the history does not show: an info read or claim,
    # or a Consume session (the server pushes entries ahead of the client's asking; those
    # still buffered when the session ends are pending to it yet never recorded).
    unsure_consumers = set()
    acked = set()
    for o in ops:
        if o.f in ("xreadgroup", "consume", "xautoclaim"):
            consumer = o.extra.get("consumer")
            if o.type == "info" or o.f == "consume":
                unsure_consumers.add(consumer)
            if o.type != "ok":
                continue
            for entry_id in o.result or []:
                if o.f == "consume" and any(d.f == "consume" and d.extra.get("consumer") == consumer
                                            for d in deliveries[(o.key, entry_id)]):
                    continue    # a Consume session's replay of its own pending entry after a failover
                deliveries[(o.key, entry_id)].append(o)
                if o.f != "xautoclaim":
                    new_deliveries[(o.key, entry_id)].append(o)
        elif o.f == "xack" and o.type in ("ok", "info"):
            acked.update((o.key, i) for i in o.value)
    for (key, entry_id), ds in new_deliveries.items():
        if len(ds) > 1:
            out.append(_anomaly("groups", "delivered-twice", key=key, id=entry_id,
                                consumers=[d.extra.get("consumer") for d in ds]))
    stream_ids = {(k, e[0]) for k, es in final.get("streams", {}).items() for e in es}
    for (key, entry_id) in deliveries:
        if (key, entry_id) not in stream_ids:
            out.append(_anomaly("groups", "delivered-unknown-entry", key=key, id=entry_id))
    pending = {}
    for key, pel in final.get("pel", {}).items():
        for entry_id, consumer, count in pel:
            pending[(key, entry_id)] = (consumer, count)
            owners = {d.extra.get("consumer") for d in deliveries.get((key, entry_id), [])}
            if consumer not in owners and consumer not in unsure_consumers:
                out.append(_anomaly("groups", "pending-never-delivered", key=key, id=entry_id, consumer=consumer))
    group_keys = set(final.get("pel", {}))
    for o in ops:
        if o.f == "xadd" and o.type == "ok" and o.key in group_keys:
            if (o.key, o.result) not in pending and (o.key, o.result) not in acked:
                out.append(_anomaly("groups", "neither-acked-nor-pending", key=o.key, id=o.result))
    out += _check_delivery_counts(ops, pending)
    out += _check_claim_idle(ops, deliveries)
    return out


def _check_delivery_counts(ops: list, pending: dict) -> list:
    out = []
    seen = collections.defaultdict(list)   # (key, id) -> [(invoke, complete, count)]
    for o in ops:
        if o.f == "xpending" and o.type == "ok":
            for entry_id, _consumer, count in o.result or []:
                seen[(o.key, entry_id)].append((o.invoke, o.complete, count))
    for (key, entry_id), reads in seen.items():
        if (key, entry_id) in pending:
            reads.append((float("inf"), float("inf"), pending[(key, entry_id)][1]))
        reads.sort()
        for a in reads:
            for b in reads:
                if a[1] < b[0] and b[2] < a[2]:
                    out.append(_anomaly("groups", "delivery-count-shrank", key=key, id=entry_id,
                                        before=a[2], after=b[2]))
                    break
            else:
                continue
            break
    return out


def _check_claim_idle(ops: list, deliveries: dict) -> list:
    """No claim of an entry idle less than min-idle, judged as the server judges it: by
    replicated time (the leader's stamp in each record), not by the runner's clock. Under
    a clock fault the two differ: replicated time may lead real time (a leader whose
    clock is ahead is trusted up to MAX_CLOCK_LEAD_MS past its monotonic estimate, or
    fully when it starts skewed; node/fsm/resolve.py), so a claim 1.6 s of real time
    after a delivery can be a legal claim 2 s of replicated time later.

    The history measures replicated time through XADD `*` (stream and registers): its
    ID's ms part is the record's stamp exactly (max(stamp, last ms), and stamps never
    decrease), taken somewhere between the op's invoke and complete. Records are in log
    order consistent with real time, so a claim's stamp is at most the smallest ID ms of
    the adds invoked after it completed, and a delivery's stamp at least the largest of
    the adds completed before it was invoked (and the entry's own ID ms). An anomaly is
    a claim whose stamp is certainly less than min-idle after a delivery that completed
    before it was invoked; without a bound on either side nothing is decided. A
    Consume delivery may predate its op (the server pushes and replays before the
    client asks), so only the entry's own ID bounds it."""
    out = []
    clock = _ReplicatedClock(ops)
    for o in ops:
        if o.f != "xautoclaim" or o.type != "ok":
            continue
        min_idle_ms = o.extra.get("min_idle_ms", 0)
        claim_at_most = clock.at_most(o.complete)
        if claim_at_most is None:
            continue
        for entry_id in o.result or []:
            for d in deliveries.get((o.key, entry_id), []):
                if d is o or not d.complete < o.invoke:
                    continue
                delivered_at_least = stream_id(entry_id)[0]
                if d.f != "consume":
                    delivered_at_least = max(delivered_at_least, clock.at_least(d.invoke))
                if claim_at_most - delivered_at_least < min_idle_ms:
                    out.append(_anomaly("groups", "claimed-before-min-idle", key=o.key, id=entry_id,
                                        idle_ms_at_most=claim_at_most - delivered_at_least,
                                        min_idle_ms=min_idle_ms, real_idle_s=round(o.complete - d.invoke, 3)))
    return out


class _ReplicatedClock:
    """Bounds on replicated time at a moment of the runner's clock, from the IDs of ok
    XADD `*` ops (see _check_claim_idle)."""

    def __init__(self, ops: list):
        samples = [(o.invoke, o.complete, stream_id(o.result)[0]) for o in ops
                   if o.f in ("xadd", "reg-write") and o.type == "ok" and isinstance(o.result, str)]
        self._by_complete = sorted((c, ms) for _i, c, ms in samples)
        self._by_invoke = sorted((i, ms) for i, _c, ms in samples)
        # prefix max over completions; suffix min over invocations
        self._max_before, best = [], 0
        for _c, ms in self._by_complete:
            best = max(best, ms)
            self._max_before.append(best)
        self._min_after, low = [0] * len(self._by_invoke), None
        for k in range(len(self._by_invoke) - 1, -1, -1):
            ms = self._by_invoke[k][1]
            low = ms if low is None else min(low, ms)
            self._min_after[k] = low

    def at_least(self, t: float) -> int:
        """Replicated time of any record of an op invoked at t is at least this (0: no bound)."""
        k = bisect.bisect_left(self._by_complete, (t, -1))      # completed strictly before t
        return self._max_before[k - 1] if k else 0

    def at_most(self, t: float) -> Optional[int]:
        """Replicated time of any record of an op completed at t is at most this (None: no bound)."""
        k = bisect.bisect_right(self._by_invoke, (t, float("inf")))   # invoked strictly after t
        return self._min_after[k] if k < len(self._by_invoke) else None


# -- lists ----------------------------------------------------------------------------

def check_lists(ops: list, final: dict) -> list:
    """pushed = popped ⊎ remaining: nothing popped twice, nothing invented, nothing both
    popped and remaining, no failed push present, and no ok push missing beyond what
    pops of unknown outcome may have taken."""
    out = []
    pushes = {o.value: o for o in ops if o.f == "lpush"}
    popped = collections.Counter()
    unsure_pops = 0
    for o in ops:
        if o.f in ("blpop", "blmove"):
            if o.type == "info":
                unsure_pops += o.f == "blpop"
            elif o.type == "ok" and o.result is not None and o.f == "blpop":
                popped[o.result] += 1
    remaining = collections.Counter(v for values in final.get("lists", {}).values() for v in values)
    for value, n in popped.items():
        if n > 1:
            out.append(_anomaly("lists", "popped-twice", value=value, times=n))
    for value in list(popped) + list(remaining):
        if value not in pushes:
            out.append(_anomaly("lists", "invented", value=value))
    for value, n in remaining.items():
        if n > 1:
            out.append(_anomaly("lists", "duplicated", value=value, times=n))
        if value in popped:
            out.append(_anomaly("lists", "popped-and-remaining", value=value))
        if value in pushes and pushes[value].type == "fail":
            out.append(_anomaly("lists", "failed-but-present", value=value))
    lost = [v for v, o in pushes.items() if o.type == "ok" and v not in popped and v not in remaining]
    if len(lost) > unsure_pops:
        out.append(_anomaly("lists", "lost", count=len(lost), unsure_pops=unsure_pops, values=lost[:MAX_DETAILS]))
    return out


# -- replicas ---------------------------------------------------------------------------

def check_replicas(final: dict) -> list:
    """Every replica answered and holds the same state. Each state was read between two
    equal readings of the node's applied index; the indexes may differ between nodes
    only by entries that change no data (the leader's time and session records go on
    after the clients stop), so a replica that does not answer (applied None) is the
    one that has not converged."""
    replicas = final.get("replicas", {})
    if not replicas:
        return [_anomaly("replicas", "no-replica-state")]
    out = []
    applied = {node: r.get("applied") for node, r in replicas.items()}
    if None in applied.values():
        out.append(_anomaly("replicas", "not-converged", applied=applied))
        return out
    nodes = sorted(replicas)
    first = replicas[nodes[0]].get("state")
    for node in nodes[1:]:
        if replicas[node].get("state") != first:
            out.append(_anomaly("replicas", "state-differs", node=node, reference=nodes[0],
                                applied=applied[node]))
    return out


# -- all of them --------------------------------------------------------------------------

def check(history: list, lin_max_steps: int = LIN_MAX_STEPS) -> dict:
    """{"anomalies": {checker: count}, "details": {checker: [first anomalies]}, "notes": [...]}."""
    ops = pair(history)
    final = final_state(history)
    notes: list = []
    found = {name: [] for name in CHECKERS}
    if final is None:
        notes.append("no final state in the history: only the order and linearizability checkers ran")
        final_checks = []
    else:
        final_checks = [check_streams(ops, final), check_groups(ops, final), check_lists(ops, final),
                        check_replicas(final)]
    for anomalies in final_checks + [check_id_order(ops), check_linearizable(ops, notes, lin_max_steps)]:
        for a in anomalies:
            found[a["checker"]].append(a)
    return {"anomalies": {k: len(v) for k, v in found.items()},
            "details": {k: v[:MAX_DETAILS] for k, v in found.items() if v},
            "notes": notes}


def summary(history: list) -> dict:
    """Operation counts and unavailability: the longest stretches in which no write succeeded."""
    ops = pair(history)
    counts = collections.Counter(o.type for o in ops)
    return {"ops": len(ops), "ok": counts["ok"], "fail": counts["fail"], "info": counts["info"],
            "unavailable": unavailable_windows(ops)}


UNAVAILABLE_GAP_S = 1.0   # no successful write for this long is a window of unavailability


def unavailable_windows(ops: list, gap: float = UNAVAILABLE_GAP_S) -> list:
    """[(start, end)] stretches longer than `gap` with writes invoked but none completing ok."""
    writes = [o for o in ops if o.f in ("xadd", "lpush", "reg-write")]
    if not writes:
        return []
    oks = sorted(o.complete for o in writes if o.type == "ok")
    # Ops of unknown outcome never complete: the window ends at the last thing a client saw.
    start = min(o.invoke for o in writes)
    end = max(o.complete if o.complete != float("inf") else o.invoke for o in writes)
    marks = [start] + oks + [end]
    return [(a, b) for a, b in zip(marks, marks[1:]) if b - a > gap]
