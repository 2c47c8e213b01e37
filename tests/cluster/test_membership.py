"""Membership on real processes (docs/sharding.md, "Membership"): 3 nodes, 3 data groups,
streams with consumer groups and PELs in every group.

  * node 4 started with --join waits; `xraftctl node add` (under a RedisCluster producer)
    gives it groups: it replicates them (XINFO STREAM FULL read from it identical to another
    replica's) and leads some group;
  * node 1 is killed with -9, then `xraftctl node remove --id 1` replaces it without it:
    every acked entry and every PEL entry is still there, all 16384 slots are served, and
    `xraftctl status` shows node 1 removed;
  * node 1's data dir wiped: it cannot come back under id 1 (refused, with a clear message)
    but joins under a new id through `node add`.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from redis.cluster import RedisCluster

from tests.cluster.conftest import Node, cluster_factory, free_ports, wait_until  # noqa: F401 - a fixture
from tests.cluster.harness import check_stream, node_state
from tests.cluster.sharded_util import ClusterProducer, wait_settled
from tests.cluster.test_slot_move import _group_view, _quiet_group
from xraft.client.slots import key_slot

GROUPS = 3


class JoinNode(Node):
    """A node started with --join SEED (no --peers: it learns them from the seed's map)."""

    def __init__(self, cluster, node_id, seed, data_dir=None):
        g, r = free_ports(2)
        super().__init__(cluster, node_id, "127.0.0.1:%d" % g, "127.0.0.1:%d" % r)
        self.seed = seed
        if data_dir:
            self.data_dir = data_dir

    def argv(self) -> list:
        c = self.cluster
        return [sys.executable, "-m", "xraft.node.server.node_main", "--id", str(self.id), "--cluster-id",
                c.cluster_id, "--data-dir", self.data_dir, "--grpc", self.grpc, "--resp", self.resp,
                "--join", self.seed, "--secret-file", self.secret_file, "--tick-ms", "50",
                "--election-ticks", "10", "--snapshot-entries", "200"] + self.extra_args


def _keys(slot_map: dict, tag_prefix: str, per_group: int = 2) -> dict:
    """{group: [keys]}: keys whose slots each data group owns."""
    out = {g["id"]: [] for g in slot_map["groups"]}
    i = 0
    while any(len(v) < per_group for v in out.values()):
        k = "{%s%d}s" % (tag_prefix, i)
        slot = key_slot(k.encode())
        g = next(g for a, b, g in slot_map["slots"] if a <= slot <= b)
        if len(out[g]) < per_group:
            out[g].append(k)
        i += 1
    return out


def _ctl(cluster, seed, *args, wait=240):
    cmd = [sys.executable, "-m", "xraft.ops", *args, "--seed", seed, "--timeout", "5"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=wait + 60)


def _slot_map(cluster, seed):
    r = _ctl(cluster, seed, "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _pels(rc, keys) -> dict:
    """Groups, consumers, PELs (owners, delivery counts; idle times only grow) and entries."""
    return {k: _group_view(rc, k) for k in keys}


def _start(cluster_factory):  # noqa: F811
    """3 nodes, GROUPS groups, quiet streams with consumer groups in every group, and node 4
    started with --join (waiting to be added): (cluster, seed, founding map, {group: keys}, n4)."""
    cluster = cluster_factory(3)
    for node in cluster.nodes.values():
        node.extra_args = ["--groups", str(GROUPS), "--snapshot-entries", "200"]
    cluster.start()
    wait_settled(cluster)
    seed = cluster.nodes[2].grpc
    founding = json.loads(_map_json(cluster, seed))
    quiet = _keys(founding, "q")
    rc = _rc(cluster)
    for keys in quiet.values():
        for k in keys:
            _quiet_group(rc, k)
    n4 = JoinNode(cluster, 4, seed)
    cluster.nodes[4] = n4
    n4.start()
    n4.wait_ready()
    return cluster, seed, founding, quiet, n4


def test_add_then_remove_a_dead_node(cluster_factory):  # noqa: F811
    cluster, seed, founding, quiet, n4 = _start(cluster_factory)
    all_quiet = [k for keys in quiet.values() for k in keys]
    pels_before = _pels(_rc(cluster), all_quiet)
    produced = [k for keys in _keys(founding, "p", 1).values() for k in keys]
    producer = ClusterProducer(cluster, produced)
    producer.start()
    try:
        r = _ctl(cluster, seed, "node", "add", "--id", "4", "--grpc", n4.grpc, "--resp", n4.resp, "--json")
        assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs()[-6000:])
        added = json.loads(r.stdout)
        assert added["node"] == 4 and any(c["kind"] == "promote_learner" for c in added["changes"])
        m = _slot_map(cluster, seed)
        mine = [g["id"] for g in m["groups"] if 4 in g["voters"]]
        assert mine, m
        # node 4's copy of its groups' streams is a replica's: the same as another voter's
        for g in m["groups"]:
            if g["id"] not in mine:
                continue
            other = cluster.nodes[next(n for n in g["voters"] if n != 4)]
            keys = quiet[g["id"]]
            wait_until(lambda: node_state(n4, keys) == node_state(other, keys), 60,
                       "node 4's streams of group %d identical to node %d's" % (g["id"], other.id))
        # leaders spread onto it: the map prefers it for some group, and the balancers follow
        prefs = {g["id"]: g["preferred_leader"] for g in json.loads(_map_json(cluster, seed))["groups"]}
        led = [g for g, n in prefs.items() if n == 4]
        assert led and len(set(prefs.values())) == len(prefs), prefs
        wait_until(lambda: all(g.leader == 4 for g in _layout(seed).groups if g.id in led), 60,
                   "node 4 leading groups %s" % led)

        # node 1 dies; it is removed without ever answering
        cluster.nodes[1].signal(signal.SIGKILL)
        cluster.nodes[1].wait_exit()
        r = _ctl(cluster, seed, "node", "remove", "--id", "1", "--json")
        assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs()[-6000:])
    finally:
        producer.finish()
    m = _slot_map(cluster, seed)
    assert {n["id"]: n["state"] for n in m["nodes"]}[1] == "removed", m
    assert all(1 not in g["voters"] + g["learners"] for g in m["groups"]), m
    rc = _rc(cluster)
    slots = sorted((a, b) for a, b, *_ in rc.cluster_slots().keys()) if isinstance(rc.cluster_slots(), dict) \
        else sorted((s[0], s[1]) for s in rc.cluster_slots())
    covered = sum(b - a + 1 for a, b in slots)
    assert covered == 16384 and slots[0][0] == 0 and slots[-1][1] == 16383, slots
    for k in produced:
        check_stream(rc.xrange(k), [producer.view(k)])
    assert _pels(rc, all_quiet) == pels_before
    assert producer.count() > 0

    # node 1's disk is wiped: id 1 never returns, a new id joins through node add
    shutil.rmtree(cluster.nodes[1].data_dir)
    back = JoinNode(cluster, 1, seed, data_dir=cluster.nodes[1].data_dir)
    back.start()
    assert back.wait_exit(30) == 1
    assert "node 1 was removed from this cluster" in back.log_text(), back.log_text()
    n5 = JoinNode(cluster, 5, seed, data_dir=cluster.nodes[1].data_dir)
    cluster.nodes[5] = n5
    n5.start()
    n5.wait_ready()
    r = _ctl(cluster, seed, "node", "add", "--id", "5", "--grpc", n5.grpc, "--resp", n5.resp, "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    m = _slot_map(cluster, seed)
    assert {n["id"]: n["state"] for n in m["nodes"]}[5] == "up"
    assert os.path.isdir(n5.data_dir)


def _rc(cluster):
    """redis-py RedisCluster with its own retries (it follows MOVED after a membership change)."""
    n = next(n for n in cluster.nodes.values() if n.running())
    return RedisCluster(host="127.0.0.1", port=n.resp_port, decode_responses=True)


def _layout(seed):
    from xraft.client import sync
    with sync.Client([seed], timeout=10) as c:
        return c.cluster_layout()


def _map_json(cluster, seed) -> str:
    from xraft.client import sync
    with sync.Client([seed], timeout=10) as c:
        return c.get_slot_map().slot_map


def test_add_resumes_after_kill_9_of_the_cli_and_the_meta_leader(cluster_factory):  # noqa: F811
    """The CLI dies (SIGKILL, a failpoint) right after its first AddLearner applied, then the
    metadata leader (whose reconciler drives the Raft side) is killed -9 and restarted: the
    same command run again resumes from the map and finishes, node 4 holds its groups' data.
    Then node 3, alive, is removed: it leaves every group and deletes their data itself, and every
    group has 3 replicas again (a node that left a group when 4 came in rejoins it as a new replica)."""
    cluster, seed, _, quiet, n4 = _start(cluster_factory)
    add = ["node", "add", "--id", "4", "--grpc", n4.grpc, "--resp", n4.resp, "--json"]
    cluster.env["XRAFTCTL_FAILPOINT"] = "node.after_add_learner"
    try:
        cmd = [sys.executable, "-m", "xraft.ops", *add, "--seed", seed, "--timeout", "5"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cluster.env)
    finally:
        del cluster.env["XRAFTCTL_FAILPOINT"]
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr)
    m = json.loads(_map_json(cluster, seed))
    assert any(4 in g["learners"] for g in m["groups"]), m          # it died half way

    meta_leader = _meta_leader(seed)
    cluster.nodes[meta_leader].signal(signal.SIGKILL)
    cluster.nodes[meta_leader].wait_exit()
    cluster.nodes[meta_leader].start()
    cluster.nodes[meta_leader].wait_ready()

    r = _ctl(cluster, seed, *add)
    assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs()[-6000:])
    m = _slot_map(cluster, seed)
    assert all(not g["learners"] for g in m["groups"]), m
    mine = [g for g in m["groups"] if 4 in g["voters"]]
    assert len(mine) == 2, m                         # 3 groups x 3 replicas over 4 nodes: 2 or 3 each
    for g in mine:
        other = cluster.nodes[next(n for n in g["voters"] if n not in (4, meta_leader))]
        keys = quiet[g["id"]]
        wait_until(lambda: node_state(n4, keys) == node_state(other, keys), 60,
                   "node 4's streams of group %d identical to node %d's" % (g["id"], other.id))


    # a live node removed: it leaves every group's Raft configuration, then deletes their data
    r = _ctl(cluster, seed, "node", "remove", "--id", "3", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs()[-6000:])
    assert cluster.nodes[3].running()
    # A liveness bound, and a generous one: in two full suites of session 9 (two workers, a
    # loaded machine) node 3 had not deleted them after 60 s; alone it takes a few seconds.
    try:
        wait_until(lambda: not [d for d in os.listdir(cluster.nodes[3].data_dir)
                                if d.startswith("group-") and d != "group-0"], 180,
                   "node 3 deleting the data of the groups it left")
    except AssertionError:
        with open(cluster.nodes[3].log_path, "rb") as f:
            raise AssertionError("node 3 kept %r; its log ends:\n%s" % (
                os.listdir(cluster.nodes[3].data_dir), f.read()[-6000:].decode(errors="replace"))) from None
    m = _slot_map(cluster, seed)
    assert {n["id"]: n["state"] for n in m["nodes"]}[3] == "removed"
    raw = json.loads(_map_json(cluster, seed))
    for g in raw["groups"]:
        # 3 replicas again: a node that left a group rejoins it as a new replica (a new Raft id)
        assert 3 not in g["voters"] and not g["learners"] and len(g["voters"]) == 3, raw
    # With 3 groups on 4 nodes some node left a group when 4 came in and rejoined it now: it
    # holds the group's data again, in a fresh directory of its new generation.
    rejoined = [(g["id"], n, gen) for g in raw["groups"] for n, gen in g.get("generations", ())]
    assert rejoined, raw
    for gid, n, gen in rejoined:
        assert n in next(g for g in raw["groups"] if g["id"] == gid)["voters"], raw
        assert os.path.isdir(os.path.join(cluster.nodes[n].data_dir, "group-%d.g%d" % (gid, gen)))
        assert not os.path.exists(os.path.join(cluster.nodes[n].data_dir, "group-%d" % gid))
        other = cluster.nodes[next(v for v in next(g for g in raw["groups"] if g["id"] == gid)["voters"]
                                   if v != n)]
        wait_until(lambda: node_state(cluster.nodes[n], quiet[gid]) == node_state(other, quiet[gid]), 60,
                   "rejoined node %d's streams of group %d identical to node %d's" % (n, gid, other.id))


