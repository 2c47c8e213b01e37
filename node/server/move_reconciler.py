"""The move reconciler: on the metadata group's leader, drive every slot move of the map.

The intent lives in the map (a Migration and its phase), so the reconciler keeps no state of
its own that matters: a new metadata leader (or this one after a restart) reads the map and
goes on. For each migration, one step per round:

    phase      data-group work (MoveSteps, idempotent;        then propose (AdvanceMove)
               docs/slot-move-steps.md)
    PRECOPYING pre-copy A -> B while A serves (resumes from   Precopied
               B's pre-copy cursor; best effort)
    SEALING    seal at A                                      Sealed
    COPYING    the map's cursor is not END: copy A -> B       Copied(END, replicated + chunks)
               (resumes from B's replicated cursor)
               the map's cursor is END: verify -> digest      Verified(digest)
    VERIFIED   -                                              Decide   (the point of no return)
    DECIDED    activate at B (the verified digest);           Released
               release at A
    RELEASED   activate at B again (B live: idempotent)       Finish
    ABORTED    abort: UNSEAL at A, DROP_STAGING at B          Finish

The pre-copy is why writes wait only for the delta: the sealed copy sends every key again,
but a big stream as a DELTA record against B's pre-copy (the nodes after B's last one, plus
its groups), checked at B by a prefix digest and at the end by the manifest digest as before.
A pre-copy step the fsm refuses (A's keys changed under a piece, ...) is not fatal: Precopied
is proposed anyway, and the sealed copy sends in full whatever the pre-copy missed.

The map records the copy once, when it is complete (B's own replicated cursor is what a
resumed copy starts from, so per-chunk map writes would only cost metadata entries).

Every change names the epoch of the map it was planned on (compare-and-set). A refusal is
normal: StaleEpoch whose effect is already in the map (changes.already_applied: a re-sent or
duplicated step) counts as done; any other refusal means the map moved on, and the next round
plans from the new map. A proposal whose outcome is unknown is the same: the next round reads
the map. A move that has not reached DECIDED within move_timeout_s of this leader first seeing
it is aborted (Abort("timeout"); refused if the decision committed meanwhile). The clock
restarts with each new leader: a timeout aborts later, never wrongly.

The reconciler stops acting the moment the node stops leading group 0 (each round checks),
and a data step that fails (a group without a leader, an RPC error) is retried next round
after RETRY_S; steps never assume the previous round's work happened. A step a data group's
fsm refuses (MoveStepRefused: a stale move, a digest mismatch) is final: before the decision
the move is aborted with that reason; after it the step is retried (the map cannot go back).

Failpoints (tests): XRAFT_FAILPOINTS="name,name" kills this process with SIGKILL when the
reconciler reaches `move.<phase>.step` (before the data step of that phase) or
`move.<phase>.propose` (data step done, change not yet proposed). With XRAFT_FAILPOINTS_ONCE
set to a directory, each failpoint fires once (the process that creates DIR/<name> dies), so
the next metadata leader, started with the same environment, goes on. No sleeps: the test waits for
the process to die.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Optional, Protocol

import grpc

from ..cluster.changes import AdvanceMove, StaleEpoch, already_applied
from ..cluster.meta_machine import MetaApplied, MetaRefused
from ..cluster.slot_map import BEFORE_DECISION, MAX_REASON_CHARS, Migration, MovePhase, SlotMap
from ..cluster.slot_move import Abort, Copied, Decide, Finish, MoveError, Precopied, Released, Sealed, Verified
from ..fsm.slot_moves import END
from .slot_move_steps import MoveStepRefused

log = logging.getLogger("xraft.reconciler")

FAILPOINTS_ENV = "XRAFT_FAILPOINTS"
FAILPOINTS_ONCE_ENV = "XRAFT_FAILPOINTS_ONCE"   # a directory: each failpoint fires once (a file per name)
MOVE_TIMEOUT_S = 60.0       # before DECIDED; then Abort("timeout")
PROPOSE_TIMEOUT_S = 5.0
IDLE_WAIT_S = 0.5           # no move, or not the leader: look again after this (or on a new map)
RETRY_S = 0.2               # after a failed step


# The copy cursor once everything is staged: the data side's own END (docs/slot-move-steps.md),
# never a copy of its value (the cursor grew from 6 to 10 bytes once already).
COPY_END = END


class MoveSteps(Protocol):
    """The data-group side of a move (slot_move_steps.py, docs/slot-move-steps.md). Every
    method is idempotent; raising means "not done, try again"."""

    async def seal(self, source_group: int, first: int, last: int, started_epoch: int) -> None: ...
    # optional: precopy(source_group, target_group, first, last, started_epoch) -> keys pre-copied
    async def copy(self, source_group: int, target_group: int, first: int, last: int, started_epoch: int,
                   cursor: Optional[bytes] = None, progress=None) -> tuple: ...
    async def verify(self, source_group: int, target_group: int, first: int, last: int,
                     started_epoch: int) -> bytes: ...
    async def activate(self, target_group: int, first: int, last: int, started_epoch: int,
                       digest: bytes) -> None: ...
    async def release(self, source_group: int, first: int, last: int, started_epoch: int) -> None: ...
    async def abort(self, source_group: int, target_group: int, first: int, last: int,
                    started_epoch: int) -> None: ...


class MetaApi(Protocol):
    """What the reconciler needs of the metadata group (meta_group.MetaGroup)."""

    @property
    def slot_map(self) -> SlotMap: ...
    def is_leader(self) -> bool: ...
    async def propose(self, change, timeout: float): ...
    async def wait_change(self, timeout: float) -> None: ...


def move_steps_factory(node) -> MoveSteps:
    """The node's MoveSteps (slot_move_steps.py): each group's leader looked for among its
    voters in the node's current map, reached with the node's own token and TLS."""
    from .slot_move_steps import MoveSteps as GrpcMoveSteps

    def voters(gid: int) -> list:
        m = node.layout
        spec = m.groups[gid]
        order = [spec.preferred_leader] + [v for v in spec.voters if v != spec.preferred_leader]
        return [m.nodes[n].grpc for n in order]

    tls = node.tls
    if tls is None:
        return GrpcMoveSteps(voters, token=node.token)
    options = (("grpc.ssl_target_name_override", tls.server_name),) if tls.server_name else None

    def channel(address: str) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options)
    return GrpcMoveSteps(voters, token=node.token, channel=channel)


def _reason(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:MAX_REASON_CHARS]


def failpoint(name: str) -> None:
    names = os.environ.get(FAILPOINTS_ENV, "")
    if not names or name not in names.split(","):
        return
    once = os.environ.get(FAILPOINTS_ONCE_ENV)
    if once:
        try:                # the first process to get here creates the mark and dies; later ones go on
            os.close(os.open(os.path.join(once, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    log.warning("failpoint %s: SIGKILL", name)
    os.kill(os.getpid(), signal.SIGKILL)


async def run_rounds(round_fn, meta: MetaApi, what: str, busy_pause_s: float = 0.0,
                     idle_s: float = IDLE_WAIT_S) -> None:
    """A reconciler's loop: round_fn() -> busy, forever. A round that raises is retried after
    RETRY_S (the map says where to resume); an idle one waits for the next map (or idle_s);
    a busy one goes on after busy_pause_s."""
    while True:
        try:
            busy = await round_fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a step failed: the map says where to resume
            log.info("%s failed (%r); retrying", what, exc)
            await asyncio.sleep(RETRY_S)
            continue
        if not busy:
            await meta.wait_change(idle_s)
        elif busy_pause_s:
            await asyncio.sleep(busy_pause_s)


class MoveReconciler:
    def __init__(self, meta: MetaApi, steps: MoveSteps, *, move_timeout_s: float = MOVE_TIMEOUT_S,
                 clock=time.monotonic):
        self.meta = meta
        self.steps = steps
        self.move_timeout_s = move_timeout_s
        self._clock = clock
        self._first_seen: dict[tuple, float] = {}   # (first, last, started_epoch) -> clock
        self.rounds = 0

    async def run(self) -> None:
        await run_rounds(self.round, self.meta, "slot move step")

    async def round(self) -> bool:
        """One step of every migration in the map. False when there was nothing to do."""
        self.rounds += 1
        if not self.meta.is_leader():
            self._first_seen.clear()
            return False
        m = self.meta.slot_map
        if not m.migrations:
            self._first_seen.clear()
            return False
        live = set()
        for mig in list(m.migrations.values()):
            if not self.meta.is_leader():
                return False
            live.add(self._id(mig))
            await self.step(self.meta.slot_map.migrations.get(mig.key, mig))
        for k in list(self._first_seen):
            if k not in live:
                del self._first_seen[k]
        return True

    @staticmethod
    def _id(mig: Migration) -> tuple:
        return (mig.first, mig.last, mig.started_epoch)

    async def step(self, mig: Migration) -> None:
        """Advance `mig` by one phase (module doc)."""
        now = self._clock()
        seen = self._first_seen.setdefault(self._id(mig), now)
        phase = mig.phase
        if phase in BEFORE_DECISION and now - seen > self.move_timeout_s:
            await self._propose(mig, Abort("timeout"))
            return
        name = "move.%s" % phase.value
        failpoint(name + ".step")
        try:
            event = await self._data_step(mig)
        except MoveStepRefused as exc:
            # A data group's fsm refused the step (a stale move, a digest mismatch...): the
            # same request would be refused again. Before the decision the move is given up;
            # after it there is no way back, so the step is retried (and logged) until it works.
            if phase not in BEFORE_DECISION:
                raise
            log.warning("slots %d-%d -> group %d: %s refused (%s): aborting the move", mig.first, mig.last,
                        mig.target, phase.value, exc)
            await self._propose(mig, Abort(_reason(exc)))
            return
        failpoint(name + ".propose")
        await self._propose(mig, event)

    async def _data_step(self, mig: Migration):
        """The data-group work of mig's phase (module doc); the event to propose next."""
        phase = mig.phase
        st, a, b, run = self.steps, mig.source, mig.target, (mig.first, mig.last, mig.started_epoch)
        if phase == MovePhase.PRECOPYING:
            await self._precopy(mig)
            event = Precopied()
        elif phase == MovePhase.SEALING:
            await st.seal(a, *run)
            event = Sealed()
        elif phase == MovePhase.COPYING and mig.cursor != COPY_END:
            chunks = 0

            def progress(_cursor, _keys):
                nonlocal chunks
                chunks += 1
            cursor, _keys = await st.copy(a, b, *run, cursor=mig.cursor or None, progress=progress)
            event = Copied(bytes(cursor), mig.replicated + max(1, chunks))
        elif phase == MovePhase.COPYING:
            event = Verified(bytes(await st.verify(a, b, *run)))
        elif phase == MovePhase.VERIFIED:
            event = Decide()
        elif phase == MovePhase.DECIDED:
            await st.activate(b, *run, mig.digest)
            await st.release(a, *run)
            event = Released()
        elif phase == MovePhase.RELEASED:
            await st.activate(b, *run, mig.digest)
            event = Finish()
        else:
            await st.abort(a, b, *run)
            event = Finish()
        return event

    async def _precopy(self, mig: Migration) -> None:
        """The pre-copy before the seal (module doc); a refusal only means less was pre-copied.
        A MoveSteps without `precopy` (an older one, a test's) pre-copies nothing."""
        precopy = getattr(self.steps, "precopy", None)
        if precopy is None:
            return
        try:
            keys = await precopy(mig.source, mig.target, mig.first, mig.last, mig.started_epoch)
        except MoveStepRefused as exc:
            log.info("slots %d-%d -> group %d: pre-copy refused (%s): going on to the seal", mig.first, mig.last,
                     mig.target, exc)
            return
        log.info("slots %d-%d -> group %d: pre-copied %d keys", mig.first, mig.last, mig.target, keys)

    async def _propose(self, mig: Migration, event) -> bool:
        """Propose one step; True when its effect is in the map."""
        m = self.meta.slot_map
        change = AdvanceMove(m.epoch, mig.first, mig.last, mig.started_epoch, mig.target, event)
        result = await self.meta.propose(change, PROPOSE_TIMEOUT_S)
        if isinstance(result, MetaApplied):
            log.info("slots %d-%d -> group %d: %s (epoch %d)", mig.first, mig.last, mig.target,
                     event.kind, result.slot_map.epoch)
            return True
        if isinstance(result, MetaRefused):
            err = result.error
            if isinstance(err, StaleEpoch):
                return already_applied(self.meta.slot_map, change)
            if isinstance(err, MoveError) and err.already_applied:
                return True
            log.info("slots %d-%d: %s refused: %s", mig.first, mig.last, event.kind, err)
        return False
