"""The member nemesis' replace-a-wiped-node and slot moves (ops/nemesis_member.py).

The range choice is checked on hand-made maps; replace and move run for real on a namespace
cluster (root only) without other faults: the changes must end, the new node must serve from
the old one's namespace, and the replicas must agree."""
import random

import pytest

from xraft.client import errors

from xraft.client.slots import key_slot
from xraft.ops import faults as fl
from xraft.ops import local_cluster as lc
from xraft.ops import nemesis_member as nm
from xraft.ops import nemesis_workload as wl
from xraft.ops import netns_hosts as nh
from xraft.ops import slots_cli
from xraft.ops.cluster_admin import _ask
from xraft.ops.cluster_status import Connection

class LostFirstReply:
    """A real client whose first ProposeMapChange is applied but its reply lost."""

    def __init__(self, client):
        self.client, self.lost = client, False

    def __getattr__(self, name):
        return getattr(self.client, name)

    def propose_map_change(self, *args, **kwargs):
        r = self.client.propose_map_change(*args, **kwargs)
        if not self.lost:
            self.lost = True
            raise errors.UnknownOutcomeError("the reply was lost")
        return r


GROUPS = [{"id": 1}, {"id": 2}, {"id": 3}]


@pytest.mark.parametrize("seed", range(50))
def test_a_planned_move_stays_inside_one_owners_run_and_changes_owner(seed):
    runs = [[0, 99, 1], [100, 100, 3], [101, 9000, 2], [9001, 16383, 1]]
    first, last, group = nm.Members(None, None, random.Random(seed))._plan_move({"slots": runs, "groups": GROUPS})
    owner = next(g for a, b, g in runs if a <= first <= b)
    assert any(a <= first <= last <= b and g == owner for a, b, g in runs), (first, last)
    assert last - first + 1 <= nm.MAX_MOVE_SLOTS
    assert group != owner and group in (1, 2, 3)


def test_half_the_planned_moves_take_the_workloads_slot():
    slot = key_slot(wl.STREAM.encode())
    runs = [[0, 16383, 1]]
    rng = random.Random(5)
    members = nm.Members(None, None, rng)
    hits = sum(a <= slot <= b for a, b, _g in (members._plan_move({"slots": runs, "groups": GROUPS})
                                                for _ in range(200)))
    assert 60 <= hits <= 140


WHY_NOT = nh.available()


# About a minute on a loaded 2-core machine (4 nodes, a node remove and add, two moves): soak only.
@pytest.mark.soak
@pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace harness: {WHY_NOT}")
def test_replace_a_wiped_node_then_move_the_workloads_slots(tmp_path):
    d = str(tmp_path / "c")
    nh.up(d, nodes=4, groups=2, disk_mb=32, node_args=("--tick-ms=50",))
    try:
        f = fl.Faults(d, random.Random(3))
        members = nm.Members(d, f, random.Random(3))
        assert "wiped" in members._begin_replace()
        op, old = members.pending
        old_ns = nh.netns_of(d, old)
        assert op == "replace" and old not in f.ids
        assert not any((tmp_path / "c" / f"node-{old}" / "mnt" / "data").iterdir())
        done = members._change(*members.pending, 120.0)
        assert "in place of wiped node" in done and members.pending is None, done
        new = max(f.ids)
        assert new not in (1, 2, 3, 4) and nh.netns_of(d, new) == old_ns
        conn = Connection(seed=lc.load(d).node(1).grpc, timeout=5.0)
        m = _ask(conn, "slot map", lambda c: slots_cli.read_map(c, conn))
        assert {n["id"] for n in m["nodes"] if n["state"] != "removed"} == set(f.ids)
        assert all(old not in g["voters"] for g in m["groups"])
        # A move of the range holding the workload's slot, to the group that does not own it;
        # the reply to its BeginMove is lost (UNKNOWNOUTCOME, as the member soak saw when the
        # metadata leader changed): `slots move` reads the map again and watches the move.
        slot = key_slot(wl.STREAM.encode())
        owner = slots_cli.owner_of(m, slot)
        target = next(g["id"] for g in m["groups"] if g["id"] != owner)
        done = _ask(conn, "slot move", lambda c: slots_cli.watch(LostFirstReply(c), conn, slot, slot, target,
                                                                 120.0, False))
        assert done["result"] == "moved", done
        done = members._change("move", None, 120.0)     # and a range the nemesis picks
        assert "failed" not in done and members.pending is None, done
        m = _ask(conn, "slot map", lambda c: slots_cli.read_map(c, conn))
        assert slots_cli.owner_of(m, slot) == target
        # The new node serves: a write through it (or its redirect) lands.
        r = wl.Resp([lc.load(d).node(new).resp], random.Random(1))
        try:
            assert r.call("XADD", wl.STREAM, "*", "v", "after-replace")
        finally:
            r.close()
    finally:
        nh.down(d)


