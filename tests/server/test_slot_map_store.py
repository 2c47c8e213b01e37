"""slot_map_store on real files: the founding map every node computes alike, written durably
(a SIGKILL after each step of tmp write / fsync / rename / dir fsync leaves no file or the
whole map, and the bootstrap that re-runs after the crash writes the same bytes), read back
validated, and every start whose --groups disagrees with it refused."""
import os
import signal
import subprocess
import sys

import pytest

from xraft.node.cluster.slot_map import SlotMap
from xraft.node.engine.slots import SLOT_COUNT
from xraft.node.server.config import parse_args
from xraft.node.server.data_dir import StartError
from xraft.node.server.slot_map_store import SLOT_MAP_FILE, founding_layout, load_slot_map

STEPS = ("written", "synced", "renamed", "dir-synced")
PEERS = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"
RESP_PEERS = "1=127.0.0.1:6001,2=127.0.0.1:6002,3=127.0.0.1:6003"


def argv(data_dir, node=1, groups=6):
    return ["--id", str(node), "--cluster-id", "c", "--data-dir", str(data_dir),
            "--grpc", "127.0.0.1:700%d" % node, "--resp", "0.0.0.0:600%d" % node,
            "--peers", PEERS, "--resp-peers", RESP_PEERS, "--groups", str(groups)]


def cfg(data_dir, node=1, groups=6):
    os.makedirs(data_dir, exist_ok=True)
    return parse_args(argv(data_dir, node, groups))


CRASHER = r'''
import os, signal, sys
from xraft.node.server.config import parse_args
from xraft.node.server.slot_map_store import load_slot_map
crash_at, args = sys.argv[1], sys.argv[2:]

def hook(step):
    if step == crash_at:
        os.kill(os.getpid(), signal.SIGKILL)
load_slot_map(parse_args(args), bootstrap=True, crash_hook=hook)
print("survived", flush=True)
'''


@pytest.mark.parametrize("crash_at", STEPS)
def test_a_kill_at_each_step_of_the_write_leaves_no_map_or_the_whole_map(tmp_path, crash_at):
    data = tmp_path / "d"
    os.makedirs(data)
    p = subprocess.run([sys.executable, "-c", CRASHER, crash_at] + argv(data), capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr          # killed mid-write, for real
    path = data / SLOT_MAP_FILE
    expected = founding_layout(cfg(data))
    if crash_at in ("written", "synced"):
        assert not path.exists()                               # not renamed: nothing committed
    else:
        assert SlotMap.decode(path.read_bytes()) == expected
    # The bootstrap re-runs after the crash (node.json still says bootstrap_pending): a leftover
    # .tmp is never read, and the map written (or found) is the founding one, byte for byte.
    assert load_slot_map(cfg(data), bootstrap=True) == expected
    assert path.read_bytes() == expected.encode()
    assert load_slot_map(cfg(data), bootstrap=False) == expected


def test_every_founding_node_computes_the_same_map(tmp_path):
    maps = [load_slot_map(cfg(tmp_path / str(n), node=n), bootstrap=True) for n in (1, 2, 3)]
    raw = [(tmp_path / str(n) / SLOT_MAP_FILE).read_bytes() for n in (1, 2, 3)]
    assert raw[0] == raw[1] == raw[2]
    m = maps[0]
    assert len(m.groups) == 6 and m.epoch == 1
    assert sorted(g.preferred_leader for g in m.groups.values()) == [1, 1, 2, 2, 3, 3]
    assert sum(m.slot_counts().values()) == SLOT_COUNT
    # Each node's own --resp (0.0.0.0 here) is not in it: only --peers / --resp-peers are.
    assert m.nodes[1].resp == "127.0.0.1:6001"


def test_one_group_keeps_every_peer_a_voter(tmp_path):
    m = founding_layout(cfg(tmp_path, groups=1))
    assert list(m.groups) == [1] and m.groups[1].voters == (1, 2, 3) and m.ranges(1) == [(0, SLOT_COUNT - 1)]


def test_groups_disagreeing_with_the_stored_map_are_refused(tmp_path):
    load_slot_map(cfg(tmp_path), bootstrap=True)
    with pytest.raises(StartError, match="--groups 4, but this cluster was founded with 6 group"):
        load_slot_map(cfg(tmp_path, groups=4), bootstrap=False)
    with pytest.raises(StartError, match="--groups 4, but"):
        load_slot_map(cfg(tmp_path, groups=4), bootstrap=True)    # the stored map wins over a re-run


def test_a_data_dir_from_before_slot_maps_is_one_group(tmp_path):
    m = load_slot_map(cfg(tmp_path, groups=1), bootstrap=False)
    assert list(m.groups) == [1] and not (tmp_path / SLOT_MAP_FILE).exists()
    with pytest.raises(StartError, match="founded before slot maps.*--groups 1"):
        load_slot_map(cfg(tmp_path, groups=6), bootstrap=False)


@pytest.mark.parametrize("content", [b"", b"{", b'{"epoch": 1}', b"x" * 100])
def test_a_damaged_map_is_refused_not_recomputed(tmp_path, content):
    c = cfg(tmp_path)
    (tmp_path / SLOT_MAP_FILE).write_bytes(content)
    for bootstrap in (False, True):
        with pytest.raises(StartError, match="not a valid slot map"):
            load_slot_map(c, bootstrap=bootstrap)
