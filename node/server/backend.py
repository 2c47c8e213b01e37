"""What the RESP server needs from the node, and a local implementation.

The server never touches a StateMachine or a Raft group directly: it talks to
a `Backend`. Today that is `LocalBackend` (one StateMachine applied in this
process: tests and single-node dev mode); tomorrow a Raft backend over
node/runtime implements the same methods, and the server does not change.

    write path   submit(requests) -> results      one record, one result per request
    read path    read(argv, linearizable) -> result
    wake-ups     add_ready_listener(cb)            cb(frozenset(keys)) after each apply
    leadership   add_role_listener(cb)             cb() when leadership or leader changes
                 is_leader(), leader_address()
    routing      redirect_for(slot) -> None (serve here) | "host:port" | "" (no leader known)
                 shards() -> [Shard]               CLUSTER SLOTS / SHARDS / NODES
    time         now_ms()                          the one clock the server stamps with
    info         raft_info() -> {name: value}      INFO's "# Raft" section
                 engine_config()                   the applied EngineConfig (CONFIG GET)

Errors the write and read paths raise (typed; each knows its wire text from
wire_errors, so the server replies `-<message>` without knowing the kinds):

    NotLeader       nothing was proposed; the message names the leader (NOTLEADER addr)
    UnknownOutcome  proposed, fate unknown: never retried blindly (not idempotent)
    Unavailable     nothing was proposed (no quorum, shutting down)

Group commit (LocalBackend): every submit() made during one event-loop
iteration lands in the same record, applied in the next iteration. One
submit's requests are never split across records (a MULTI/EXEC or a retry
batch stays atomic); several submits are split into several records only when
the record limits (entry.MAX_REQUESTS / MAX_RECORD_BYTES) require it.
"""
import abc
import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..engine.keyspace import EngineConfig
from ..engine.slots import SLOT_COUNT
from ..fsm.entry import MAX_RECORD_BYTES, MAX_REQUESTS, RECORD_OVERHEAD, encode_record, request_size
from ..fsm.errors import EntryTooLarge
from ..fsm.resolve import TimeStamper
from ..fsm.state_machine import StateMachine
from .wire_errors import not_leader_message, unavailable_message, unknown_outcome_message


# -- errors ---------------------------------------------------------------------

