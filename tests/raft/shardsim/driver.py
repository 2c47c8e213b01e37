"""The simulated move driver: the operator's `begin_move` and the reconciler, as one actor
per node that believes it leads the metadata group (a deposed leader that has not noticed
yet runs too, as a real one would until its next is_leader check).

This is node/server/move_reconciler.py (MoveReconciler.step / _data_step / _propose) and the
caller side of node/server/slot_move_steps.py (MoveSteps.copy / verify / release / abort)
with the same step order, events and refusal rules, over simulated calls:

    data writes   a SLOT_MOVE record proposed to the group's leader (Propose)
    data reads    export_chunk / manifest / staging_status on the leader's applied state
                  after a ReadIndex (Read): what SlotMoveRpcs._read does
    the map       this node's own applied copy of group 0 (what meta.slot_map reads)
    map changes   AdvanceMove / BeginMove proposed on this node's group-0 replica

All phase logic is in `data_step` (one place: a new phase, e.g. a pre-copy, is one branch).
"""
from __future__ import annotations

from xraft.node.cluster.changes import AdvanceMove, BeginMove, StaleEpoch, already_applied, encode_change
from xraft.node.cluster.meta_machine import MetaApplied, MetaRefused
from xraft.node.cluster.slot_map import BEFORE_DECISION, MAX_REASON_CHARS, MovePhase, SlotMapError
from xraft.node.cluster.slot_move import Abort, Copied, Decide, Finish, MoveError, Precopied, Released, Sealed, Verified
from xraft.node.engine.errors import EngineError
from xraft.node.fsm.entry import Kind, Request, encode_record
from xraft.node.fsm.slot_export import decode_have, export_chunk, manifest, precopy_status, staged_have, staging_status
from xraft.node.fsm.slot_move_apply import move_argv
from xraft.node.fsm.slot_moves import END, MoveId, Phase, encode_cursor

from .actors import Propose, Read, Sleep, Unavailable
from .replica import META

RETRY_STEPS = 20          # after a failed round (move_reconciler.RETRY_S)
IDLE_STEPS = 40           # nothing to do (IDLE_WAIT_S)


class MoveStepRefused(Exception):
    """The data group's fsm refused the step (slot_move_steps.MoveStepRefused)."""


def _reason(exc: Exception) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:MAX_REASON_CHARS]


