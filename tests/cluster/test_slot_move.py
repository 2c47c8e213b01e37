"""Online slot moves end to end on real processes: 3 nodes, 3 data groups, the metadata
group's leader driving each move (move_reconciler.py + slot_move_steps.py), started with
`xraftctl slots move`.

  * under load: an SDK producer XADDs to a stream in the moving slots while a redis-py
    RedisCluster consumer group reads (XREADGROUP >) and acks it; the CLI exits 0 with the
    target as owner; every acknowledged entry is there exactly once, the group's PEL is
    exactly what was delivered and not acked (owners and delivery counts), and a quiet
    stream's XINFO GROUPS / CONSUMERS / XPENDING are identical before the seal and after the
    commit (idle times aside, which only grow);
  * a CLI killed right after it began the move: the move goes on, and the same command run
    again watches it to its end (or finds it done), exit 0;
  * kill -9 of the metadata leader at every phase (failpoints, each once per cluster; a
    watcher restarts whatever died): the move still finishes, its data intact.
"""
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from redis.cluster import RedisCluster

from tests.cluster.conftest import cluster_factory, wait_until  # noqa: F401 - a fixture
from tests.cluster.harness import GROUP, Consumer, GroupModel, SdkProducer, check_group, check_stream
from tests.cluster.sharded_util import ClusterConn, wait_settled
from xraft.client import sync
from xraft.client.slots import key_slot

GROUPS = 3
KILL_POINTS = ("move.precopying.step", "move.precopying.propose", "move.sealing.propose", "move.copying.step", "move.copying.propose", "move.verified.step",
               "move.decided.step", "move.decided.propose", "move.released.step")


def _start(cluster_factory, tmp_path_factory, env=None):  # noqa: F811
    cluster = cluster_factory(3)
    for node in cluster.nodes.values():
        node.extra_args = ["--groups", str(GROUPS), "--snapshot-entries", "200"]
    cluster.env.update(env or {})
    cluster.start()
    wait_settled(cluster)         # the leader balancers' first hand-overs over
    return cluster


def _run_range(cluster, tag):
    """A slot run around `{tag}`'s slot, inside one group's slots; (first, last, owner, target)."""
    slot = key_slot(("{%s}" % tag).encode())
    with sync.Client([n.grpc for n in cluster.nodes.values()], timeout=20) as c:
        m = json.loads(c.get_slot_map().slot_map)
    a, b, owner = next(r for r in m["slots"] if r[0] <= slot <= r[1])
    first, last = max(a, slot - 3), min(b, slot + 3)
    return first, last, owner, owner % GROUPS + 1


