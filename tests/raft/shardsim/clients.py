"""Simulated clients: XADD / XREADGROUP / XACK with a session id, routed by the last map seen.

Each client is one actor with its own id (sessions.py: REGISTER at a group before the first
request there, then seq-numbered requests) and its own consumer name. Routing follows the
client's copy of the map (refreshed from some node's applied map, as CLUSTER SLOTS answers);
-MOVED / -TRYAGAIN from the group's fsm refreshes it and retries the same seq (a refusal is
not recorded in the at-most-once table). A lost or timed-out call retries the same seq too:
  XADD        gives up after `give_up` attempts: its outcome is then unknown (applied 0 or 1 times)
  XREADGROUP, XACK   retry until a definite answer, so every delivery and ack is known
What each client saw is kept in `Ledger`, the checker's expectations.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from xraft.node.cluster.slot_move import who_serves
from xraft.node.engine.errors import EngineError
from xraft.node.engine.slots import key_slot
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.slot_moves import frozen_slot
from xraft.node.fsm.slot_owner import not_owned_slot

from .actors import NotSent, Propose, Sleep, Unavailable

GROUP = b"g"              # the consumer group every stream has from the start


@dataclass
class Ledger:
    acked: dict = field(default_factory=dict)          # value -> (key, id) of an XADD answered with an id
    unknown: dict = field(default_factory=dict)        # value -> key of an XADD with unknown outcome
    never: dict = field(default_factory=dict)          # value -> key of an XADD no attempt of which reached a log
    delivered: dict = field(default_factory=lambda: defaultdict(set))   # (key, consumer) -> ids
    ever_delivered: dict = field(default_factory=lambda: defaultdict(set))  # key -> ids any consumer got
    acks: dict = field(default_factory=lambda: defaultdict(set))        # (key, consumer) -> ids acked
    errors: list = field(default_factory=list)          # unexpected answers (checked: must stay empty)


class Client:
    def __init__(self, sim, cid: int):
        self.sim = sim
        self.cid = cid
        self.consumer = b"c%d" % cid
        self.seq = 0
        self.registered: set = set()
        self.slot_map = None
        self.sent = 0

    def run(self):
        """Requests until the simulation stops the workload; the last one is always finished."""
        rng = self.sim.rng
        self.refresh()
        while self.sim.workload_on:
            mine = [(k, ids - self.sim.ledger.acks[(k, self.consumer)])
                    for (k, c), ids in self.sim.ledger.delivered.items() if c == self.consumer]
            mine = [(k, sorted(ids)) for k, ids in mine if ids]
            r = rng.random()
            if mine and r < 0.25:
                key, ids = rng.choice(mine)
                yield from self.xack(key, ids[:rng.randint(1, 3)])
            elif r < 0.45:
                yield from self.xreadgroup(rng.choice(self.sim.keys))
            else:
                yield from self.xadd(rng.choice(self.sim.keys))
            yield Sleep(rng.randint(1, 30))

    def refresh(self) -> None:
        self.slot_map = self.sim.any_node_map(self.slot_map)

    def call(self, key: bytes, argv: tuple, give_up: int = 0):
        """The request's answer after routing, MOVED/TRYAGAIN and retries; Unavailable only
        after `give_up` attempts (0: never)."""
        self.seq += 1
        seq, attempts, slot = self.seq, 0, key_slot(key)
        self.maybe_applied = False      # some attempt reached a log and its outcome is unknown
        while True:
            attempts += 1
            gid, frozen = who_serves(self.slot_map, slot)
            try:
                if frozen:
                    raise NotSent("TRYAGAIN (map: slot %d frozen)" % slot)
                yield from self.register(gid)
                result = yield Propose(gid, encode_record(self.sim.now_ms(), [Request.command(self.cid, seq, argv)]))
                if not_owned_slot(result) is None and frozen_slot(result) is None:
                    return result
                self.sim.stats["redirects"] += 1
            except Unavailable as exc:
                self.maybe_applied |= not isinstance(exc, NotSent)
                if give_up and attempts >= give_up:
                    raise
                if "new_seq_on_retry" in self.sim.cfg.inject:
                    self.seq += 1                      # INJECTED BUG (checker self-test)
                    seq = self.seq
            yield Sleep(self.sim.rng.randint(2, 20))
            self.refresh()

    def register(self, gid: int):
        while gid not in self.registered:
            try:
                result = yield Propose(gid, encode_record(self.sim.now_ms(), [Request.register(self.cid)]))
            except Unavailable:
                yield Sleep(self.sim.rng.randint(2, 20))
                continue
            if isinstance(result, EngineError):
                self.sim.ledger.errors.append("REGISTER at group %d: %s" % (gid, result.message))
            self.registered.add(gid)

    def xadd(self, key: bytes):
        self.sent += 1
        value = b"c%d-%d" % (self.cid, self.sent)
        try:
            result = yield from self.call(key, (b"XADD", key, b"*", b"v", value), give_up=self.sim.cfg.give_up)
        except Unavailable:
            if self.maybe_applied:
                self.sim.ledger.unknown[value] = key
            else:
                self.sim.ledger.never[value] = key
            self.sim.trace_event("client", self.cid, "XADD", key, value,
                                 "unknown outcome" if self.maybe_applied else "never sent")
            return
        self.sim.trace_event("client", self.cid, "XADD", key, value, result)
        if isinstance(result, bytes):
            self.sim.ledger.acked[value] = (key, result)
        else:
            self.sim.ledger.errors.append("XADD %r: %r" % (key, result))
            self.sim.ledger.unknown[value] = key

    def xreadgroup(self, key: bytes):
        argv = (b"XREADGROUP", b"GROUP", GROUP, self.consumer, b"COUNT", b"3", b"STREAMS", key, b">")
        result = yield from self.call(key, argv)
        self.sim.trace_event("client", self.cid, "XREADGROUP", key, _ids(result))
        if isinstance(result, EngineError):
            self.sim.ledger.errors.append("XREADGROUP %r: %s" % (key, result.message))
        elif isinstance(result, list):
            ids = [e[0] for _stream, entries in result for e in entries]
            again = self.sim.ledger.ever_delivered[key].intersection(ids)
            if again:   # ">" serves entries after the group's last-delivered id only
                self.sim.ledger.errors.append("XREADGROUP > %r delivered %r a second time" % (key, sorted(again)))
            self.sim.ledger.ever_delivered[key].update(ids)
            self.sim.ledger.delivered[(key, self.consumer)].update(ids)

    def xack(self, key: bytes, ids: list):
        result = yield from self.call(key, (b"XACK", key, GROUP) + tuple(ids))
        self.sim.trace_event("client", self.cid, "XACK", key, ids, "->", result)
        if result != len(ids):
            self.sim.ledger.errors.append("XACK %r %r of consumer %r acked %r (all were delivered, none acked)"
                                          % (key, ids, self.consumer, result))
        self.sim.ledger.acks[(key, self.consumer)].update(ids)


def _ids(result):
    if isinstance(result, list):
        return [e[0] for _stream, entries in result for e in entries]
    return result
