"""The SDK's slot routing and `xraftctl status` against real sharded nodes: 3 node
processes, 6 data groups (`--groups 6`), leaders spread over the nodes.

  * every group gets writes; once the routing table is warm they go straight to
    the leader of their key's group (no NOT_LEADER / MOVED answer at all);
  * the client registered its session in every group it wrote to, and each
    write applied exactly once;
  * kill -9 of a node leading some groups: writes to those groups re-route to the
    new leaders, a consumer of a stream in such a group keeps receiving;
  * a stale table (an older epoch) heals: redirects name the right leaders at
    once and the background refresh installs the current layout;
  * a BLPOP blocked in a group whose leader is killed re-routes and gets the
    element pushed after the failover;
  * 200 calls redirected at once cost at most one layout fetch per
    REFRESH_MIN_INTERVAL_S;
  * `xraftctl status --json` describes the same layout."""
import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.conftest import cluster_factory, wait_until  # noqa: F401 - a fixture
from xraft.client import errors, sync
from xraft.client.router import REFRESH_MIN_INTERVAL_S
from xraft.client.routing import Layout
from xraft.client.slots import key_slot
from xraft.proto.v1 import client_pb2 as pb

GROUPS = 6
WRITES_PER_KEY = 20


def _ready_layout(client):
    """The layout once every group is led by its preferred node (where the nodes move
    leaders after the start), None before."""
    try:
        layout = client.cluster_layout()
    except errors.XRaftError:
        return None
    settled = all(g.leader and g.leader == (g.preferred_leader or g.leader) for g in layout.groups)
    return layout if len(layout.groups) == GROUPS and settled else None


def _leaders_moved(client, layout) -> bool:
    """Whether some group elected a leader since `layout` (a missed heartbeat on a loaded
    machine can move one for a moment; the nodes move it back): then, and only then, a
    redirect is no routing error."""
    now = {g.id: g.term for g in client.cluster_layout().groups}
    return any(now.get(g.id) != g.term for g in layout.groups)


def _key_per_group(layout, prefix="stream") -> dict:
    """group id -> a key ("<prefix>-<n>") whose slot that group owns."""
    owner = {}
    for g in layout.groups:
        for first, last in g.slots:
            for slot in range(first, last + 1):
                owner[slot] = g.id
    keys = {}
    i = 0
    while len(keys) < len(layout.groups):
        key = f"{prefix}-{i}"
        keys.setdefault(owner[key_slot(key.encode())], key)
        i += 1
    return keys


@pytest.fixture(scope="module")
def sharded(cluster_factory):  # noqa: F811
    cluster = cluster_factory(3)
    for node in cluster.nodes.values():
        node.extra_args = ["--groups", str(GROUPS)]
    cluster.start()
    return cluster


def test_writes_go_straight_to_each_groups_leader_and_survive_a_leader_kill(sharded):
    seeds = [n.grpc for n in sharded.nodes.values()]
    with sync.Client(seeds[:1], timeout=30) as client:
        layout = wait_until(lambda: _ready_layout(client), 30, "every group led by its preferred node")
        assert client.routing_mode == "layout"
        assert len({g.leader for g in layout.groups}) == 3, layout       # leaders on every node
        keys = _key_per_group(layout)

        for key in keys.values():                                          # warm: sessions, leaders
            client.xadd(key, {"n": "warm"})
        warm_redirects = client.redirects
        for n in range(WRITES_PER_KEY):
            for key in keys.values():
                client.xadd(key, {"n": str(n)})
        assert client.redirects == warm_redirects or _leaders_moved(client, layout), \
            "a write went to a node that does not lead its group"
        registered = {group for cid, group in client._aio._registered if cid == client.client_id}
        assert registered == set(keys), registered                         # one session per group
        for gid, key in keys.items():
            assert client.leader_for(key) == next(n.grpc for n in layout.nodes
                                                  if n.id == next(g.leader for g in layout.groups if g.id == gid))
            assert client.xlen(key) == WRITES_PER_KEY + 1                  # each write applied once

        # kill -9 a node that leads some groups; their writes re-route to the new leaders
        victim_id = layout.groups[0].leader
        victim_groups = {g.id for g in layout.groups if g.leader == victim_id}
        victim = sharded.nodes[victim_id]
        consumer_key = keys[layout.groups[0].id]
        client.xgroup_create(consumer_key, "g", "$")
        session = client.consume([consumer_key], "g", "c1")
        deliveries = iter(session)
        client.xadd(consumer_key, {"n": "before"})
        assert next(deliveries).entry.fields_dict == {b"n": b"before"}
        victim.signal(signal.SIGKILL)
        victim.wait_exit()
        for key in keys.values():
            client.xadd(key, {"n": "after"})
        for gid in victim_groups:
            assert client.leader_for(keys[gid]) != victim.grpc
        client.xadd(consumer_key, {"n": "after-kill"})
        seen = []                          # at least once: "before" (never acked) may come again first
        while b"after-kill" not in seen:
            seen.append(next(deliveries).entry.fields_dict[b"n"])
            assert len(seen) <= 3, seen
        session.close()
        for key in keys.values():
            assert client.xlen(key) == WRITES_PER_KEY + 2 + (key == consumer_key) * 2
        victim.start()
        victim.wait_ready()