def _move(cluster, first, last, target, seed=1):
    cmd = [sys.executable, "-m", "xraft.ops", "slots", "move", "--slots", f"{first}-{last}", "--to-group",
           str(target), "--json", "--seed", cluster.nodes[seed].grpc, "--timeout", "5", "--wait", "240"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    result = json.loads(r.stdout)
    assert result["result"] == "moved" and result["owner"] == target
    return result


def _rc(cluster):
    n = next(n for n in cluster.nodes.values() if n.running())
    return RedisCluster(host="127.0.0.1", port=n.resp_port, decode_responses=True)


def _quiet_group(rc, key):
    """A stream with a consumer group in some state, nobody touching it afterwards."""
    for i in range(30):
        rc.xadd(key, {"i": str(i)})
    rc.xgroup_create(key, "qg", id="0")
    rc.xreadgroup("qg", "c1", {key: ">"}, count=10)
    got = rc.xreadgroup("qg", "c2", {key: ">"}, count=5)
    rc.xreadgroup("qg", "c1", {key: "0"})                       # a second delivery of c1's
    rc.xack(key, "qg", *[e[0] for e in got[0][1][:2]])


def _group_view(rc, key):
    groups = rc.xinfo_groups(key)
    consumers = [{k: v for k, v in c.items() if k not in ("idle", "inactive")} for c in rc.xinfo_consumers(key, "qg")]
    pel = [(p["message_id"], p["consumer"], p["times_delivered"])
           for p in rc.xpending_range(key, "qg", min="-", max="+", count=1000)]
    return groups, consumers, pel, rc.xrange(key)


def _idle(rc, key):
    return {c["name"]: c["idle"] for c in rc.xinfo_consumers(key, "qg")}


def _owner(cluster, slot):
    with sync.Client([n.grpc for n in cluster.nodes.values() if n.running()], timeout=20) as c:
        layout = c.cluster_layout()
    return next(g.id for g in layout.groups if any(a <= slot <= b for a, b in g.slots))


class ClusterConsumer(Consumer):
    def __init__(self, cluster, stream, name, model):
        super().__init__(cluster, stream, name, model)
        self.conn.close()
        self.conn = ClusterConn(cluster, name)


@pytest.fixture(scope="module")
def plain(cluster_factory, tmp_path_factory):  # noqa: F811
    return _start(cluster_factory, tmp_path_factory)


def test_a_move_under_load_loses_nothing_and_keeps_the_groups(plain):
    cluster = plain
    first, last, owner, target = _run_range(cluster, "mv")
    load, quiet = "{mv}load", "{mv}quiet"
    rc = _rc(cluster)
    try:
        rc.xgroup_create(load, GROUP, id="0", mkstream=True)
        _quiet_group(rc, quiet)
        before = _group_view(rc, quiet)
        idle_before = _idle(rc, quiet)
    finally:
        rc.close()
    producer = SdkProducer(cluster, load, "p", interval=0.003)
    model = GroupModel()
    consumer = ClusterConsumer(cluster, load, "c1", model)
    producer.start()
    consumer.start()
    try:
        wait_until(lambda: len(producer.acked) >= 50 and model.ever, 60, "load flowing before the move")
        result = _move(cluster, first, last, target)
        t_moved = time.monotonic()
        wait_until(lambda: producer.acked_since(t_moved) >= 30, 60, "writes acknowledged after the move")
    finally:
        producer.finish()
        consumer.finish()
    assert _owner(cluster, key_slot(load.encode())) == target
    rc = _rc(cluster)
    try:
        figures = check_stream(rc.xrange(load), [producer])
        check_group(rc, load, model, ["c1"])
        assert _group_view(rc, quiet) == before
        # the target's time starts at the source's (time floor): idle times never go back
        idle_after = _idle(rc, quiet)
        assert all(idle_after[c] >= idle_before[c] for c in idle_before), (idle_before, idle_after)
    finally:
        rc.close()
    phases = [p["phase"] for p in result["phases"]]
    assert phases[-1] == "finished" and phases[0] in ("precopying", "sealing", "copying"), phases
    assert figures["acked"] >= 80 and result["write_wait_ms"] >= 0


@pytest.fixture(scope="module")
def killing(cluster_factory, tmp_path_factory):  # noqa: F811
    marks = tmp_path_factory.mktemp("failpoints")
    cluster = _start(cluster_factory, tmp_path_factory, {"XRAFT_FAILPOINTS": ",".join(KILL_POINTS),
                                                          "XRAFT_FAILPOINTS_ONCE": str(marks)})
    cluster.marks = marks
    return cluster


class Restarter(threading.Thread):
    """Starts again every node that died (a failpoint's SIGKILL) until stopped."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.stop, self.restarts, self.error = cluster, threading.Event(), 0, None

    def run(self):
        try:
            while not self.stop.wait(0.05):
                for node in self.cluster.nodes.values():
                    if node.proc is not None and node.proc.poll() is not None:
                        assert node.proc.returncode == -9, (node.id, node.proc.returncode, node.log_text())
                        node.start()
                        node.wait_ready()
                        self.restarts += 1
        except BaseException as e:  # noqa: BLE001 - raised by the test
            self.error = e


def test_the_metadata_leader_killed_at_every_phase_still_finishes_the_move(killing):
    cluster = killing
    first, last, owner, target = _run_range(cluster, "kill")
    key = "{kill}s"
    rc = _rc(cluster)
    try:
        _quiet_group(rc, key)
        before = _group_view(rc, key)
    finally:
        rc.close()
    watcher = Restarter(cluster)
    watcher.start()
    try:
        _move(cluster, first, last, target, seed=1)
    finally:
        watcher.stop.set()
        watcher.join(60)
    assert watcher.error is None, watcher.error
    fired = sorted(os.listdir(cluster.marks))
    assert fired == sorted(KILL_POINTS) and watcher.restarts == len(KILL_POINTS)
    assert _owner(cluster, key_slot(key.encode())) == target
    rc = _rc(cluster)
    try:
        assert _group_view(rc, key) == before
        assert rc.xadd(key, {"after": "move"})
    finally:
        rc.close()
    with sync.Client([n.grpc for n in cluster.nodes.values()], timeout=20) as c:
        assert "migrations" not in json.loads(c.get_slot_map().slot_map)


def test_killing_the_cli_does_not_stop_the_move_and_a_rerun_reports_it(plain):
    cluster = plain
    first, last, owner, target = _run_range(cluster, "cli")
    cmd = [sys.executable, "-m", "xraft.ops", "slots", "move", "--slots", f"{first}-{last}", "--to-group",
           str(target), "--json", "--seed", cluster.nodes[2].grpc, "--timeout", "5"]
    cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with sync.Client([n.grpc for n in cluster.nodes.values()], timeout=20) as c:
            def begun():
                m = json.loads(c.get_slot_map().slot_map)
                return any(g["first"] == first for g in m.get("migrations", ())) or \
                    all(g == target for a, b, g in m["slots"] if a <= last and b >= first)
            wait_until(begun, 60, "the CLI's BeginMove in the map")
    finally:
        cli.kill()
        cli.communicate()
    result = _move(cluster, first, last, target, seed=3)     # watches the move, or finds it done
    assert result["from_group"] in (owner, target)
    assert _owner(cluster, first) == target