class Driver:
    """One driver incarnation on `node` (a new leader starts a new one: no state that matters)."""

    def __init__(self, sim, node: int):
        self.sim = sim
        self.node = node
        self.first_seen: dict = {}       # move id -> step this incarnation first saw it

    # -- what the node can see ---------------------------------------------------------------
    def leads(self) -> bool:
        r = self.sim.replica(self.node, META)
        return r is not None and r.is_leader()

    def slot_map(self):
        return self.sim.replica(self.node, META).machine.slot_map

    # -- the loop (move_reconciler.run_rounds) -------------------------------------------------
    def run(self):
        while self.leads():
            try:
                busy = yield from self.round()
            except (Unavailable, MoveStepRefused, EngineError) as exc:
                self.sim.trace_event("driver", self.node, "round failed", _reason(exc))
                yield Sleep(RETRY_STEPS)
                continue
            yield Sleep(1 if busy else IDLE_STEPS)

    def round(self):
        m = self.slot_map()
        idle = [r for r in self.sim.move_ranges if r not in m.migrations]
        if self.sim.moves_wanted > 0 and idle and (not m.migrations or self.sim.rng.random() < 0.3):
            yield from self.begin(m, self.sim.rng.choice(idle))   # sometimes two moves at once
            return True
        if not m.migrations:
            self.first_seen.clear()
            return False
        for mig in list(m.migrations.values()):
            if not self.leads():
                return False
            cur = self.slot_map().migrations.get(mig.key)
            if cur is not None:
                yield from self.step(cur)
        return True

    def begin(self, m, move_range: tuple):
        """The operator: `xraftctl slots move` of a range to the group that does not own it."""
        first, last = move_range
        self.sim.moves_begun += 1
        source = m.owner(first)
        target = next(g for g in sorted(m.groups) if g != source)
        change = BeginMove(m.epoch, first, last, target)
        result = yield Propose(META, encode_change(change), via=self.node, local=True)
        if isinstance(result, MetaApplied):
            self.sim.moves_wanted -= 1
            self.sim.trace_event("driver", self.node, "begin", first, last, "->", target)

    def step(self, mig):
        """MoveReconciler.step: timeout, data step, propose; a refusal before the decision aborts."""
        mid = (mig.first, mig.last, mig.started_epoch)
        seen = self.first_seen.setdefault(mid, self.sim.now)
        phase = mig.phase
        if phase in BEFORE_DECISION and self.sim.now - seen > self.sim.cfg.move_timeout:
            yield from self.propose(mig, Abort("timeout"))
            return
        try:
            event = yield from self.data_step(mig)
        except MoveStepRefused as exc:
            if phase not in BEFORE_DECISION:
                raise
            yield from self.propose(mig, Abort(_reason(exc)))
            return
        yield from self.propose(mig, event)

    def data_step(self, mig):
        """MoveReconciler._data_step: the data-group work of mig's phase; the event to propose."""
        phase, a, b = mig.phase, mig.source, mig.target
        m = MoveId(mig.first, mig.last, mig.started_epoch)
        if phase == MovePhase.PRECOPYING:
            try:
                yield from self.precopy(a, b, m)
            except MoveStepRefused as exc:      # best effort (MoveReconciler._precopy): seal anyway
                self.sim.trace_event("driver", self.node, "precopy refused", _reason(exc))
            return Precopied()
        if phase == MovePhase.SEALING:
            yield from self.write(a, "SEAL", m)
            return Sealed()
        if phase == MovePhase.COPYING and mig.cursor != END:
            cursor, chunks = yield from self.copy(a, b, m)
            return Copied(bytes(cursor), mig.replicated + max(1, chunks))
        if phase == MovePhase.COPYING:
            digest = yield from self.verify(a, b, m)
            return Verified(bytes(digest))
        if phase == MovePhase.VERIFIED:
            return Decide()
        if phase == MovePhase.DECIDED:
            if "unseal_at_decide" in self.sim.cfg.inject:
                yield from self.write(a, "UNSEAL", m)      # INJECTED BUG (checker self-test)
            yield from self.write(b, "ACTIVATE", m, mig.digest)
            yield from self.release(a, m)
            return Released()
        if phase == MovePhase.RELEASED:
            yield from self.write(b, "ACTIVATE", m, mig.digest)
            return Finish()
        yield from self.write(a, "UNSEAL", m)
        yield from self.write(b, "DROP_STAGING", m)
        return Finish()

    def propose(self, mig, event):
        """MoveReconciler._propose: True when the event's effect is in the map."""
        m = self.slot_map()
        change = AdvanceMove(m.epoch, mig.first, mig.last, mig.started_epoch, mig.target, event)
        result = yield Propose(META, encode_change(change), via=self.node, local=True)
        self.sim.trace_event("driver", self.node, event.kind, mig.first, mig.last, type(result).__name__)
        if isinstance(result, MetaApplied):
            self.sim.stats["map_" + event.kind] += 1
            return True
        if isinstance(result, MetaRefused):
            err = result.error
            if isinstance(err, StaleEpoch):
                return already_applied(self.slot_map(), change)
            if isinstance(err, MoveError) and err.already_applied:
                return True
            if not isinstance(err, SlotMapError):
                raise AssertionError("metadata group refused with %r" % (err,))
        return False

    # -- data-group calls (slot_move_steps.MoveSteps) -------------------------------------------
    def write(self, gid: int, op: str, m: MoveId, *args):
        req = Request(0, 0, Kind.SLOT_MOVE, (move_argv(op, m, *args),))
        result = yield Propose(gid, encode_record(self.sim.now_ms(), [req]), via=self.node)
        if isinstance(result, EngineError):
            raise MoveStepRefused(result.message)
        return result

    def read(self, gid: int, fn):
        try:
            return (yield Read(gid, fn, via=self.node))
        except EngineError as exc:          # MoveRefused from the read (not sealed, bad cursor)
            raise MoveStepRefused(exc.message) from None

    def copy(self, a: int, b: int, m: MoveId):
        """MoveSteps.copy: export at A -> STAGE at B from B's replicated cursor until END."""
        max_bytes = self.sim.cfg.chunk_bytes
        phase, at, _, _ = yield from self.read(b, lambda sm: staging_status(sm, m))
        if phase is Phase.ACTIVE:
            return END, 0
        cursor, chunks = at or encode_cursor(m.first, 0), 0
        # B's pre-copied streams travel as DELTA records; if B cannot apply one, the rest in full.
        have = (yield from self.read(b, lambda sm: staged_have(sm, m))) if cursor != END else b""
        while cursor != END:
            records, nxt, _done, sessions, now = yield from self.read(
                a, lambda sm, c=cursor, h=have: export_chunk(sm, m, c, max_bytes, have=decode_have(h) if h else None)
                + (sm.last_now_ms,))
            if len(nxt) != len(END) or nxt <= cursor or len(records) > max_bytes:
                raise MoveStepRefused("group %d answered EXPORT with a bad cursor" % a)
            try:
                yield from self.write(b, "STAGE", m, cursor, nxt, b"%d" % now, records, sessions)
            except MoveStepRefused as exc:
                if have and "does not fit the pre-copy" in str(exc):
                    have = b""
                    continue
                if "at cursor" not in str(exc):
                    raise
                _, cursor, _, _ = yield from self.read(b, lambda sm: staging_status(sm, m))
                continue
            cursor, chunks = nxt, chunks + 1
        return END, chunks

    def precopy(self, a: int, b: int, m: MoveId):
        """MoveSteps.precopy: export at A while it serves -> PRESTAGE at B, from B's pre-copy
        cursor; nothing once B's pre-copy is complete or its sealed copy began."""
        max_bytes = self.sim.cfg.chunk_bytes
        phase, at, _, _ = yield from self.read(b, lambda sm: staging_status(sm, m))
        pre_cursor, _ = yield from self.read(b, lambda sm: precopy_status(sm, m))
        start = encode_cursor(m.first, 0)
        if (phase is not None and phase is not Phase.STAGING) or (at and at != start):
            return
        cursor = pre_cursor or start
        while cursor != END:
            records, nxt, _done, _sessions = yield from self.read(
                a, lambda sm, c=cursor: export_chunk(sm, m, c, max_bytes, live=True))
            if len(nxt) != len(END) or nxt <= cursor or len(records) > max_bytes:
                raise MoveStepRefused("group %d answered EXPORT with a bad cursor" % a)
            yield from self.write(b, "PRESTAGE", m, cursor, nxt, records)
            self.sim.stats["precopy_chunks"] += 1
            cursor = nxt

    def verify(self, a: int, b: int, m: MoveId):
        source = yield from self.read(a, lambda sm: manifest(sm, m))
        phase, cursor, _, staged = yield from self.read(b, lambda sm: staging_status(sm, m))
        if phase is Phase.ACTIVE:
            return source
        if cursor != END:
            raise MoveStepRefused("staging of move %s at group %d is not complete" % (m, b))
        if staged != source:
            raise MoveStepRefused("digest mismatch: source %s, staged %s" % (source.hex(), staged.hex()))
        return source

    def release(self, a: int, m: MoveId):
        left = yield from self.write(a, "RELEASE", m)
        while left:
            left = yield from self.write(a, "PURGE", m)
