"""The driver's public surface: outcomes callers see, the protocols it drives, its options and
status. Split out of raft_driver.py (which holds the GroupDriver machinery) so each file stays
readable; raft_driver re-exports every name here.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ..raft.read_only import ReadOnlyOption
from ..raft.types import ConfState, Message, StateRole
from .disk_storage import DiskStorageOptions

if TYPE_CHECKING:
    from .raft_driver import GroupDriver


# ---------------------------------------------------------------- errors


class DriverError(Exception):
    def __init__(self, message: str, group_id: int):
        super().__init__(f"group {group_id}: {message}")
        self.group_id = group_id


class NotLeader(DriverError):
    """This replica is not the leader; `leader_id` is its best guess (0 = unknown)."""

    def __init__(self, group_id: int, leader_id: int, term: int):
        super().__init__(f"not leader (leader {leader_id or 'unknown'}, term {term})", group_id)
        self.leader_id = leader_id
        self.term = term


class ProposalDropped(DriverError):
    """The command did not and never will take effect; retrying is safe."""

    def __init__(self, group_id: int, reason: str):
        super().__init__(f"proposal dropped: {reason}", group_id)
        self.reason = reason


class UnknownOutcome(DriverError):
    """The entry reached the log at (term, index) and may or may not be committed."""

    def __init__(self, group_id: int, reason: str, term: int, index: int):
        super().__init__(f"outcome unknown for entry ({term}, {index}): {reason}", group_id)
        self.reason = reason
        self.term = term
        self.index = index


class ReadFailed(DriverError):
    def __init__(self, group_id: int, reason: str):
        super().__init__(f"read index failed: {reason}", group_id)
        self.reason = reason


# ---------------------------------------------------------------- interfaces


class StateMachine(Protocol):
    """The deterministic machine a group replicates (node/fsm provides the real one).

    apply() is called for every committed NORMAL entry with non-empty data, in
    index order, exactly once per incarnation (a new leader's empty entry and
    conf changes are the driver's business). Its return value resolves the
    proposer's future on this node. It must not raise: an exception means the
    replicas may diverge, so the group stops (fail-stop).
    """

    @property
    def applied_index(self) -> int:
        """Highest index passed to apply() or restore()."""
        ...

    def apply(self, index: int, data: bytes) -> Any:
        ...

    # Optional: a machine with `results_optional = True` also takes
    # apply(index, data, False) for entries no local caller waits for, and may then
    # skip building results (its state must change exactly the same).

    # Optional: `prepare(index, data, decoded) -> callable | None` with `prepare_min_bytes`
    # (int): the pure, costly part of applying an entry of at least that many bytes, for the
    # driver to run in the host's prepare_executor right before apply(index, ...)
    # (apply_ahead.py). The results and the state must not depend on whether it ran.

    # Optional: `prepare_restore(data) -> decoded` and `restore(data, index, prepared)`: a
    # snapshot installed from the leader is decoded off the loop (in the storage job that
    # persists it) and the result handed to restore(); a machine without them decodes in
    # restore(), on the loop.

    def snapshot(self) -> bytes:
        """The machine's whole state as of its last applied entry."""
        ...

    def restore(self, data: bytes, index: int) -> None:
        """Replace the state with `data` (a snapshot() taken at `index`)."""
        ...


class DriverHost(Protocol):
    """What a driver needs from the node loop (MultiRaft)."""

    loop: asyncio.AbstractEventLoop
    executor: Executor
    closing: bool

    def send(self, group_id: int, m: Message) -> None:
        ...

    def mark_dirty(self, driver: "GroupDriver") -> None:
        ...

    # Optional (MultiRaft has both): `inline_sync_bytes` (int; 0 = never sync on the
    # loop thread) and `run_now()` (pump the marked groups and send, from a loop
    # callback); a host without them gets executor syncs and the next loop pass.
    # Optional: `prepare_executor` (an Executor), where a machine's prepare() callables
    # run (apply_ahead.py); a host without one applies every entry wholly on the loop.


# ---------------------------------------------------------------- options and stats


@dataclass(frozen=True)
class GroupOptions:
    election_tick: int = 10
    heartbeat_tick: int = 1
    check_quorum: bool = True
    pre_vote: bool = True
    read_only_option: ReadOnlyOption = ReadOnlyOption.SAFE
    max_size_per_msg: int = 1 << 20
    max_inflight_msgs: int = 256
    max_uncommitted_entries_size: int = 64 << 20
    # A snapshot travels in chunks, this many bytes unacknowledged per follower at most: well
    # under the transport's per-link queue (TransportLimits.max_queued_bytes, 64 MiB).
    max_snapshot_chunk_bytes: int = 1 << 20
    max_snapshot_inflight_bytes: int = 8 << 20
    max_inflight_proposals: int = 20_000  # queued + awaiting apply; beyond: ProposalDropped
    max_proposal_bytes: int = 8 << 20
    max_proposals_per_ready: int = 4096  # bounds one Ready (and one WAL write)
    max_inbox_messages: int = 20_000  # inbound messages queued while busy; beyond: dropped
    max_pending_reads: int = 20_000
    snapshot_entries: int = 10_000  # snapshot once this many entries were applied since the last
    # ... or once this many bytes of entries were (and at least the last image's size): what a
    # restart replays stays bounded when records are big (XADD batches of thousands).
    snapshot_bytes: int = 64 << 20
    snapshot_keep_entries: int = 1_000  # entries kept behind a snapshot for slow followers
    # Images made by a forked child while the group goes on (snapshot_child.py; where fork
    # exists): the loop never stops for a state-sized serialization.
    snapshot_in_child: bool = True
    # Commit-index-only hard states are written without fsync (a lower commit on disk
    # is safe: Raft re-learns it); this bounds how many may sit unsynced in the WAL buffer.
    max_unsynced_commit_saves: int = 256
    # Per group, and a node hosts many groups: DiskStorage's 64 MiB cache defaults would
    # let 50 groups pin 6 GiB. 8 MiB still holds every entry a follower is likely to ask for.
    storage: DiskStorageOptions = field(default_factory=lambda: DiskStorageOptions(
        cache_bytes=8 << 20, snapshot_cache_bytes=8 << 20))
    seed: Optional[int] = None  # election jitter seed; None = from os.urandom
    # Idle groups stop ticking and heartbeating (node/raft/quiesce.py); MultiRaft's liveness
    # watch (liveness.py) wakes followers whose leader's node goes silent.
    quiesce: bool = False

    def validate(self) -> None:
        for name in ("max_inflight_proposals", "max_proposal_bytes", "max_proposals_per_ready",
                     "max_inbox_messages", "max_pending_reads", "snapshot_entries",
                     "snapshot_bytes", "max_unsynced_commit_saves"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GroupOptions.{name} must be > 0")
        if self.snapshot_keep_entries < 0:
            raise ValueError("GroupOptions.snapshot_keep_entries must be >= 0")


@dataclass
class GroupStats:
    readies: int = 0  # Readies handled
    syncs: int = 0  # Readies persisted with one storage sync (fsync under fsync=always)
    proposals: int = 0  # entries this driver appended as leader
    applied_entries: int = 0
    snapshots_created: int = 0
    snapshots_installed: int = 0
    snapshot_restores_prepared: int = 0  # installs whose decode ran off the loop (prepare_restore)
    snapshot_bytes_created: int = 0  # state machine image bytes of every snapshot created here
    last_snapshot_bytes: int = 0  # the newest snapshot's image (created or installed), bytes
    snapshots_in_child: int = 0  # images a forked child made (of snapshots_created, or discarded)
    snapshot_child_failures: int = 0  # children that made no file (fork refused, crash, exit status)
    prepared_off_loop: int = 0  # entries whose apply's costly part ran in the prepare thread
    inbox_dropped: int = 0
    step_errors: int = 0


@dataclass(frozen=True)
class DriverStatus:
    group_id: int
    node_id: int
    role: StateRole
    leader_id: int
    term: int
    commit: int
    applied: int
    snapshot_index: int
    first_index: int
    last_index: int
    inflight_proposals: int
    busy: bool
    failed: Optional[str]
    conf_state: ConfState


@dataclass(frozen=True)
class SoftStateChange:
    """What GroupDriver.on_change is told: this replica's role, leader or term moved,
    it fail-stopped, or (as leader) it appended `appended` entries ending at `last_index`."""
    role: StateRole
    leader_id: int
    term: int
    appended: int  # entries proposed into the log by this leader since the last report
    last_index: int  # the log's last index (the leader's: where the appended entries end)
    failed: bool


