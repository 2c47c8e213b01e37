"""Child process for test_snapshot_crash.py: build a log, then create a snapshot and die mid-way.

    python snapshot_crash_child.py DIR [create|install]

Environment XRAFT_TEST_CRASH chooses the failpoint, armed only around create_snapshot():
    count            run to the end; print {"op": calls, ...} (JSON) for create_snapshot
    OP:N             SIGKILL this process right after the N-th call (1-based) of os.OP

OP is one of the durable-write steps of a snapshot: write (snapshot .tmp bytes), fsync
(.tmp file, snapshot dir), rename (.tmp -> .snap), pwrite or pwritev (WAL records), fdatasync (WAL),
unlink (pruned snapshots, released WAL segments). The storage runs on real files with the
real os calls; the failpoint only adds the kill, so whatever reached the kernel stays.

The log is the follower case of ISSUE9 B1: entries durable, then a commit-only hard state
only buffered (as GroupDriver does for a Ready whose only change is the commit index),
then (create) create_snapshot() at that commit index, or (install) a leader's snapshot
beyond the log installed the way GroupDriver persists such a Ready: apply_snapshot(), then
save() of the hard state committing it, then sync().
"""
from __future__ import annotations

import functools
import json
import os
import signal
import sys

from xraft.node.raft.types import ConfState, Entry, HardState, Snapshot, SnapshotMetadata
from xraft.node.runtime.disk_storage import DiskStorage, DiskStorageOptions
from xraft.node.runtime.wal import FsyncPolicy, WalOptions

OPS = ("write", "fsync", "rename", "pwrite", "pwritev", "fdatasync", "unlink")
TERM = 2
LAST = 240  # entries 1..LAST are durable before the snapshot
SNAP_AT = 200  # commit index (buffered) and snapshot index
KEEP = 10  # create_snapshot keep_entries
INSTALL_AT, INSTALL_TERM = 300, 3  # the leader's snapshot in the install scenario
CONF = ConfState(voters=(1, 2, 3))
OPTIONS = DiskStorageOptions(wal=WalOptions(fsync=FsyncPolicy.ALWAYS, segment_bytes=4096,
                                            zero_ahead_bytes=0))


def entry(i: int) -> Entry:
    return Entry(term=TERM, index=i, data=b"entry-%d-" % i + bytes(40))


def snapshot_data(index: int) -> bytes:
    return b"state-machine@%d" % index


def _arm(spec: str) -> dict[str, int]:
    """Wrap os.<op> to count calls and, for OP:N, SIGKILL right after the N-th."""
    counts = {op: 0 for op in OPS}
    target, nth = None, 0
    if spec != "count":
        target, n = spec.split(":")
        nth = int(n)
        if target not in OPS or nth < 1:
            raise SystemExit(f"bad XRAFT_TEST_CRASH {spec!r}")
    for op in OPS:
        real = getattr(os, op)

        @functools.wraps(real)
        def wrapped(*args, _op=op, _real=real, **kwargs):
            result = _real(*args, **kwargs)
            counts[_op] += 1
            if _op == target and counts[_op] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(os, op, wrapped)
    return counts


def main() -> None:
    path = sys.argv[1]
    scenario = sys.argv[2] if len(sys.argv) > 2 else "create"
    if scenario not in ("create", "install"):
        raise SystemExit(f"unknown scenario {scenario!r}")
    st = DiskStorage.open(path, OPTIONS)
    st.save(HardState(term=TERM, vote=1, commit=0), ())
    for lo in range(1, LAST + 1, 20):
        st.save(HardState(term=TERM, vote=1, commit=max(0, lo - 60)),
                [entry(i) for i in range(lo, lo + 20)])
        st.sync()
    # The follower learns commit = SNAP_AT from a heartbeat: a commit-only Ready, buffered.
    st.save(HardState(term=TERM, vote=1, commit=SNAP_AT), ())
    counts = _arm(os.environ.get("XRAFT_TEST_CRASH", "count"))
    if scenario == "create":
        st.create_snapshot(SNAP_AT, CONF, snapshot_data(SNAP_AT), keep_entries=KEEP)
    else:
        st.apply_snapshot(Snapshot(SnapshotMetadata(INSTALL_AT, INSTALL_TERM, CONF),
                                   snapshot_data(INSTALL_AT)))
        st.save(HardState(term=INSTALL_TERM, vote=0, commit=INSTALL_AT), ())
        st.sync()
    print(json.dumps(counts), flush=True)
    st.close()


if __name__ == "__main__":
    main()