def test_status_describes_the_layout(sharded):
    seed = sharded.nodes[2].grpc
    with sync.Client([seed], timeout=30) as client:
        wait_until(lambda: _ready_layout(client), 30, "every group led by its preferred node")
    r = subprocess.run([sys.executable, "-m", "xraft.ops", "status", "--seed", seed, "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert sorted(n["id"] for n in data["nodes"]) == [1, 2, 3] and data["epoch"] >= 1
    assert {n["grpc"] for n in data["nodes"]} == {n.grpc for n in sharded.nodes.values()}
    assert len(data["groups"]) == GROUPS and all(g["leader"] in (1, 2, 3) for g in data["groups"])
    covered = []
    for g in data["groups"]:
        for part in g["slots"].split(","):
            first, _, last = part.partition("-")
            covered += range(int(first), int(last or first) + 1)
    assert sorted(covered) == list(range(16384))
    r = subprocess.run([sys.executable, "-m", "xraft.ops", "status", "--seed", seed],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("epoch "), r.stderr


def test_a_stale_table_heals_by_redirects_and_a_refresh(sharded):
    seeds = [n.grpc for n in sharded.nodes.values()]
    with sync.Client(seeds[:1], timeout=30) as client:
        layout = wait_until(lambda: _ready_layout(client), 30, "every group led by its preferred node")
        keys = _key_per_group(layout)
        aio = client._run(_install_stale(client, layout))
        assert aio._router.table.epoch == 0
        before = client.redirects
        elsewhere = [keys[g.id] for g in layout.groups if g.leader != 1]
        for key in elsewhere:                          # the first one surely goes to the wrong node
            client.xadd(key, {"n": "stale"})
        # one hop each at most (the error names the leader), none once the refresh is in
        assert 1 <= client.redirects - before <= len(elsewhere)
        wait_until(lambda: aio._router.table.epoch == layout.epoch, 30, "the background refresh")
        before = client.redirects
        for key in keys.values():
            client.xadd(key, {"n": "fresh"})
        assert client.redirects == before or _leaders_moved(client, layout)


def test_refreshes_are_rate_limited_however_many_calls_are_redirected(sharded):
    seeds = [n.grpc for n in sharded.nodes.values()]
    # no request ids: the calls are not serialized behind one session registration
    with sync.Client(seeds[:1], timeout=30, request_ids=False) as client:
        layout = wait_until(lambda: _ready_layout(client), 30, "every group led by its preferred node")
        elsewhere = [g.id for g in layout.groups if g.leader != 1]
        keys = [k for gid, k in _key_per_group(layout, "burst").items() if gid in elsewhere]
        aio = client._run(_install_stale(client, layout))
        fetches, redirects = client.layout_fetches, client.redirects
        started = time.monotonic()

        async def burst():
            await asyncio.gather(*(aio.xadd(keys[i % len(keys)], {"i": str(i)}) for i in range(200)))
        asyncio.run_coroutine_threadsafe(burst(), client._loop).result(60)
        elapsed = time.monotonic() - started
        wait_until(lambda: aio._router.table.epoch == layout.epoch, 30, "the background refresh")
        # every call of the burst was redirected, but the layout was asked for at most once per
        # REFRESH_MIN_INTERVAL_S (each fetch asks up to 3 nodes), plus the one running at the end
        assert client.redirects - redirects >= 100                # sent at once, to the wrong node
        assert client.layout_fetches - fetches <= 3 * (elapsed / REFRESH_MIN_INTERVAL_S + 2)


async def _install_stale(client, layout):
    """Make `client` (sync) route by what a node of an older epoch could have said: one
    group, led by node 1, owns every slot. Returns its async client."""
    stale = pb.ClusterLayoutResponse(epoch=0)
    for n in layout.nodes:
        stale.nodes.add(id=n.id, grpc=n.grpc, resp=n.resp, state=n.state)
    stale.groups.add(id=1, leader=1, term=1, voters=[1, 2, 3]).slots.add(first=0, last=16383)
    aio = client._aio
    aio._router.table = None                   # as a client that only ever saw the stale layout
    aio._router.install(Layout.from_pb(stale))
    return aio


def test_a_blocked_pop_follows_its_group_to_the_new_leader(sharded):
    seeds = [n.grpc for n in sharded.nodes.values()]
    with sync.Client(seeds, timeout=30) as client, sync.Client(seeds, timeout=30) as pusher:
        layout = wait_until(lambda: _ready_layout(client), 30, "every group led by its preferred node")
        group = layout.groups[-1]
        key = _key_per_group(layout, "list")[group.id]
        victim = sharded.nodes[group.leader]
        # the pop runs on the sync client's loop while this thread kills and pushes
        future = asyncio.run_coroutine_threadsafe(client._aio.blpop([key], block_ms=0), client._loop)
        assert client.leader_for(key) == victim.grpc
        # Sent once its request id is issued (the gRPC service's blocked calls are not in
        # INFO): blocked at the victim, or about to be; either way it must re-route.
        wait_until(lambda: client._aio._window._issued or future.done() and future.result(), 30, "the BLPOP sent")
        assert not future.done()
        victim.signal(signal.SIGKILL)
        victim.wait_exit()
        assert pusher.rpush(key, "after-kill") == 1
        assert future.result(60) == (key.encode(), b"after-kill")
        assert client.leader_for(key) != victim.grpc
        assert pusher.llen(key) == 0                     # popped once, by the blocked call
        victim.start()
        victim.wait_ready()

