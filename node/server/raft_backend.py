"""RaftBackend: the Backend protocol (backend.py) over one Raft group.

    front ends (RESP, gRPC)
        | submit(requests)            | read(argv, linearizable)
        v                             v
    RaftBackend --- group commit ---> GroupDriver.propose_nowait(record) (leader only)
        |                             GroupDriver.read_index()          (leader only)
        |<-- apply(index, data) ----- GroupDriver (every replica, in log order)
        v
    FsmAdapter -> fsm.StateMachine.apply -> results to the proposer; ready keys to listeners

Writes (group commit). The leader gathers submit()s into ONE record
(entry.encode_record), stamped by its TimeStamper, and proposes it; each
submit gets its own slice of the record's results once the entry is applied
here. One submit's requests are never split (a MULTI/EXEC or a client's
batch stays atomic). New submits keep gathering while any of these holds:
  - the group's storage is busy (the previous Ready's fsync in the executor):
    a proposal would only wait in the driver's queue for that moment anyway;
  - a record we proposed has not been appended by the driver yet (same);
  - max_records_in_flight records (default 1) are proposed and not yet
    applied. This is the gate that batches under load: while one record
    makes its round (peer messages, three fsyncs, acks, apply), everything
    that arrives becomes the next record, so the per-record costs (a gRPC
    stream write and read per peer and direction, an fsync per replica, a
    Ready) are paid once per round, not once per request. Measured with 64
    single XADDs in flight: ~9 requests per record instead of ~4, and
    8-20% less CPU per write over all processes (bench/README.md).
    A lone write is never held: with nothing in flight it goes at once.
Gathered submits are flushed as one record the moment the gate opens: the
driver's on_idle hook (its storage job ended; called before the node loop
pumps the group again, so the record goes into that very pump's Ready), the
driver reporting the append (on_change), or a record resolving
(_proposal_ended). Bounded: a full record (MAX_REQUESTS requests or
max_record_bytes: the driver's max_proposal_bytes, so the packer never builds
a record the driver refuses; one submit larger than that is refused at once
with a non-retriable EntryTooLarge naming the limit) is proposed at once
whatever the gate says, and
max_pending_requests bounds what waits. An idle leader flushes on the next
loop iteration (a lone write does not wait).
A record is queued in the driver synchronously (propose_nowait, then kick:
the node loop pumps it at once) and its outcome comes back as a callback
from inside the driver's apply, which resolves the submits' futures right
there: no task per record, no future hop between apply and the callers.

Time. A new leader must not stamp below any time already in its log, and its
log may hold its predecessor's records, appended but not yet applied, stamped
later than anything applied (resolve.TimeStamper). The driver's hook reports
only the entries a leader appends itself, not those it took as a follower or
recovered from its WAL, so a new leader accepts no write until a ReadIndex
round (started from the hook as it takes office) has completed in its term:
the core answers that only once an entry of the leader's own term is
committed, and the driver returns only once it is applied here. By then every predecessor record is applied, so
StateMachine.last_now_ms is the largest time in the log below our own
proposals, and the stamper is seeded with it (observe). Writes arriving in
that window (one heartbeat round in practice) wait for it, bounded by
leader_ready_timeout_s, instead of being redirected to ourselves.
Stamps (and the time reads use) are also held to the stamper's bound against
wall-clock jumps: anchored at start, fed every applied record's time with the
monotonic time it was applied here (FsmAdapter on_time), read with `mono_clock`,
and capped by the group's clocks (`peer_clock_skews`, the transport's handshake
readings; cap_time_by_group) on every new reading and before a new leader's
first write, so a node that started with its clock ahead is outvoted.

Reads. Linearizable: ReadIndex on the leader (the driver batches every read
queued in one iteration into one round), then StateMachine.read. A follower
refuses them with NotLeader. Stale reads (linearizable=False) are served from
whatever this replica has applied, leader or not.

Errors (backend.py's typed ones; the driver's are mapped, never leaked):
    driver NotLeader        -> NotLeader(leader's RESP address)     nothing proposed
    driver ProposalDropped  -> Unavailable(reason)                  did not and will not apply
                               (NotLeader if this node was deposed meanwhile)
    driver UnknownOutcome   -> UnknownOutcome                       may or may not apply
    driver ReadFailed       -> NotLeader if we lost leadership, else Unavailable

Leadership changes come from the driver's on_change hook (raft_driver.
SoftStateChange), called from inside its pump the moment the core's role,
leader or term moves (or the group fail-stops): nothing is polled. On a change
the role listeners run (the RESP server fails its blocked clients with a
redirect), unproposed writes are failed with NotLeader, and the proposals
already in the log are settled by the driver as this replica learns their
fate (applied, or dropped), else UnknownOutcome (raft_driver._check_leadership). The
hook also reports entries this leader appended (counted for INFO). Work that
may not run inside the driver's pump (the warm-up's ReadIndex) is started from
the hook as a task.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional, Sequence

from ..engine.keyspace import EngineConfig
from ..engine.slots import SLOT_COUNT
from ..fsm.entry import MAX_RECORD_BYTES, MAX_REQUESTS, Record, encode_record
from ..cluster.slot_map import node_of_replica
from ..fsm.resolve import TimeStamper
from ..fsm.slot_owner import OwnedSlots
from ..fsm.state_machine import StateMachine
from ..invariant import invariant
from ..raft.types import StateRole
from ..runtime import latency_trace, raft_driver as drv
from .backend import (Backend, NodeInfo, NotLeader, Shard, Unavailable, UnknownOutcome, check_fits_record,
                      cluster_node_id, record_end, settle_submits, split_address)
from .config import NodeAddresses
from .fsm_adapter import FsmAdapter

log = logging.getLogger("xraft.backend")

MAX_RESTORE_WAKE = 100_000
ROLE_NAMES = {StateRole.LEADER: "leader", StateRole.FOLLOWER: "follower",
              StateRole.CANDIDATE: "candidate", StateRole.PRE_CANDIDATE: "candidate"}


# How a proposed record ended: applied; NotLeader (deposed before it was logged);
# dropped (ProposalDropped: will never apply); unknown (UnknownOutcome: may have applied).
PROPOSAL_OUTCOMES = ("applied", "not_leader", "dropped", "unknown")


def _outcome(exc) -> str:
    if exc is None:
        return "applied"
    if isinstance(exc, drv.NotLeader):
        return "not_leader"
    if isinstance(exc, drv.ProposalDropped):
        return "dropped"
    return "unknown"


class _Record:
    """One proposed record: the submits it carries, resolved by the driver's callback."""

    __slots__ = ("backend", "group")

    def __init__(self, backend: "RaftBackend", group: list):
        self.backend = backend
        self.group = group

    def done(self, results, exc) -> None:
        self.backend._proposal_ended(self, results, exc)


