"""Config: the knobs of one Raft group member, validated on construction of the node."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import MAX_SNAPSHOT_DATA_BYTES
from .read_only import ReadOnlyOption
from .types import NONE, ConfigError


@dataclass(slots=True)
class Config:
    id: int  # this node's ID. Invariant: > 0
    election_tick: int = 10  # ticks without a leader before campaigning. > heartbeat_tick
    heartbeat_tick: int = 1  # leader heartbeat period in ticks
    applied: int = 0  # last index the application applied (restart): not re-delivered
    max_size_per_msg: int = 1 << 20  # bytes of entries per MsgApp (at least one entry is sent)
    max_committed_size_per_ready: int = 64 << 20  # bytes of committed entries per Ready
    max_uncommitted_entries_size: int = 64 << 20  # leader's bytes of uncommitted payloads; 0 = no limit
    max_inflight_msgs: int = 256  # MsgApps in flight per follower (REPLICATE)
    max_inflight_bytes: int = 32 << 20  # bytes in flight per follower; 0 = no limit
    check_quorum: bool = True  # leader steps down without a quorum for an election timeout
    pre_vote: bool = True  # thesis §9.6
    # LEASE_BASED trusts that no other leader exists within an election timeout: safe only with
    # check_quorum AND bounded clock drift between nodes (thesis §6.4.1). SAFE needs neither.
    read_only_option: ReadOnlyOption = ReadOnlyOption.SAFE
    disable_proposal_forwarding: bool = False  # followers drop proposals instead of forwarding
    max_snapshot_chunk_bytes: int = 1 << 20  # bytes of snapshot data per MsgSnap
    # Snapshot bytes sent to one follower and not yet acknowledged (its chunk acks): the
    # window that keeps a large image from flooding the transport's queue. >= one chunk.
    max_snapshot_inflight_bytes: int = 8 << 20
    # An idle group stops ticking and heartbeating until a message wakes it (quiesce.py);
    # the application must then watch the leaders' nodes and call RawNode.wake().
    quiesce: bool = False
    rng: Any = None  # a random.Random-like object (randrange); required: the core imports no random

    def validate(self) -> None:
        if not isinstance(self.id, int) or self.id == NONE or self.id < 0:
            raise ConfigError("id", "must be a positive integer")
        if self.heartbeat_tick <= 0:
            raise ConfigError("heartbeat_tick", "must be > 0")
        if self.election_tick <= self.heartbeat_tick:
            raise ConfigError("election_tick", "must be greater than heartbeat_tick")
        if self.applied < 0:
            raise ConfigError("applied", "must be >= 0")
        for name in ("max_size_per_msg", "max_committed_size_per_ready", "max_inflight_msgs",
                     "max_snapshot_chunk_bytes", "max_snapshot_inflight_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be > 0")
        if self.max_snapshot_chunk_bytes > MAX_SNAPSHOT_DATA_BYTES:
            raise ConfigError("max_snapshot_chunk_bytes", "over the codec's snapshot limit")
        if self.max_snapshot_inflight_bytes < self.max_snapshot_chunk_bytes:
            raise ConfigError("max_snapshot_inflight_bytes", "must be >= max_snapshot_chunk_bytes")
        for name in ("max_uncommitted_entries_size", "max_inflight_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(name, "must be >= 0 (0 = no limit)")
        if self.read_only_option == ReadOnlyOption.LEASE_BASED and not self.check_quorum:
            raise ConfigError("read_only_option", "LEASE_BASED requires check_quorum")
        if self.quiesce and self.read_only_option == ReadOnlyOption.LEASE_BASED:
            raise ConfigError("quiesce", "a quiesced leader does not check its quorum: not with LEASE_BASED reads")
        if self.rng is None or not hasattr(self.rng, "randrange"):
            raise ConfigError("rng", "a random.Random-like object with randrange() is required")
