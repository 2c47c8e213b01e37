"""xraftctl status: the layout as a table and as JSON (from real ClusterLayoutResponse
protobufs); against a real one-group node; and the failures, each exit 1 with a
sentence saying why: a server without ClusterLayout, no node at all, unreadable
options. (A sharded cluster: tests/client/test_routing_cluster.py.)"""
import json
import subprocess
import sys

from click.testing import CliRunner

from tests.client import ThreadServer
from tests.cluster.conftest import cluster_factory, free_ports  # noqa: F401 - a fixture
from xraft.client.routing import Layout
from xraft.ops import cli, cluster_status
from xraft.proto.v1 import client_pb2 as pb


def _ctl(*args, timeout=60):
    """xraftctl as an operator runs it: a separate process."""
    return subprocess.run([sys.executable, "-m", "xraft.ops", *args], capture_output=True, text=True,
                          timeout=timeout)


def _layout() -> Layout:
    m = pb.ClusterLayoutResponse(epoch=9, node_id=2)
    for i in (1, 2, 3):
        m.nodes.add(id=i, grpc=f"127.0.0.1:710{i}", resp=f"127.0.0.1:630{i}", state="up" if i < 3 else "draining")
    g = m.groups.add(id=1, leader=3, term=4, voters=[1, 2, 3])
    g.slots.add(first=0, last=5460)
    g.slots.add(first=16000, last=16383)
    g = m.groups.add(id=2, leader=0, term=4, voters=[1, 2], learners=[3])
    g.slots.add(first=5461, last=15999)
    return Layout.from_pb(m)


def test_table_names_nodes_groups_leaders_and_slots():
    text = cluster_status.table(_layout())
    lines = text.splitlines()
    assert lines[0] == "epoch 9 (answered by node 2)"
    node3 = next(line for line in lines if line.split()[:1] == ["3"] and "draining" in line)
    assert node3.split() == ["3", "draining", "127.0.0.1:7103", "127.0.0.1:6303", "1"]   # node 3 leads group 1
    group1 = next(line for line in lines if line.split()[:2] == ["1", "3(draining)"])
    assert group1.split()[2:] == ["1,2,3", "-", str(5461 + 384), "0-5460,16000-16383"]
    group2 = next(line for line in lines if line.split()[:2] == ["2", "none"])
    assert group2.split()[2:] == ["1,2", "3", str(15999 - 5461 + 1), "5461-15999"]


def test_json_is_the_documented_shape():
    data = _layout().to_json()
    assert list(data) == ["epoch", "nodes", "groups"] and data["epoch"] == 9
    assert all(list(n) == ["id", "grpc", "resp", "state"] for n in data["nodes"])
    assert [list(g) for g in data["groups"]] == [["id", "leader", "voters", "learners", "slots"]] * 2
    assert data["groups"][1] == {"id": 2, "leader": None, "voters": [1, 2], "learners": [3], "slots": "5461-15999"}


def test_a_one_group_node(cluster_factory):  # noqa: F811
    cluster = cluster_factory(1)
    cluster.start()
    node = cluster.wait_leader()
    r = _ctl("status", "--seed", node.grpc, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["nodes"] == [{"id": 1, "grpc": node.grpc, "resp": node.resp, "state": "up"}]
    assert [(g["leader"], g["voters"], g["slots"]) for g in data["groups"]] == [(1, [1], "0-16383")]


def test_a_server_without_cluster_layout_is_reported():
    with ThreadServer() as (address, _backend):        # the client API alone: no slot map to show
        r = _ctl("status", "--seed", address, "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert "does not serve ClusterLayout" in r.stderr and "without sharding" in r.stderr, r.stderr


def test_no_node_at_the_seed():
    [port] = free_ports(1)
    r = _ctl("status", "--seed", f"127.0.0.1:{port}", "--timeout", "3")
    assert r.returncode == 1 and f"no cluster layout from 127.0.0.1:{port}" in r.stderr, r.stderr


def test_unreadable_options_are_errors_not_tracebacks(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli.main, ["status", "--seed", "127.0.0.1:1", "--token-file", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "cannot read the token file" in r.output, r.output
    (tmp_path / "empty").write_text("\n")
    r = runner.invoke(cli.main, ["status", "--seed", "127.0.0.1:1", "--token-file", str(tmp_path / "empty")])
    assert r.exit_code == 1 and "is empty" in r.output, r.output
    r = runner.invoke(cli.main, ["status", "--seed", "127.0.0.1:1", "--no-tls", "--tls-ca", str(tmp_path / "empty")])
    assert r.exit_code == 1 and "bad connection options" in r.output, r.output
