"""A sharded cluster of real processes: 3 nodes with --groups 6 (each node replicates all six
groups and prefers the leadership of two).

    - every node holds the same slot map (slot-map.json and the ClusterLayout RPC);
    - leaders spread: each node ends up leading exactly its two preferred groups;
    - CLUSTER SLOTS on every node covers all 16384 slots with six shards, each led by the
      node ClusterLayout names, and redis-py RedisCluster / redis-cli -c write and read keys
      of every group through any node, following MOVED;
    - XADD / XGROUP / XREADGROUP / XACK / XPENDING work in every group;
    - keyless commands answer for the groups the node leads (DBSIZE, KEYS, SCAN);
    - gRPC errors name the key's group and its leader; XRAFT.REGISTER ... SLOT s registers
      in the group of s;
    - a --groups that disagrees with the stored map is refused at start.
The kill -9 and restart-from-disk test is test_sharded_failover.py.
"""
import os
import subprocess

import grpc
import pytest
import redis
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.cluster import RedisCluster

from xraft.node.engine.slots import key_slot
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

from tests.cluster.conftest import wait_until
from tests.cluster.harness import rclient

GROUPS = 6


def start_sharded(cluster_factory, n: int = 3, groups: int = GROUPS):
    c = cluster_factory(n)
    for node in c.nodes.values():
        node.extra_args = ["--groups", str(groups)]
    c.start()
    return c


def layout(node, timeout: float = 5.0) -> pb.ClusterLayoutResponse:
    with grpc.insecure_channel(node.grpc) as ch:
        return pb_grpc.XRaftStub(ch).ClusterLayout(pb.ClusterLayoutRequest(), timeout=timeout)


def led_groups(node) -> list:
    """The groups the node says it leads and may write in (INFO raft's per-group lines)."""
    inf = rclient(node).info("raft")
    return sorted(g for g in range(1, GROUPS + 1)
                  if inf.get("raft_group%d" % g, {}).get("role") == "leader"
                  and inf["raft_group%d" % g].get("writable") == 1)


def wait_spread(cluster, ids=None, timeout: float = 30.0) -> dict:
    """{node id: [led groups]} once every group is led by its preferred node (placement:
    group g prefers node ((g - 1) mod 3) + 1)."""
    ids = ids or list(cluster.nodes)

    def spread():
        got = {i: led_groups(cluster.nodes[i]) for i in ids}
        want = {i: [g for g in range(1, GROUPS + 1) if (g - 1) % len(cluster.nodes) + 1 == i] for i in ids}
        return got if got == want else None
    return wait_until(spread, timeout, "every group led by its preferred node")


def key_of_group(group: int, prefix: str = "k") -> str:
    """A key whose slot the placement gives `group` (six even runs of 16384 slots)."""
    lo, hi = round((group - 1) * 16384 / GROUPS), round(group * 16384 / GROUPS) - 1
    for i in range(100_000):
        k = "%s%d" % (prefix, i)
        if lo <= key_slot(k.encode()) <= hi:
            return k
    raise AssertionError("no key")


def detail_of(err: grpc.RpcError) -> pb.ErrorDetail:
    [raw] = [v for k, v in err.trailing_metadata() if k == "grpc-status-details-bin"]
    detail = pb.ErrorDetail()
    assert status_pb2.Status.FromString(raw).details[0].Unpack(detail)
    return detail


@pytest.fixture(scope="module")
def sharded(cluster_factory):
    c = start_sharded(cluster_factory)
    wait_spread(c)
    return c


