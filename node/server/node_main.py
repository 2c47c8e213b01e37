"""`xraft-node`: one node process (CLI in config.py).

    grpc.aio server on --grpc     XRaft client API (grpc_service), Peer API (GrpcTransport),
                                  grpc.health.v1 (SERVING while every hosted group knows a
                                  leader), reflection
    RESP server on --resp         redis clients (resp_server)
    MultiRaft                     one data group per slot map group this node replicates
                                  (--groups G, default 1: group 1 owns all 16384 slots);
                                  WAL + snapshots in --data-dir/group-<g>; bootstraps each
                                  group's voters only on the first start with
                                  --initial-cluster-state new (data_dir.py); the map is
                                  DATA/slot-map.json (slot_map_store.py)
    backend                       --groups 1: the group's RaftBackend; more: ShardedBackend
                                  (sharded_backend.py) routing each request by its keys' slot
    LeaderBalancer                leaders move to each group's preferred node (leader_balance.py)
    metrics on --metrics          Prometheus /metrics over HTTP on the event loop (metrics.py)
    MetaGroup                     Raft group 0 (DATA/group-0), the slot map replicated
                                  (meta_group.py); every applied change re-routes the node
    MoveReconciler                on group 0's leader: drives the map's slot moves
                                  (move_reconciler.py)
    MembershipFollower            the hosted groups, peers and addresses follow the map;
    MembershipReconciler          on group 0's leader: the groups' Raft configurations follow
                                  the map's members (membership.py); --join: node_join.py

Start-up: validate everything (config, secret, TLS files, token) before
touching the data dir; lock the data dir (a second process on the same
directory would corrupt the WAL), check it belongs to this cluster and
node id and decide whether this start may bootstrap (data_dir.py: an empty
data dir without --initial-cluster-state new is refused); recover the group;
then open the listeners, warn once for each API served without
authentication, and log
`xraft-node <id> ready grpc=<addr> resp=<addr>` at WARNING (visible at the
default quiet level: `xraftctl local up` waits for it).

Shutdown on SIGTERM/SIGINT, in an order that gives every client a true answer:
  1. health NOT_SERVING; the backend refuses new requests (UNAVAILABLE:
     nothing happened, retry elsewhere) and fails writes never proposed;
  2. records already proposed get up to DRAIN_S to commit and apply, so
     their clients get their real results;
  3. a leader hands leadership to its most caught-up follower (the group
     does not wait an election timeout for a new leader);
  4. MultiRaft closes: anything still in flight fails with UNKNOWN_OUTCOME
     (never a false failure), the WAL is synced and closed;
  5. the listeners close: gRPC with a grace of GRACE_S, RESP gracefully (stop
     listening, running commands finish, replies flush, connections close;
     bounded by GRACE_S); exit 0.
If the group fail-stops (storage or apply error) the node runs the same
sequence and exits 70 so a supervisor restarts it from disk.

Exit codes: 0 clean stop, 2 bad configuration, 1 could not start
(port in use, data dir locked), 70 the Raft group failed.
"""
from __future__ import annotations

import os

