"""data_dir.open_data_dir on real directories: when a start may bootstrap, and every way a
data dir that lost its Raft state is refused (the cluster-level test in
tests/cluster/test_node_identity.py runs the same rules with real processes)."""
import json
import os

import pytest

from xraft.node.runtime.incarnation import write_durably
from xraft.node.server.config import parse_args
from xraft.node.server.data_dir import StartError, open_data_dir


def cfg(tmp_path, state=None, node=1):
    argv = ["--id", str(node), "--cluster-id", "c", "--data-dir", str(tmp_path / "d"),
            "--grpc", "127.0.0.1:7001", "--resp", "127.0.0.1:6001", "--peers", "%d=127.0.0.1:7001" % node]
    return parse_args(argv + (["--initial-cluster-state", state] if state else []))


def group(tmp_path):
    return str(tmp_path / "d" / "group-1")


def fake_wal(tmp_path):
    os.makedirs(os.path.join(group(tmp_path), "wal"))
    open(os.path.join(group(tmp_path), "wal", "wal-0000000000000001-0000000000000000"), "wb").close()


def identity(tmp_path):
    return json.loads((tmp_path / "d" / "node.json").read_text())


def test_an_empty_data_dir_bootstraps_only_with_new(tmp_path):
    for state in (None, "existing"):
        with pytest.raises(StartError, match="holds no state of node 1.*membership change"):
            open_data_dir(cfg(tmp_path, state), group(tmp_path))
        assert os.listdir(tmp_path / "d") == ["LOCK"]  # nothing written
    dd = open_data_dir(cfg(tmp_path, "new"), group(tmp_path))
    assert dd.bootstrap and len(dd.incarnation) == 16
    assert identity(tmp_path) == {"cluster_id": "c", "node_id": 1, "incarnation": dd.incarnation.hex(),
                                  "bootstrap_pending": True}
    fake_wal(tmp_path)            # what the driver's bootstrap leaves behind
    dd.mark_bootstrapped()
    assert identity(tmp_path)["bootstrap_pending"] is False and not dd.bootstrap
    dd.close()
    # Restarts keep the incarnation; `new` on an initialised dir is ignored (as etcd does).
    for state in (None, "new"):
        again = open_data_dir(cfg(tmp_path, state), group(tmp_path))
        assert (again.bootstrap, again.incarnation) == (False, dd.incarnation)
        again.close()


def test_a_crash_before_the_bootstrap_was_durable_bootstraps_again(tmp_path):
    dd = open_data_dir(cfg(tmp_path, "new"), group(tmp_path))
    dd.close()  # killed before the group's bootstrap: node.json says pending
    again = open_data_dir(cfg(tmp_path), group(tmp_path))
    assert again.bootstrap and again.incarnation == dd.incarnation
    again.close()


def test_lost_raft_data_is_refused(tmp_path):
    dd = open_data_dir(cfg(tmp_path, "new"), group(tmp_path))
    fake_wal(tmp_path)
    dd.mark_bootstrapped()
    dd.close()
    os.remove(os.path.join(group(tmp_path), "wal", os.listdir(os.path.join(group(tmp_path), "wal"))[0]))
    for state in (None, "new"):
        with pytest.raises(StartError, match="holds no Raft log although node 1 bootstrapped it"):
            open_data_dir(cfg(tmp_path, state), group(tmp_path))
    # Raft data without the identity file: whose is it? Refused, not adopted.
    fake_wal_dir = os.path.join(group(tmp_path), "wal")
    open(os.path.join(fake_wal_dir, "wal-0000000000000002-0000000000000000"), "wb").close()
    os.remove(tmp_path / "d" / "node.json")
    with pytest.raises(StartError, match="node.json is missing"):
        open_data_dir(cfg(tmp_path, "new"), group(tmp_path))


def test_identity_mismatch_and_a_legacy_identity_file(tmp_path):
    dd = open_data_dir(cfg(tmp_path, "new"), group(tmp_path))
    fake_wal(tmp_path)
    dd.mark_bootstrapped()
    dd.close()
    with pytest.raises(StartError, match="belongs to"):
        open_data_dir(cfg(tmp_path, node=2), group(tmp_path))
    # Written by an xraft before incarnations: the node keeps its data under a first incarnation.
    write_durably(str(tmp_path / "d" / "node.json"), b'{"cluster_id": "c", "node_id": 1}')
    legacy = open_data_dir(cfg(tmp_path), group(tmp_path))
    assert not legacy.bootstrap and identity(tmp_path)["incarnation"] == legacy.incarnation.hex()
    legacy.close()
    (tmp_path / "d" / "node.json").write_text('{"cluster_id": "c", "node_id": 1, "incarnation": "zz"}')
    with pytest.raises(StartError):
        open_data_dir(cfg(tmp_path), group(tmp_path))


def test_the_data_dir_is_locked(tmp_path):
    dd = open_data_dir(cfg(tmp_path, "new"), group(tmp_path))
    with pytest.raises(StartError, match="in use by another process"):
        open_data_dir(cfg(tmp_path, "new"), group(tmp_path))
    dd.close()


def test_each_generation_of_a_groups_replica_has_its_own_directory(tmp_path):
    """A node that rejoins a group does so as a new replica (cluster/slot_map.py generations): its
    directory is a fresh one, never the old replica's log; generation 0 keeps group-G."""
    from xraft.node.server.config import ConfigError
    from xraft.node.server.node_main import generations_on_disk, group_dir
    c = cfg(tmp_path)
    assert group_dir(c, 3) == str(tmp_path / "d" / "group-3")
    assert group_dir(c, 3, 2) == str(tmp_path / "d" / "group-3.g2")
    assert generations_on_disk(c, 3) == []
    for name in ("group-3", "group-3.g2", "group-3.g10", "group-33", "group-3.gx", "group-0"):
        os.makedirs(tmp_path / "d" / name)
    assert generations_on_disk(c, 3) == [0, 2, 10]
    assert generations_on_disk(c, 33) == [0]
    with pytest.raises(ConfigError):
        cfg(tmp_path, node=1 << 40)           # replica ids keep the node id in 40 bits
