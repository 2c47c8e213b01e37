"""A follower behind a compacted log is caught up by a snapshot LARGER than the transport's
per-link queue, over real gRPC links and real disk storage (Raft thesis §5.3, chunked
InstallSnapshot). Before the leader sent a window of chunks at a time (raft/snapshot_send.py),
it put every chunk of the image into one Ready: the link refused the whole batch (over
max_queued_bytes), the leader retried at every heartbeat and the follower never caught up
(bench/scale.py's catch-up at 10M entries: a 430 MiB image against a 64 MiB queue).

The image here is ~6 MiB against a 1 MiB queue; chunks of 64 KiB, 256 KiB in flight; the
leader's snapshot is read from its file a chunk at a time (snapshot_cache_bytes=0).
"""
import asyncio

from tests.runtime.test_grpc_transport import CLUSTER, FAST, KV, SECRET, run, wait_until  # noqa: F401
from xraft.node.runtime.disk_storage import DiskStorageOptions
from xraft.node.runtime.grpc_transport import GrpcTransport
from xraft.node.runtime.grpc_transport_config import TransportLimits
from xraft.node.runtime.multiraft import MultiRaft, MultiRaftOptions
from xraft.node.runtime.raft_driver import GroupOptions

QUEUE_BYTES = 1 << 20
VALUE = "v" * 150_000
KEYS = 40  # ~6 MB of image


def test_a_snapshot_larger_than_the_link_queue_catches_a_follower_up(run, tmp_path):
    limits = TransportLimits(max_queued_bytes=QUEUE_BYTES, backoff_initial_s=FAST.backoff_initial_s,
                             backoff_max_s=FAST.backoff_max_s, handshake_timeout_s=FAST.handshake_timeout_s)
    group = GroupOptions(election_tick=10, heartbeat_tick=2, snapshot_entries=10, snapshot_keep_entries=2,
                         snapshot_in_child=False, max_size_per_msg=256 << 10,
                         max_snapshot_chunk_bytes=64 << 10, max_snapshot_inflight_bytes=256 << 10,
                         storage=DiskStorageOptions(cache_bytes=1 << 20, snapshot_cache_bytes=0))
    opts = MultiRaftOptions(tick_interval_s=0.02, group=group)

    async def main():
        ts, nodes, sms, ports = {}, {}, {}, {}

        async def transport(i):
            ts[i] = GrpcTransport(i, CLUSTER, SECRET, "127.0.0.1:%d" % ports.get(i, 0), {}, limits=limits)
            await ts[i].serve()
            ports[i] = ts[i].port
        for i in (1, 2, 3):
            await transport(i)
        for i, t in ts.items():
            for j, u in ts.items():
                if i != j:
                    t.add_peer(j, f"127.0.0.1:{u.port}")

        async def start(i):
            nodes[i] = MultiRaft(i, ts[i], opts)
            await nodes[i].start()
            sms[i] = KV()
            await nodes[i].add_group(1, str(tmp_path / f"n{i}"), sms[i], bootstrap_voters=(1, 2, 3))
        try:
            for i in (1, 2, 3):
                await start(i)
            await wait_until(lambda: any(n.group(1).is_leader() for n in nodes.values()), 20, "a leader")
            lead = next(i for i, n in nodes.items() if n.group(1).is_leader())
            lag = next(i for i in nodes if i != lead)
            await nodes.pop(lag).close()
            for k in range(KEYS):           # one at a time: each record ~150 KB, under the queue
                await nodes[lead].group(1).propose(b"k%d=%s" % (k, VALUE.encode()), 10)
            leader = nodes[lead].group(1)
            await wait_until(lambda: leader.snap_index > 20 and leader.status().first_index > 2, 20,
                             "the leader to snapshot and compact")
            assert leader.stats.last_snapshot_bytes > 4 * QUEUE_BYTES
            await transport(lag)            # the same port: its peers redial it
            for j in (1, 2, 3):
                if j != lag:
                    ts[lag].add_peer(j, f"127.0.0.1:{ports[j]}")
            await start(lag)                # its log ends before the leader's: a snapshot must go
            await wait_until(lambda: sms[lag].applied_index >= sms[lead].applied_index, 30,
                             "the follower caught up by snapshot")
            assert nodes[lag].group(1).stats.snapshots_installed >= 1
            assert sms[lag].data == sms[lead].data and sms[lag].chain == sms[lead].chain
            link = ts[lead].stats.links[lag]
            assert link.refused_full == 0, "the window kept the link's queue under its limit"
        finally:
            for mr in nodes.values():
                await mr.close()
            for t in ts.values():
                await t.close()
    run(main(), timeout=90)
