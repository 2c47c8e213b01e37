"""The TEST-ONLY unsynced-loss layer (runtime/unsynced_loss.py) on real files and a real
kill -9: a child process writes a WAL with XRAFT_UNSYNCED_LOSS set and SIGKILLs itself;
with the marker present ("power cut") the reopened WAL holds exactly the records that
were fdatasynced, without it ("process crash") everything written."""
import json
import os
import signal
import subprocess
import sys

import pytest

from xraft.node.runtime import unsynced_loss as ul
from xraft.node.runtime.wal import FsyncPolicy, RecordType, Wal, WalOptions

CHILD = r"""
import json, os, signal, sys
from xraft.node.runtime.wal import FsyncPolicy, RecordType, Wal, WalOptions
path, policy, segment_bytes, plan = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
opts = WalOptions(fsync=FsyncPolicy(policy), segment_bytes=segment_bytes, batch_interval_ms=10**9,
                  batch_bytes=1 << 30)
wal = Wal.open(path, opts)
now = 0
for step in plan:          # [n records, "sync" (fsync due) | "write" (written, not fsynced)]
    n, how = step
    wal.append([(RecordType.ENTRIES, b"r%d" % (now * 1000 + k) + b" " * 100) for k in range(n)])
    wal.sync(now_ms=0 if how == "sync" else 1, force=how == "sync")
    now += 1
os.kill(os.getpid(), signal.SIGKILL)
"""


def crash_child(path, marker, policy, plan, segment_bytes=1 << 20):
    env = dict(os.environ, **{ul.ENV: str(marker)})
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), policy, str(segment_bytes), json.dumps(plan)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def reopen(path, marker, monkeypatch, policy="batch"):
    monkeypatch.setenv(ul.ENV, str(marker))
    seen = []
    wal = Wal.open(str(path), WalOptions(fsync=FsyncPolicy(policy)), visit=seen.append)
    wal.close()
    if policy != "never":     # under never the reopened WAL's own writes are unsynced again
        assert journals(marker) == []     # applied or dropped at open, then synced
    return [r.payload.decode().rstrip() for r in seen if r.type == RecordType.ENTRIES]


def journals(marker):
    d = str(marker) + ".undo"
    return os.listdir(d) if os.path.isdir(d) else []


def names(plan, upto):
    return [f"r{step * 1000 + k}" for step in range(upto) for k in range(plan[step][0])]


PLAN = [[5, "sync"], [3, "write"], [4, "write"]]


def test_a_power_cut_loses_exactly_the_writes_never_fsynced(tmp_path, monkeypatch):
    marker = tmp_path / "power-cut"
    crash_child(tmp_path / "wal", marker, "batch", PLAN)
    assert journals(marker)       # the crash left a journal (outside the WAL's directory)
    marker.write_text("")
    assert reopen(tmp_path / "wal", marker, monkeypatch) == names(PLAN, 1)


def test_a_process_crash_without_the_marker_loses_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "power-cut"
    crash_child(tmp_path / "wal", marker, "batch", PLAN)
    assert reopen(tmp_path / "wal", marker, monkeypatch) == names(PLAN, 3)


def test_fsync_always_loses_nothing_at_a_power_cut(tmp_path, monkeypatch):
    marker = tmp_path / "power-cut"
    plan = [[5, "write"], [3, "write"], [4, "write"]]       # ALWAYS fsyncs every sync() anyway
    crash_child(tmp_path / "wal", marker, "always", plan)
    assert journals(marker) == []
    marker.write_text("")
    assert reopen(tmp_path / "wal", marker, monkeypatch, "always") == names(plan, 3)


def test_fsync_never_loses_everything_at_a_power_cut(tmp_path, monkeypatch):
    marker = tmp_path / "power-cut"
    crash_child(tmp_path / "wal", marker, "never", PLAN)
    marker.write_text("")
    assert reopen(tmp_path / "wal", marker, monkeypatch, "never") == []


def test_a_full_data_filesystem_does_not_fail_the_journal(tmp_path, monkeypatch):
    """The journals live beside the marker, not in the WAL's directory: an ENOSPC fault on
    the node's data filesystem hits the WAL's own writes only."""
    marker = tmp_path / "power-cut"
    crash_child(tmp_path / "wal", marker, "batch", PLAN)
    assert journals(marker) and not [n for n in os.listdir(tmp_path / "wal") if ul.SUFFIX in n]


def test_rotation_keeps_the_sealed_segments_and_loses_the_new_tail(tmp_path, monkeypatch):
    """Small segments: syncs rotate (the sealed segment and the new one are fsynced), then
    unsynced writes in the newest segment are what a power cut takes."""
    marker = tmp_path / "power-cut"
    plan = [[40, "sync"], [40, "sync"], [40, "sync"], [2, "sync"], [6, "write"]]
    crash_child(tmp_path / "wal", marker, "batch", plan, segment_bytes=4096)
    assert len([n for n in os.listdir(tmp_path / "wal") if n.endswith(".log")]) >= 3
    marker.write_text("")
    assert reopen(tmp_path / "wal", marker, monkeypatch) == names(plan, 4)


def test_journal_round_trip_and_torn_last_record(tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"synced--")
    loss = ul.UnsyncedLoss(str(tmp_path / "marker"))
    fd = os.open(target, os.O_RDWR)
    try:
        loss.before_write(fd, 6, 6)
        os.pwrite(fd, b"XXnew!", 6)
        loss.before_truncate(fd, 3)
        os.ftruncate(fd, 3)
        loss.before_write(fd, 3, 4)
        os.pwrite(fd, b"ZZZZ", 3)
    finally:
        os.close(fd)
    journal = loss.journal_of(str(target))
    assert ul.journal_target(journal) == os.path.realpath(target)
    size, changes = ul.read_journal(journal)
    assert size == 8 and changes == [(6, b"--"), (3, b"cedXXnew!")]
    with open(journal, "ab") as f:           # a record whose write was interrupted
        f.write(b"B" + (100).to_bytes(8, "big") + (50).to_bytes(4, "big") + b"half")
    assert ul.read_journal(journal) == (size, changes)
    (tmp_path / "marker").write_text("")
    assert loss.recover(str(tmp_path)) == [(str(target), 8, 11)]
    assert target.read_bytes() == b"synced--" and not os.path.exists(journal)


def test_a_journal_without_its_size_record_is_refused(tmp_path):
    (tmp_path / "j").write_bytes(b"B" + bytes(12))
    with pytest.raises(ul.UndoJournalError):
        ul.read_journal(str(tmp_path / "j"))


def test_the_harness_arms_the_layer_by_this_modules_variable():
    from xraft.ops import netns_hosts
    assert netns_hosts.UNSYNCED_LOSS_ENV == ul.ENV
