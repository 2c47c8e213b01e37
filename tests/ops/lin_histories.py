"""Register histories for the linearizability checker's tests and bench/linearizability.py:
linearizable by construction (simulated against a register), with violations planted
on demand, and in the shape of a nemesis soak's register keys.

A history is built from `Step`s, one client's ops in turn. Each op takes effect at one
point inside its window (a linearization point), so ordering the ops by their points
is a legal order that respects real time: the reads' outputs are what the register held
at their points. An info (unknown outcome) op's client gives up after its duration and
moves on; its write takes effect at its point, possibly after the client gave up (still
replicating), or never.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from xraft.ops.linearizability import INFINITY, Op


@dataclass
class Step:
    client: int
    kind: str                 # "put" | "get"
    gap: float                # after the client's previous op (or its giving up)
    duration: float           # call to return, or to giving up (info)
    info: bool = False        # unknown outcome: ret +infinity
    effect: Optional[float] = 0.0   # point - call; None: an info op that never took effect


def simulate(steps: list[Step], key: str = "k") -> list[Op]:
    """Ops of `steps`, linearizable by construction; put values are unique ("v<i>")."""
    free_at: dict = {}
    ops, points = [], []
    for i, s in enumerate(steps):
        call = free_at.get(s.client, 0.0) + s.gap
        free_at[s.client] = call + s.duration
        ret = INFINITY if s.info else call + s.duration
        op = Op(s.client, s.kind, key, value=f"v{i}" if s.kind == "put" else None, call=call, ret=ret,
                indeterminate=s.info)
        ops.append(op)
        if s.effect is not None and not (s.info and s.kind == "get"):
            effect = s.effect if s.info else min(s.effect, s.duration)
            points.append((call + effect, i))
    value = None
    for _point, i in sorted(points):
        op = ops[i]
        if op.kind == "put":
            value = op.value
        else:
            op.output = value
    return sorted(ops, key=lambda op: op.call)


def shift_after(ops: list[Op], t: float, by: float) -> list[Op]:
    """Every event after t moved later by `by`: the same real-time order, a free gap after t."""
    move = lambda x: x + by if x > t else x   # noqa: E731
    return [Op(op.client, op.kind, op.key, op.value, op.output, move(op.call), move(op.ret), op.indeterminate)
            for op in ops]


def plant(ops: list[Op], violation: str, at: float) -> list[Op]:
    """`ops` with a gap opened after time `at` and a violation placed in it:
    stale-read: a put q acked, then a read of a value written (and acked) before q;
    lost-write: a put z acked, then a read of the value current before z (None if none);
    never-written: a read of a value no op writes.
    Ops open across the gap stay open across it (an info write may still land there, but
    none writes the value read, so the read is illegal whatever they do)."""
    gap = 100.0
    out = shift_after(ops, at, gap)
    t = at + 1
    acked_before = [op for op in out if op.kind == "put" and op.ret < at]
    put = lambda value, when: Op(99, "put", out[0].key if out else "k", value, call=when, ret=when + 1)  # noqa: E731
    get = lambda value, when: Op(99, "get", out[0].key if out else "k", output=value, call=when, ret=when + 1)  # noqa: E731
    if violation == "stale-read":
        if acked_before:
            old = acked_before[len(acked_before) // 2].value
        else:
            out.append(put("planted-old", t))
            old, t = "planted-old", t + 2
        out += [put("planted-new", t), get(old, t + 2)]
    elif violation == "lost-write":
        current = _current_acked(out, at)
        out += [put("planted-lost", t), get(current, t + 2)]
    elif violation == "never-written":
        out.append(get("never-written", t))
    else:
        raise ValueError(violation)
    return sorted(out, key=lambda op: op.call)


def _current_acked(ops: list[Op], at: float):
    """A value a read after `at` cannot legally return once a newer put is acked: that of the
    last acked put before `at` (acked ones all precede the new put), or None (no put writes None)."""
    acked = [op for op in ops if op.kind == "put" and op.ret < at]
    return max(acked, key=lambda op: op.ret).value if acked else None


def soak_steps(rng: random.Random, ops: int = 3000, clients: int = 2, outages: int = 3,
               info_writes_per_outage: int = 20, seen_fraction: float = 0.3) -> list[Step]:
    """A nemesis soak's register key: `clients` processes writing and reading half and half,
    ops of 1-30 ms with ~50 ms pauses, and `outages` stretches (a partition, a kill) in which
    ops end in info (2 x info_writes_per_outage of them, half writes): writes that land
    later (seen_fraction of them, up to 3 s on, so later reads see some) or never, and
    reads that see nothing. (A real soak's keys had ~1,500 info writes each, most of them
    refused connections: bench/README.md "Issue 11".)"""
    outage_at = set(rng.sample(range(50, ops - 50), outages))
    steps = []
    pending_info = 0
    for i in range(ops):
        if i in outage_at:
            pending_info = info_writes_per_outage * 2
        client = rng.randrange(clients)
        kind = "put" if rng.random() < 0.5 else "get"
        if pending_info:
            pending_info -= 1
            lands = rng.random() < seen_fraction
            effect = rng.uniform(0.001, 3.0) if lands else None
            steps.append(Step(client, kind, rng.uniform(0.025, 0.075), 3.0, info=True, effect=effect))
        else:
            duration = rng.uniform(0.001, 0.030)
            steps.append(Step(client, kind, rng.uniform(0.025, 0.075), duration, effect=rng.uniform(0, duration)))
    return steps
