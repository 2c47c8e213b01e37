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