def test_a_node_paused_through_its_removal_leaves_its_groups_when_it_wakes(cluster_factory):  # noqa: F811
    """Node 3 is paused (SIGSTOP) while `node remove --id 3` swaps it out of every group and
    marks it REMOVED: it never applies those map entries, and once it wakes its peers refuse
    it, so its own map stays old for ever. It still leaves: a refused link makes it read a
    peer's map, and it closes and deletes every data group that map no longer gives it (each
    one's leader confirming its replica is out) and does not reopen them."""
    cluster, seed, _, quiet, n4 = _start(cluster_factory)
    r = _ctl(cluster, seed, "node", "add", "--id", "4", "--grpc", n4.grpc, "--resp", n4.resp, "--json")
    assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs()[-6000:])
    held = lambda: sorted(d for d in os.listdir(cluster.nodes[3].data_dir)  # noqa: E731
                          if d.startswith("group-") and d != "group-0")
    assert held(), os.listdir(cluster.nodes[3].data_dir)
    cluster.nodes[3].signal(signal.SIGSTOP)
    try:
        r = _ctl(cluster, seed, "node", "remove", "--id", "3", "--wait", "90")
        assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs()[-12000:])
        assert held(), "node 3 is paused: nothing of it changed yet"
    finally:
        cluster.nodes[3].signal(signal.SIGCONT)
    try:
        wait_until(lambda: not held(), 60, "node 3 deleting the data of the groups it was removed from")
        wait_until(lambda: "is REMOVED from the cluster" in cluster.nodes[3].log_text(), 10,
                   "node 3 saying it is removed")
    except AssertionError:
        raise AssertionError("node 3 kept %r; its log ends:\n%s" % (
            held(), cluster.nodes[3].log_text()[-6000:])) from None
    time.sleep(3)                              # it does not reopen them from its old map
    assert not held(), held()
    raw = json.loads(_map_json(cluster, seed))
    assert all(3 not in g["voters"] and not g["learners"] and len(g["voters"]) == 3 for g in raw["groups"]), raw
    rc = _rc(cluster)
    for gid, keys in quiet.items():
        assert all(rc.xlen(k) > 0 for k in keys), (gid, keys)


def _meta_leader(seed) -> int:
    from xraft.client import sync

    def leader():
        with sync.Client([seed], timeout=10) as c:
            return c.get_slot_map().meta_leader
    return wait_until(leader, 30, "a metadata leader")