def test_every_node_holds_the_same_layout_and_leads_two_groups(sharded):
    maps = [open("%s/slot-map.json" % n.data_dir, "rb").read() for n in sharded.nodes.values()]
    assert maps[0] == maps[1] == maps[2]
    layouts = {i: layout(n) for i, n in sharded.nodes.items()}
    for i, lay in layouts.items():
        assert lay.node_id == i and lay.epoch == 1
        assert [(g.id, list(g.voters), g.preferred_leader) for g in lay.groups] == \
            [(g, [1, 2, 3], (g - 1) % 3 + 1) for g in range(1, GROUPS + 1)]
        assert sum(r.last - r.first + 1 for g in lay.groups for r in g.slots) == 16384
        assert {n.id: n.grpc for n in lay.nodes} == {j: m.grpc for j, m in sharded.nodes.items()}
    strip = [[(g.id, [(r.first, r.last) for r in g.slots]) for g in lay.groups] for lay in layouts.values()]
    assert strip[0] == strip[1] == strip[2]
    # Leaders as every node knows them: the preferred ones. (Awaited, not asserted at once: on a
    # loaded machine a missed heartbeat may move a leader for a moment; the balancer brings it back.)
    def preferred_everywhere():
        lays = [layout(n) for n in sharded.nodes.values()]
        return all([g.leader for g in lay.groups] == [g.preferred_leader for g in lay.groups]
                   and all(g.term >= 1 for g in lay.groups) for lay in lays)
    wait_until(preferred_everywhere, 30, "every node naming the preferred leaders")
    wait_spread(sharded)
    # INFO's role is "leader" on a node leading some group; its raft lines name each group.
    inf = rclient(sharded.nodes[1]).info("raft")
    assert inf["raft_role"] == "leader" and inf["raft_groups"] == GROUPS
    assert inf["raft_group1"]["slots"] == "0-2730"


def test_health_is_serving_once_every_hosted_group_knows_a_leader(sharded):
    wait_spread(sharded)
    for node in sharded.nodes.values():
        with grpc.insecure_channel(node.grpc) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def cluster_view(node):
    """(CLUSTER SLOTS as [first, last, master address], the raw slots reply, CLUSTER INFO,
    the raw CLUSTER NODES text) of one node."""
    with rclient(node, decode_responses=False) as r:
        slots = r.execute_command("CLUSTER SLOTS")
        info = r.execute_command("CLUSTER INFO")             # parsed by redis-py
    nodes_txt = subprocess.run(["redis-cli", "-p", str(node.resp_port), "CLUSTER", "NODES"],
                               capture_output=True, text=True, timeout=30).stdout  # the raw text
    masters = [[s[0], s[1], "%s:%d" % (s[2][0].decode(), s[2][1])] for s in slots]
    return masters, slots, info, nodes_txt


def test_cluster_slots_cover_every_slot_with_each_group_led_where_it_is(sharded):
    resp_of = {n.id: n.resp for n in sharded.nodes.values()}
    want = [[g.slots[0].first, g.slots[0].last, resp_of[g.preferred_leader]] for g in layout(sharded.nodes[1]).groups]
    for node in sharded.nodes.values():
        # Awaited: a leader moved for a moment by a missed heartbeat on a loaded machine comes back.
        masters, slots, info, nodes_txt = wait_until(
            lambda: (lambda v: v if v[0] == want else None)(cluster_view(node)), 30,
            "node %d's CLUSTER SLOTS naming the preferred leaders" % node.id)
        assert all(len(s) == 5 for s in slots)              # master + two replicas each
        assert info["cluster_state"] == "ok" and int(info["cluster_slots_assigned"]) == 16384
        # CLUSTER NODES: the node is "myself,master" on its groups' lines, "myself,slave" on others.
        mine = [line for line in nodes_txt.splitlines() if "myself" in line]
        assert len(mine) == GROUPS
        assert sorted(line.split()[-1] for line in mine if "myself,master" in line) == \
            sorted("%d-%d" % (w[0], w[1]) for w in want if w[2] == node.resp)


