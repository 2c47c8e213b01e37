"""Value types shared by the Raft core, its storage and its users.

Everything here is an immutable, slotted value (cheap to create, safe to share
between the core, the storage and the network) or a typed error. The binary
form of these values lives in codec.py.

Node IDs are positive integers; 0 (NONE) means "nobody" (no vote, no leader).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Optional

NONE = 0  # the "no node" ID: no vote cast, no leader known


class EntryType(enum.IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1  # data is an encoded ConfChange (one change, §4.1 single-server)
    CONF_CHANGE_V2 = 2  # data is an encoded ConfChangeV2 (joint consensus, §4.3)


@dataclass(frozen=True, slots=True, init=False)
class Entry:
    term: int  # Invariant: >= 1 for any entry in a log (term 0 only for the dummy before index 1)
    index: int  # Invariant: >= 1; consecutive within a log
    type: EntryType = EntryType.NORMAL
    data: bytes = b""  # opaque to Raft for NORMAL; an encoded conf change otherwise

    def __init__(self, term: int, index: int, type: EntryType = EntryType.NORMAL, data: bytes = b""):
        # Same signature as the generated __init__, about twice as fast: the frozen dataclass
        # one calls object.__setattr__(self, name, value) per field; the slot descriptors'
        # setters skip the by-name lookup. Entries are built twice per proposed command
        # (proposal, then with term/index on the leader), so this is the batch path's hot spot.
        _set_term(self, term)
        _set_index(self, index)
        _set_type(self, type)
        _set_data(self, data)


_set_term = Entry.term.__set__  # the slot descriptors of the class @dataclass(slots=True) built
_set_index = Entry.index.__set__
_set_type = Entry.type.__set__
_set_data = Entry.data.__set__


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0  # Invariant: never decreases on a node
    vote: int = 0  # node voted for in `term`; NONE if none. Invariant: fixed once set in a term
    commit: int = 0  # Invariant: never decreases; <= last index of the durable log


@dataclass(frozen=True, slots=True)
class ConfState:
    """A membership configuration (etcd's ConfState) plus the IDs ever removed.

    Invariant: voters, learners are sorted and disjoint; learners_next are in
    voters_outgoing; `removed` (sorted) is disjoint from every other set: an ID
    that has left the cluster may never rejoin (thesis §4: IDs never reused).
    """

    voters: tuple[int, ...] = ()  # incoming (or only) voter set
    learners: tuple[int, ...] = ()  # non-voting members receiving the log
    voters_outgoing: tuple[int, ...] = ()  # old voter set while joint; () when not joint
    learners_next: tuple[int, ...] = ()  # outgoing voters to become learners on leaving joint
    auto_leave: bool = False  # leave the joint config automatically once it is committed
    removed: tuple[int, ...] = ()  # IDs that were members and were removed; never re-added

    def is_joint(self) -> bool:
        return len(self.voters_outgoing) > 0

    def members(self) -> frozenset[int]:
        return frozenset(self.voters) | frozenset(self.learners) | frozenset(self.voters_outgoing)


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    index: int = 0  # last log index the snapshot covers; 0 = empty snapshot
    term: int = 0  # term of the entry at `index`
    conf_state: ConfState = field(default_factory=ConfState)  # configuration as of `index`


@dataclass(frozen=True, slots=True)
class Snapshot:
    metadata: SnapshotMetadata = field(default_factory=SnapshotMetadata)
    data: bytes = b""  # the state machine's image; opaque to Raft

    def is_empty(self) -> bool:
        return self.metadata.index == 0


EMPTY_SNAPSHOT = Snapshot()


class MessageType(enum.IntEnum):
    HUP = 0  # local: start an election
    BEAT = 1  # local: leader sends heartbeats
    PROP = 2  # proposal (local, or forwarded from a follower to the leader)
    APP = 3  # append entries
    APP_RESP = 4
    VOTE = 5
    VOTE_RESP = 6
    PRE_VOTE = 7
    PRE_VOTE_RESP = 8
    SNAP = 9  # install snapshot (one chunk of it)
    HEARTBEAT = 10
    HEARTBEAT_RESP = 11
    UNREACHABLE = 12  # local: the transport could not reach `frm`
    SNAP_STATUS = 13  # local report; a follower's chunk ack (chunk_total > 0) or rejection of a broken transfer
    CHECK_QUORUM = 14  # local: leader checks it heard from a quorum
    TRANSFER_LEADER = 15
    TIMEOUT_NOW = 16  # leader tells the transfer target to campaign now
    READ_INDEX = 17
    READ_INDEX_RESP = 18
    STORAGE_APPEND_RESP = 19  # reserved (etcd async storage writes); not produced


LOCAL_MESSAGES = frozenset(
    {MessageType.HUP, MessageType.BEAT, MessageType.UNREACHABLE, MessageType.CHECK_QUORUM}
)
# Requests a node passes on to its leader with their originator kept in `frm`: the leader
# answers a ReadIndex to the node that holds the waiting read, a forwarded transfer names its
# target in `frm`, and a proposal may travel two hops (stale leader hints). So over the link
# of node A they may name any sender; see link_violation().
FORWARDED_MESSAGES = frozenset({MessageType.PROP, MessageType.READ_INDEX, MessageType.TRANSFER_LEADER})
RESPONSE_MESSAGES = frozenset(
    {
        MessageType.APP_RESP,
        MessageType.VOTE_RESP,
        MessageType.PRE_VOTE_RESP,
        MessageType.HEARTBEAT_RESP,
        MessageType.UNREACHABLE,
        MessageType.READ_INDEX_RESP,
    }
)


@dataclass(frozen=True, slots=True, init=False)
class Message:
    type: MessageType
    to: int = NONE
    frm: int = NONE
    term: int = 0  # sender's term; 0 for local messages and proposals ("no term")
    log_term: int = 0  # APP: term of entry at `index`; VOTE: term of candidate's last entry;
    #                    APP_RESP reject: term of the follower's entry at reject_hint
    index: int = 0  # APP: index before `entries`; VOTE: candidate's last index; APP_RESP: ack/reject
    entries: tuple[Entry, ...] = ()
    commit: int = 0  # leader's commit index (APP, HEARTBEAT)
    snapshot: Optional[Snapshot] = None  # SNAP: metadata + this chunk's bytes (in .data)
    reject: bool = False
    reject_hint: int = 0  # APP_RESP reject: follower's guess of the matching index
    context: bytes = b""  # ReadIndex request context; campaign-transfer marker on VOTE
    chunk_offset: int = 0  # SNAP: byte offset of this chunk within the whole snapshot data
    chunk_total: int = 0  # SNAP: total snapshot data length. Invariant: offset+len(chunk) <= total

    def __init__(self, type: MessageType, to: int = NONE, frm: int = NONE, term: int = 0,
                 log_term: int = 0, index: int = 0, entries: tuple[Entry, ...] = (), commit: int = 0,
                 snapshot: Optional[Snapshot] = None, reject: bool = False, reject_hint: int = 0,
                 context: bytes = b"", chunk_offset: int = 0, chunk_total: int = 0):
        # Same signature and defaults as the generated one (checked in test_core_batching),
        # about twice as fast (see Entry.__init__): one Message per proposal and per send.
        _m_type(self, type)
        _m_to(self, to)
        _m_frm(self, frm)
        _m_term(self, term)
        _m_log_term(self, log_term)
        _m_index(self, index)
        _m_entries(self, entries)
        _m_commit(self, commit)
        _m_snapshot(self, snapshot)
        _m_reject(self, reject)
        _m_reject_hint(self, reject_hint)
        _m_context(self, context)
        _m_chunk_offset(self, chunk_offset)
        _m_chunk_total(self, chunk_total)


_MESSAGE_FIELDS = ("type", "to", "frm", "term", "log_term", "index", "entries", "commit", "snapshot",
                   "reject", "reject_hint", "context", "chunk_offset", "chunk_total")
# message_with() and Message.__init__ list the fields positionally: a field added without updating
# them would be silently dropped or reset to its default, so refuse to import instead.
if tuple(f.name for f in fields(Message)) != _MESSAGE_FIELDS:  # pragma: no cover
    raise ImportError("types.Message fields changed: update message_with()")
(_m_type, _m_to, _m_frm, _m_term, _m_log_term, _m_index, _m_entries, _m_commit, _m_snapshot, _m_reject,
 _m_reject_hint, _m_context, _m_chunk_offset, _m_chunk_total) = (
    getattr(Message, f.name).__set__ for f in fields(Message))  # slot descriptors' setters


def message_with(m: Message, to: int, frm: int, term: int) -> Message:
    """A copy of `m` with to/frm/term replaced.

    The core re-addresses and stamps messages on every send and forward; dataclasses.replace
    (getattr over every field by name, then keyword __init__) was ~65% of the per-proposal
    cost, a positional constructor call is several times cheaper.
    """
    return Message(m.type, to, frm, term, m.log_term, m.index, m.entries, m.commit, m.snapshot,
                   m.reject, m.reject_hint, m.context, m.chunk_offset, m.chunk_total)


def _same(raft_id: int) -> int:
    return raft_id


def link_violation(m: Message, link_from: int, link_to: int, node_of=_same) -> Optional[str]:
    """Why `m` may not arrive over the authenticated link link_from -> link_to; None if it may.
    `node_of(raft id)`: the node that hosts that Raft member (the identity unless a group's
    members have ids of their own: cluster/slot_map.py's replica ids, whose node the caller knows).

    The one acceptance rule of every transport (GrpcTransport ends the stream on a violation)
    and of the simulator's network. A message must be addressed to the link's receiver and be
    a network message. Its sender must be the link's sender, except for FORWARDED_MESSAGES:
    requests any member may make anyway (a proposal, a read, a transfer), whose `frm` names the
    originator. Votes, appends, heartbeats, snapshots and every response carry authority or
    state of their sender and are accepted only from the node that authenticated the link.
    """
    t = m.type
    if t in LOCAL_MESSAGES:
        return f"local-only {t.name} message"
    if node_of(m.to) != link_to:
        return f"{t.name} message to {m.to} on a link to {link_to}"
    if node_of(m.frm) == link_from or (t in FORWARDED_MESSAGES and m.frm != NONE):
        return None
    return f"{t.name} message from {m.frm} on the link of node {link_from}"


class ConfChangeType(enum.IntEnum):
    ADD_NODE = 0  # add (or promote to) voter
    REMOVE_NODE = 1
    UPDATE_NODE = 2  # no-op for membership (etcd compatibility)
    ADD_LEARNER_NODE = 3  # add (or demote to) learner


@dataclass(frozen=True, slots=True)
class ConfChangeSingle:
    type: ConfChangeType
    node_id: int  # Invariant: > 0


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One membership change (thesis §4.1 single-server change)."""

    type: ConfChangeType
    node_id: int
    context: bytes = b""  # opaque to Raft (e.g. the new node's address)

    def as_v2(self) -> "ConfChangeV2":
        return ConfChangeV2(changes=(ConfChangeSingle(self.type, self.node_id),), context=self.context)


class ConfChangeTransition(enum.IntEnum):
    AUTO = 0  # simple if possible (<= 1 voter change), else joint with auto-leave
    JOINT_IMPLICIT = 1  # joint, auto-leave
    JOINT_EXPLICIT = 2  # joint, leave by an explicit empty ConfChangeV2


@dataclass(frozen=True, slots=True)
class ConfChangeV2:
    """Several changes at once; an empty `changes` leaves a joint configuration."""

    transition: ConfChangeTransition = ConfChangeTransition.AUTO
    changes: tuple[ConfChangeSingle, ...] = ()
    context: bytes = b""

    def as_v2(self) -> "ConfChangeV2":
        return self

    def enter_joint(self) -> tuple[bool, bool]:
        """(use joint consensus?, auto-leave?) — etcd's EnterJoint."""
        if self.transition != ConfChangeTransition.AUTO or len(self.changes) > 1:
            auto = self.transition in (ConfChangeTransition.AUTO, ConfChangeTransition.JOINT_IMPLICIT)
            return True, auto
        return False, False

    def leave_joint(self) -> bool:
        return len(self.changes) == 0


@dataclass(frozen=True, slots=True)
class ReadState:
    index: int  # commit index at the time the read was confirmed; apply up to it, then read
    request_ctx: bytes  # the ctx given to read_index()


class StateRole(enum.IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
    PRE_CANDIDATE = 3


@dataclass(frozen=True, slots=True)
class SoftState:
    leader: int  # NONE if unknown
    role: StateRole


@dataclass(frozen=True, slots=True)
class Ready:
    """See rawnode.py for the contract (persist, send, apply, advance)."""

    soft_state: Optional[SoftState]  # None if unchanged since the last Ready
    hard_state: Optional[HardState]  # None if unchanged since the last Ready
    entries: tuple[Entry, ...]  # to append to stable storage (may overwrite a suffix)
    snapshot: Optional[Snapshot]  # to install in stable storage; None if none
    messages: tuple[Message, ...]  # may be sent before persisting
    persisted_messages: tuple[Message, ...]  # send only after persisting this Ready
    committed_entries: tuple[Entry, ...]  # to apply to the state machine, in order
    read_states: tuple[ReadState, ...]
    must_sync: bool  # fsync before sending persisted_messages


# ---------------------------------------------------------------- errors


class RaftError(Exception):
    """Base of the core's typed errors."""


class ProposalDropped(RaftError):
    def __init__(self, reason: str, node_id: int = NONE, term: int = 0):
        super().__init__(f"proposal dropped on node {node_id} (term {term}): {reason}")
        self.reason = reason
        self.node_id = node_id
        self.term = term


class Compacted(RaftError):
    """Requested index is below the first available index (compacted away)."""

    def __init__(self, index: int, first_index: int):
        super().__init__(f"index {index} compacted (first available {first_index})")
        self.index = index
        self.first_index = first_index


class Unavailable(RaftError):
    """Requested index is beyond the last index in storage."""

    def __init__(self, index: int, last_index: int):
        super().__init__(f"index {index} unavailable (last index {last_index})")
        self.index = index
        self.last_index = last_index


class SnapshotTemporarilyUnavailable(RaftError):
    def __init__(self, node_id: int = NONE):
        super().__init__("snapshot temporarily unavailable")
        self.node_id = node_id


class SnapshotOutOfDate(RaftError):
    def __init__(self, index: int, current: int):
        super().__init__(f"snapshot at {index} older than current snapshot at {current}")
        self.index = index
        self.current = current


class ConfigError(RaftError, ValueError):
    def __init__(self, field_name: str, reason: str):
        super().__init__(f"invalid raft config {field_name}: {reason}")
        self.field_name = field_name
        self.reason = reason


class ConfChangeError(RaftError):
    """A membership change that cannot be applied to the current configuration."""

    def __init__(self, reason: str, node_id: int = NONE):
        super().__init__(f"conf change rejected (node {node_id}): {reason}")
        self.reason = reason
        self.node_id = node_id


class StepError(RaftError):
    """A message the core refuses to step (e.g. a response from an unknown peer)."""

    def __init__(self, reason: str, msg_type: int = -1, frm: int = NONE):
        super().__init__(f"step refused ({reason}) for message type {msg_type} from {frm}")
        self.reason = reason
        self.msg_type = msg_type
        self.frm = frm


class StorageStateError(RaftError):
    """Storage contents inconsistent with Raft's expectations (e.g. a gap after the snapshot)."""

    def __init__(self, reason: str, **data: int):
        super().__init__(f"storage state invalid: {reason} {data}")
        self.reason = reason
        self.data = data