class RaftBackend(Backend):
    """Backend over one GroupDriver. Build, pass `.machine` to MultiRaft.add_group,
    then attach() the driver it returns."""

    def __init__(self, raft_id: int, addresses: dict, *, config: Optional[EngineConfig] = None,
                 clock: Optional[Callable[[], int]] = None,
                 mono_clock: Optional[Callable[[], int]] = None,
                 peer_clock_skews: Optional[Callable[[], dict]] = None,
                 propose_timeout_s: float = 10.0, read_timeout_s: float = 5.0,
                 leader_ready_timeout_s: float = 5.0, warm_up_retry_s: float = 0.05,
                 leader_settle_s: float = 2.0, max_pending_requests: int = 100_000,
                 max_records_in_flight: int = 1, group_id: int = 1, owned: Optional[OwnedSlots] = None):
        invariant(raft_id in addresses, "this node's addresses are known")
        self.raft_id = raft_id
        self.group_id = group_id           # the Raft group this backend drives (named in NotLeader)
        self.addresses: dict[int, NodeAddresses] = dict(addresses)
        self.sm = StateMachine(config, owned=owned)
        self.machine = FsmAdapter(self.sm, self._on_ready_keys, self._on_applied_time)
        self.driver: Optional[drv.GroupDriver] = None
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        # Monotonic ms: bounds how far a jumping wall clock moves stamps (resolve.TimeStamper).
        self._mono = mono_clock or (lambda: time.monotonic_ns() // 1_000_000)
        self.stamper = TimeStamper()
        self.stamper.anchor(self._clock(), self._mono())
        # {peer id: its clock minus ours, ms} (GrpcTransport.peer_clock_skews); None: no group vote.
        self._peer_clock_skews = peer_clock_skews
        own = self.addresses[raft_id].resp
        self.node_id = cluster_node_id(own) if own else ""
        self.propose_timeout_s = propose_timeout_s
        self.read_timeout_s = read_timeout_s
        self.leader_ready_timeout_s = leader_ready_timeout_s
        self.warm_up_retry_s = warm_up_retry_s   # pause between failed warm-up ReadIndex rounds
        self.leader_settle_s = leader_settle_s   # _role_moved: wait this long for a successor
        self.max_pending_requests = max_pending_requests
        # Group commit gate: at most this many records proposed and not yet applied; what
        # arrives meanwhile gathers into the next record (a full record still goes at once).
        self.max_records_in_flight = max_records_in_flight
        # Invariant: every record proposed is <= max_record_bytes <= the driver's
        # max_proposal_bytes (set by attach(); submit refuses a larger submit).
        self.max_record_bytes = MAX_RECORD_BYTES
        self._ready_listeners: list = []
        self._role_listeners: list = []
        self._failure_listeners: list = []
        self._pending: list = []           # (requests, size, future) gathered this iteration
        self._scheduled = False
        self._outstanding = 0              # requests submitted and not yet resolved (limit)
        self._inflight: set = set()        # records proposed and not yet resolved (_Record)
        self._untaken: set = set()         # records the driver has not appended yet
        self._drained: list = []           # drain() waiters, resolved when _inflight empties
        self._closed = False
        self._view = (StateRole.FOLLOWER, 0, 0)   # (role, leader id, term) last observed
        self._ready_term = 0               # term in which we may write (warm-up done); 0 = none
        self._warming: Optional[asyncio.Task] = None
        self._changed = asyncio.Event()    # set (and replaced) on every observed change
        self._failed_reported = False
        self._told = (False, 0)            # (leader?, leader id) the role listeners last heard
        self._settle_timer: Optional[asyncio.TimerHandle] = None
        # Figures for INFO: how well group commit batches.
        self.records = 0
        self.requests = 0
        self.max_batch = 0
        self.appended = 0                  # entries this node appended as leader (on_change)
        # Records by how they ended (server/metrics.py): applied, or failed before / after the log.
        self.outcomes = dict.fromkeys(PROPOSAL_OUTCOMES, 0)

    # -- life cycle ---------------------------------------------------------------------
    def attach(self, driver: drv.GroupDriver) -> None:
        invariant(self.driver is None, "attach() once")
        self.driver = driver
        # One limit for packing and proposing: a record is never larger than what
        # the driver accepts (propose_nowait refuses more with ProposalDropped).
        self.max_record_bytes = min(MAX_RECORD_BYTES, driver.options.max_proposal_bytes)
        self.machine.on_restored = self._on_restored
        driver.on_change = self._on_change
        driver.on_idle = self._on_storage_free
        self._observe()                    # whatever happened before the hook was set

    def add_failure_listener(self, callback: Callable[[BaseException], None]) -> None:
        """callback(exc) once if the group fail-stops (storage or apply error)."""
        self._failure_listeners.append(callback)

    async def close(self) -> None:
        """Refuse new work and fail what was never proposed. Proposals already in
        the log are resolved by MultiRaft.close() (UnknownOutcome if unapplied)."""
        self._closed = True
        self._fail_pending(Unavailable("shutting down"))
        if self._warming is not None:
            self._warming.cancel()
        # A pending _settled() timer stays: shutdown hands leadership over after close(),
        # and the blocked clients must still be told where the successor is.
        self._bump()

    def refresh(self) -> None:
        """Look at the group's role now: after MultiRaft.close() no pump runs, so a
        change made by the last one (a hand-over) is reported from here."""
        self._observe()

    async def drain(self, timeout_s: float) -> bool:
        """Wait (bounded) for records already proposed to resolve, so their
        clients get definite answers before shutdown; True if all did."""
        if not self._inflight:
            return True
        w = asyncio.get_running_loop().create_future()
        self._drained.append(w)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(w)
        except asyncio.TimeoutError:
            pass
        return not self._inflight

    # -- the core's view (fields only: safe while the group's storage is busy) ----------
    def _core(self):
        return self.driver.rn.raft if self.driver is not None else None

    def _raw_view(self):
        r = self._core()
        if r is None:
            return StateRole.FOLLOWER, 0, 0
        return r.state, r.lead, r.term

    def writable(self) -> bool:
        """A settled leader: its term's first commit is applied here, writes go at once."""
        return self._writable()

    def _writable(self) -> bool:
        r = self._core()
        return (r is not None and not self._closed and self.driver.failed is None
                and r.state == StateRole.LEADER and r.term == self._ready_term)

    # -- leadership (the driver's on_change hook) ---------------------------------------
    def _on_change(self, change: drv.SoftStateChange) -> None:
        # Inside the driver's pump: only bookkeeping, listeners and task creation here.
        self.appended += change.appended
        if change.appended and self._untaken:
            # The driver took what was queued (one pump takes its whole queue): the
            # next record may be formed (group commit gate, see _flush).
            self._untaken.clear()
            self._flush_soon()
        self._observe()

    def _observe(self) -> None:
        d = self.driver
        if d is None:
            return
        if d.failed is not None and not self._failed_reported:
            self._failed_reported = True
            self._ready_term = 0
            self._fail_pending(Unavailable("raft group failed"))
            for cb in list(self._failure_listeners):
                try:
                    cb(d.failed)
                except Exception:
                    log.exception("failure listener failed")
        view = self._raw_view()
        if view == self._view:
            return
        old, self._view = self._view, view
        role, lead, term = view
        log.info("raft role %s leader %d term %d", ROLE_NAMES.get(role, role), lead, term)
        if role == StateRole.LEADER and (old[0] != StateRole.LEADER or old[2] != term):
            self._ready_term = 0
            if self._warming is not None:
                self._warming.cancel()
            self._warming = asyncio.get_running_loop().create_task(self._warm_up(term))
        if role != StateRole.LEADER:
            self._ready_term = 0
            self._fail_pending(self._not_leader(lead))
        self._bump()
        self._role_moved()

    def _role_moved(self) -> None:
        """Tell the role listeners if (leader?, leader id) differs from what they were
        last told. A replica that knows no leader (deposed by a transfer or an
        election in progress) usually learns the successor within a round trip:
        its listeners hear once it does (they redirect blocked clients there)
        instead of now (they could only say CLUSTERDOWN), bounded by leader_settle_s."""
        if self._settle_timer is not None:
            self._settle_timer.cancel()
            self._settle_timer = None
        role, lead, _ = self._view
        now = (role == StateRole.LEADER, lead)
        if now == self._told:
            return
        if not now[0] and not lead:
            self._settle_timer = asyncio.get_running_loop().call_later(self.leader_settle_s, self._settled)
            return
        self._told = now
        self._notify_role()

    def _settled(self) -> None:
        self._settle_timer = None
        role, lead, _ = self._view
        now = (role == StateRole.LEADER, lead)
        if now != self._told:
            self._told = now
            self._notify_role()

    async def _warm_up(self, term: int) -> None:
        """See the module doc ("Time"): no write before our term's first commit is applied."""
        while not self._closed:
            r = self._core()
            if r.state != StateRole.LEADER or r.term != term or self.driver.failed is not None:
                return
            try:
                await self.driver.read_index(timeout=self.leader_ready_timeout_s)
            except drv.DriverError as exc:
                log.info("leader warm-up in term %d: %s; retrying", term, exc)
                await asyncio.sleep(self.warm_up_retry_s)
                continue
            r = self._core()
            if r.state == StateRole.LEADER and r.term == term:
                self.stamper.observe(self.sm.last_now_ms)
                self.cap_time_by_group()          # before our first stamp in this term
                self._ready_term = term
                self._bump()
                self._notify_role()
            return

    def _bump(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    def _notify_role(self) -> None:
        for cb in list(self._role_listeners):
            try:
                cb()
            except Exception:
                log.exception("role listener failed")

    def _on_ready_keys(self, keys: frozenset) -> None:
        # Called from inside the driver's apply: an exception escaping here would
        # fail-stop the group, so a listener's bug is logged, never raised.
        for cb in list(self._ready_listeners):
            try:
                cb(keys)
            except Exception:
                log.exception("ready listener failed")

    def _on_restored(self) -> None:
        """A snapshot replaced the whole state (a follower far behind): any key may
        have changed, so blocked readers (READONLY XREAD BLOCK) look again. Bounded:
        beyond MAX_RESTORE_WAKE keys they wait for the next write to their key."""
        keys = self.sm.keyspace.data
        if keys and len(keys) <= MAX_RESTORE_WAKE:
            self._on_ready_keys(frozenset(keys))

    # -- addresses ------------------------------------------------------------------------
    def _resp_of(self, raft_id: int) -> Optional[str]:
        a = self.addresses.get(node_of_replica(raft_id))
        return a.resp if a is not None else None

    def _grpc_of(self, raft_id: int) -> Optional[str]:
        a = self.addresses.get(node_of_replica(raft_id))
        return a.grpc if a is not None else None

    def leader_id(self) -> int:
        """The NODE of the leader this replica knows (0: none); Raft knows it by replica id."""
        return node_of_replica(self._raw_view()[1])

    def replica_of(self, node_id: int) -> int:
        """The Raft id of node_id's replica in this group's configuration (the newest if the
        node has two while one of them leaves), else node_id itself (cluster/slot_map.py)."""
        d = self.driver
        if d is None:
            return node_id
        cs = d.conf_state
        ids = set(cs.voters) | set(cs.learners) | set(cs.voters_outgoing) | set(d.raft_status().progress)
        return max((r for r in ids if node_of_replica(r) == node_id), default=node_id)

    def leader_grpc_address(self) -> Optional[str]:
        """The leader's gRPC address (for the gRPC front end's redirects)."""
        lead = self.leader_id()
        return self._grpc_of(lead) if lead else None

    def _not_leader(self, lead: Optional[int] = None) -> NotLeader:
        lead = self.leader_id() if lead is None else node_of_replica(lead)
        exc = NotLeader(self._resp_of(lead) if lead else None)
        exc.grpc_address = self._grpc_of(lead) if lead else None
        exc.leader_id = lead
        exc.group_id = self.group_id
        return exc

    # -- Backend: listeners, role, routing ----------------------------------------------
    def add_ready_listener(self, callback) -> None:
        self._ready_listeners.append(callback)

    def add_role_listener(self, callback) -> None:
        self._role_listeners.append(callback)

    def now_ms(self) -> int:
        return self._clock()

    def cap_time_by_group(self) -> None:
        """Hold the stamper to the group's clocks (TimeStamper.cap_by_group). Called when
        the transport read a peer's clock, and as this node takes office."""
        if self._peer_clock_skews is None:
            return
        skews = self._peer_clock_skews()
        if self.stamper.cap_by_group(skews.values(), self.now_ms(), self._mono()):
            log.warning("this node's clock is ahead of its peers' (skews %s ms): replicated time is "
                        "held to the group's clocks", sorted(skews.values()))

    def _on_applied_time(self, now_ms: int) -> None:
        self.stamper.observe(now_ms, self._mono())

    def is_leader(self) -> bool:
        r = self._core()
        return r is not None and r.state == StateRole.LEADER and self.driver.failed is None

    def leader_address(self) -> Optional[str]:
        lead = self.leader_id()
        return self._resp_of(lead) if lead else None

    def redirect_for(self, slot: int) -> Optional[str]:
        if self.is_leader():
            return None                   # serve here (a write may wait for the warm-up)
        return self.leader_address() or ""

    def advertise(self, host: str, port: int) -> None:
        a = self.addresses[self.raft_id]
        if a.resp is None:
            resp = "%s:%d" % (host, port)
            self.addresses[self.raft_id] = NodeAddresses(a.grpc, resp)
            self.node_id = cluster_node_id(resp)

    def shards(self) -> list:
        shard = self.shard(((0, SLOT_COUNT - 1),))
        return [shard] if shard is not None else []

    def leader_term(self) -> tuple:
        """(leader id, term) as this replica knows them; (0, term) while none is known."""
        _, lead, term = self._raw_view()
        return node_of_replica(lead), term

    def shard(self, slot_ranges: tuple, fallback_leader: int = 0) -> Optional[Shard]:
        """The group as one Shard over `slot_ranges`: the leader (master) first, then the
        other voters. No leader known: `fallback_leader` is shown as the master (a sharded
        node keeps every slot covered), or None without one."""
        lead = self.leader_id() or fallback_leader
        leader_resp = self._resp_of(lead) if lead else None
        if not leader_resp:
            return None                   # no leader known: no slot is served
        d = self.driver
        # Raft's ids are replica ids: the shard lists nodes.
        progress = {node_of_replica(r): pr for r, pr in d.raft_status().progress.items()} if self.is_leader() else {}
        voters = sorted({node_of_replica(v) for v in d.conf_state.voters} | {lead})
        nodes = []
        for nid in [lead] + [v for v in voters if v != lead]:
            resp = self._resp_of(nid)
            if not resp:
                continue
            host, port = split_address(resp)
            pr = progress.get(nid)
            if nid == self.raft_id:
                offset, healthy = self.sm.applied_index, True
            elif pr is not None:
                offset, healthy = pr.match, pr.recent_active
            else:
                offset, healthy = 0, True
            nodes.append(NodeInfo(cluster_node_id(resp), host, port, "master" if nid == lead else "slave",
                                  myself=nid == self.raft_id, healthy=healthy, replication_offset=offset))
        return Shard(tuple(slot_ranges), tuple(nodes))

    def raft_info(self) -> dict:
        d = self.driver
        if d is None:
            return {"raft_node_id": self.raft_id, "raft_role": "follower", "raft_leader_id": 0,
                    "raft_term": 0, "raft_commit_index": 0, "raft_applied_index": 0}
        st = d.status()
        return {
            "raft_node_id": self.raft_id,
            "raft_group_id": st.group_id,
            "raft_role": ROLE_NAMES.get(st.role, "follower"),
            "raft_leader_id": node_of_replica(st.leader_id),
            "raft_leader": self._resp_of(st.leader_id) or "" if st.leader_id else "",
            "raft_leader_grpc": self._grpc_of(st.leader_id) or "" if st.leader_id else "",
            "raft_term": st.term,
            "raft_commit_index": st.commit,
            "raft_applied_index": st.applied,
            "raft_snapshot_index": st.snapshot_index,
            "raft_last_index": st.last_index,
            "raft_voters": ",".join(str(node_of_replica(v)) for v in st.conf_state.voters),
            "raft_writable": int(self._writable()),
            "raft_inflight_proposals": st.inflight_proposals,
            "raft_records": self.records,
            "raft_requests": self.requests,
            "raft_max_batch": self.max_batch,
            "raft_outstanding_requests": self._outstanding,
            "raft_gathering_requests": sum(len(p[0]) for p in self._pending),
            "raft_leader_appended": self.appended,
            "raft_syncs": d.stats.syncs,
            "raft_snapshots_created": d.stats.snapshots_created,
            "raft_snapshots_installed": d.stats.snapshots_installed,
            "raft_snapshots_in_child": d.stats.snapshots_in_child,
            "raft_snapshot_child_failures": d.stats.snapshot_child_failures,
            "raft_log_cache_bytes": d.storage.memory_held()[0],
            "raft_snapshot_cache_bytes": d.storage.memory_held()[1],
            "raft_time_clamped": self.stamper.clamped,
            "raft_time_capped": self.stamper.capped,
            "raft_failed": st.failed or "",
        }

    def engine_config(self) -> EngineConfig:
        return self.sm.keyspace.config

    # -- reads -----------------------------------------------------------------------------
    async def read(self, argv, linearizable: bool = True):
        self._check_open()
        if linearizable:
            await self._read_barrier()
        return self.sm.read(argv, self.stamper.clock(self.now_ms(), self._mono()))

    async def read_state(self, fn, off_loop: bool = False, held: bool = False):
        """fn(the fsm) once a read index confirmed this leader and it applied up to it: a
        linearizable read of state no command reads (slot_move_steps.py: export, manifest).
        off_loop: in the node's prepare thread (GroupDriver.run_off_loop), for a costly read
        of state that no apply changes meanwhile (the keys of sealed slots). Should an apply
        change it all the same (an abort's UNSEAL, a late PURGE or PRESTAGE), fn's
        RuntimeError / KeyError is Unavailable: the caller retries.
        held: in the prepare thread too, for state this group's applies do change (the
        pre-copy's live EXPORT): the group is held meanwhile (GroupDriver.run_held), so only
        its own commits wait, not the other groups' on this node's loop."""
        self._check_open()
        await self._read_barrier()
        if off_loop or held:
            run = self.driver.run_held if held else self.driver.run_off_loop
            try:
                return await run(lambda: fn(self.sm))
            except (RuntimeError, KeyError) as exc:   # ("changed size during iteration", a key gone)
                raise Unavailable("the state changed under an off-loop read (%s): retry" % exc) from None
        return fn(self.sm)

    async def _read_barrier(self) -> None:
        if not self.is_leader():
            raise self._not_leader()
        try:
            await self.driver.read_index(timeout=self.read_timeout_s)
        except drv.NotLeader as exc:
            raise self._not_leader(exc.leader_id) from None
        except (drv.ReadFailed, drv.ProposalDropped) as exc:
            if not self.is_leader():
                raise self._not_leader() from None
            raise Unavailable("read not confirmed: %s" % getattr(exc, "reason", exc)) from None

    # -- writes ----------------------------------------------------------------------------
    async def submit(self, requests: Sequence) -> list:
        requests = tuple(requests)
        if not requests:
            return []
        self._check_open()
        size = check_fits_record(requests, self.max_record_bytes)
        await self._wait_writable()
        if self._outstanding + len(requests) > self.max_pending_requests:
            raise Unavailable("too many writes in flight (%d)" % self._outstanding)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((requests, size, fut))
        n = len(requests)
        self._outstanding += n
        if latency_trace.ON:
            latency_trace.mark("submit")
        self._flush_soon()
        try:
            return await fut
        finally:
            self._outstanding -= n

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("shutting down")
        if self.driver is None:
            raise Unavailable("starting")
        if self.driver.failed is not None:
            raise Unavailable("raft group failed")

    async def _wait_writable(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.leader_ready_timeout_s
        while not self._writable():
            self._check_open()
            if not self.is_leader():
                raise self._not_leader()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Unavailable("leader not ready (its first commit is not applied yet)")
            # Woken by _bump(): the warm-up finishing, a role change, close().
            try:
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except asyncio.TimeoutError:
                pass

    def _gathering(self) -> bool:
        """Group commit gate: True while a new record would only wait in the driver
        (its storage is busy, or a record of ours is queued there and not yet appended),
        or while max_records_in_flight records are proposed and not yet applied.
        Reopened by on_change (appended), a record resolving, or the driver's on_idle
        hook (_on_storage_free) when its storage job ends."""
        return (bool(self._untaken) or self.driver.busy
                or len(self._inflight) >= self.max_records_in_flight)

    def _on_storage_free(self) -> None:
        # The driver's on_idle hook: called as its storage job ends, before the node loop
        # pumps the group again, so what we propose now goes into that very pump's Ready.
        if self._pending and not self._scheduled and not self._untaken:
            self._flush()

    def _flush_soon(self) -> None:
        """One _flush on the next loop pass for what is gathered (it decides what may go)."""
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Everything gathered, as few records as fit; while the driver cannot take
        a proposal yet (_gathering), only full records go now and the rest waits."""
        self._scheduled = False
        pending = [p for p in self._pending if not p[2].done()]
        self._pending = []
        if not pending:
            return
        if not self._writable():
            # Lost leadership between submit() and now: nothing was proposed.
            exc = Unavailable("shutting down") if self._closed else self._not_leader()
            for _, _, fut in pending:
                if not fut.done():
                    fut.set_exception(exc)
            return
        gathering = self._gathering()
        proposed = False
        i = 0
        while i < len(pending):
            j = record_end(pending, i, MAX_REQUESTS, self.max_record_bytes)
            if gathering and j == len(pending):
                self._pending = pending[i:]   # not full: keeps gathering until the gate opens
                break
            self._propose_group(pending[i:j])
            proposed = True
            i = j
        if proposed:
            self.driver.kick()                # into a Ready now, not after the node loop's wake-up

    def _propose_group(self, group) -> None:
        requests = [r for reqs, _, _ in group for r in reqs]
        # Stamped now, in flush order, and queued in the driver right here: the driver's
        # queue (and the log) gets records in stamp order.
        now_ms = self.stamper.stamp(self.now_ms(), self._mono())
        data = encode_record(now_ms, requests)
        self.records += 1
        self.requests += len(requests)
        self.max_batch = max(self.max_batch, len(requests))
        rec = _Record(self, group)
        self._inflight.add(rec)
        self._untaken.add(rec)
        try:
            # Queued in the driver at once, in stamp order; rec.done is called from inside
            # the driver as the entry is applied here (no task, no future hop per record).
            # The record itself goes along: applied here, it is not decoded again (followers
            # decode data; tests/fsm/test_leader_record.py: decode(encode(x)) is x, type for type).
            self.driver.propose_nowait(data, rec.done, timeout=self.propose_timeout_s,
                                       decoded=Record(now_ms, tuple(requests)))
        except Exception as exc:          # refused before it was queued
            rec.done(None, exc)

    def _proposal_ended(self, rec: "_Record", results, exc) -> None:
        """A record's outcome (loop thread; possibly from inside the driver: no driver calls)."""
        group = rec.group
        self.outcomes[_outcome(exc)] += 1
        if exc is None:
            invariant(isinstance(results, list) and len(results) == sum(len(g[0]) for g in group),
                      "one result per request of the record")
            settle_submits(group, results)
        elif isinstance(exc, drv.NotLeader):
            self._fail_group(group, self._not_leader(exc.leader_id))
        elif isinstance(exc, drv.ProposalDropped):
            # Never applied. Deposed meanwhile (another leader's entry took its index): the
            # write belongs at the leader, like one that arrives here now.
            if self._closed:
                self._fail_group(group, Unavailable("shutting down"))
            elif not self.is_leader():
                self._fail_group(group, self._not_leader())
            else:
                self._fail_group(group, Unavailable("write not proposed: %s" % exc.reason))
        elif isinstance(exc, drv.UnknownOutcome):
            self._fail_group(group, UnknownOutcome())
        else:
            log.error("proposal failed unexpectedly", exc_info=exc)
            self._fail_group(group, UnknownOutcome())
        self._inflight.discard(rec)
        self._untaken.discard(rec)        # resolved without an append being reported (refused)
        self._flush_soon()                # the gate may have opened (_flush decides)
        if not self._inflight and self._drained:
            waiters, self._drained = self._drained, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    @staticmethod
    def _fail_group(group, exc) -> None:
        for _, _, fut in group:
            if not fut.done():
                fut.set_exception(exc)

    def _fail_pending(self, exc) -> None:
        pending, self._pending = self._pending, []
        self._fail_group(pending, exc)
