"""Prometheus metrics of one node: `xraft-node --metrics HOST:PORT` serves GET /metrics.

What is measured, and where the cost falls:

    per Raft group (label group)        read at scrape time from each group's public
      term, role, leader, commit/       surface (GroupDriver.status(), raft_status(),
      applied/last/snapshot index,      stats; RaftBackend.outcomes): nothing on the
      follower match lag (leader only), hot path but a counter increment per record
      proposals by outcome, snapshots
    fsync latency (histogram)           WalOptions.fsync_observer: timed around each
                                        commit fdatasync, in the executor thread
    requests per command, latency       request_stats.RequestStats: the front ends
      (histograms, label api, command)  record each command (RESP) / unary RPC (gRPC)
    blocked clients (label api)         the blocking registries, at scrape time
    process_* (CPU, memory, fds)        prometheus_client's ProcessCollector (/proc)
    streams: length, consumer groups,   read at scrape time, only for the groups this
      PEL entries (labels key, cgroup)  node leads (a cluster-wide sum counts each once),
                                        bounded: at most MAX_KEYS_SCANNED keys looked at
                                        and MAX_STREAMS streams reported per scrape
                                        (xraft_stream_scan_truncated says when cut)

The HTTP endpoint runs on the node's event loop (asyncio), not in a thread:
the collectors read the keyspace and the Raft state the loop mutates, so they
must run between two loop callbacks, never beside one. A scrape holds the loop
for as long as the bounded collection takes (milliseconds).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..cluster.slot_map import node_of_replica
from ..engine.stream import Stream
from ..raft.types import StateRole
from .backend import split_address
from .raft_backend import PROPOSAL_OUTCOMES

log = logging.getLogger("xraft.metrics")

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ROLES = {StateRole.FOLLOWER: "follower", StateRole.CANDIDATE: "candidate",
         StateRole.LEADER: "leader", StateRole.PRE_CANDIDATE: "pre_candidate"}
MAX_KEYS_SCANNED = 20_000      # keys looked at per scrape, over every led group
MAX_STREAMS = 500              # streams reported per scrape
MAX_LABEL_CHARS = 128          # a key or group name longer than this is cut (label size)
MAX_REQUEST_HEAD = 8192        # bytes of an HTTP request head; more is refused
MAX_CONNECTIONS = 16           # concurrent scrapers; more are refused with 503
READ_TIMEOUT_S = 5.0
_REASONS = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed", 500: b"Internal Server Error",
            503: b"Service Unavailable"}


def _label(raw) -> str:
    return bytes(raw[:MAX_LABEL_CHARS]).decode("utf-8", "backslashreplace")


class NodeCollector:
    """Everything but the fsync histogram, built at scrape time (prometheus_client's
    custom collector protocol: collect() yields metric families)."""

    def __init__(self, node_id: int, backends: Callable[[], dict], request_stats: Iterable,
                 blocked: Callable[[], dict]):
        self.node_id = node_id
        self._backends = backends            # () -> {group id: RaftBackend}
        self._request_stats = list(request_stats)
        self._blocked = blocked              # () -> {api: blocked clients}

    def collect(self):
        backends = self._backends()
        yield from self._raft(backends)
        yield from self._requests()
        blocked = GaugeMetricFamily("xraft_blocked_clients", "Clients blocked in a blocking command",
                                    labels=["api"])
        for api, n in sorted(self._blocked().items()):
            blocked.add_metric([api], n)
        yield blocked
        yield from self._streams(backends)

    def _raft(self, backends: dict):
        g = ["group"]
        term = GaugeMetricFamily("xraft_raft_term", "Current Raft term", labels=g)
        role = GaugeMetricFamily("xraft_raft_role", "1 for this replica's Raft role", labels=g + ["role"])
        leader = GaugeMetricFamily("xraft_raft_leader_id", "Leader's node id as this replica knows it (0: none)",
                                   labels=g)
        index = {name: GaugeMetricFamily(f"xraft_raft_{name}_index", f"Raft {name} index", labels=g)
                 for name in ("commit", "applied", "last", "snapshot")}
        lag = GaugeMetricFamily("xraft_raft_follower_lag_entries",
                                "Leader only: its last log index minus the follower's match index",
                                labels=g + ["peer"])
        inflight = GaugeMetricFamily("xraft_raft_inflight_proposals", "Proposals queued or awaiting apply",
                                     labels=g)
        outcomes = CounterMetricFamily("xraft_raft_proposals", "Records proposed by this node, by outcome",
                                       labels=g + ["outcome"])
        requests = CounterMetricFamily("xraft_raft_proposed_requests", "Client requests packed into records",
                                       labels=g)
        snaps = CounterMetricFamily("xraft_raft_snapshots", "Snapshots created or installed", labels=g + ["kind"])
        snap_bytes = CounterMetricFamily("xraft_raft_snapshot_created_bytes",
                                         "State machine image bytes of the snapshots created", labels=g)
        snap_last = GaugeMetricFamily("xraft_raft_snapshot_last_bytes",
                                      "Bytes of the newest snapshot image (created or installed)", labels=g)
        syncs = CounterMetricFamily("xraft_raft_storage_syncs", "Readies persisted with one storage sync",
                                    labels=g)
        for gid in sorted(backends):
            b = backends[gid]
            d = b.driver
            if d is None:
                continue
            lg = [str(gid)]
            st = d.status()
            term.add_metric(lg, st.term)
            for r, name in ROLES.items():
                role.add_metric(lg + [name], 1 if st.role == r else 0)
            leader.add_metric(lg, node_of_replica(st.leader_id))
            for name, value in (("commit", st.commit), ("applied", st.applied), ("last", st.last_index),
                                ("snapshot", st.snapshot_index)):
                index[name].add_metric(lg, value)
            if st.role == StateRole.LEADER:
                for peer, pr in sorted(d.raft_status().progress.items()):
                    if node_of_replica(peer) != self.node_id:
                        lag.add_metric(lg + [str(node_of_replica(peer))], max(0, st.last_index - pr.match))
            inflight.add_metric(lg, st.inflight_proposals)
            for outcome in PROPOSAL_OUTCOMES:
                outcomes.add_metric(lg + [outcome], b.outcomes[outcome])
            requests.add_metric(lg, b.requests)
            snaps.add_metric(lg + ["created"], d.stats.snapshots_created)
            snaps.add_metric(lg + ["installed"], d.stats.snapshots_installed)
            snap_bytes.add_metric(lg, d.stats.snapshot_bytes_created)
            snap_last.add_metric(lg, d.stats.last_snapshot_bytes)
            syncs.add_metric(lg, d.stats.syncs)
        yield from (term, role, leader, *index.values(), lag, inflight, outcomes, requests, snaps, snap_bytes,
                    snap_last, syncs)

    def _requests(self):
        fam = HistogramMetricFamily("xraft_request_duration_seconds",
                                    "Commands (RESP) and unary RPCs (gRPC) served, by name: count and latency",
                                    labels=["api", "command"])
        for stats in self._request_stats:
            for name, buckets, total in stats.snapshot():
                fam.add_metric([stats.api, name], buckets, total)
        yield fam

    def _streams(self, backends: dict):
        length = GaugeMetricFamily("xraft_stream_length", "Entries in a stream (groups this node leads)",
                                   labels=["group", "key"])
        cgroups = GaugeMetricFamily("xraft_stream_consumer_groups", "Consumer groups of a stream",
                                    labels=["group", "key"])
        pel = GaugeMetricFamily("xraft_stream_pel_entries", "Pending entries of a consumer group",
                                labels=["group", "key", "cgroup"])
        consumers = GaugeMetricFamily("xraft_stream_consumers", "Consumers of a consumer group",
                                      labels=["group", "key", "cgroup"])
        scanned = reported = 0
        truncated = False
        for gid in sorted(backends):
            b = backends[gid]
            if b.driver is None or not b.is_leader():
                continue
            for key, value in b.sm.keyspace.data.items():
                if scanned >= MAX_KEYS_SCANNED or reported >= MAX_STREAMS:
                    truncated = True
                    break
                scanned += 1
                if type(value) is not Stream:
                    continue
                reported += 1
                lk = [str(gid), _label(key)]
                length.add_metric(lk, value.length)
                cg = value.cgroups
                cgroups.add_metric(lk, len(cg) if cg is not None else 0)
                if cg is None:
                    continue
                for name, group in cg.items():
                    pel.add_metric(lk + [_label(name)], len(group.pel))
                    consumers.add_metric(lk + [_label(name)], len(group.consumers))
        cut = GaugeMetricFamily("xraft_stream_scan_truncated",
                                f"1 if this scrape stopped at {MAX_KEYS_SCANNED} keys or {MAX_STREAMS} streams")
        cut.add_metric([], 1 if truncated else 0)
        yield from (length, cgroups, pel, consumers, cut)


class Metrics:
    """The node's registry: the fsync histogram (fed from the WAL), NodeCollector, and the
    process' CPU, memory and file descriptors (prometheus_client's process_* from /proc)."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.fsync_seconds = Histogram("xraft_wal_fsync_seconds", "WAL commit fdatasync latency",
                                       buckets=FSYNC_BUCKETS, registry=self.registry)

    def observe_fsync(self, seconds: float) -> None:
        """WalOptions.fsync_observer (executor thread; prometheus_client's Histogram locks)."""
        self.fsync_seconds.observe(seconds)

    def add_collector(self, collector: NodeCollector) -> None:
        self.registry.register(collector)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """GET /metrics over HTTP/1.1 on the event loop, one request per connection."""

    def __init__(self, metrics: Metrics, address: str):
        self.metrics = metrics
        self.address = address
        self._server: Optional[asyncio.AbstractServer] = None
        self._connections = 0

    async def start(self) -> None:
        host, port = split_address(self.address)
        self._server = await asyncio.start_server(self._serve, host.strip("[]"), port, reuse_address=True,
                                                  limit=MAX_REQUEST_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > MAX_CONNECTIONS:
                await self._reply(writer, 503, b"too many scrapers\n")
                return
            try:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                    ConnectionError):
                return
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
                await self._reply(writer, 405, b"only GET /metrics\n")
                return
            path = parts[1].split(b"?", 1)[0]
            if path != b"/metrics":
                await self._reply(writer, 404, b"see /metrics\n")
                return
            body = self.metrics.exposition()
            await self._reply(writer, 200, b"" if parts[0] == b"HEAD" else body,
                              CONTENT_TYPE_LATEST.encode(), len(body))
        except Exception:  # noqa: BLE001 - a scrape must never take the node down
            log.exception("metrics request failed")
            await self._reply(writer, 500, b"collecting the metrics failed: see the node's log\n")
        finally:
            self._connections -= 1
            writer.close()

    @staticmethod
    async def _reply(writer, status: int, body: bytes, ctype: bytes = b"text/plain; charset=utf-8",
                     length: Optional[int] = None) -> None:
        reason = _REASONS[status]
        writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                     % (status, reason, ctype, len(body) if length is None else length) + body)
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