class BackendError(Exception):
    """Base of the backend's typed errors; `message` is the complete wire text."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class NotLeader(BackendError):
    """This node takes no writes (and no linearizable reads); nothing was proposed."""

    def __init__(self, leader_address: Optional[str]):
        super().__init__(not_leader_message(leader_address))
        self.leader_address = leader_address or None


class UnknownOutcome(BackendError):
    """The record was proposed and may or may not be applied."""

    def __init__(self):
        super().__init__(unknown_outcome_message())


class Unavailable(BackendError):
    """Nothing was proposed: no quorum, no leader, or shutting down."""

    def __init__(self, detail: str = "no quorum"):
        super().__init__(unavailable_message(detail))


# -- topology ---------------------------------------------------------------------

def check_fits_record(requests, max_record_bytes: int) -> int:
    """The bytes `requests` take in a record (one submit: never split). Raises
    EntryTooLarge, a command error (non-retriable on every wire: the same
    request can never fit), for a submit no record the group accepts can
    hold: `max_record_bytes` is the limit the packer applies (RaftBackend:
    the driver's max_proposal_bytes), so a refused record is never built."""
    size = sum(request_size(r) for r in requests)     # EntryTooLarge for the codec's limits
    if len(requests) > MAX_REQUESTS:
        raise EntryTooLarge("ERR xraft: %d requests in one write (limit %d)" % (len(requests), MAX_REQUESTS))
    if size + RECORD_OVERHEAD > max_record_bytes:
        raise EntryTooLarge("ERR xraft: request of %d bytes exceeds the maximum proposal size "
                            "(max_proposal_bytes %d)" % (size + RECORD_OVERHEAD, max_record_bytes))
    return size


def record_end(pending, i: int, max_requests: int = MAX_REQUESTS, max_bytes: int = MAX_RECORD_BYTES) -> int:
    """Where the record that starts at pending[i] ends (exclusive): as many whole submits
    ((requests, size, future), in order) as the record limits allow, and at least one."""
    j, n, size = i, 0, RECORD_OVERHEAD
    while j < len(pending) and (j == i or (n + len(pending[j][0]) <= max_requests
                                           and size + pending[j][1] <= max_bytes)):
        n += len(pending[j][0])
        size += pending[j][1]
        j += 1
    return j


def settle_submits(group, results: list) -> None:
    """Give each submit of a record ((requests, size, future), in order) its own slice of
    the record's results; a submit whose caller gave up is skipped."""
    k = 0
    for reqs, _, fut in group:
        if not fut.done():
            fut.set_result(results[k:k + len(reqs)])
        k += len(reqs)


def cluster_node_id(address: str) -> str:
    """A stable 40-hex redis cluster node id for a node address. Redis ids are
    random; ours must be the same on every node that names this one, and the
    address is what every node knows about every other."""
    return hashlib.sha1(b"xraft-node:" + address.encode()).hexdigest()


@dataclass(frozen=True)
class NodeInfo:
    node_id: str              # 40 hex characters (cluster_node_id)
    host: str
    port: int
    role: str                 # "master" (the leader) or "slave"
    myself: bool = False
    healthy: bool = True
    replication_offset: int = 0

    @property
    def address(self) -> str:
        return "%s:%d" % (self.host, self.port)


@dataclass(frozen=True)
class Shard:
    slot_ranges: tuple        # ((first, last), ...) inclusive
    nodes: tuple              # NodeInfo, the leader (master) first
    epoch: int = 0            # the slot map's epoch (CLUSTER INFO's epochs); 0 without a map


def split_address(address: str):
    host, _, port = address.rpartition(":")
    return host, int(port)


# -- the protocol ---------------------------------------------------------------------

class Backend(abc.ABC):
    """What the RESP server needs from the node (module doc)."""

    node_id: str              # this node's cluster node id (40 hex)

    @abc.abstractmethod
    async def submit(self, requests: Sequence) -> list:
        """Propose the resolved requests as one record; their results, in order."""

    @abc.abstractmethod
    async def read(self, argv, linearizable: bool = True):
        """A read-only command's reply (or its EngineError, or a WouldBlock)."""

    @abc.abstractmethod
    def add_ready_listener(self, callback: Callable[[frozenset], None]) -> None:
        """callback(keys) after every apply that signalled keys ready."""

    @abc.abstractmethod
    def add_role_listener(self, callback: Callable[[], None]) -> None:
        """callback() whenever is_leader() or leader_address() may have changed."""

    @abc.abstractmethod
    def now_ms(self) -> int:
        """Wall-clock milliseconds: the time the leader stamps records with."""

    @abc.abstractmethod
    def is_leader(self) -> bool:
        ...

    @abc.abstractmethod
    def leader_address(self) -> Optional[str]:
        """"host:port" of the RESP listener of the leader, None when unknown."""

    @abc.abstractmethod
    def redirect_for(self, slot: int) -> Optional[str]:
        """None: this node serves `slot`; else the address to send the client
        to ("" when no leader is known)."""

    @abc.abstractmethod
    def shards(self) -> list:
        """[Shard] covering every slot this node knows a server for."""

    @abc.abstractmethod
    def raft_info(self) -> dict:
        """Fields of INFO's "# Raft" section, in order."""

    @abc.abstractmethod
    def engine_config(self) -> EngineConfig:
        """The engine settings as applied on this node (read-only view)."""

    def advertise(self, host: str, port: int) -> None:
        """The RESP server tells the backend where it listens (port 0 binds)."""

    def hosts_slot(self, slot: int) -> bool:
        """Whether this node holds a replica of the group that owns `slot` (one group
        serves every slot unless a backend says otherwise)."""
        return True

    def group_of_slot(self, slot: int) -> int:
        """The Raft group serving `slot`: writes to one group may share a record
        (resp_pipeline.py). One group unless the backend is sharded."""
        return 0

    def applied_index(self, keys=()) -> int:
        """The last log index applied on this node (of the group serving `keys`): what a
        WATCH remembers (fsm/watch.py). Both backends apply into `self.sm`, a StateMachine."""
        return self.sm.applied_index


# -- LocalBackend ---------------------------------------------------------------------

class LocalBackend(Backend):
    """One StateMachine, applied in this process, with group commit.

    `leader=False` with `leader_address` makes a follower: every write and
    every linearizable read raises NotLeader, and redirect_for() names the
    leader, which is all the server needs to send -MOVED. `set_role()`
    changes that at run time (a leadership change, for tests).
    """

    def __init__(self, config: Optional[EngineConfig] = None, *, address: Optional[str] = None,
                 leader: bool = True, leader_address: Optional[str] = None,
                 clock: Optional[Callable[[], int]] = None):
        self.sm = StateMachine(config)
        self.stamper = TimeStamper()
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._address = address
        self.node_id = cluster_node_id(address) if address else ""
        self._leader = leader
        self._leader_address = leader_address
        self._pending = []            # (requests tuple, size, future) gathered this iteration
        self._scheduled = False
        self._closed = False
        self._ready_listeners = []
        self._role_listeners = []
        # Figures for INFO: how well group commit batches.
        self.records = 0
        self.requests = 0
        self.max_batch = 0

    # -- role ------------------------------------------------------------------------
    def advertise(self, host: str, port: int) -> None:
        if self._address is None:
            self._address = "%s:%d" % (host, port)
            self.node_id = cluster_node_id(self._address)

    @property
    def address(self) -> Optional[str]:
        return self._address

    def set_role(self, leader: bool, leader_address: Optional[str] = None) -> None:
        self._leader = leader
        self._leader_address = leader_address
        if not leader:
            # A deposed leader fails what it has not applied yet: those writes
            # were proposed, and in a real group their fate would be unknown.
            self._fail_pending(UnknownOutcome())
        for cb in list(self._role_listeners):
            cb()

    def is_leader(self) -> bool:
        return self._leader

    def leader_address(self) -> Optional[str]:
        return self._address if self._leader else self._leader_address

    def redirect_for(self, slot: int) -> Optional[str]:
        if self._leader:
            return None
        return self._leader_address or ""

    def shards(self) -> list:
        nodes = []
        leader = self.leader_address()
        if leader:
            host, port = split_address(leader)
            nodes.append(NodeInfo(cluster_node_id(leader), host, port, "master",
                                  myself=self._leader, replication_offset=self.sm.applied_index))
        if not self._leader and self._address:
            host, port = split_address(self._address)
            nodes.append(NodeInfo(self.node_id, host, port, "slave", myself=True,
                                  replication_offset=self.sm.applied_index))
        if not nodes or nodes[0].role != "master":
            return []                 # no leader known: no slot is served
        return [Shard(((0, SLOT_COUNT - 1),), tuple(nodes))]

    def raft_info(self) -> dict:
        return {
            "raft_backend": "local",
            "raft_role": "leader" if self._leader else "follower",
            "raft_leader": self.leader_address() or "",
            "raft_applied_index": self.sm.applied_index,
            "raft_records": self.records,
            "raft_requests": self.requests,
            "raft_max_batch": self.max_batch,
            "raft_pending": sum(len(p[0]) for p in self._pending),
        }

    def engine_config(self) -> EngineConfig:
        return self.sm.keyspace.config

    def now_ms(self) -> int:
        return self._clock()

    # -- listeners -------------------------------------------------------------------
    def add_ready_listener(self, callback) -> None:
        self._ready_listeners.append(callback)

    def add_role_listener(self, callback) -> None:
        self._role_listeners.append(callback)

    # -- reads -----------------------------------------------------------------------
    async def read(self, argv, linearizable: bool = True):
        if self._closed:
            raise Unavailable("shutting down")
        if linearizable and not self._leader:
            raise NotLeader(self._leader_address)
        return self.sm.read(argv, self.now_ms())

    # -- writes ----------------------------------------------------------------------
    async def submit(self, requests: Sequence) -> list:
        requests = tuple(requests)
        if not requests:
            return []
        if self._closed:
            raise Unavailable("shutting down")
        if not self._leader:
            raise NotLeader(self._leader_address)
        size = check_fits_record(requests, MAX_RECORD_BYTES)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((requests, size, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        """Apply everything gathered since the last flush, as few records as fit."""
        self._scheduled = False
        pending, self._pending = self._pending, []
        i = 0
        while i < len(pending):
            j = record_end(pending, i)
            group = [p for p in pending[i:j] if not p[2].cancelled()]
            i = j
            if group:
                self._apply_group(group)

    def _apply_group(self, group) -> None:
        requests = [r for reqs, _, _ in group for r in reqs]
        data = encode_record(self.stamper.stamp(self.now_ms()), requests)
        results = self.sm.apply(self.sm.applied_index + 1, data)
        self.records += 1
        self.requests += len(requests)
        self.max_batch = max(self.max_batch, len(requests))
        settle_submits(group, results)
        ready = self.sm.last_ready_keys
        if ready:
            for cb in list(self._ready_listeners):
                cb(ready)

    def _fail_pending(self, exc: BackendError) -> None:
        pending, self._pending = self._pending, []
        for _, _, fut in pending:
            if not fut.done():
                fut.set_exception(exc)

    def close(self) -> None:
        self._closed = True
        self._fail_pending(Unavailable("shutting down"))
