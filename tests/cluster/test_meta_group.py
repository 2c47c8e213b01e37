"""The metadata group on real nodes: 3 node processes, 3 data groups, group 0 holding the
slot map (snapshot every 3 entries, so restarts go through its snapshot and its log).

  * every node starts from the founding map (epoch 1) and serves GetSlotMap;
  * a BeginMove (PRECOPYING) then Precopied (SEALING) proposed through the SDK
    (ProposeMapChange, to group 0's leader) reach every node: GetSlotMap, CLUSTER INFO's
    epochs and ClusterLayout say epoch 3;
  * a write to a slot the move froze is parked and answered -TRYAGAIN; other slots write;
  * the same change again is refused as stale with already_applied; a move step the state
    machine does not allow is refused as "move"; bytes that are not a change as "invalid";
  * the map survives a clean restart of every node and a kill -9 of group 0's leader;
  * Abort then Finish (what the reconciler does on a timeout) unfreezes the slots.
  * `xraftctl slots move` begins a move, `xraftctl status --json` lists it, a second CLI for
    the same slots watches that move (not a new one), and the CLI reports the abort (exit 1,
    the owner unchanged);
  * `xraftctl rebalance` applies a preferred-leader change and the leader balancers follow.
Nothing drives the moves here (--pause-moves): this checks the map side only; the moves
themselves: test_slot_move.py."""
import json
import signal
import subprocess
import sys

import pytest
import redis

from tests.cluster.conftest import cluster_factory, wait_until  # noqa: F401 - a fixture
from tests.cluster.sharded_util import wait_settled
from xraft.client import errors, sync
from xraft.client.slots import key_slot

GROUPS = 3
FIRST, LAST = 100, 199


def _change(obj) -> bytes:
    return json.dumps({"v": 1, **obj}, sort_keys=True, separators=(",", ":")).encode()


def _key_in(first, last, prefix="k"):
    i = 0
    while not first <= key_slot(f"{prefix}{i}".encode()) <= last:
        i += 1
    return f"{prefix}{i}"


@pytest.fixture(scope="module")
def meta_cluster(cluster_factory):  # noqa: F811
    cluster = cluster_factory(3)
    for node in cluster.nodes.values():
        node.extra_args = ["--groups", str(GROUPS), "--snapshot-entries", "3", "--pause-moves"]
    cluster.start()
    wait_settled(cluster)         # the leader balancers' first hand-overs over
    return cluster


def _maps(cluster):
    out = {}
    for node in cluster.nodes.values():
        with sync.Client([node.grpc], timeout=5) as c:
            r = c.get_slot_map()
            assert r.node_id == node.id
            out[node.id] = (r.epoch, json.loads(r.slot_map))
    return out


def _all_at(cluster, epoch):
    try:
        maps = _maps(cluster)
    except errors.XRaftError:          # a node still starting
        return None
    return maps if all(e == epoch for e, _ in maps.values()) else None


def _cluster_epoch(node):
    info = node.client().execute_command("CLUSTER", "INFO")
    info = info.decode() if isinstance(info, bytes) else info
    return int(dict(line.split(":") for line in info.split("\r\n") if ":" in line)["cluster_current_epoch"])


def test_founding_map_is_group_zero_state(meta_cluster):
    maps = wait_until(lambda: _all_at(meta_cluster, 1), 30, "every node on the founding map")
    first = next(iter(maps.values()))[1]
    assert all(m == first for _, m in maps.values())
    assert [g["id"] for g in first["groups"]] == [1, 2, 3] and "migrations" not in first