# Regression (member soak seed 811, ec4d28a): the final heal crashed on "no node 8" — hosts.json
# listed the wiped node's replacement as a member but cluster.json did not, because its start
# never ran (the cluster lock was held: a heal's restart runs under it). ec4d28a's `finally: save`
# did not cover that (a start that times out was already saved by start_and_wait); this test
# fails on it. A start that cannot run leaves the node a spare; one that times out leaves it
# recorded, and the heal restarts it. The start deadline is set through the environment.
@pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace harness: {WHY_NOT}")
def test_a_member_start_that_times_out_leaves_nothing_the_final_heal_cannot_find(tmp_path, monkeypatch):
    d = str(tmp_path / "c")
    nh.up(d, nodes=3, groups=2, spares=1, disk_mb=16, node_args=("--tick-ms=50",))
    try:
        # 0 s: the lock is tried once, and no node logs ready the instant it is spawned.
        monkeypatch.setenv(nm.START_TIMEOUT_ENV, "0")
        f = fl.Faults(d, random.Random(3))
        members = nm.Members(d, f, random.Random(3))
        # 1. A replacement whose start cannot even begin (a restart holds the lock past the deadline).
        members._begin_replace()
        _op, old = members.pending
        with lc.locked(d), pytest.raises(lc.LocalClusterError, match="another xraftctl"):
            members._replacement(old)
        row = next(h for h in f.hosts["nodes"] if h.get("replaces") == old)
        assert row["id"] not in f.ids
        healed = f.heal_all()        # "no node 5" here before the fix
        assert healed[-1] == "all running", healed
        # 2. A spare whose start times out (not ready within 0 s): recorded, so the heal restarts it.
        spare = members._spares()[0]
        members._begin_add()
        assert members.pending == ("add", spare)
        with pytest.raises(lc.LocalClusterError, match="timed out"):
            members._ensure_running(spare)
        assert spare in f.ids and lc.load(d).node(spare).pid
        f.kill(spare)
        assert f.heal_all()[-1] == f"restarted [{spare}]"
        cluster = lc.load(d)
        assert lc.is_alive(cluster, cluster.node(spare))
        # Recorded once the lock is free: the wiped node leaves cluster.json, or every later
        # start's --peers lists two nodes at one address and xraft-node refuses to start (a
        # member soak's restart after a replace). Last: the replacement joins only after `node
        # remove` of the wiped node, which this test does not run.
        members._record(row["id"], members._seed())
        cluster = lc.load(d)
        assert old not in [n.id for n in cluster.nodes] and row["id"] in f.ids
        for n in cluster.nodes:
            argv = lc.node_argv(cluster, n)
            if "--peers" in argv:
                addrs = [p.split("=", 1)[1] for p in argv[argv.index("--peers") + 1].split(",")]
                assert len(addrs) == len(set(addrs)), argv
    finally:
        nh.down(d)
