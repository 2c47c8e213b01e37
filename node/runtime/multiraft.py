"""MultiRaft: the per-node loop driving every Raft group hosted on this node.

One event loop per node; an iteration is a plain loop callback (no task).
Each iteration:

  1. if the tick timer fired: one tick for every group (a group whose storage
     is busy in the executor gets it later: ticks are counted, never lost);
  2. pump() every group that has something to do — it was ticked, got
     messages, proposals, reads, actions, or just finished a sync. A group
     with none of these is not looked at; an idle node costs one tick per
     group per tick interval plus its heartbeats, and no fsync at all;
  3. flush the outbox: every message of every group for the same peer goes
     out in ONE transport send (split only at max_batch_bytes /
     max_batch_messages). A refused send or a batch the transport later reports
     lost turns into report_unreachable (and report_snapshot(.., False) for
     snapshot messages) on the groups that sent them; a snapshot's last chunk
     accepted by the transport is reported as report_snapshot(.., True).

New work (mark_dirty, a tick) schedules ONE iteration with call_soon: it
runs after what the event loop already has ready (transport deliveries,
executor completions, proposers), so work arriving together is handled
together; an idle node schedules nothing until the next tick.

Iterations also run at once, inside the callback that brought the work
(run_now(); never nested in an iteration): when the transport delivers a
batch (its messages are stepped at once, a follower's append then syncs and
acks in that same call), when a group's storage job ends (the group is
pumped and its queued proposals and inbound messages go into the next Ready
at once), and when RaftBackend has just queued proposals (GroupDriver.kick).
Each saves a loop turn on the commit path; the iteration scheduled for the
same work then finds nothing left and costs one empty callback.

Commit-only appends. When the leader's commit index moves, the core sends every
follower an append with no entries that only carries the new commit (Raft
thesis 3.5: followers learn commits from later appends or heartbeats). Under
load the next record's append follows within a fraction of a millisecond and
carries a commit at least as large, so the commit-only one is pure cost: a gRPC
stream write here, a read, a Ready and an answer on the follower, another read
here. send() therefore holds such an append (the latest per peer and group) for
commit_hold_s; _flush() drops a held one that a later append of the same group
to the same peer supersedes (same term, starting at or after its index, commit
at least as large: the follower learns the same and answers for more), and
send() one that a heartbeat supersedes (same term, commit at least as large: a
quiesce heartbeat must not be followed by it, which would wake the group again);
whatever is not superseded goes out when the hold ends. Dropping one is no
different from the network losing it, which Raft tolerates; holding it delays
only the followers' apply (stale follower reads), never an acknowledgement,
which needs the leader's commit only. A lone write's commit reaches the
followers commit_hold_s late (2 ms by default).

fsyncs run in a thread pool (io_threads), except small follower appends
(inline_sync_bytes; raft_driver.py "Inline sync"). A group has at most one storage
job at a time (see raft_driver.py: "busy"), which keeps per-group ordering;
different groups sync in parallel.

Inline syncs only while the node leads no awake group and follows at most one. An
inline fsync blocks the loop thread (0.5-5 ms on a shared disk; 20-200 ms seen while a
slot move wrote MBs to the same disk: XRAFT_STALL_TRACE, bench/README.md session 10),
which costs nothing on a follower of one group (the ack waits for the sync anyway) but
stalls everything else on the loop: a follower of two awake groups made each group's
ack wait for the other's fsync too, one after the other. On a
sharded node that leads some groups and follows others, a follower append of each
followed group fsynced one after the other on the loop held up the node's own
leaders (taking requests, stepping acks, applying) for every one of them: profiled
in bench/sharded.py, 15-50 % of the loop's wall time. So while the node leads a
group that is not quiesced, follower appends go to the thread pool like the
leader's: their fsyncs run in parallel with each other (the file system merges
concurrent fdatasyncs of different files into shared journal commits) and with the
loop. Re-evaluated every tick (the leader set changes rarely; either path is
correct, this only picks the faster one).

Shutdown: close() stops the loop, waits for storage jobs already running
(a thread cannot be interrupted), resolves every caller (ProposalDropped for
proposals that never reached the log, UnknownOutcome for those that did,
ReadFailed for reads), closes the transport, syncs and closes every storage.
abort() is the fail-stop variant that leaves storages as they are (nothing
buffered is flushed); tests use it to model a process crash.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..cluster.slot_map import node_of_replica
from ..raft.types import Message, MessageType, StateRole
from . import apply_ahead
from .disk_storage import DiskStorage
from .liveness import LIVENESS_GROUP_ID, NodeLiveness
from .raft_driver import GroupDriver, GroupOptions, StateMachine
from .transport import Batch, Transport

log = logging.getLogger("xraft.multiraft")

MESSAGE_OVERHEAD_BYTES = 96  # encoded message head (codec._MSG_HEAD + framing), rounded up
ENTRY_OVERHEAD_BYTES = 21


@dataclass(frozen=True)
class MultiRaftOptions:
    tick_interval_s: float = 0.1
    io_threads: int = 4  # concurrent fsyncs (different groups)
    # A Ready whose entries are at most this many bytes is written and synced on the loop
    # thread instead of the executor (raft_driver.py, "Inline sync"); 0: always the executor.
    inline_sync_bytes: int = 128 << 10
    max_batch_bytes: int = 4 << 20  # one transport send; a single larger message goes alone
    max_batch_messages: int = 10_000
    max_groups: int = 10_000
    # An append that only carries a commit index (no entries) waits this long before it
    # is sent, and is dropped if a later append to the same peer and group supersedes it
    # meanwhile; 0: send at once. See "Commit-only appends" in the module docstring.
    commit_hold_s: float = 0.002
    group: GroupOptions = field(default_factory=GroupOptions)

    def validate(self) -> None:
        if self.tick_interval_s <= 0:
            raise ValueError("tick_interval_s must be > 0")
        if self.inline_sync_bytes < 0:
            raise ValueError("inline_sync_bytes must be >= 0")
        if not 0 <= self.commit_hold_s <= 0.1:
            raise ValueError("commit_hold_s must be in [0, 0.1]")
        if self.io_threads <= 0 or self.max_batch_bytes <= 0 or self.max_batch_messages <= 0 \
                or self.max_groups <= 0:
            raise ValueError("io_threads, max_batch_bytes, max_batch_messages, max_groups must be > 0")
        self.group.validate()


@dataclass
class LoopStats:
    iterations: int = 0
    ticks: int = 0
    pumps: int = 0  # group pump() calls
    flushes: int = 0  # iterations that had something to send
    sends: int = 0  # transport sends (batches)
    largest_batch: int = 0  # messages in the largest batch sent
    messages_sent: int = 0
    sends_refused: int = 0
    batches_lost: int = 0  # reported lost by the transport after being accepted
    messages_received: int = 0
    commits_held: int = 0  # commit-only appends held back (commit_hold_s)
    commits_superseded: int = 0  # ... and dropped: a later append to the peer carried more
    unknown_group_messages: int = 0


def message_size(m: Message) -> int:
    """Approximate encoded size, for batch limits (exact sizes would cost an encode)."""
    n = MESSAGE_OVERHEAD_BYTES + len(m.context)
    for e in m.entries:
        n += ENTRY_OVERHEAD_BYTES + len(e.data)
    if m.snapshot is not None:
        n += len(m.snapshot.data) + 64 + 8 * len(m.snapshot.metadata.conf_state.voters)
    return n


def _is_last_snapshot_chunk(m: Message) -> bool:
    return m.type == MessageType.SNAP and m.snapshot is not None \
        and m.chunk_offset + len(m.snapshot.data) >= m.chunk_total


class MultiRaft:
    def __init__(self, node_id: int, transport: Transport, options: MultiRaftOptions = MultiRaftOptions()):
        options.validate()
        if transport.node_id != node_id:
            raise ValueError(f"transport is node {transport.node_id}'s, not {node_id}'s")
        self.node_id = node_id
        self.transport = transport
        self.options = options
        self.stats = LoopStats()
        self.groups: dict[int, GroupDriver] = {}
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.executor = ThreadPoolExecutor(max_workers=options.io_threads,
                                           thread_name_prefix=f"xraft-io-{node_id}")
        self.prepare_executor = apply_ahead.new_executor(node_id)   # costly applies' pure part
        self.closing = False
        self.closed = False
        self._started = False
        self._scheduled = False  # an iteration is queued with call_soon
        self._dirty: dict[GroupDriver, None] = {}  # ordered set of groups to pump
        self._outbox: dict[int, list[tuple[int, Message]]] = {}
        # peer -> {group: its latest commit-only append}, sent by _release_held() unless a
        # later append of that group to that peer supersedes it first (_flush).
        self._held: dict[int, dict[int, Message]] = {}
        self._hold_handle: Optional[asyncio.TimerHandle] = None
        self._tick_due = False
        self._tick_handle: Optional[asyncio.TimerHandle] = None
        self._crashed_exc: Optional[BaseException] = None
        self._iterating = False
        # Read by GroupDriver at each durable Ready: options.inline_sync_bytes while this node
        # leads no awake group and follows at most one, else 0 (see "Inline syncs only while
        # the node leads no awake group"); set each tick.
        self.inline_sync_bytes = options.inline_sync_bytes
        # Quiesced groups' followers watch their leaders' nodes instead (liveness.py).
        self.liveness = NodeLiveness(node_id, silence_ticks=options.group.election_tick)

    # ------------------------------------------------ life cycle

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("already started")
        self.loop = asyncio.get_running_loop()
        self.transport.start(self)
        self._tick_handle = self.loop.call_later(self.options.tick_interval_s, self._on_tick)
        self._started = True
        self._wakeup()

    async def add_group(self, group_id: int, data_dir: str, sm: StateMachine,
                        bootstrap_voters: Sequence[int] = (),
                        options: Optional[GroupOptions] = None,
                        bootstrap_learners: Sequence[int] = (),
                        replica_id: Optional[int] = None) -> GroupDriver:
        """Open a group's storage (in the executor: recovery reads the whole WAL) and start driving it.
        `replica_id`: this node's Raft id in the group (default: the node id); it must live
        on this node (node_of_replica), so messages to it are routed here."""
        if self.loop is None or self.closing:
            raise RuntimeError("add_group() needs a started, open MultiRaft")
        if group_id in self.groups:
            raise ValueError(f"group {group_id} already on node {self.node_id}")
        if group_id == LIVENESS_GROUP_ID:
            raise ValueError(f"group id {group_id} is reserved for node liveness messages")
        if len(self.groups) >= self.options.max_groups:
            raise ValueError(f"node {self.node_id} already hosts {len(self.groups)} groups (limit)")
        raft_id = self.node_id if replica_id is None else replica_id
        if node_of_replica(raft_id) != self.node_id:
            raise ValueError(f"replica {raft_id} of group {group_id} is not on node {self.node_id}")
        opts = options or self.options.group
        g = await self.loop.run_in_executor(self.executor, GroupDriver.open, group_id, raft_id,
                                            data_dir, sm, opts, self, tuple(bootstrap_voters),
                                            tuple(bootstrap_learners))
        if self.closing:  # closed while we were opening: do not leak the storage
            await self.loop.run_in_executor(self.executor, g.close_storage)
            raise RuntimeError("MultiRaft closed while the group was opening")
        self.groups[group_id] = g
        self.mark_dirty(g)  # the first Ready re-applies committed entries after the snapshot
        return g

    async def remove_group(self, group_id: int) -> None:
        """Stop driving a group this node no longer replicates (it is out of the group's
        configuration): its callers are resolved as on shutdown, its storage synced and
        closed. Deleting its directory is the caller's."""
        g = self.groups.get(group_id)
        if g is None:
            return
        if g.busy:
            await g.wait_idle()
        del self.groups[group_id]
        self._dirty.pop(g, None)
        g.closed = True               # pump() does nothing from here on
        g.fail_outstanding("the group left this node")
        await self.loop.run_in_executor(self.executor, g.close_storage)

    def group(self, group_id: int) -> GroupDriver:
        return self.groups[group_id]

    async def close(self) -> None:
        """Clean shutdown (see the module docstring)."""
        if self.closed:
            return
        await self._stop("node shutting down")
        for g in self.groups.values():
            await self.loop.run_in_executor(self.executor, g.close_storage)
        self.executor.shutdown(wait=True)
        self.prepare_executor.shutdown(wait=True)
        self.closed = True

    async def abort(self) -> list[DiskStorage]:
        """Fail-stop without touching storage: returns the storages, still open, for the
        caller (a test modelling a crash) to dispose of."""
        await self._stop("node stopped")
        for g in self.groups.values():
            g.closed = True
        self.executor.shutdown(wait=True)
        self.prepare_executor.shutdown(wait=True)
        self.closed = True
        return [g.storage for g in self.groups.values()]

    async def _stop(self, reason: str) -> None:
        self.closing = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        if self._hold_handle is not None:
            self._hold_handle.cancel()
            self._hold_handle = None
        self._held.clear()
        # No iteration runs from here on (run_now() and a queued one see `closing`).
        # Storage jobs already in a thread run to completion; their callers are resolved
        # by them (applied) or below.
        busy = [g.wait_idle() for g in self.groups.values() if g.busy]
        if busy:
            await asyncio.gather(*busy, return_exceptions=True)
        for g in self.groups.values():
            g.fail_outstanding(reason)
        await self.transport.close()

    # ------------------------------------------------ DriverHost

    def send(self, group_id: int, m: Message) -> None:
        # A data group's Raft ids are replica ids (cluster/slot_map.py): the node is their low bits.
        peer = node_of_replica(m.to)
        if m.type == MessageType.HEARTBEAT and self._held:
            self._heartbeat_supersedes(peer, group_id, m)
        if m.type == MessageType.APP and not m.entries and self.options.commit_hold_s:
            held = self._held.get(peer)
            if held is None:
                held = self._held[peer] = {}
            held[group_id] = m  # replaces an older one: same peer and group, later state
            self.stats.commits_held += 1
            if self._hold_handle is None:
                self._hold_handle = self.loop.call_later(self.options.commit_hold_s, self._release_held)
            return
        box = self._outbox.get(peer)
        if box is None:
            box = self._outbox[peer] = []
        box.append((group_id, m))

    def mark_dirty(self, g: GroupDriver) -> None:
        self._dirty[g] = None
        self._wakeup()

    def _wakeup(self) -> None:
        """Queue one iteration behind what the event loop already has ready."""
        if not self._scheduled and self._started:
            self._scheduled = True
            self.loop.call_soon(self._scheduled_iteration)

    def _scheduled_iteration(self) -> None:
        self._scheduled = False
        if self._dirty or self._tick_due or self._outbox:
            self.run_now()

    def run_now(self) -> None:
        """One iteration now, from a loop callback; inside an iteration it does nothing
        (what was marked waits for the queued next one)."""
        if self.closing or not self._started or self._crashed_exc is not None or self._iterating:
            return
        try:
            self._iterate()
        except Exception as exc:
            self._crashed(exc)

    # ------------------------------------------------ TransportHandler

    def deliver(self, from_node: int, batch: Batch) -> None:
        if self.closing:
            return
        self.stats.messages_received += len(batch)
        groups = self.groups
        dirty = self._dirty
        self.liveness.heard(from_node)
        for gid, m in batch:
            if gid == LIVENESS_GROUP_ID:
                self.liveness.received(from_node, m)
                continue
            g = groups.get(gid)
            if g is None or g.failed is not None or m.to != g.node_id:
                # Not (yet) hosted here, or for another replica of the group than ours (a
                # newer one joining while ours leaves, or an older one): Raft retries.
                self.stats.unknown_group_messages += 1
                continue
            if g.push_message(m):
                dirty[g] = None
        if self._iterating:
            self._wakeup()
        else:
            self.run_now()  # step them now: no loop turn in between

    def unreachable(self, peer: int, lost: Batch) -> None:
        if self.closing:
            return
        self.stats.batches_lost += 1
        self._report_lost(peer, lost)

    def _report_lost(self, peer: int, lost: Batch) -> None:
        seen: set[int] = set()
        for gid, m in lost:
            g = self.groups.get(gid)
            if g is None:
                continue
            if gid not in seen:
                seen.add(gid)
                g.report_unreachable(m.to)       # the group's Raft id of the replica on `peer`
                self.mark_dirty(g)
            if m.type == MessageType.SNAP:
                g.report_snapshot(m.to, False)

    # ------------------------------------------------ the loop

    def _on_tick(self) -> None:
        self._tick_due = True
        self._wakeup()
        # Rescheduled from now, not from the planned time: a stalled loop slows the
        # node's clock instead of bursting ticks (a burst could expire election
        # timeouts of followers that did hear from their leader).
        self._tick_handle = self.loop.call_later(self.options.tick_interval_s, self._on_tick)

    def _crashed(self, exc: BaseException) -> None:
        # A bug in the loop itself: stop every group (callers get their typed outcome now
        # rather than at their deadlines) instead of serving from an unknown state.
        log.error("node %d: the Raft loop crashed", self.node_id, exc_info=exc)
        self._crashed_exc = exc  # no iteration runs any more
        for g in self.groups.values():
            g.fail_stop(exc)

    def _iterate(self) -> None:
        self._iterating = True
        try:
            self._iterate_once()
        finally:
            self._iterating = False

    def _iterate_once(self) -> None:
        st = self.stats
        st.iterations += 1
        if self._tick_due:
            self._tick_due = False
            st.ticks += 1
            dirty = self._dirty
            leads_awake = False
            awake = 0
            for g in self.groups.values():
                raft = g.rn.raft
                if raft.quiesced:
                    continue  # asleep: its tick is a no-op (a message or a wake marks it dirty)
                awake += 1
                if raft.state == StateRole.LEADER:
                    leads_awake = True
                g.pending_ticks += 1
                dirty[g] = None
            inline = not leads_awake and awake <= 1
            self.inline_sync_bytes = self.options.inline_sync_bytes if inline else 0
            self.liveness.on_tick(self.groups.values(), self.send)
        # Groups marked while we pump (their own follow-ups) wait for the next iteration.
        dirty, self._dirty = self._dirty, {}
        for g in dirty:
            if g.busy:
                continue  # re-marked when its storage job completes
            st.pumps += 1
            g.pump()
        if self._outbox:
            self._flush()

    def _release_held(self) -> None:
        self._hold_handle = None
        held, self._held = self._held, {}
        if self.closing:
            return
        for peer, by_group in held.items():
            box = self._outbox.get(peer)
            if box is None:
                box = self._outbox[peer] = []
            box.extend(by_group.items())
        self._wakeup()

    def _drop_superseded(self, peer: int, msgs: list) -> None:
        """A held commit-only append is superseded by a later append of the same group to
        the same peer that starts at or after its index and carries at least its commit:
        the follower learns everything the held one would tell it (and answers for more)."""
        held = self._held.get(peer)
        for gid, m in msgs:
            h = held.get(gid)
            if h is not None and m.type == MessageType.APP and m.term == h.term \
                    and m.index >= h.index and m.commit >= h.commit:
                del held[gid]
                self.stats.commits_superseded += 1
        if not held:
            del self._held[peer]

    def _heartbeat_supersedes(self, peer: int, group_id: int, m: Message) -> None:
        """A heartbeat carries the commit too: a held commit-only append of the same group and
        term with no larger commit tells the follower nothing more. Sent after it, it would
        wake a follower that the heartbeat (a quiesce heartbeat) has just put to sleep, which
        wakes the leader too: the whole group's heartbeat round again, for nothing."""
        held = self._held.get(peer)
        h = held.get(group_id) if held is not None else None
        if h is not None and h.term == m.term and h.commit <= m.commit:
            del held[group_id]
            self.stats.commits_superseded += 1
            if not held:
                del self._held[peer]

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        self.stats.flushes += 1
        max_bytes, max_msgs = self.options.max_batch_bytes, self.options.max_batch_messages
        for peer, msgs in outbox.items():
            if peer in self._held:
                self._drop_superseded(peer, msgs)
            start, size = 0, 0
            for k, (_, m) in enumerate(msgs):
                n = message_size(m)
                if k > start and (size + n > max_bytes or k - start >= max_msgs):
                    self._send_batch(peer, msgs[start:k])
                    start, size = k, 0
                size += n
            self._send_batch(peer, msgs[start:] if start else msgs)

    def _send_batch(self, peer: int, batch: list[tuple[int, Message]]) -> None:
        st = self.stats
        st.sends += 1
        st.messages_sent += len(batch)
        if len(batch) > st.largest_batch:
            st.largest_batch = len(batch)
        if not self.transport.send(peer, batch):
            st.sends_refused += 1
            self._report_lost(peer, batch)
            return
        for gid, m in batch:
            if m.type == MessageType.SNAP and _is_last_snapshot_chunk(m):
                g = self.groups.get(gid)
                if g is not None:
                    g.report_snapshot(m.to, True)
                    self.mark_dirty(g)