def test_move_map_changes_reach_every_node_and_survive_restarts(meta_cluster):
    cluster = meta_cluster
    seeds = [n.grpc for n in cluster.nodes.values()]
    with sync.Client(seeds, timeout=20) as c:
        m = json.loads(c.get_slot_map().slot_map)
        owner = next(g for a, b, g in m["slots"] if a <= FIRST <= b)
        target = owner % GROUPS + 1
        begin = _change({"kind": "begin_move", "expect_epoch": 1, "first": FIRST, "last": LAST,
                         "target": target})
        r = c.propose_map_change(begin)
        assert r.applied and r.epoch == 2 and not r.refused_kind
        # a re-sent change: refused as stale, and its effect is in the map
        again = c.propose_map_change(begin)
        assert not again.applied and again.refused_kind == "stale_epoch" and again.already_applied
        bad_step = _change({"kind": "advance_move", "expect_epoch": 2, "first": FIRST, "last": LAST,
                            "started_epoch": 2, "target": target, "event": {"kind": "finish"}})
        r = c.propose_map_change(bad_step)
        assert not r.applied and r.refused_kind == "move" and not r.already_applied
        r = c.propose_map_change(b"not a change")
        assert not r.applied and r.refused_kind == "invalid"
        # a pre-copying move leaves the slots served; the step to SEALING freezes them
        precopied = _change({"kind": "advance_move", "expect_epoch": 2, "first": FIRST, "last": LAST,
                             "started_epoch": 2, "target": target, "event": {"kind": "precopied"}})
        r = c.propose_map_change(precopied)
        assert r.applied and r.epoch == 3

    maps = wait_until(lambda: _all_at(cluster, 3), 30, "every node on epoch 3")
    for _, m in maps.values():
        assert m["migrations"] == [{"cursor": "", "digest": "", "first": FIRST, "last": LAST, "phase": "sealing",
                                    "reason": "", "replicated": 0, "source": owner, "started_epoch": 2,
                                    "target": target}]
    for node in cluster.nodes.values():
        assert _cluster_epoch(node) == 3
        nodes = node.client().execute_command("CLUSTER", "NODES")
        nodes = nodes.decode() if isinstance(nodes, bytes) else nodes
        if isinstance(nodes, dict):                  # redis-py parses it: config_epoch per node
            assert {int(n["config_epoch"]) for n in nodes.values()} == {3}
        else:
            assert {line.split(" ")[6] for line in nodes.splitlines()} == {"3"}
    with sync.Client(seeds, timeout=20) as c:
        assert c.cluster_layout().epoch == 3

    # a frozen slot: parked, then TRYAGAIN at the node that serves it (the others redirect
    # there); another slot writes as before
    frozen_key, free_key = _key_in(FIRST, LAST), _key_in(LAST + 1, 16383)
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[1].resp_port)
    try:
        assert rc.xadd(free_key, {"f": "v"})
    finally:
        rc.close()
    answers = []
    for node in cluster.nodes.values():
        try:
            node.client().xadd(frozen_key, {"f": "v"})
            answers.append("written")
        except redis.exceptions.ResponseError as e:     # redis-py's TryAgainError, MovedError
            answers.append(type(e).__name__)
    assert "TryAgainError" in answers and set(answers) <= {"TryAgainError", "MovedError"}, answers

    # clean restart of every node: the map comes back from group 0 (snapshot + log)
    cluster.stop()
    cluster.start()
    maps = wait_until(lambda: _all_at(cluster, 3), 30, "epoch 3 after a restart")
    assert all(m["migrations"][0]["phase"] == "sealing" for _, m in maps.values())

    # kill -9 group 0's leader, then abort and finish the move through the new one
    with sync.Client(seeds, timeout=20) as c:
        lead = wait_until(lambda: c.get_slot_map().meta_leader, 30, "a metadata leader")
    cluster.nodes[lead].signal(signal.SIGKILL)
    cluster.nodes[lead].wait_exit()
    alive = [n.grpc for n in cluster.nodes.values() if n.id != lead]
    with sync.Client(alive, timeout=30) as c:
        for event, epoch in (({"kind": "abort", "reason": "operator"}, 3), ({"kind": "finish"}, 4)):
            r = c.propose_map_change(_change({"kind": "advance_move", "expect_epoch": epoch, "first": FIRST,
                                              "last": LAST, "started_epoch": 2, "target": target,
                                              "event": event}))
            assert r.applied, r.refused
    cluster.nodes[lead].start()
    cluster.nodes[lead].wait_ready()
    maps = wait_until(lambda: _all_at(cluster, 5), 30, "epoch 5 everywhere, the killed node included")
    assert all("migrations" not in m and any(a <= FIRST <= b and g == owner for a, b, g in m["slots"])
               for _, m in maps.values())
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[1].resp_port)
    try:
        assert rc.xadd(frozen_key, {"f": "after"})
        assert rc.xlen(frozen_key) == 1
    finally:
        rc.close()