# Before anything imports grpc: its fork handlers would restart grpc's threads inside a snapshot
# child (runtime/snapshot_child.py), which must run nothing but the serializer, and they abort it.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import asyncio  # noqa: E402
import dataclasses
import logging
import shutil
import signal
import sys
from typing import Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from ...proto.v1 import client_pb2, client_pb2_grpc, peer_pb2
from ..cluster.slot_map import SlotMap, generation_of_replica, replica_id
from ..engine.commands import COMMANDS
from ..fsm.slot_owner import OwnedSlots
from ..raft.types import StateRole
from ..runtime.disk_storage import DiskStorageOptions
from ..runtime.grpc_transport import GrpcTransport, TlsConfig, TransportError, server_options
from ..runtime.multiraft import MultiRaft, MultiRaftOptions
from ..runtime.peer_auth import DEFAULT_SECRET_ENV, SecretError, load_secret
from ..runtime.raft_driver import GroupOptions
from ..runtime.wal import FsyncPolicy, WalOptions
from . import gc_policy, logging_setup, loop_stalls
from .admin_rpcs import AdminRpcs
from .slot_move_steps import SlotMoveRpcs, tls_channels
from .backend import Backend, split_address
from .client_memory import ClientMemory
from .config import ConfigError, NodeAddresses, NodeConfig, parse_args
from .data_dir import DataDir, StartError, open_data_dir
from .grpc_service import XRaftService, rpc_names
from .info import SERVER_COMMANDS
from .leader_balance import LeaderBalancer
from .metrics import Metrics, MetricsServer, NodeCollector
from .meta_group import MetaGroup
from .node_join import prepare_join
from .membership import MembershipCalls, MembershipFollower, MembershipReconciler, MembershipRpcs, members_of
from .move_reconciler import MoveReconciler, move_steps_factory
from .raft_backend import RaftBackend
from .request_stats import RequestStats
from .resp_server import RespServer
from .sharded_backend import ShardedBackend
from .slot_map_store import load_slot_map

log = logging.getLogger("xraft.node")

GROUP_ID = 1                # the only group with --groups 1 (its data dir: DATA/group-1)
SECRET_ENV = DEFAULT_SECRET_ENV      # one name, owned by peer_auth (the CLI documents it)
DRAIN_S = 2.0               # step 2: in-flight proposals may still commit
TRANSFER_WAIT_S = 1.5       # step 3: leadership hand-over
GRACE_S = 1.0               # step 5: replies already produced reach their clients
SHUTDOWN_LIMIT_S = 20.0     # the whole sequence; beyond it the process exits anyway
MAX_TOKEN_BYTES = 4096
EXIT_OK, EXIT_START, EXIT_CONFIG, EXIT_FAILED = 0, 1, 2, 70