def test_redis_cluster_and_redis_cli_write_and_read_every_group(sharded):
    keys = {g: key_of_group(g, "rc") for g in range(1, GROUPS + 1)}
    for entry in sharded.nodes.values():                     # any node is a fine seed
        host, port = entry.resp.rsplit(":", 1)
        rc = RedisCluster(host=host, port=int(port), socket_timeout=5, decode_responses=True)
        try:
            for g, k in keys.items():
                rc.xadd(k, {"via": str(entry.id)})
            many = ["{t%d}s" % i for i in range(60)]        # keys over many slots and all groups
            for k in many:
                rc.rpush(k, entry.id)
            assert all(rc.llen(k) == entry.id for k in many)
            assert [rc.xlen(k) for k in keys.values()] == [entry.id] * GROUPS
        finally:
            rc.close()
    # A plain client on a node that does not lead the key's group gets MOVED to the leader.
    wait_spread(sharded)                                     # leaders where placement wants them
    with rclient(sharded.nodes[1]) as r:
        with pytest.raises(redis.exceptions.MovedError) as ei:
            r.xlen(keys[2])
        assert str(ei.value) == "%d %s" % (key_slot(keys[2].encode()), sharded.nodes[2].resp)
        assert r.xlen(keys[4]) == 3                          # group 4 is led here
    # redis-cli -c follows the MOVED from node 1 to group 3's leader (node 3).
    port = sharded.nodes[1].resp_port
    out = subprocess.run(["redis-cli", "-c", "-p", str(port), "XADD", keys[3], "*", "cli", "1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "-" in out.stdout, out
    out = subprocess.run(["redis-cli", "-c", "-p", str(port), "XLEN", keys[3]],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip().endswith("4"), out


def test_consumer_groups_work_in_every_group(sharded):
    host, port = sharded.nodes[2].resp.rsplit(":", 1)
    rc = RedisCluster(host=host, port=int(port), socket_timeout=5, decode_responses=True)
    try:
        for g in range(1, GROUPS + 1):
            k = key_of_group(g, "cg")
            ids = [rc.xadd(k, {"n": str(i)}) for i in range(5)]
            rc.xgroup_create(k, "grp", id="0")
            got = rc.xreadgroup("grp", "c1", {k: ">"}, count=10)
            assert [e[0] for e in got[0][1]] == ids
            assert rc.xack(k, "grp", *ids[:3]) == 3
            assert rc.xpending(k, "grp")["pending"] == 2
            assert [e[0] for e in rc.xreadgroup("grp", "c1", {k: "0"})[0][1]] == ids[3:]
    finally:
        rc.close()


def test_keyless_commands_answer_for_the_groups_the_node_leads(sharded):
    keys = {g: [key_of_group(g, "kl%d-" % g + str(i)) for i in range(3)] for g in range(1, GROUPS + 1)}
    host, port = sharded.nodes[1].resp.rsplit(":", 1)
    rc = RedisCluster(host=host, port=int(port), socket_timeout=5, decode_responses=True)
    try:
        for ks in keys.values():
            for k in ks:
                rc.set(k, "v")
    finally:
        rc.close()
    every = set()
    wait_spread(sharded)
    for node in sharded.nodes.values():
        led = led_groups(node)
        with rclient(node) as r:
            listed = set(r.keys("kl*"))
            assert listed == {k for g in led for k in keys[g]}
            scanned = set(r.scan_iter(match="kl*", count=2))
            assert scanned == listed
            assert r.dbsize() == len(set(r.keys("*")))
        every |= listed
    assert every == {k for ks in keys.values() for k in ks}


def test_grpc_errors_name_the_keys_group_and_register_follows_the_slot(sharded):
    k = key_of_group(5, "grpc")                                # group 5 is led by node 2
    slot = key_slot(k.encode())
    wait_spread(sharded)
    with grpc.insecure_channel(sharded.nodes[1].grpc) as ch:
        stub = pb_grpc.XRaftStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Execute(pb.ExecuteRequest(argv=[b"XADD", k.encode(), b"*", b"f", b"v"]), timeout=5)
        d = detail_of(ei.value)
        assert (d.reason, d.leader_id, d.leader_address, d.group_id, d.slot) == \
            ("NOT_LEADER", 2, sharded.nodes[2].grpc, 5, slot)
        # Group 4 is led here: the same write for one of its keys succeeds.
        stub.Execute(pb.ExecuteRequest(argv=[b"XADD", key_of_group(4, "grpc").encode(), b"*", b"f", b"v"]),
                     timeout=5)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Execute(pb.ExecuteRequest(argv=[b"XRAFT.REGISTER", b"99", b"SLOT", b"%d" % slot]), timeout=5)
        assert (detail_of(ei.value).group_id, detail_of(ei.value).leader_id) == (5, 2)
        assert stub.Execute(pb.ExecuteRequest(argv=[b"XRAFT.REGISTER", b"99"]), timeout=5)  # slot 0: group 1
    with grpc.insecure_channel(sharded.nodes[2].grpc) as ch:
        stub = pb_grpc.XRaftStub(ch)
        stub.Execute(pb.ExecuteRequest(argv=[b"XRAFT.REGISTER", b"99", b"SLOT", b"%d" % slot]), timeout=5)
        # Registered in group 5: an id-carrying write to its key applies once.
        md = (("xraft-request-id", "99:1"),)
        argv = [b"XADD", k.encode(), b"*", b"f", b"v"]
        first = stub.Execute(pb.ExecuteRequest(argv=argv), metadata=md, timeout=5)
        again = stub.Execute(pb.ExecuteRequest(argv=argv), metadata=md, timeout=5)
        assert first == again
        assert stub.Execute(pb.ExecuteRequest(argv=[b"XLEN", k.encode()]), timeout=5).reply.integer == 1


def test_a_groups_flag_that_disagrees_with_the_stored_map_is_refused(sharded):
    node = sharded.nodes[3]
    node.signal(15)
    assert node.wait_exit() == 0
    node.extra_args = ["--groups", "4"]
    node.start()
    assert node.wait_exit() == 1
    assert "--groups 4, but this cluster was founded with 6 group(s)" in node.log_text()
    node.extra_args = ["--groups", str(GROUPS)]
    node.start()
    node.wait_ready()
    wait_spread(sharded)


def test_more_nodes_than_replicas_each_node_hosts_its_groups_only(cluster_factory):
    """4 nodes, --groups 4: group g on the 3 nodes from g, so node 4 has no replica of group 1.
    It still routes: RedisCluster works through it, and a key of group 1 gets MOVED to group
    1's preferred leader (the best a node without a replica knows)."""
    c = start_sharded(cluster_factory, n=4, groups=4)
    try:
        def one_each():
            infos = {i: rclient(n).info("raft") for i, n in c.nodes.items()}
            led = {i: inf["raft_group%d" % i].get("role") for i, inf in infos.items()}
            return infos if all(r == "leader" for r in led.values()) else None
        infos = wait_until(one_each, 30, "each node leading its preferred group")
        assert {i: list(inf["raft_groups_hosted"]) for i, inf in infos.items()} == \
            {1: [1, 3, 4], 2: [1, 2, 4], 3: [1, 2, 3], 4: [2, 3, 4]}
        host, port = c.nodes[4].resp.rsplit(":", 1)
        rc = RedisCluster(host=host, port=int(port), socket_timeout=5, decode_responses=True)
        try:
            keys = ["{m%d}" % i for i in range(40)]
            for k in keys:
                rc.rpush(k, "x")
            assert [rc.llen(k) for k in keys] == [1] * 40
        finally:
            rc.close()
        k1 = next(k for k in ("n%d" % i for i in range(10_000)) if key_slot(k.encode()) < 4096)
        with rclient(c.nodes[4]) as r:
            with pytest.raises(redis.exceptions.MovedError) as ei:
                r.rpush(k1, "x")
            assert str(ei.value) == "%d %s" % (key_slot(k1.encode()), c.nodes[1].resp)
            slots = r.execute_command("CLUSTER SLOTS")
        assert [(s[0], s[1], "%s:%d" % (s[2][0], s[2][1])) for s in slots] == \
            [(0, 4095, c.nodes[1].resp), (4096, 8191, c.nodes[2].resp),
             (8192, 12287, c.nodes[3].resp), (12288, 16383, c.nodes[4].resp)]
    finally:
        c.kill_all()


def test_one_group_nodes_answer_cluster_layout_and_data_dirs_from_before_maps_still_start(cluster_factory):
    """The default (--groups 1): ClusterLayout is one group of every slot with every peer a voter;
    a data dir without slot-map.json (written before maps existed) restarts as that group."""
    c = cluster_factory(3)
    c.start()
    try:
        leader = c.wait_leader()
        with rclient(leader) as r:
            r.xadd("old", {"f": "v"})
        lay = layout(c.nodes[1])
        assert [(g.id, list(g.voters), [(s.first, s.last) for s in g.slots]) for g in lay.groups] == \
            [(1, [1, 2, 3], [(0, 16383)])]
        assert wait_until(lambda: layout(c.nodes[2]).groups[0].leader == leader.id, 10, "the leader known")
        node = c.nodes[3]
        node.signal(15)
        assert node.wait_exit() == 0
        os.remove(os.path.join(node.data_dir, "slot-map.json"))
        node.extra_args = ["--groups", "2"]
        node.start()
        assert node.wait_exit() == 1 and "founded before slot maps" in node.log_text()
        node.extra_args = []
        node.start()
        node.wait_ready()
        assert [list(g.voters) for g in layout(node).groups] == [[1, 2, 3]]
        with rclient(node) as r:
            r.readonly()
            assert wait_until(lambda: r.xlen("old") == 1, 10, "the entry on the restarted node")
    finally:
        c.kill_all()