def _ctl(cluster, *args, **kw):
    cmd = [sys.executable, "-m", "xraft.ops", *args, "--seed", cluster.nodes[1].grpc, "--timeout", "10"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_slots_move_cli_begins_watches_and_reports_an_abort(meta_cluster):
    cluster = meta_cluster
    seeds = [n.grpc for n in cluster.nodes.values()]
    first, last = 300, 310
    with sync.Client(seeds, timeout=20) as c:
        m = json.loads(c.get_slot_map().slot_map)
        target = owner = next(g for a, b, g in m["slots"] if a <= first <= b)
        target = owner % GROUPS + 1
        bad = _ctl(cluster, "slots", "move", "--slots", "310-300", "--to-group", str(target))
        assert bad.wait(60) == 1 and "FIRST <= LAST" in bad.communicate()[1]
        cli = _ctl(cluster, "slots", "move", "--slots", f"{first}-{last}", "--to-group", str(target), "--json")
        mig = wait_until(lambda: json.loads(c.get_slot_map().slot_map).get("migrations"), 60, "the CLI's BeginMove")
        assert mig[0]["first"] == first and mig[0]["target"] == target and mig[0]["phase"] == "precopying"
        status = _ctl(cluster, "status", "--json")
        out, err = status.communicate(timeout=60)
        assert status.returncode == 0, err
        assert [(s["first"], s["last"], s["phase"]) for s in json.loads(out)["migrations"]] == [(first, last, "precopying")]
        started = mig[0]["started_epoch"]
        epoch = json.loads(c.get_slot_map().slot_map)["epoch"]
        for event in ({"kind": "abort", "reason": "operator"}, {"kind": "finish"}):
            r = c.propose_map_change(_change({"kind": "advance_move", "expect_epoch": epoch, "first": first,
                                              "last": last, "started_epoch": started, "target": target,
                                              "event": event}))
            assert r.applied, r.refused
            epoch += 1
            if event["kind"] == "abort":
                # a second CLI for the same slots watches the move in the map (not a new one):
                # aborted, not finished within its --wait
                wait_until(lambda: _all_at(cluster, epoch), 30, "every node sees the abort")
                again = _ctl(cluster, "slots", "move", "--slots", f"{first}-{last}", "--to-group", str(target),
                             "--json", "--wait", "1")
                out, err = again.communicate(timeout=60)
                assert again.returncode == 1, err
                seen = json.loads(out)
                assert seen["result"] == "timeout" and seen["reason"] == "operator" and seen["epoch"] == epoch
                assert [p["phase"] for p in seen["phases"]] == ["aborted"]
    try:
        out, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 1, err
    result = json.loads(out)
    # (the reason is shown when the CLI polled the map while the move was ABORTED)
    assert result["result"] == "aborted" and result["reason"] in ("operator", "") and result["owner"] == owner
    assert result["from_group"] == owner and result["to_group"] == target and result["epoch"] == epoch
    assert [p["phase"] for p in result["phases"]][-1] == "finished"


def test_rebalance_applies_preferred_leaders_and_the_balancer_follows_the_map(meta_cluster):
    cluster = meta_cluster
    seeds = [n.grpc for n in cluster.nodes.values()]
    with sync.Client(seeds, timeout=20) as c:
        m = json.loads(c.get_slot_map().slot_map)
        prefs = {g["id"]: g["preferred_leader"] for g in m["groups"]}
        assert sorted(prefs.values()) == [1, 2, 3]
        # unbalance: group 1 prefers the node that group 2 prefers
        r = c.propose_map_change(_change({"kind": "set_preferred_leader", "expect_epoch": m["epoch"],
                                          "group_id": 1, "node_id": prefs[2]}))
        assert r.applied, r.refused
        wait_until(lambda: _all_at(cluster, r.epoch), 30, "every node on the unbalanced map")
        ctl = _ctl(cluster, "rebalance", "--json")
        out, err = ctl.communicate(timeout=120)
        assert ctl.returncode == 0, err
        result = json.loads(out)
        assert result["result"] == "balanced" and [s["kind"] for s in result["steps"]] == ["preferred_leader"]
        m = json.loads(c.get_slot_map().slot_map)
        assert sorted(g["preferred_leader"] for g in m["groups"]) == [1, 2, 3] and m["epoch"] == r.epoch + 1

        def settled():
            layout = c.cluster_layout()
            return layout.epoch == m["epoch"] and all(g.leader == g.preferred_leader for g in layout.groups)
        wait_until(settled, 60, "every group led by its preferred node of the new map")
