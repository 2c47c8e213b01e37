"""The shard simulation's invariants.

At every first application of a log index in a group (the group's "frontier": every replica
applies the same entries in the same order, so the state after index i is one state):

  one server   for every moving slot, at most one data group's frontier state serves it
               (owns it and has not sealed it); a request that the fsm accepted for a key of a
               slot ran at a group whose frontier serves that slot, and no other group's does
  no double    an accepted XADD leaves its value at most once in the group's stream

At the end (everything healed, every move finished, every client done):

  same state   the replicas of each group hold byte-identical snapshots
  map          no move left; no slot sealed, no staging left; each group owns exactly the moving
               slots the map gives it; each key's stream lives at its owner only (the source purged it)
  exactly once every acked XADD is at the final owner exactly once, with the ID the client
               got; an unknown-outcome one at most once; no value nobody sent
  PEL          the owner's pending entries, per consumer, are exactly delivered - acked
  answers      no client saw an unexpected error (XACK acks every delivered id it names)
"""
from __future__ import annotations

from collections import Counter, defaultdict

from xraft.node.cluster.meta_machine import MetaApplied
from xraft.node.engine.errors import EngineError
from xraft.node.engine.slots import key_slot
from xraft.node.fsm.entry import Kind, decode_record
from xraft.node.fsm.sessions import decode_result
from xraft.node.fsm.slot_moves import frozen_slot
from xraft.node.fsm.slot_owner import not_owned_slot

from .clients import GROUP
from .replica import META

FAR_FUTURE_MS = 1 << 62


class Violation(AssertionError):
    pass


def serves(sm, slot: int) -> bool:
    return sm.owned.owns(slot) and not sm.moves.sealed[slot]


