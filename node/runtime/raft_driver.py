"""GroupDriver: one Raft group on this node — RawNode + DiskStorage + StateMachine.

The driver turns the core's Ready contract (raft/rawnode.py) into futures for
callers. It never runs on its own: MultiRaft (multiraft.py) owns the event
loop, calls pump() for groups with something to do, and sends what the driver
queues. One Ready at a time per group:

    pump()   (loop thread; only while not busy)
        ticks, queued inbound messages, queued actions (transfer, reports),
        EVERY queued proposal (group commit), one ReadIndex for all queued
        reads, then at most ONE Ready:
          rd.messages -> outbox at once (the leader replicates while it writes)
          if the Ready must be durable: busy = True, and the job goes to the
              thread executor AT ONCE (submitted from here, no task): save
              snapshot/entries/hard state + ONE sync (fsync); the worker's
              end is one call_soon_threadsafe straight into _persisted():
          then (loop thread) _finish(): rd.persisted_messages -> outbox,
              install snapshot, apply committed entries, conf changes,
              read states, advance(); maybe snapshot + compact (executor);
              busy = False, on_idle(), and the node loop pumps the group and
              sends what it queued right there (MultiRaft.run_now), without
              waiting for the loop task's wake-up
        Ready without must_sync (heartbeats, commit-index moves, applies) is
        finished inline: no thread hop, no fsync.

Inline sync. A non-leader's Ready that must be durable but has no
rd.messages (a follower's append, whose ack is a persisted message) and at most
MultiRaftOptions.inline_sync_bytes of entries is written and fsynced right
in pump(), on the loop thread, then finished like a Ready without sync.
Nothing could overlap with that write (the ack waits for it in any case),
and the two thread hops (~0.1-0.3 ms each on a busy machine, on the
critical path of every commit) disappear. The order is the Ready contract's
exactly: persist, then persisted_messages, then apply, then advance. A
leader's Ready always goes to the executor (even one without MsgApps: a
single-node group, or every follower paused): its loop keeps taking requests
while it syncs, which is what gathers them into large records
(raft_backend.py, group commit; measured: inline leader syncs made every
request a record of its own). For the same reason a follower does not sync
inline while its node leads another group or follows another awake one (the host's
inline_sync_bytes is 0 then; multiraft.py "Inline syncs only while the node leads no
awake group").

Why "busy" blocks the whole group while its fsync runs: DiskStorage and the
WAL are not thread-safe, and the core reads storage (entries for MsgApp,
terms) from step()/ready(). So while a group's storage is in the executor
nothing touches that group's core; its inbound messages, ticks and proposals
queue up and go into the NEXT Ready — which is exactly what makes the batches
large under load (one fsync per batch). Other groups keep running.

Outcomes a caller can see (all DriverError, all carry group_id):
  NotLeader(leader_id)  this node cannot take writes; nothing was proposed.
  ProposalDropped       the command did not and will not take effect (never
                        reached the log, or its slot was committed with
                        something else). Safe to retry.
  UnknownOutcome        the entry reached the log and may or may not commit
                        (leadership lost, deadline passed, shutdown, group
                        failure). Never reported as failure: it might commit.
  ReadFailed            a linearizable read could not be confirmed. Safe to retry.

Linearizable reads (read_index()) are batched into one ReadIndex round per pump
and answered once applied here: read_index.py (ReadIndexQueue).

Proposals come with a future (propose(): the caller awaits it) or a plain
callback (propose_nowait(): called synchronously from inside the driver,
e.g. from apply — no task and no future hop per record; RaftBackend uses it).

Proposals are matched to applied entries by (term, index): the leader's log
position is known the moment propose() appends, and an entry applied at that
index with the same term IS ours (Log Matching). A request id inside the data
is not needed for matching; the state machine may still use one to dedupe
client retries after UnknownOutcome.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
from collections import deque
from typing import Any, Callable, Optional, Sequence, Union

from ..invariant import invariant
from ..raft.codec import decode_conf_change_entry
from ..raft.config import Config
from ..raft.rawnode import RawNode, Status
from ..raft.types import NONE, ConfChange, ConfChangeError, ConfChangeV2, ConfState, Entry, EntryType, \
    HardState, Message, ProposalDropped as CoreProposalDropped, Ready, Snapshot, \
    SnapshotMetadata, StateRole, StepError
from . import apply_ahead, driver_proposals, driver_snapshots, latency_trace
from .disk_storage import DiskStorage
from . import snapshot_child
from .proposal import Callback, Proposal, monotonic_ms
from .read_index import ReadIndexQueue, settle
from .snapfile import snapshot_bytes

log = logging.getLogger("xraft.driver")

# The public surface (errors, protocols, options, status) lives in driver_api.py.
from .driver_api import (  # noqa: F401  (re-exported)
    DriverError,
    NotLeader,
    ProposalDropped,
    UnknownOutcome,
    ReadFailed,
    StateMachine,
    DriverHost,
    GroupOptions,
    GroupStats,
    DriverStatus,
    SoftStateChange,
)


# ---------------------------------------------------------------- internals

def _entries_bytes(entries: Sequence[Entry]) -> int:
    n = 0
    for e in entries:
        n += len(e.data) + 32
    return n


class GroupDriver(driver_proposals.Proposals, apply_ahead.ApplyAhead, driver_snapshots.Snapshots):
    """One group member. Build with GroupDriver.open(); MultiRaft.add_group() does."""

    def __init__(self, group_id: int, node_id: int, storage: DiskStorage, sm: StateMachine,
                 options: GroupOptions, host: DriverHost):
        # Use open().
        self.group_id = group_id
        self.node_id = node_id
        self.storage = storage
        self.sm = sm
        self.options = options
        self.host = host
        self.stats = GroupStats()
        snap = storage.snapshot()
        if not snap.is_empty():
            sm.restore(snapshot_bytes(snap), snap.metadata.index)
            invariant(sm.applied_index == snap.metadata.index, "state machine restored to the snapshot index")
        self.applied = snap.metadata.index  # Invariant: everything <= applied is in the state machine
        self.snap_index = snap.metadata.index  # newest snapshot in storage
        self.stats.last_snapshot_bytes = len(snap.data)
        self._bytes_since_snap = 0  # entry bytes applied since the last image (_snapshot_due)
        # Snapshots imaged in a forked child (snapshot_child.py) while the group goes on:
        self._child_images = options.snapshot_in_child and snapshot_child.available()
        self._image_task: Optional[asyncio.Task] = None  # a child is imaging (at most one)...
        self._image: Optional[snapshot_child.ChildImage] = None  # ...this one
        self._child_failures_in_row = 0  # driver_snapshots.MAX_CHILD_FAILURES in a row: images in process from then on
        self._image_done: Optional[tuple] = None  # (plan, tmp, data length): adopt at the next pump
        self.conf_state = snap.metadata.conf_state  # configuration as of `applied`
        rng = random.Random(options.seed if options.seed is not None else int.from_bytes(os.urandom(8), "big"))
        self.rn = RawNode(Config(
            id=node_id, rng=rng, applied=snap.metadata.index,
            election_tick=options.election_tick, heartbeat_tick=options.heartbeat_tick,
            check_quorum=options.check_quorum, pre_vote=options.pre_vote,
            read_only_option=options.read_only_option, max_size_per_msg=options.max_size_per_msg,
            max_inflight_msgs=options.max_inflight_msgs,
            max_uncommitted_entries_size=options.max_uncommitted_entries_size,
            max_snapshot_chunk_bytes=options.max_snapshot_chunk_bytes,
            max_snapshot_inflight_bytes=options.max_snapshot_inflight_bytes,
            quiesce=options.quiesce), storage)
        self.busy = False  # storage is in the executor: nothing may touch rn or storage
        self.failed: Optional[BaseException] = None
        self.closed = False
        self.task: Optional[asyncio.Task] = None
        self.pending_ticks = 0
        self._wake: Optional[bool] = None  # request_wake(lease_expired) not yet given to the core
        self._inbox: deque[Message] = deque()
        self._actions: deque[tuple[Callable[[], None], asyncio.Future]] = deque()  # callers' core calls
        self._unreachable: set[int] = set()  # peers to report_unreachable (deduplicated)
        self._snap_reports: list[tuple[int, bool]] = []  # (peer, ok) for report_snapshot
        self._queue: deque[Proposal] = deque()  # not yet given to the core
        self._pending: dict[int, Proposal] = {}  # index -> proposal appended in _lead_term
        self._lead_term = 0
        # Proposals of a lost leadership wait this many more ticks for their fate (_check_leadership).
        self._orphaned_term = 0
        self._orphan_ticks = 0
        self._inflight = 0  # Invariant: == len(_queue) + len(_pending)
        self._reads = ReadIndexQueue(group_id, options.max_pending_reads)  # linearizable reads
        self._unsynced_commit_saves = 0
        self._log_bounds = (storage.first_index(), storage.last_index())  # as of the last storage job
        # on_change(SoftStateChange), loop thread, from inside pump(): must be quick and must not
        # call back into the driver's core. Set by the owner (RaftBackend) after open().
        self.on_change: Optional[Callable[[SoftStateChange], None]] = None
        # on_idle(), loop thread, each time a storage job ends (the group is no longer busy),
        # before the node loop pumps the group again: must be quick; may propose.
        self.on_idle: Optional[Callable[[], None]] = None
        self._idle_waiters: list[asyncio.Future] = []
        # The optional parts of the host and machine protocols (driver_api.py), looked up once.
        # The host may change its inline_sync_bytes at any time (MultiRaft: 0 while the node
        # leads a group), so it is read at each Ready; a host without one never syncs inline.
        self._host_inline = hasattr(host, "inline_sync_bytes")
        self._host_run_now = getattr(host, "run_now", None)
        # fsync=batch's clock (monotonic ms, read from the executor too); a host (a test) may
        # supply now_ms(). The timer: see _arm_flush().
        self._now_ms: Callable[[], int] = getattr(host, "now_ms", None) or monotonic_ms
        self._flush_timer: Optional[asyncio.TimerHandle] = None
        self._flush_wanted = False  # the timer fired: pump() starts a flush job if still due
        self._results_optional = bool(getattr(sm, "results_optional", False))
        # Costly applies off the loop (apply_ahead.py): the machine's prepare() for entries of
        # at least prepare_min_bytes, run in the host's prepare_executor; where it stopped.
        self._prep_executor = getattr(host, "prepare_executor", None)
        self._prepare = getattr(sm, "prepare", None) if self._prep_executor is not None else None
        self._prepare_min_bytes = int(getattr(sm, "prepare_min_bytes", 0))
        self._ahead: Optional[tuple] = None  # (Ready, position of its committed entry, callable)
        # An installed snapshot's decode, made in the storage job that persisted it (_persist):
        # (its data, the machine's prepare_restore() result); taken by _install for that data only.
        self._restore_prepared: Optional[tuple] = None
        self._reported = (StateRole.FOLLOWER, NONE, 0, False)  # (role, lead, term, failed) last told
        self._reported_proposals = 0

    @classmethod
    def open(cls, group_id: int, node_id: int, data_dir: str, sm: StateMachine, options: GroupOptions,
             host: DriverHost, bootstrap_voters: Sequence[int] = (),
             bootstrap_learners: Sequence[int] = ()) -> "GroupDriver":
        """Open (or create) the group's storage in `data_dir` and recover the state machine.

        bootstrap_voters: for a founding member of a new group, the initial voters;
        written as a snapshot at index 1, term 1 only if the directory is empty
        (a restart ignores it). A member added later passes () and is caught up by
        the leader's snapshot. bootstrap_learners: the founding learners, with the voters. Blocking (disk reads): call from a thread.
        """
        options.validate()
        storage = DiskStorage.open(data_dir, options.storage)
        try:
            fresh = (storage.last_index() == 0 and storage.snapshot().is_empty()
                     and storage.hard_state() == HardState())
            if fresh and bootstrap_voters:
                cs = ConfState(voters=tuple(sorted(set(bootstrap_voters))),
                               learners=tuple(sorted(set(bootstrap_learners) - set(bootstrap_voters))))
                storage.apply_snapshot(Snapshot(SnapshotMetadata(index=1, term=1, conf_state=cs), sm.snapshot()))
                storage.sync()
            return cls(group_id, node_id, storage, sm, options, host)
        except BaseException:
            storage.close()
            raise

    # ------------------------------------------------ public API (loop thread)

    async def propose(self, data: bytes, timeout: Optional[float] = None) -> Any:
        """Replicate `data`; the state machine's apply() result once applied on this node."""
        return await self._submit(self._checked_data(data), None, timeout)

    def _checked_data(self, data) -> bytes:
        data = bytes(data)
        if len(data) > self.options.max_proposal_bytes:
            raise ProposalDropped(self.group_id, f"{len(data)} bytes over the limit "
                                                 f"{self.options.max_proposal_bytes}")
        if not data:
            # An empty entry is what a new leader appends; we never give the machine one.
            raise ProposalDropped(self.group_id, "empty proposal")
        return data

    def propose_nowait(self, data: bytes, callback: Callable[[Any, Optional[BaseException]], None],
                       timeout: Optional[float] = None, decoded: Any = None) -> None:
        """propose() without a coroutine or a future: queued at once, and
        callback(result, exc) is called exactly once, synchronously on the loop thread
        from inside the driver (apply, a deadline, a leadership change, shutdown) with
        the outcome propose() would have returned or raised. The callback must be quick
        and must not call into the driver. Raises now (nothing queued, no callback) for
        what propose() raises before queueing: NotLeader, ProposalDropped.

        `decoded`: what the state machine's decoding of `data` gives (its caller
        guarantees it, type for type); if this entry is applied here as proposed,
        sm.apply(index, data, True, decoded) is called with it."""
        self._enqueue(self._checked_data(data), None, timeout, Callback(callback), decoded)

    async def propose_conf_change(self, cc: Union[ConfChange, ConfChangeV2],
                                  timeout: Optional[float] = None) -> ConfState:
        """Resolves with the new ConfState once applied here; ConfChangeError if invalid
        (identically on every replica); ProposalDropped if the leader refused it (another
        change pending)."""
        return await self._submit(b"", cc, timeout)

    async def read_index(self, timeout: Optional[float] = None) -> int:
        """Linearizable read barrier: returns once this replica has applied everything
        committed before the call; the caller then reads the state machine. Works on
        followers too (the request is forwarded to the leader)."""
        self._check_usable()
        r = self.rn.raft
        if r.lead == NONE:
            raise NotLeader(self.group_id, NONE, r.term)
        fut = self._reads.add(self.host.loop, timeout)
        self.host.mark_dirty(self)
        return await fut

    async def transfer_leader(self, to: int) -> None:
        """Ask the leader to hand leadership to `to` (returns once the request is stepped)."""
        await self._run_action(lambda: self.rn.transfer_leader(to))

    async def campaign(self) -> None:
        """Start an election now (tests, operators)."""
        await self._run_action(self.rn.campaign)

    def status(self) -> DriverStatus:
        # Reads only core fields that never touch storage, and the storage's bounds as of its
        # last job: safe even while the storage is busy in the executor.
        r = self.rn.raft
        first, last = self._log_bounds
        return DriverStatus(
            group_id=self.group_id, node_id=self.node_id, role=r.state, leader_id=r.lead, term=r.term,
            commit=r.raft_log.committed, applied=self.applied, snapshot_index=self.snap_index,
            first_index=first, last_index=last,
            inflight_proposals=self._inflight, busy=self.busy,
            failed=repr(self.failed) if self.failed else None, conf_state=self.conf_state)

    def raft_status(self) -> Status:
        return self.rn.status()

    def is_leader(self) -> bool:
        return self.rn.raft.state == StateRole.LEADER

    # ------------------------------------------------ inputs from the node loop

    def push_message(self, m: Message) -> bool:
        if len(self._inbox) >= self.options.max_inbox_messages:
            self.stats.inbox_dropped += 1  # Raft retransmits; memory stays bounded
            return False
        self._inbox.append(m)
        return True

    def report_unreachable(self, peer: int) -> None:
        self._unreachable.add(peer)

    def request_wake(self, lease_expired: bool) -> None:
        """Wake the quiesced core at the next pump (liveness.py: its leader's node is silent,
        or no longer lists the group); lease_expired wins over a lease-keeping request."""
        self._wake = lease_expired or bool(self._wake)
        self.host.mark_dirty(self)

    def report_snapshot(self, peer: int, ok: bool) -> None:
        # At most a few snapshot streams per group exist at a time; keep the latest per peer.
        self._snap_reports = [(p, o) for p, o in self._snap_reports if p != peer]
        self._snap_reports.append((peer, ok))

    def pump(self) -> None:
        """Feed everything queued into the core and handle at most one Ready. Not while busy."""
        invariant(not self.busy, "pump() while the group's storage is in use")
        if self.failed is not None or self.closed:
            return
        if self._image_done is not None:
            # A child's snapshot file is written: publishing it is a (short) storage job.
            done, self._image_done = self._image_done, None
            self._start(self._adopt_image(*done))
            return
        rn = self.rn
        try:
            if self._wake is not None:
                rn.wake(self._wake)
                self._wake = None
            inbox = self._inbox
            while inbox:
                m = inbox.popleft()
                try:
                    rn.step(m)
                except StepError as exc:  # a message no correct peer sends: drop it, keep going
                    self.stats.step_errors += 1
                    log.warning("group %d node %d: %s", self.group_id, self.node_id, exc)
            # Messages before ticks: ticks that piled up while the group was busy must not
            # time out a leader whose heartbeats are sitting in the inbox.
            n, self.pending_ticks = self.pending_ticks, 0
            for _ in range(n):
                rn.tick()
            if n and self._orphan_ticks:
                self._count_orphan_ticks(n)
            if n and self._reads.in_round:
                self._reads.prune()
            if self._unreachable:
                for peer in self._unreachable:
                    rn.report_unreachable(peer)
                self._unreachable.clear()
            if self._snap_reports:
                for peer, ok in self._snap_reports:
                    rn.report_snapshot(peer, ok)
                self._snap_reports.clear()
            actions = self._actions
            while actions:
                fn, fut = actions.popleft()
                try:
                    fn()
                except CoreProposalDropped as exc:
                    settle(fut, exc=ProposalDropped(self.group_id, exc.reason))
                else:
                    settle(fut)
            self._check_leadership()
            if self._queue:
                self._propose_queued()
            if self._reads.queued:
                self._reads.issue(rn)
            if rn.has_ready():
                self._handle_ready(rn.ready())
            if self._orphan_ticks and rn.quiesced:
                self._end_orphans_beyond_log()
            if self._flush_wanted and not self.busy:
                self._flush_wanted = False
                if self.storage.fsync_deferred:
                    self._start(self._flush())
        except Exception as exc:
            self.fail_stop(exc)
        # Every role, leader or term change happens in step()/tick()/actions above, so
        # one look here sees them all (fail_stop() reports on its own).
        self._report()

    def _report(self) -> None:
        """Call on_change if the soft state moved or this leader appended entries."""
        cb = self.on_change
        if cb is None:
            return
        r = self.rn.raft
        now = (r.state, r.lead, r.term, self.failed is not None)
        appended = self.stats.proposals - self._reported_proposals
        if now == self._reported and not appended:
            return
        self._reported, self._reported_proposals = now, self.stats.proposals
        # Storage may be in the executor (a Ready was just handed off): the unstable tail or
        # the bounds of its last job, never the storage itself.
        last = r.raft_log.unstable.maybe_last_index()
        try:
            cb(SoftStateChange(r.state, r.lead, r.term, appended,
                               self._log_bounds[1] if last is None else last, now[3]))
        except Exception:  # the owner's bug must not fail-stop the group
            log.exception("group %d node %d: on_change callback failed", self.group_id, self.node_id)

    async def _run_action(self, fn: Callable[[], None]) -> None:
        self._check_usable()
        if len(self._actions) >= 64:  # operator calls are rare; a pile-up means a stuck group
            raise ProposalDropped(self.group_id, "too many queued leadership/campaign requests")
        fut = self.host.loop.create_future()
        self._actions.append((fn, fut))
        self.host.mark_dirty(self)
        await fut

    # ------------------------------------------------ Ready handling

    def _handle_ready(self, rd: Ready) -> None:
        self.stats.readies += 1
        send = self.host.send
        gid = self.group_id
        for m in rd.messages:
            send(gid, m)
        if rd.must_sync or rd.snapshot is not None \
                or (rd.hard_state is not None
                    and self._unsynced_commit_saves >= self.options.max_unsynced_commit_saves):
            self._unsynced_commit_saves = 0
            inline_bytes = self.host.inline_sync_bytes if self._host_inline else 0
            if not rd.messages and rd.snapshot is None and inline_bytes \
                    and self.rn.raft.state != StateRole.LEADER \
                    and _entries_bytes(rd.entries) <= inline_bytes:
                # Nothing to overlap the write with (a follower's append, a vote): sync
                # right here, then finish as a Ready without sync would (see "Inline sync").
                self._persist(rd)
                self._log_bounds = (self.storage.first_index(), self.storage.last_index())
                self.stats.syncs += 1
                self._arm_flush()
                if not self._finish(rd):
                    self._start_ahead()
                    return
                self.host.mark_dirty(self)  # advance() may have made the next Ready
                self._maybe_snapshot()
                return
            self._start_persist(rd)
            return
        if rd.hard_state is not None:
            # Only the commit index moved: buffer it, the next sync carries it.
            self.storage.save(rd.hard_state, ())
            self._unsynced_commit_saves += 1
        if not self._finish(rd):
            self._start_ahead()
            return
        self._maybe_snapshot()

    def _start_persist(self, rd: Ready) -> None:
        """Hand the Ready's storage job to the executor now (no task, no loop hop): the
        worker thread starts writing while this loop thread goes on to send rd.messages.
        Its end comes back as ONE call_soon_threadsafe straight into _persisted()."""
        self.busy = True
        try:
            job = self.host.executor.submit(self._persist, rd)
        except RuntimeError as exc:  # the executor is shut down
            self.fail_stop(exc)
            self._job_ended()
            return
        job.add_done_callback(functools.partial(self._persist_done, rd))

    def _persist_done(self, rd: Ready, job) -> None:
        """Worker thread (or the loop thread, if the job is already done)."""
        self.host.loop.call_soon_threadsafe(self._persisted, rd, job)

    def _persisted(self, rd: Ready, job) -> None:
        """Loop thread: the Ready is durable (or its job failed). Finish it and let the
        node loop pump this group at once: its inbound messages and proposals queued
        during the sync go into the next Ready without waiting for a loop wake-up."""
        exc = job.exception()
        if latency_trace.ON and rd.entries:
            latency_trace.mark("persisted", rd.entries[-1].index)
        if exc is None:
            self.stats.syncs += 1
            try:
                finished = self._finish(rd)
            except Exception as e:
                exc = e
            else:
                if not finished:            # the group stays busy until the Ready is finished
                    self._start_ahead()
                    self._run_host()
                    return
                if not self.host.closing and self._maybe_snapshot(job_ending=True):
                    self._run_host()  # flush what _finish queued; the group stays busy
                    return
        if exc is not None:
            self.fail_stop(exc)
        self._job_ended()
        self._run_host()

    def kick(self) -> None:
        """Let the node loop pump now what was just queued (proposals), when called from a
        loop callback; inside the node loop's own iteration it is a no-op (the group is
        already marked for the next one)."""
        self._run_host()

    def _run_host(self) -> None:
        if self._host_run_now is not None:
            self._host_run_now()

    def _start(self, coro) -> None:
        self.busy = True
        self.task = self.host.loop.create_task(self._busy(coro))

    async def _busy(self, coro) -> None:
        try:
            await coro
        except Exception as exc:
            self.fail_stop(exc)
        finally:
            self.task = None
            self._job_ended()

    def _job_ended(self) -> None:
        """The storage is ours again (loop thread)."""
        self.busy = False
        if not self.storage.closed:
            self._log_bounds = (self.storage.first_index(), self.storage.last_index())
            self._arm_flush()
        self.host.mark_dirty(self)
        waiters, self._idle_waiters = self._idle_waiters, []
        for w in waiters:
            settle(w)
        cb = self.on_idle
        if cb is not None:
            try:
                cb()
            except Exception:  # the owner's bug must not fail-stop the group
                log.exception("group %d node %d: on_idle callback failed", self.group_id, self.node_id)

    async def wait_idle(self) -> None:
        """Returns once no storage job of this group is running (at once if none is)."""
        while self.busy:
            w = self.host.loop.create_future()
            self._idle_waiters.append(w)
            await w

    def _persist(self, rd: Ready) -> None:
        """Executor thread. Order per the Ready contract: snapshot, entries, hard state, fsync.
        The clock lets fsync=batch defer the fsync: acks, votes and applies then rest on
        written, not yet fsynced records, as --fsync batch documents (see _arm_flush())."""
        st = self.storage
        if latency_trace.ON and rd.entries:
            latency_trace.mark("persist_start", rd.entries[-1].index)
        if rd.snapshot is not None:
            self._persist_snapshot(rd.snapshot)
        st.save(rd.hard_state, rd.entries)
        synced = st.sync(self._now_ms())
        if latency_trace.ON and rd.entries:
            latency_trace.mark("persist_done", rd.entries[-1].index)
        invariant(synced or not st.durable, "a durable storage's sync() returned False")

    # ------------------------------------------------ fsync=batch: the deferred fsync

    def _arm_flush(self) -> None:
        """Loop thread, storage idle: if the last sync deferred its fsync, one happens once
        batch_interval_ms has passed even if no other write comes (a group gone quiet)."""
        if self._flush_timer is None and not self.closed and self.storage.fsync_deferred:
            self._flush_timer = self.host.loop.call_later(self.storage.batch_interval_ms / 1000,
                                                          self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        self._flush_timer = None
        if self.closed or self.failed is not None:
            return
        self._flush_wanted = True
        self.host.mark_dirty(self)
        self._run_host()

    async def _flush(self) -> None:
        """Storage job: sync by the clock (if not yet due, _job_ended() re-arms the timer)."""
        await self.host.loop.run_in_executor(self.host.executor, lambda: self.storage.sync(self._now_ms()))

    def _finish(self, rd: Ready, resume_at: Optional[int] = None) -> bool:
        """After persisting: promise durability, apply, advance. Loop thread. False: stopped
        before a committed entry whose costly part must run off the loop first (self._ahead;
        the caller starts _apply_ahead(), which runs it, then resumes here at that entry)."""
        ents = rd.committed_entries
        start = 0 if resume_at is None else resume_at
        if resume_at is None:
            send = self.host.send
            gid = self.group_id
            for m in rd.persisted_messages:
                send(gid, m)
            if rd.snapshot is not None:
                self._install(rd.snapshot)
            if latency_trace.ON and ents:
                latency_trace.mark("commit", ents[-1].index)
        for i in range(start, len(ents)):
            e = ents[i]
            if self._prepare is not None and i != resume_at:
                fn = self._prepare_of(e)
                if fn is not None:
                    self._ahead = (rd, i, fn)
                    return False
            self._apply(e)
            self._bytes_since_snap += len(e.data)
        if latency_trace.ON and rd.committed_entries:
            latency_trace.mark("applied", rd.committed_entries[-1].index)
        for rs in rd.read_states:
            self._reads.on_read_state(rs)
        self.rn.advance(rd)
        if self._reads.waiting:
            self._reads.resolve(self.applied)
        if rd.soft_state is not None:
            self._check_leadership()
        return True

    def _apply(self, e: Entry) -> None:
        if e.index <= self.applied:
            return  # covered by the snapshot installed in this same Ready
        invariant(e.index == self.applied + 1, f"apply gap: {e.index} after {self.applied}")
        result: Any = None
        err: Optional[BaseException] = None
        if e.type == EntryType.NORMAL:
            if e.data:
                invariant(e.index > self.sm.applied_index, "state machine already has this index")
                p = self._pending.get(e.index)
                if p is not None and p.decoded is not None and p.term == e.term:
                    # Our own proposal, applied as proposed (same term, same index: the
                    # same entry): its in-memory form instead of decoding its bytes.
                    result = self.sm.apply(e.index, e.data, True, p.decoded)
                elif not self._results_optional or p is not None:
                    result = self.sm.apply(e.index, e.data)
                else:
                    # Nobody here waits for this entry (a follower's, another
                    # leader's): a state machine that declares results_optional
                    # may leave results unbuilt; its state changes the same.
                    self.sm.apply(e.index, e.data, False)
        else:
            try:
                self.conf_state = self.rn.apply_conf_change(decode_conf_change_entry(e))
                result = self.conf_state
            except ConfChangeError as exc:  # rejected identically by every replica
                err = exc
        self.applied = e.index
        self.stats.applied_entries += 1
        p = self._pending.pop(e.index, None)
        if p is None:
            return
        self._done(p)
        if e.term != p.term:
            err = ProposalDropped(self.group_id, f"log index {e.index} committed with term {e.term}'s entry")
        elif p.cc is not None and e.type == EntryType.NORMAL:
            err = ProposalDropped(self.group_id, "conf change refused by the leader (one is pending)")
        settle(p.fut, result, err)

    # ------------------------------------------------ failure and shutdown

    def fail_stop(self, exc: BaseException) -> None:
        """Fail-stop: a storage or state machine error leaves this replica's state uncertain."""
        if self.failed is None:
            log.error("group %d node %d failed; it stops serving", self.group_id, self.node_id,
                      exc_info=exc)
            self.failed = exc
        self.fail_outstanding(f"group failed: {exc!r}")
        self._report()

    def fail_outstanding(self, reason: str) -> None:
        """Resolve every caller: queued -> ProposalDropped, in the log -> UnknownOutcome.
        A snapshot child at work is killed (its file is dropped)."""
        if self._image_task is not None:
            if self._image is not None:
                self._image.kill()  # now: the group's directory may be reopened or deleted next
            self._image_task.cancel()
        actions, self._actions = self._actions, deque()
        for _, fut in actions:
            settle(fut, exc=ProposalDropped(self.group_id, reason))
        q, self._queue = self._queue, deque()
        for p in q:
            self._done(p)
            settle(p.fut, exc=ProposalDropped(self.group_id, reason))
        self._fail_pending(reason)
        self._reads.fail_all(reason)

    def close_storage(self, sync: bool = True) -> None:
        """Blocking: sync (clean shutdown) and close the storage. Never while busy."""
        invariant(not self.busy, "close_storage() while the storage is in use")
        self.closed = True
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self.storage.closed:
            return
        if sync and self.failed is None:
            self.storage.sync()
        self.storage.close()

