"""--join (node_join.py, config.py, data_dir.py): who may join under which id, before any disk
or network state is made."""
import pytest

from xraft.node.cluster.changes import RemoveReplica, SetNodeState, SetPreferredLeader, apply_change
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import NodeSpec, NodeState
from xraft.node.server.config import ConfigError, parse_args
from xraft.node.server.data_dir import StartError, open_data_dir
from xraft.node.server.node_join import check_joinable


def _cfg(tmp_path, node_id=4, grpc="127.0.0.1:7004", *extra):
    return parse_args(["--id", str(node_id), "--cluster-id", "c", "--data-dir", str(tmp_path / "d"),
                       "--grpc", grpc, "--resp", "127.0.0.1:6004", "--join", "127.0.0.1:7001", *extra])


def _map():
    return initial_layout({n: NodeSpec(n, "127.0.0.1:%d" % (7000 + n), "") for n in (1, 2, 3)}, 3, 3)


def test_join_needs_no_peers_and_refuses_new(tmp_path):
    cfg = _cfg(tmp_path)
    assert cfg.peers == {4: "127.0.0.1:7004"} and cfg.join == "127.0.0.1:7001"
    with pytest.raises(ConfigError, match="--join adds a node"):
        _cfg(tmp_path, 4, "127.0.0.1:7004", "--initial-cluster-state", "new")


def test_a_new_id_may_join(tmp_path):
    check_joinable(_cfg(tmp_path), _map(), fresh=True)


def test_a_removed_id_never_returns(tmp_path):
    m = _map()
    m = apply_change(m, SetNodeState(m.epoch, 1, NodeState.DRAINING))
    for gid in m.groups_of_node(1):
        if m.groups[gid].preferred_leader == 1:
            m = apply_change(m, SetPreferredLeader(m.epoch, gid, 2))
        m = apply_change(m, RemoveReplica(m.epoch, gid, 1))
    m = apply_change(m, SetNodeState(m.epoch, 1, NodeState.REMOVED))
    with pytest.raises(StartError, match="node 1 was removed from this cluster .* new --id"):
        check_joinable(_cfg(tmp_path, 1, "127.0.0.1:7001"), m, fresh=True)


def test_a_member_with_an_empty_data_dir_lost_its_disk(tmp_path):
    with pytest.raises(StartError, match="lost its disk"):
        check_joinable(_cfg(tmp_path, 2, "127.0.0.1:7002"), _map(), fresh=True)
    check_joinable(_cfg(tmp_path, 2, "127.0.0.1:7002"), _map(), fresh=False)    # its restart


def test_an_address_in_use_is_refused(tmp_path):
    with pytest.raises(StartError, match="node 3 already uses"):
        check_joinable(_cfg(tmp_path, 4, "127.0.0.1:7003"), _map(), fresh=True)


def test_a_joining_data_dir_bootstraps_nothing(tmp_path):
    cfg = _cfg(tmp_path)
    data = open_data_dir(cfg, str(tmp_path / "d" / "group-1"))
    try:
        assert data.bootstrap is False
    finally:
        data.close()
    data = open_data_dir(cfg, str(tmp_path / "d" / "group-1"))     # its restart
    data.close()
