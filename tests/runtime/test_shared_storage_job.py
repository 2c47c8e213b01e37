"""multiraft.py "One storage job per iteration": the Readies of several groups persisted by one
executor job (write all, then sync each), on real DiskStorage with fsync on."""
import asyncio

from xraft.node.raft.types import MessageType as MT

from tests.runtime.test_driver import Cluster, DurableWatch, run  # noqa: F401 - a fixture

GROUPS = (1, 2, 3)


async def lead_all_groups_from_node_1(c: Cluster) -> dict:
    for gid in GROUPS:
        await c.g(1, gid).campaign()
        await c.wait_for(lambda: c.g(1, gid).is_leader(), 10, f"node 1 to lead group {gid}")
    return {gid: c.g(1, gid) for gid in GROUPS}


def test_groups_sharing_a_storage_job_keep_acknowledged_writes_across_a_crash(tmp_path, run):
    """Node 1 leads three groups and every node syncs in the executor (inline_sync_bytes 0):
    proposals to the three groups in the same iteration are persisted by one job on the
    leader, and their appends (one envelope) by one job on each follower. Each group's acks
    leave only after its own storage's sync (DurableWatch per group), and every write
    acknowledged before all nodes crash with writes in flight is on every node after the
    restart."""
    async def main():
        c = Cluster(tmp_path, groups=GROUPS, election_tick=300, mr_kw=dict(inline_sync_bytes=0))
        watches = [DurableWatch(c, gid=gid) for gid in GROUPS]
        for nid in c.ids:
            await c.start_node(nid)
            for w in watches:
                w.install(nid)
        try:
            leaders = await lead_all_groups_from_node_1(c)
            acked: dict[int, dict[str, str]] = {gid: {} for gid in GROUPS}

            async def write(gid, key):
                await leaders[gid].propose(f"{key}={gid}".encode(), 10)
                acked[gid][key] = str(gid)

            for rnd in range(3):
                await asyncio.gather(*(write(gid, f"r{rnd}k{i}") for i in range(20) for gid in GROUPS))
            for nid in c.ids:
                st = c.nodes[nid].stats
                # Groups shared jobs on every node (leader: its proposals; followers: the appends).
                assert st.persist_readies > st.persist_jobs > 0, (nid, st)
            for w in watches:
                assert not w.violations, w.violations[:5]
                assert w.checked[MT.APP_RESP] > 0, w.checked
            # A last round still in flight when every node crashes.
            tasks = [asyncio.ensure_future(write(gid, f"late{i}")) for i in range(20) for gid in GROUPS]
            await c.wait_for(lambda: any(acked[gid].get("late0") for gid in GROUPS), 10, "a late ack")
            for n in list(c.nodes):
                await c.crash(n)
            await asyncio.gather(*tasks, return_exceptions=True)
            c.sms.clear()
            await c.start()
            for gid in GROUPS:
                await c.g(1, gid).campaign()
                leader = await c.wait_leader(gid)
                await leader.propose(b"post=1", 10)  # commits the new term; every node catches up
                await c.wait_converged(gid)
                for n in c.ids:
                    data = c.sms[(n, gid)].data
                    missing = [k for k, v in acked[gid].items() if data.get(k) != v]
                    assert not missing, f"node {n} group {gid} lost acknowledged writes, e.g. {missing[:3]}"
        finally:
            await c.close()
    run(main())


def test_a_failing_storage_in_a_shared_job_stops_only_its_group(tmp_path, run):
    """One group's storage fails its sync inside a job shared with the other groups: that
    group fail-stops (its callers get typed outcomes), the others' Readies of the same job
    are durable, finished and acknowledged, and they keep taking writes."""
    async def main():
        c = Cluster(tmp_path, groups=GROUPS, election_tick=300, mr_kw=dict(inline_sync_bytes=0))
        await c.start()
        try:
            leaders = await lead_all_groups_from_node_1(c)
            bad = leaders[2].storage

            def failing_sync(*a, **kw):
                raise OSError(5, "injected EIO")
            bad.sync = failing_sync
            mr = c.nodes[1]
            jobs0, readies0 = mr.stats.persist_jobs, mr.stats.persist_readies
            outcomes = await asyncio.gather(*(leaders[gid].propose(f"k={gid}".encode(), 5) for gid in GROUPS),
                                            return_exceptions=True)
            assert mr.stats.persist_readies - readies0 > mr.stats.persist_jobs - jobs0, "no shared job"
            assert isinstance(outcomes[0], int) and isinstance(outcomes[2], int), outcomes
            assert isinstance(outcomes[1], Exception) and "injected EIO" in str(outcomes[1]), outcomes
            assert leaders[2].failed is not None and leaders[1].failed is None and leaders[3].failed is None
            for gid in (1, 3):
                assert await leaders[gid].propose(b"after=1", 5) > 0
        finally:
            await c.close()
    run(main())
