"""A node's identity with real `xraft-node` processes: no founding start without
--initial-cluster-state new, a wiped data dir refused at start, a wiped node
restarted as `new` refused by its peers (who remember its incarnation across
their own restarts), and the authentication start-up rules (--requirepass
needs --token-file; every API served without authentication is named at
WARNING)."""
import os
import shutil
import subprocess
import sys

from tests.cluster.conftest import free_ports, wait_until


def _writes(node, n, key="ident"):
    with node.client() as r:
        return [r.xadd(key, {"i": i}) for i in range(n)]


def test_a_wiped_node_refuses_to_start_and_is_refused_by_its_peers_as_new(cluster_factory):
    c = cluster_factory(3)
    c.start()
    leader = c.wait_leader()
    ids = _writes(leader, 20)
    victim = c.followers(leader)[0]
    others = [n for n in c.nodes.values() if n is not victim]
    assert c.stop([victim.id]) == {victim.id: 0}

    # The operator's disk is gone; a supervisor restarts the node as it always did.
    shutil.rmtree(victim.data_dir)
    victim.start()
    code = victim.wait_exit()
    out = victim.log_text()
    # main started it here, as a voter with an empty log.
    assert code == 1, out
    assert "holds no state of node %d" % victim.id in out and "membership change" in out, out
    assert not os.path.exists(os.path.join(victim.data_dir, "group-1")), "no Raft state may be created"

    # Told to found a cluster again, it starts, but under a new incarnation its peers refuse.
    victim.founded = False
    victim.start()
    victim.wait_ready()
    line = "node %d came back with incarnation" % victim.id
    wait_until(lambda: all(line in n.log_text(since_start=False) for n in others), 15,
               "both peers refusing the wiped node")
    assert "must not vote" in others[0].log_text(since_start=False)
    leader = c.wait_leader([n.id for n in others])
    more = _writes(leader, 5)
    info = victim.raft_info()
    assert info["raft_leader_id"] == 0 and info["raft_commit_index"] <= 1, info  # it learnt nothing
    with leader.client() as r:
        assert [e[0] for e in r.xrange("ident")] == ids + more

    # The peers' memory of its incarnation is on disk: a restarted peer refuses it too.
    peer = [n for n in others if n is not leader][0]
    assert c.stop([peer.id]) == {peer.id: 0}
    peer.start()
    peer.wait_ready()
    wait_until(lambda: line in peer.log_text(), 15, "the restarted peer refusing the wiped node")
    c.wait_leader([n.id for n in others])
    assert c.stop() == {n: 0 for n in c.nodes}


def _solo_argv(tmp_path, *extra):
    g, r = free_ports(2)
    secret = tmp_path / "secret"
    secret.write_text("s" * 32 + "\n")
    os.chmod(secret, 0o600)
    return [sys.executable, "-m", "xraft.node.server.node_main", "--id", "1", "--cluster-id", "solo",
            "--data-dir", str(tmp_path / "d"), "--grpc", "127.0.0.1:%d" % g, "--resp", "127.0.0.1:%d" % r,
            "--peers", "1=127.0.0.1:%d" % g, "--secret-file", str(secret), "--tick-ms", "50", *extra]


def test_requirepass_without_a_grpc_token_is_refused(tmp_path):
    argv = _solo_argv(tmp_path, "--requirepass", "pw")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=30)  # main served RESP with a password and gRPC without one
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2, err
    assert b"--requirepass protects RESP only" in err and b"--token-file" in err, err
    assert not (tmp_path / "d").exists()


def test_every_api_served_without_authentication_is_named_once_at_warning(cluster_factory):
    c = cluster_factory(1, cluster_id="open")
    node = c.nodes[1]
    c.start()
    c.wait_leader()
    text = node.log_text()
    assert text.count("WITHOUT authentication") == 2, text
    assert "the RESP API on %s is served WITHOUT authentication" % node.resp in text
    assert "the gRPC client API (XRaft, Execute included) on %s is served WITHOUT" % node.grpc in text
    assert c.stop() == {1: 0}
    # With a gRPC token only, RESP alone is named; with both, nothing is.
    token = os.path.join(c.root, "token")
    with open(token, "w") as f:
        f.write("t0ken\n")
    node.extra_args = ["--token-file", token]
    c.start()
    c.wait_leader()
    text = node.log_text()
    assert "the RESP API on %s is served WITHOUT authentication" % node.resp in text
    assert "gRPC client API" not in text, text
    assert c.stop() == {1: 0}
    node.extra_args = ["--token-file", token, "--requirepass", "pw"]
    c.start()
    assert "WITHOUT authentication" not in node.log_text()
    assert c.stop() == {1: 0}
