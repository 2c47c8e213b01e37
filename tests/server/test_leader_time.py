"""ISSUE9 C6: a leader whose wall clock jumps an hour ahead must not move replicated time
an hour ahead (XADD * IDs, PEL idle times, XAUTOCLAIM). 3 RaftBackends in process, each
with its own injected wall clock (no global time patching); monotonic clocks are real."""
import time

from tests.server.test_raft_backend import Cluster, others, run, xadd  # noqa: F401 (run: fixture)
from xraft.node.fsm.resolve import MAX_CLOCK_LEAD_MS, resolve_command
from xraft.node.server.raft_backend import RaftBackend

BASE = 1_800_000_000_000
HOUR = 3_600_000


def _cmd(s):
    return resolve_command(0, 0, s.encode().split()).request


def test_a_leader_whose_clock_jumps_an_hour_ahead_does_not_move_time_an_hour(tmp_path, run):
    async def main():
        started = time.monotonic()                        # before the nodes read their clocks
        c = await Cluster(tmp_path, clocks={1: BASE, 2: BASE, 3: BASE}).start()
        try:
            leader = await c.writable_leader()
            [first] = await leader.submit([xadd(b"s", f="v")])
            assert first == b"%d-0" % BASE
            await leader.submit([_cmd("XGROUP CREATE s g 0")])
            await leader.submit([_cmd("XREADGROUP GROUP g worker STREAMS s >")])   # delivered at BASE
            target = others(leader)[0]
            await c.converged()
            c.clock[target] = BASE + HOUR                 # its wall clock jumps an hour ahead
            await leader.driver.transfer_leader(target)
            new = await c.writable_leader(among=(target,))
            [later] = await new.submit([xadd(b"s", f="w")])
            pending = await new.read(b"XPENDING s g - + 10".split())
            claimed = await new.submit([_cmd("XAUTOCLAIM s g thief 1800000 0")])   # min idle 30 min
            # Wall time that really passed, plus the lead the bound allows.
            slack = int((time.monotonic() - started) * 1000) + MAX_CLOCK_LEAD_MS + 1
            ms = int(later.split(b"-")[0])
            assert BASE <= ms <= BASE + slack                       # main: BASE + HOUR
            [[entry_id, consumer, idle, count]] = pending
            assert consumer == b"worker" and idle <= slack            # main: idle ~ an hour
            assert claimed[0][1] == []                                # main: the live entry is stolen
            assert new.stamper.clamped >= 1
            await c.converged()
            assert {c.b[n].sm.last_now_ms for n in c.b} == {c.b[target].sm.last_now_ms}
            assert c.b[target].sm.last_now_ms <= BASE + slack
        finally:
            await c.close()
    run(main())


def test_a_node_that_starts_an_hour_ahead_and_leads_is_held_to_the_groups_clocks(tmp_path, run, monkeypatch):
    """A node whose clock is an hour ahead from the start (anchor trusts it) becomes leader.
    Its peers' clocks outvote it. The gRPC handshake does not run over LocalTransport, so each
    backend gets its peers' skews through the same hook node_main wires to
    GrpcTransport.peer_clock_skews: here, computed from the injected wall clocks."""
    import tests.server.test_raft_backend as cluster_mod

    clocks = {1: BASE, 2: BASE, 3: BASE + HOUR}

    def backend(nid, *args, **kw):
        skews = lambda: {m: clocks[m] - clocks[nid] for m in clocks if m != nid}   # noqa: E731
        return RaftBackend(nid, *args, peer_clock_skews=skews, **kw)
    monkeypatch.setattr(cluster_mod, "RaftBackend", backend)

    async def main():
        started = time.monotonic()
        c = await Cluster(tmp_path, clocks=clocks).start()
        try:
            leader = await c.writable_leader()
            if leader.raft_id == 3:                  # the first writes come from a right clock
                await leader.driver.transfer_leader(1)
                leader = await c.writable_leader(among=(1,))
            [first] = await leader.submit([xadd(b"s", f="v")])
            await leader.submit([_cmd("XGROUP CREATE s g 0")])
            await leader.submit([_cmd("XREADGROUP GROUP g worker STREAMS s >")])   # delivered at ~BASE
            await c.converged()
            await leader.driver.transfer_leader(3)   # the node that started an hour ahead leads
            new = await c.writable_leader(among=(3,))
            [later] = await new.submit([xadd(b"s", f="w")])
            pending = await new.read(b"XPENDING s g - + 10".split())
            claimed = await new.submit([_cmd("XAUTOCLAIM s g thief 1800000 0")])   # min idle 30 min
            slack = int((time.monotonic() - started) * 1000) + MAX_CLOCK_LEAD_MS + 1
            for entry_id in (first, later):
                assert BASE <= int(entry_id.split(b"-")[0]) <= BASE + slack    # main: BASE + HOUR
            [[_, consumer, idle, _]] = pending
            assert consumer == b"worker" and idle <= slack                   # main: idle ~ an hour
            assert claimed[0][1] == []                                  # main: the live entry is stolen
            assert new.raft_info()["raft_time_capped"] >= 1
            await c.converged()
            assert all(c.b[n].sm.last_now_ms <= BASE + slack for n in c.b)
        finally:
            await c.close()
    run(main())