def _read_token(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read --token-file {path!r}: {exc}") from None
    token = raw.strip().decode("utf-8", "strict") if len(raw) <= MAX_TOKEN_BYTES else ""
    if not token:
        raise ConfigError(f"--token-file {path!r} is empty or over {MAX_TOKEN_BYTES} bytes")
    return token


def group_dir(cfg: NodeConfig, group_id: int = GROUP_ID, generation: int = 0) -> str:
    """A group's directory; a replica of a later generation (this node rejoined the group,
    cluster/slot_map.py) has its own, so a new replica never starts from an old one's log."""
    name = "group-%d" % group_id if generation == 0 else "group-%d.g%d" % (group_id, generation)
    return os.path.join(cfg.data_dir, name)


def generations_on_disk(cfg: NodeConfig, group_id: int) -> list:
    """The generations of group_id's replicas with a directory here, ascending."""
    try:
        names = set(os.listdir(cfg.data_dir))
    except FileNotFoundError:
        return []
    prefix = "group-%d.g" % group_id
    gens = [int(n[len(prefix):]) for n in names if n.startswith(prefix) and n[len(prefix):].isdigit()]
    return sorted(gens + ([0] if "group-%d" % group_id in names else []))


def warn_unauthenticated(cfg: NodeConfig, token: Optional[str]) -> None:
    """Once at startup, at WARNING (shown at the default level): each client API that
    anyone who reaches its port may use. (config.py refuses a RESP password without a
    gRPC token, so a password never gives a false sense of a closed node.)"""
    if cfg.requirepass is None:
        log.warning("xraft-node %d: the RESP API on %s is served WITHOUT authentication "
                    "(no --requirepass): any client that reaches it may read and write every key",
                    cfg.id, cfg.resp)
    if token is None:
        log.warning("xraft-node %d: the gRPC client API (XRaft, Execute included) on %s is served "
                    "WITHOUT authentication (no --token-file): any client that reaches it may read "
                    "and write every key", cfg.id, cfg.grpc)


class Node:
    def __init__(self, cfg: NodeConfig, secret: bytes, tls: Optional[TlsConfig], token: Optional[str],
                 data: DataDir, layout: SlotMap):
        self.cfg = cfg
        self.data = data
        self.founding = layout        # the epoch-1 map: group 0's and the data groups' first state
        self.layout = layout          # the newest map group 0 applied here (_on_map)
        self.meta = MetaGroup(layout)
        self.admin: Optional[AdminRpcs] = None
        self.slot_moves: Optional[SlotMoveRpcs] = None
        self.reconciler: Optional[MoveReconciler] = None
        self._reconcile_task: Optional[asyncio.Task] = None
        self.follower: Optional[MembershipFollower] = None
        self.membership: Optional[MembershipReconciler] = None
        self.membership_calls: Optional[MembershipCalls] = None
        self._membership_tasks: list = []
        self.peer_grpc: dict = {}                     # {node id: gRPC address} the transport dials
        self.backends: dict[int, RaftBackend] = {}    # every hosted group's, by group id
        self.balancer: Optional[LeaderBalancer] = None
        self._balance_task: Optional[asyncio.Task] = None
        self.secret = secret
        self.tls = tls
        self.token = token
        self.stop = asyncio.Event()
        self.exit_code = EXIT_OK
        self.mr: Optional[MultiRaft] = None
        self.backend: Optional[Backend] = None     # what the front ends use (module doc)
        self.server: Optional[grpc.aio.Server] = None
        self.resp: Optional[RespServer] = None
        self.health = health_aio.HealthServicer()
        self._health_task: Optional[asyncio.Task] = None
        self._serving: Optional[bool] = None
        # --metrics: the registry exists before the WAL opens (it times each fsync).
        self.metrics: Optional[Metrics] = Metrics() if cfg.metrics else None
        self.metrics_server: Optional[MetricsServer] = None

    # -- start --------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        # The founding map's nodes too: a joined node (--join) knows the nodes only from it.
        peers = {**members_of(self.founding), **cfg.peers}
        peers = {nid: a for nid, a in peers.items() if nid != cfg.id}
        self.peer_grpc = dict(peers)
        transport = GrpcTransport(cfg.id, cfg.cluster_id, self.secret, cfg.grpc, peers, tls=self.tls,
                                  advertise_address=cfg.peers[cfg.id], incarnation=self.data.incarnation,
                                  check_incarnation=self.data.peers.check)
        wal = WalOptions(fsync=FsyncPolicy[cfg.fsync.upper()],
                         fsync_observer=self.metrics.observe_fsync if self.metrics else None)
        group = GroupOptions(election_tick=cfg.election_ticks, snapshot_entries=cfg.snapshot_entries,
                             storage=DiskStorageOptions(wal=wal), quiesce=not cfg.no_quiesce)
        self.transport = transport
        self.mr = MultiRaft(cfg.id, transport, MultiRaftOptions(tick_interval_s=cfg.tick_ms / 1000, group=group))
        addresses = cfg.addresses()
        for nid, spec in self.founding.nodes.items():
            addresses.setdefault(nid, NodeAddresses(spec.grpc, spec.resp or None))
        self.addresses = addresses
        # Writes wait for a proposal to apply at most this long: enough for several
        # elections, short enough that a client hears UNKNOWN_OUTCOME and not silence.
        election_s = cfg.election_ticks * cfg.tick_ms / 1000
        self._election_s = election_s
        # The groups first: recovery reads every WAL, and no listener should
        # accept clients before the state they would read exists.
        await self.mr.start()
        await self.meta.open(self.mr, group_dir(cfg, 0), bootstrap=not cfg.join)
        self.layout = self.meta.slot_map
        self.membership_calls = MembershipCalls(self, channel=tls_channels(self.tls))
        self.follower = MembershipFollower(self, self.membership_calls)
        self.follower.on_map(self.layout)            # peers added since the founding map
        transport.on_config_refusal = self.follower.on_config_refusal
        # The groups the map gives this node, and those it still holds on disk (it leaves them
        # only once out of their Raft configuration: MembershipFollower).
        for gid in sorted(self.layout.groups):
            # The replica on disk (the newest generation: an older one's directory is what
            # an interrupted close left, as a new replica opens only once the old one closed),
            # else the one the map wants here.
            gens = generations_on_disk(cfg, gid)
            for old in gens[:-1]:
                shutil.rmtree(group_dir(cfg, gid, old), ignore_errors=True)
            if gens:
                rid = replica_id(cfg.id, gens[-1])
            elif cfg.id in self.layout.groups[gid].replicas:
                rid = self.layout.groups[gid].replica_id(cfg.id)
            else:
                continue
            # The group's voters are written only on a founding start (data_dir.py), for the
            # founding map's groups; otherwise its configuration comes from its own log and
            # snapshot, or (a group joined later) from the leader's snapshot.
            spec = self.founding.groups.get(gid)
            member = spec is not None and cfg.id in spec.replicas and rid == cfg.id
            await self.open_data_group(gid, spec.voters if member and self.data.bootstrap else (),
                                       founding_member=member, replica=rid)
        self.data.mark_bootstrapped()
        if cfg.groups == 1 and not cfg.join and GROUP_ID in self.backends:
            self.backend = self.backends[GROUP_ID]    # exactly the one-group node of before
        else:
            self.backend = ShardedBackend(cfg.id, addresses, self.layout, self.backends)

        host, port = split_address(cfg.resp)
        # Built (not started) before the gRPC service: INFO over gRPC reports its figures.
        # One client-memory budget for both front ends (the gRPC service takes the RESP server's).
        self.resp = RespServer(self.backend, host.strip("[]"), port, requirepass=cfg.requirepass,
                               client_memory=ClientMemory(cfg.client_memory_bytes))
        grpc_of_resp = {a.resp: a.grpc for a in addresses.values() if a.resp}
        server = grpc.aio.server(options=server_options(transport.limits))
        self.admin = AdminRpcs(cfg.id, self.layout, self.backends, lambda: self.balancer,
                               {nid: a.grpc for nid, a in addresses.items()}, meta=self.meta)
        self.slot_moves = SlotMoveRpcs(self.backends, self.layout, {nid: a.grpc for nid, a in addresses.items()})
        service = XRaftService(self.backend, token=self.token, grpc_address_of=grpc_of_resp.get,
                               info_server=self.resp, layout=self.layout_view, admin=self.admin,
                               slot_moves=self.slot_moves, membership=MembershipRpcs(self))
        client_pb2_grpc.add_XRaftServicer_to_server(service, server)
        transport.add_to_server(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection((
            client_pb2.DESCRIPTOR.services_by_name["XRaft"].full_name,
            peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME), server)
        creds = transport.server_credentials()
        try:
            if creds is not None:
                server.add_secure_port(cfg.grpc, creds)
            else:
                server.add_insecure_port(cfg.grpc)
        except RuntimeError as exc:
            raise StartError(f"cannot listen on --grpc {cfg.grpc}: {exc}") from None
        await self._set_health(False)
        await server.start()
        self.server = server

        try:
            await self.resp.start()
        except OSError as exc:
            raise StartError(f"cannot listen on --resp {cfg.resp}: {exc}") from None
        self._update_health()
        if self.metrics is not None:
            await self._start_metrics(service)
        if len(self.layout.groups) > 1:
            self.balancer = LeaderBalancer(cfg.id, self.layout, self.backends, interval_s=max(0.2, election_s),
                                           cooldown_s=max(2.0, 5 * election_s))
            self._balance_task = asyncio.get_running_loop().create_task(self.balancer.run())
        self.meta.add_listener(self._on_map)
        self._on_map(self.meta.slot_map)         # anything applied since open()
        loop = asyncio.get_running_loop()
        self._membership_tasks = [loop.create_task(self.follower.run())]
        if not cfg.pause_moves:
            self.membership = MembershipReconciler(self, self.membership_calls)
            self._membership_tasks.append(loop.create_task(self.membership.run()))
        if not cfg.pause_moves:
            self.reconciler = MoveReconciler(self.meta, move_steps_factory(self), move_timeout_s=cfg.move_timeout_s)
            self._reconcile_task = asyncio.get_running_loop().create_task(self.reconciler.run())
        warn_unauthenticated(cfg, self.token)
        log.warning("xraft-node %d ready grpc=%s resp=%s", cfg.id, cfg.grpc, cfg.resp)

    async def _start_metrics(self, service: XRaftService) -> None:
        """--metrics: request stats in both front ends, the collector, the HTTP endpoint."""
        self.resp.request_stats = RequestStats("resp", set(COMMANDS) | set(SERVER_COMMANDS))
        service.request_stats = RequestStats("grpc", rpc_names())
        self.metrics.add_collector(NodeCollector(
            self.cfg.id, lambda: self.backends, (self.resp.request_stats, service.request_stats),
            lambda: {"resp": self.resp.registry.blocked_clients, "grpc": service.registry.blocked_clients}))
        self.metrics_server = MetricsServer(self.metrics, self.cfg.metrics)
        try:
            await self.metrics_server.start()
        except OSError as exc:
            raise StartError(f"cannot listen on --metrics {self.cfg.metrics}: {exc}") from None

    async def open_data_group(self, gid: int, bootstrap: tuple = (), founding_member: bool = False,
                              replica: Optional[int] = None) -> RaftBackend:
        """Start replicating data group `gid` as Raft member `replica` (default: the node id,
        generation 0) from its generation's dir (its state, else empty; `bootstrap`: the
        founding voters, written only into an empty dir)."""
        replica = self.cfg.id if replica is None else replica
        cfg, election_s = self.cfg, self._election_s
        # A replica added later owns nothing until its leader's snapshot says what it owns; a
        # founding one starts from the founding ranges (its own snapshot and log then apply).
        owned = self.founding.ranges(gid) if founding_member else ()
        b = RaftBackend(cfg.id, self.addresses, propose_timeout_s=max(10.0, 4 * election_s),
                        read_timeout_s=max(5.0, 2 * election_s),
                        leader_ready_timeout_s=max(5.0, 2 * election_s),
                        warm_up_retry_s=min(0.05, cfg.tick_ms / 1000),
                        leader_settle_s=2 * election_s,
                        peer_clock_skews=self.transport.peer_clock_skews,
                        group_id=gid, owned=OwnedSlots.from_ranges(owned))
        # Every handshake reads a peer's clock: replicated time stays within the group's (C6).
        self.transport.add_clock_listener(b.cap_time_by_group)
        b.add_failure_listener(lambda exc, gid=gid: self._on_group_failed(gid, exc))
        b.add_role_listener(self._update_health)
        driver = await self.mr.add_group(gid, group_dir(cfg, gid, generation_of_replica(replica)), b.machine,
                                         bootstrap_voters=bootstrap, replica_id=replica)
        b.attach(driver)
        self.backends[gid] = b
        if isinstance(self.backend, ShardedBackend):
            self.backend.add_group(gid, b)
        return b

    async def close_data_group(self, gid: int) -> None:
        """This node is out of group `gid`'s configuration: stop it and delete its data."""
        b = self.backends.pop(gid, None)
        if b is None:
            return
        if isinstance(self.backend, ShardedBackend):
            self.backend.remove_group(gid)
        generation = generation_of_replica(b.driver.node_id) if b.driver is not None else 0
        await b.close()
        await self.mr.remove_group(gid)
        await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree,
                                                         group_dir(self.cfg, gid, generation), True)
        self._update_health()

    def learn_address(self, nid: int, a: NodeAddresses) -> None:
        """A node of the map (MembershipFollower): its addresses for redirects and RPCs."""
        if nid == self.cfg.id:
            return
        if getattr(self, "addresses", None) is not None:
            self.addresses[nid] = a
        for b in self.backends.values():
            b.addresses[nid] = a
        if isinstance(self.backend, ShardedBackend):
            self.backend.addresses = {**self.backend.addresses, nid: a}
        if self.admin is not None:
            self.admin._grpc_of_node[nid] = a.grpc
        if self.slot_moves is not None:
            self.slot_moves.grpc_of_node[nid] = a.grpc

    def _on_map(self, slot_map: SlotMap) -> None:
        """A newer map applied by group 0: route by it everywhere; the groups, peers and
        addresses follow it (MembershipFollower)."""
        self.layout = slot_map
        if self.follower is not None:
            self.follower.on_map(slot_map)
        if isinstance(self.backend, ShardedBackend):
            self.backend.set_map(slot_map)
        if self.admin is not None:
            self.admin.slot_map = slot_map
        if self.slot_moves is not None:
            self.slot_moves.slot_map = slot_map
        if self.balancer is not None:
            self.balancer.slot_map = slot_map

    def layout_view(self) -> tuple:
        """(the slot map, {group id: (leader id, term)} this node knows, its id): ClusterLayout."""
        return self.layout, {gid: b.leader_term() for gid, b in self.backends.items()}, self.cfg.id

    # -- health -----------------------------------------------------------------------
    def _update_health(self) -> None:
        """SERVING while every hosted group knows a leader."""
        serving = (self.backend is not None and all(b.leader_id() != 0 for b in self.backends.values())
                   and not self.stop.is_set())
        if serving == self._serving:
            return
        self._serving = serving
        task = asyncio.get_running_loop().create_task(self._set_health(serving))
        task.add_done_callback(lambda t: t.cancelled() or t.exception() and
                               log.warning("health update failed: %r", t.exception()))

    async def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", client_pb2.DESCRIPTOR.services_by_name["XRaft"].full_name):
            await self.health.set(name, status)

    def _on_group_failed(self, group_id: int, exc: BaseException) -> None:
        log.critical("raft group %d failed (%r): shutting down for a restart from disk", group_id, exc)
        self.exit_code = EXIT_FAILED
        self.stop.set()

    # -- stop ---------------------------------------------------------------------------
    def request_stop(self, signame: str) -> None:
        if self.stop.is_set():
            log.warning("%s again: already shutting down", signame)
            return
        log.warning("xraft-node %d: %s, shutting down", self.cfg.id, signame)
        self.stop.set()

    async def shutdown(self) -> None:
        """The sequence in the module doc. Safe after a partial start."""
        self._serving = None
        if self.server is not None:
            await self._set_health(False)
        if self._balance_task is not None:
            self._balance_task.cancel()
        for t in self._membership_tasks:
            t.cancel()
        if self._membership_tasks:
            await asyncio.gather(*self._membership_tasks, return_exceptions=True)
        if self.membership_calls is not None:
            await self.membership_calls.close()
        if self._reconcile_task is not None:
            self._reconcile_task.cancel()
            await asyncio.gather(self._reconcile_task, return_exceptions=True)
            await self.reconciler.steps.close()
        if self.backends:
            await asyncio.gather(*(self._stop_group(b) for b in self.backends.values()))
        if self.mr is not None and self.mr.loop is not None:
            await self.mr.close()
        closers = []
        if self.metrics_server is not None:
            closers.append(self.metrics_server.close())
        if self.server is not None:
            closers.append(self.server.stop(GRACE_S))
        if self.resp is not None:
            closers.append(self._close_resp())
        await asyncio.gather(*closers, return_exceptions=True)

    async def _close_resp(self) -> None:
        # Step 4 resolved every write: the commands waiting on them finish, their
        # replies (and the redirects of blocked clients) are flushed, then each closes.
        if not await self.resp.shutdown(GRACE_S):
            log.info("some RESP clients did not take their last replies within %.1fs", GRACE_S)

    async def _stop_group(self, b: RaftBackend) -> None:
        """Steps 1-3 of the module doc for one group (the groups go in parallel)."""
        await b.close()
        if b.driver is not None:
            if not await b.drain(DRAIN_S):
                log.warning("group %d: writes still in flight after %.1fs: they end UNKNOWN_OUTCOME",
                            b.group_id, DRAIN_S)
            await self._hand_over_leadership(b)
            # Blocked clients hear about the new leader (a redirect) before we close.
            b.refresh()

    async def _hand_over_leadership(self, b: RaftBackend) -> None:
        d = b.driver
        if d.failed is not None or not d.is_leader():
            return
        progress = d.raft_status().progress
        candidates = [(pr.match, nid) for nid, pr in progress.items()
                      if nid != d.node_id and not pr.is_learner and pr.recent_active]
        if not candidates:
            return
        _, target = max(candidates)
        try:
            async with asyncio.timeout(TRANSFER_WAIT_S):
                await d.transfer_leader(target)
        except Exception as exc:  # noqa: BLE001 - a hand-over is a courtesy; shutdown goes on
            log.info("leadership transfer to %d not started: %r", target, exc)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRANSFER_WAIT_S
        # Until we follow a known successor (one round trip after stepping down): the
        # redirects our blocked clients get must name it.
        r = d.rn.raft
        while loop.time() < deadline and (r.state == StateRole.LEADER or r.lead in (0, d.node_id)):
            await asyncio.sleep(0.02)
        log.info("group %d: leadership %s to replica %d", b.group_id,
                 "handed" if d.rn.raft.state != StateRole.LEADER else "NOT handed", target)


async def run(cfg: NodeConfig, secret: bytes, tls: Optional[TlsConfig], token: Optional[str]) -> int:
    joined = None
    if cfg.join:
        cfg, joined = await prepare_join(cfg, tls, token)
    data = open_data_dir(cfg, group_dir(cfg))
    try:
        layout = load_slot_map(cfg, data.bootstrap, joined=joined)
        if cfg.join and len(layout.groups) != cfg.groups:
            cfg = dataclasses.replace(cfg, groups=len(layout.groups))
    except StartError:
        data.close()
        raise
    node = Node(cfg, secret, tls, token, data, layout)
    loop = asyncio.get_running_loop()
    stalls = loop_stalls.start(loop, cfg.id)      # XRAFT_STALL_TRACE (benchmarks): None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.request_stop, sig.name)
    try:
        try:
            await node.start()
        except StartError:
            async with asyncio.timeout(SHUTDOWN_LIMIT_S):
                await node.shutdown()
            raise
        await node.stop.wait()
        try:
            async with asyncio.timeout(SHUTDOWN_LIMIT_S):
                await node.shutdown()
        except asyncio.TimeoutError:
            log.error("shutdown took over %.0fs; exiting anyway", SHUTDOWN_LIMIT_S)
            return EXIT_FAILED
        return node.exit_code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if stalls is not None:
            stalls.stop()
        data.close()


def main(argv=None) -> int:
    try:
        cfg = parse_args(argv)
        logging_setup.setup(cfg.log_level, cfg.log_json, cfg.id)
        secret = load_secret(cfg.secret_file, env_var=SECRET_ENV)
        tls = TlsConfig.from_files(cfg.tls_cert, cfg.tls_key, cfg.tls_ca,
                                   require_client_cert=cfg.tls_require_client_cert) if cfg.tls else None
        token = _read_token(cfg.token_file) if cfg.token_file else None
    except (ConfigError, SecretError, TransportError) as exc:
        print(f"xraft-node: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    import uvloop
    gc_policy.WATCH.install()          # thresholds for long-lived PELs (gc_policy.py)
    profiler = _start_profile()
    try:
        code = uvloop.run(run(cfg, secret, tls, token))
    except StartError as exc:
        log.error("xraft-node %d cannot start: %s", cfg.id, exc)
        return EXIT_START
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if profiler is not None:
            _dump_profile(profiler, cfg.id)
    logging.shutdown()
    return code


# Benchmarks (bench/resp_pipeline.py --profile) set this to a directory: the node runs under
# cProfile and writes DIR/node-<id>.prof when it stops cleanly. Never set in production.
CPROFILE_ENV = "XRAFT_CPROFILE"


def _start_profile():
    if not os.environ.get(CPROFILE_ENV):
        return None
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _dump_profile(profiler, node_id: int) -> None:
    profiler.disable()
    profiler.dump_stats(os.path.join(os.environ[CPROFILE_ENV], "node-%d.prof" % node_id))


if __name__ == "__main__":
    sys.exit(main())
