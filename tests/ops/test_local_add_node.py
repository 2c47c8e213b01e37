"""`xraftctl local add-node`: one more real node joined to a running local cluster through
`--join` and `node add` (ops/members_local.py)."""
import json

from tests.ops.test_local_cluster import _ctl, cluster_dir  # noqa: F401 - a fixture
from xraft.ops import local_cluster as lc


def test_e2e_local_add_node(cluster_dir):  # noqa: F811
    r = _ctl("local", "up", "--dir", cluster_dir, "--nodes", "3", "--groups", "3", "--timeout", "40")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        r = _ctl("local", "add-node", "--dir", cluster_dir, "--json", "--wait", "120", timeout=200)
        assert r.returncode == 0, r.stdout + r.stderr
        added = json.loads(r.stdout)
        assert added["node"] == 4 and added["action"] == "add"
        cluster = lc.load(cluster_dir)
        node4 = cluster.node(4)
        assert node4.join and lc.is_alive(cluster, node4)
        r = _ctl("status", "--seed", cluster.node(1).grpc, "--json")
        assert r.returncode == 0, r.stderr
        layout = json.loads(r.stdout)
        assert {n["id"]: n["state"] for n in layout["nodes"]} == {1: "up", 2: "up", 3: "up", 4: "up"}
        assert any(4 in g["voters"] for g in layout["groups"]) and not any(g["learners"] for g in layout["groups"])
        rows = json.loads(_ctl("local", "status", "--dir", cluster_dir, "--json").stdout)
        assert sorted(r["id"] for r in rows) == [1, 2, 3, 4]
    finally:
        assert _ctl("local", "down", "--dir", cluster_dir).returncode == 0
