"""ISSUE9 C6: a leader whose wall clock jumps an hour ahead must not move replicated time
an hour ahead (XADD * IDs, PEL idle times, XAUTOCLAIM). 3 RaftBackends in process, each
with its own injected wall clock (no global time patching); monotonic clocks are real."""
import time

from tests.server.test_raft_backend import Cluster, others, run, xadd  # noqa: F401 (run: fixture)
from xraft.node.fsm.resolve import MAX_CLOCK_LEAD_MS, resolve_command

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