class Checker:
    def __init__(self, sim):
        self.sim = sim
        self.slots = sorted({s for first, last in sim.move_ranges for s in range(first, last + 1)})
        self.serving: dict = {}          # gid -> set of moving slots its frontier serves
        self.served = Counter()          # (gid, slot) -> requests accepted there (not vacuous)
        self.stats_cached = 0            # retries answered from the at-most-once table
        self.slot_map = sim.founding     # the map at group 0's highest applied index
        self.cached = None               # the at-most-once table's answer to the entry being applied

    def start(self) -> None:
        for gid in self.sim.founding.groups:
            r = self.sim.replicas(gid)[0]
            self.serving[gid] = {s for s in self.slots if serves(r.machine.sm, s)}
        self._one_server("founding state")

    def _one_server(self, when: str) -> None:
        """At most one group serves each moving slot, and only the owner the committed map
        names (the data groups never run ahead of the map: seal before the decision,
        activation after it, unseal after the abort)."""
        for s in self.slots:
            at = [g for g, slots in self.serving.items() if s in slots]
            if len(at) > 1:
                raise Violation("slot %d is served by groups %s at once (%s)" % (s, at, when))
            if at and at[0] != self.map_owner(s):
                raise Violation("slot %d is served by group %d but the committed map (epoch %d) names group %d (%s)"
                                % (s, at[0], self.slot_map.epoch, self.map_owner(s), when))

    def map_owner(self, slot: int) -> int:
        mig = self.slot_map.migration_of(slot)
        return self.slot_map.owner(slot) if mig is None else mig.owner

    def before_first_apply(self, r, e) -> None:
        """What the group's session table holds for the entry's request before it applies: a
        retry answered from it ran nothing (it is no serve, even for a slot gone elsewhere)."""
        self.cached = None
        if not e.data:
            return
        [req] = decode_record(e.data).requests
        client = r.machine.sm.sessions.clients.get(req.client_id) if req.client_id else None
        if client is not None and req.seq:
            raw = client.results.get(req.seq)
            self.cached = ("result", decode_result(raw)) if raw is not None else (
                ("stale", None) if req.seq <= client.floor else None)

    def on_first_apply(self, r, e, result) -> None:
        if r.gid == META:
            if isinstance(result, MetaApplied):
                self.slot_map = result.slot_map
                self._one_server("metadata index %d" % e.index)
            return
        if not e.data:
            return
        sm = r.machine.sm
        self.serving[r.gid] = {s for s in self.slots if serves(sm, s)}
        where = "group %d index %d" % (r.gid, e.index)
        self._one_server(where)
        [req] = decode_record(e.data).requests
        if req.kind != Kind.COMMAND or isinstance(result, EngineError) and (
                not_owned_slot(result) is not None or frozen_slot(result) is not None):
            return
        if self.cached is not None and (self.cached[0] == "stale" or self.cached[1] == result):
            self.stats_cached += 1
            return                       # answered from the at-most-once table: nothing ran
        argv = req.argv
        key = bytes(argv[1]) if argv[0].upper() in (b"XADD", b"XACK") else bytes(argv[-2])
        slot = key_slot(key)
        self.served[(r.gid, slot)] += 1
        if slot in self.slots:
            others = [g for g, slots in self.serving.items() if g != r.gid and slot in slots]
            if slot not in self.serving[r.gid] or others:
                raise Violation("%s ran %r at group %d while serving groups are %s" % (
                    where, argv[0], r.gid, [g for g, sl in self.serving.items() if slot in sl]))
        if argv[0].upper() == b"XADD" and not isinstance(result, EngineError):
            n = sum(1 for _id, fields in sm.read([b"XRANGE", key, b"-", b"+"], FAR_FUTURE_MS) if fields[1] == argv[-1])
            if n != 1:
                raise Violation("%s: XADD %r %r is in the stream %d times" % (where, key, argv[-1], n))

    # -- the end ----------------------------------------------------------------------------------
    def final(self) -> None:
        sim, ledger = self.sim, self.sim.ledger
        if ledger.errors:
            raise Violation("unexpected answers: %s" % ledger.errors[:5])
        for gid in sim.frontier:
            snaps = {r.machine.snapshot() for r in sim.replicas(gid)}
            if len(snaps) != 1:
                raise Violation("group %d: replicas differ after settling" % gid)
        slot_map = sim.replicas(META)[0].machine.slot_map
        if slot_map.migrations:
            raise Violation("moves left in the final map: %r" % slot_map.migrations)
        sms = {gid: sim.replicas(gid)[0].machine.sm for gid in slot_map.groups}
        for gid, sm in sms.items():
            if sm.moves.any_sealed or sm.moves.staging:
                raise Violation("group %d still has sealed slots or staging after every move ended: %r" % (
                    gid, [(str(m), p.name) for m, p in sm.moves.moves.items()]))
            for first, last in sim.move_ranges:
                for s in range(first, last + 1):
                    if sm.owned.owns(s) != (slot_map.owner(s) == gid):
                        raise Violation("group %d's owned slots disagree with the map at slot %d" % (gid, s))
        values = defaultdict(Counter)       # key -> value -> count at the owner
        ids = {}
        pels = {}
        for key in sim.keys:
            owner = slot_map.owner(key_slot(key))
            for gid, sm in sms.items():
                if gid != owner and sm.keyspace.exists(key):
                    raise Violation("key %r is still at group %d (its owner is group %d)" % (key, gid, owner))
            rows = sms[owner].read([b"XRANGE", key, b"-", b"+"], FAR_FUTURE_MS)
            if isinstance(rows, EngineError):
                raise Violation("XRANGE %r at its owner group %d: %s" % (key, owner, rows.message))
            for entry_id, fields in rows:
                values[key][fields[1]] += 1
                ids[fields[1]] = entry_id
            pel = sms[owner].read([b"XPENDING", key, GROUP, b"-", b"+", b"1000000"], FAR_FUTURE_MS)
            if isinstance(pel, EngineError):
                raise Violation("XPENDING %r at group %d: %s" % (key, owner, pel.message))
            pels[key] = pel
        for value, (key, entry_id) in ledger.acked.items():
            if values[key][value] != 1 or ids.get(value) != entry_id:
                raise Violation("acked XADD %r -> %r to %r is at the owner %d times (id there %r)" % (
                    value, entry_id, key, values[key][value], ids.get(value)))
        for value, key in ledger.unknown.items():
            if values[key][value] > 1:
                raise Violation("unknown-outcome XADD %r to %r is there %d times" % (value, key, values[key][value]))
        for value, key in ledger.never.items():
            if values[key][value]:
                raise Violation("XADD %r to %r, never proposed, is there %d times" % (value, key, values[key][value]))
        for key, counts in values.items():
            for value in counts:
                if value not in ledger.acked and value not in ledger.unknown:
                    raise Violation("%r holds %r, which no client sent to it" % (key, value))
        for key in sim.keys:
            have = {(row[0], row[1]) for row in pels[key]}
            want = {(i, c) for (k, c), got in ledger.delivered.items() if k == key
                    for i in got - ledger.acks[(k, c)]}
            if have != want:
                raise Violation("PEL of %r: extra %s, missing %s" % (key, sorted(have - want)[:5],
                                                                      sorted(want - have)[:5]))
