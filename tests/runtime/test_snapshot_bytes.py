"""A group snapshots by bytes as well as by entries: big records (XADD batches) must not grow
the log a restart replays without a bound (issue 14's restart_s_1gb)."""
from .test_driver import Cluster, run  # noqa: F401  (run: the uvloop fixture)


def test_a_log_of_big_entries_is_snapshotted_by_its_bytes_and_restarts_from_the_image(tmp_path, run):
    async def main():
        # 64 KiB entries; the entry count alone (100,000) would never trigger an image here.
        c = await Cluster(tmp_path, snapshot_entries=100_000, snapshot_bytes=1 << 20).start()
        try:
            leader = await c.wait_leader()
            blob = b"x" * (64 << 10)
            for i in range(40):                       # 2.5 MiB of entries: two images at least
                await leader.propose(b"k%d=" % i + blob, 10)
            await c.wait_converged()
            # Images are made by forked children while the groups go on: wait for them.
            await c.wait_for(lambda: all(c.g(n).stats.snapshots_created >= 2 and c.g(n).applied - c.g(n).snap_index < 40
                                         for n in c.ids), what="two snapshots on every node")
            for nid in c.ids:
                g = c.g(nid)
                assert g.stats.snapshots_created >= 2, (nid, g.stats)
                assert g.applied - g.snap_index < 40
            # The budget is at least the last image: an image of ~2.5 MiB raises it past 1 MiB.
            assert leader.stats.last_snapshot_bytes > 1 << 20
            follower = next(n for n in c.ids if n != leader.node_id)
            await c.crash(follower)
            await c.start_node(follower)
            assert c.g(follower).snap_index > 0 and c.g(follower).stats.last_snapshot_bytes > 0
            await c.wait_converged()
        finally:
            await c.close()
    run(main())


def test_small_entries_of_a_large_state_wait_for_a_sixteenth_of_the_image_in_log(tmp_path, run):
    """The entry count alone no longer images a large state once per snapshot_entries small
    records (issue 14: XACKs at 1M pending paid one state-sized image per 1,000 records): an
    image is due by entries once the log since the last is >= 1/16 of it, or 16x the count."""
    from xraft.node.runtime.driver_snapshots import SNAPSHOT_ENTRIES_CAP, SNAPSHOT_LOG_RATIO

    async def main():
        c = await Cluster(tmp_path, snapshot_entries=20, snapshot_bytes=64 << 20).start()
        try:
            leader = await c.wait_leader()
            blob = b"x" * (32 << 10)
            for i in range(24):                       # ~768 KiB of state
                last_big = await leader.propose(b"big%d=" % i + blob, 10)
            pad = 0
            while leader.snap_index < last_big:       # until an image holds every big entry
                await leader.propose(b"pad%d=1" % pad, 10)
                pad += 1
                assert pad < 200, "no image of the big entries"
                if pad % 20 == 0:
                    await c.wait_for(lambda: leader.snap_index >= last_big or leader._image_task is None,
                                     what="the image in progress")
            image = leader.stats.last_snapshot_bytes
            made = leader.stats.snapshots_created
            assert image > 512 << 10
            small = 3 * 20                            # three times the count, each entry ~10 bytes
            for i in range(small):
                await leader.propose(b"s%d=1" % i, 10)
            await c.wait_converged()
            assert small * 12 * SNAPSHOT_LOG_RATIO < image  # far below a sixteenth of the image
            assert leader.stats.snapshots_created == made, "small entries imaged a large state"
            for i in range(SNAPSHOT_ENTRIES_CAP * 20 - small):   # the cap: due by entries after all
                await leader.propose(b"t%d=1" % i, 10)
            await c.wait_for(lambda: leader.stats.snapshots_created > made, what="the capped image")
        finally:
            await c.close()
    run(main())
