"""--fsync always|batch|never through the driver, on real files: count the fsyncs (ISSUE9 B4).

The node's clock is driven by hand (MultiRaft.now_ms, which the driver reads), so "the batch
interval passed" is a fact of the test, not a race. Every os.fdatasync / os.fsync still runs;
the test only counts them.
"""
import asyncio
import os

import pytest

from xraft.node.runtime.disk_storage import DiskStorageOptions
from xraft.node.runtime.multiraft import MultiRaft
from xraft.node.runtime.wal import FsyncPolicy, WalOptions

from .test_driver import Cluster, run  # noqa: F401  (run: the uvloop fixture)

INTERVAL_MS = 200


class Counts:
    def __init__(self, monkeypatch):
        self.fdatasync = 0  # the WAL's
        self.fsync = 0  # snapshot files and directories
        real_fdatasync, real_fsync = os.fdatasync, os.fsync

        def fdatasync(fd):
            real_fdatasync(fd)
            self.fdatasync += 1

        def fsync(fd):
            real_fsync(fd)
            self.fsync += 1
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "fsync", fsync)


def one_node(tmp_path, monkeypatch, policy):
    clock = [0]
    monkeypatch.setattr(MultiRaft, "now_ms", lambda self: clock[0], raising=False)
    wal = WalOptions(fsync=policy, batch_interval_ms=INTERVAL_MS, batch_bytes=1 << 30)
    c = Cluster(tmp_path, n=1, storage=DiskStorageOptions(wal=wal), snapshot_entries=100_000)
    return c, clock


async def started_leader(c):
    """Start the one-node cluster; its leader once idle (the election's sync done)."""
    await c.start()
    leader = await c.wait_leader()
    await leader.wait_idle()
    return leader


async def write(leader, n, prefix):
    for i in range(n):
        await leader.propose(b"%s%d=%d" % (prefix, i, i), 10)  # one at a time: one Ready each
    await leader.wait_idle()


def test_batch_defers_fsyncs_to_the_interval_and_flushes_a_quiet_group(tmp_path, monkeypatch, run):
    async def main():
        c, clock = one_node(tmp_path, monkeypatch, FsyncPolicy.BATCH)
        counts = Counts(monkeypatch)
        leader = await started_leader(c)
        try:
            st = leader.storage
            # The election's sync at t=0 was the first: it fsynced and started the interval.
            base = counts.fdatasync
            await write(leader, 30, b"a")
            assert counts.fdatasync == base, "30 acked writes inside one interval: no fsync"
            assert st.fsync_deferred
            # The interval passes with no new write: the deferred fsync happens anyway.
            clock[0] += INTERVAL_MS
            await c.wait_for(lambda: not st.fsync_deferred and not leader.busy, 10, "the timed flush")
            assert counts.fdatasync == base + 1
            # Writes again inside the new interval, then one after it: that write's own sync fsyncs.
            await write(leader, 5, b"b")
            assert counts.fdatasync == base + 1 and st.fsync_deferred
            clock[0] += INTERVAL_MS
            await write(leader, 1, b"c")
            assert counts.fdatasync == base + 2 and not st.fsync_deferred
        finally:
            await c.close()
    run(main())


def test_always_fsyncs_every_write(tmp_path, monkeypatch, run):
    async def main():
        c, clock = one_node(tmp_path, monkeypatch, FsyncPolicy.ALWAYS)
        counts = Counts(monkeypatch)
        leader = await started_leader(c)
        try:
            base = counts.fdatasync
            await write(leader, 30, b"a")  # the clock never moves: always ignores it
            assert counts.fdatasync >= base + 30
            assert not leader.storage.fsync_deferred
        finally:
            await c.close()
    run(main())


def test_never_fsyncs_nothing(tmp_path, monkeypatch, run):
    counts = Counts(monkeypatch)

    async def main():
        c, clock = one_node(tmp_path, monkeypatch, FsyncPolicy.NEVER)
        leader = await started_leader(c)
        try:
            await write(leader, 30, b"a")
            clock[0] += 10 * INTERVAL_MS
            await asyncio.sleep(3 * INTERVAL_MS / 1000)  # a timer, if one were armed, has fired
            assert (counts.fdatasync, counts.fsync) == (0, 0)
            assert not leader.storage.fsync_deferred
        finally:
            await c.close()
    run(main())
    assert (counts.fdatasync, counts.fsync) == (0, 0), "not even at a clean shutdown"


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_every_mode_keeps_acknowledged_writes_across_a_clean_restart(tmp_path, monkeypatch, run, policy):
    async def main():
        c, clock = one_node(tmp_path, monkeypatch, policy)
        leader = await started_leader(c)
        await write(leader, 20, b"k")
        applied = c.sms[(1, 1)].applied_index
        await c.close()
        c2, _ = one_node(tmp_path, monkeypatch, policy)
        await c2.start()
        try:
            await c2.wait_for(lambda: c2.sms[(1, 1)].applied_index >= applied, 10, "replay")
            assert all(c2.sms[(1, 1)].data["k%d" % i] == str(i) for i in range(20))
        finally:
            await c2.close()
    run(main())


def test_batch_still_fsyncs_a_vote_before_it_is_acknowledged(tmp_path, monkeypatch):
    """fsync=batch defers log writes, never a (term, vote) change: a granted vote forgotten by a
    power cut could elect two leaders in one term. Entries and commit-only changes still wait."""
    from xraft.node.raft.types import Entry, HardState
    from xraft.node.runtime.disk_storage import DiskStorage

    wal = WalOptions(fsync=FsyncPolicy.BATCH, batch_interval_ms=INTERVAL_MS, batch_bytes=1 << 30)
    st = DiskStorage.open(str(tmp_path), DiskStorageOptions(wal=wal))
    st.save(HardState(1, 0, 0), [Entry(1, 1, data=b"a")])
    st.sync(0)
    counts = Counts(monkeypatch)
    st.save(None, [Entry(1, 2, data=b"b")])
    assert not st.sync(10) and counts.fdatasync == 0  # an entry inside the interval: deferred
    st.save(HardState(1, 0, 2), ())
    assert not st.sync(20) and counts.fdatasync == 0  # commit only: deferred
    st.save(HardState(2, 3, 2), ())
    assert st.sync(30) and counts.fdatasync == 1  # a new term and vote: synced at once
    st.save(HardState(2, 3, 2), [Entry(2, 3, data=b"c")])
    assert not st.sync(40) and counts.fdatasync == 1  # the same vote again: deferred as before
    st.close()
