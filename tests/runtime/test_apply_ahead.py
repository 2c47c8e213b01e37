"""Costly applies off the loop (runtime/apply_ahead.py): a machine's prepare() for an entry runs
in the node's prepare thread, before that entry's apply and after the previous one's, while the
node's loop keeps serving its other groups. 3 nodes x 2 groups in one process (test_driver's
Cluster: DiskStorage with fsync, LocalTransport)."""
import asyncio
import threading

import pytest

from tests.runtime.test_driver import KV, Cluster

GATE_S = 30.0        # how long a held prepare waits for the other group (a liveness bound only)


class PreparingKV(KV):
    """KV whose `slow=...` entries have a prepare(); `boom=...` ones a prepare that raises.
    A prepare of a slow entry holds (in its thread) until `gate` is set."""

    prepare_min_bytes = 1

    def __init__(self, gate: threading.Event):
        super().__init__()
        self.gate = gate
        self.started: list = []          # indexes whose prepare began
        self.prepared: dict = {}         # index -> (thread name, the gate was set in time)
        self.applied_prepared: list = []  # indexes applied with their prepare done first

    def prepare(self, index, data, decoded=None):
        if data.startswith(b"boom="):
            def boom():
                raise RuntimeError("a prepare that fails")
            return boom
        if not data.startswith(b"slow="):
            return None

        def run():
            self.started.append(index)
            self.prepared[index] = (threading.current_thread().name, self.gate.wait(GATE_S))
        return run

    def apply(self, index, data):
        if index in self.prepared:
            self.applied_prepared.append(index)
        return super().apply(index, data)


@pytest.fixture
def run():
    import uvloop

    def _run(coro):
        return uvloop.run(asyncio.wait_for(coro, 120))
    return _run


async def one_node_two_groups(tmp_path, gate):
    """(the cluster, group 1's leader, group 2's), group 1 with one entry applied."""
    c = Cluster(tmp_path, n=1, groups=(1, 2), sm_factory=lambda: PreparingKV(gate))
    await c.start()
    try:
        g1, g2 = await c.wait_leader(1), await c.wait_leader(2)
        await g1.propose(b"before=1")
    except BaseException:
        await c.close()
        raise
    return c, g1, g2


def test_a_held_prepare_leaves_the_loop_to_other_groups_and_applies_in_order(tmp_path, run):
    """One node with two groups: had the prepare run on the loop, group 2 could not commit."""
    gate = threading.Event()

    async def main():
        c, g1, g2 = await one_node_two_groups(tmp_path, gate)
        try:
            slow = asyncio.ensure_future(g1.propose(b"slow=1"))
            after = asyncio.ensure_future(g1.propose(b"after=1"))   # queued behind it, same group
            sm = c.sms[(1, 1)]
            await c.wait_for(lambda: sm.started or slow.done(), GATE_S, "slow=1's prepare to start")
            for i in range(5):
                await g2.propose(b"other=%d" % i)
            assert c.sms[(1, 2)].data["other"] == "4"
            assert not slow.done() and not after.done() and "slow" not in sm.data
            gate.set()
            index = await slow
            assert await after == index + 1
            thread, in_time = sm.prepared[index]
            assert thread.startswith("xraft-prepare-") and in_time
            assert sm.applied_prepared == [index]
            assert c.g(1, 1).stats.prepared_off_loop == 1 and c.g(1, 2).stats.prepared_off_loop == 0
        finally:
            gate.set()
            await c.close()
    run(main())


def test_every_replica_prepares_off_the_loop_and_the_replicas_converge(tmp_path, run):
    gate = threading.Event()
    gate.set()

    async def main():
        c = Cluster(tmp_path, groups=(1,), sm_factory=lambda: PreparingKV(gate))
        await c.start()
        try:
            g1 = await c.wait_leader(1)
            futs = [asyncio.ensure_future(g1.propose(d)) for d in (b"a=1", b"slow=1", b"b=1", b"slow=2")]
            indexes = await asyncio.gather(*futs)
            await c.wait_converged(1)
            for n in c.ids:
                sm = c.sms[(n, 1)]
                assert sm.applied_prepared == [indexes[1], indexes[3]]
                assert all(t.startswith("xraft-prepare-") and ok for t, ok in sm.prepared.values())
                assert sm.data == {"a": "1", "slow": "2", "b": "1"}
                assert c.g(n, 1).stats.prepared_off_loop == 2
        finally:
            await c.close()
    run(main())


def test_a_prepare_that_raises_leaves_the_whole_apply_to_the_loop(tmp_path, run):
    gate = threading.Event()

    async def main():
        c = Cluster(tmp_path, groups=(1,), sm_factory=lambda: PreparingKV(gate))
        await c.start()
        try:
            g1 = await c.wait_leader(1)
            index = await g1.propose(b"boom=1")
            await g1.propose(b"next=1")
            await c.wait_converged(1)
            for n in c.ids:
                assert c.sms[(n, 1)].data["boom"] == "1"
                assert c.g(n, 1).failed is None
                assert c.g(n, 1).stats.prepared_off_loop == 0
                assert c.g(n, 1).applied >= index + 1
        finally:
            await c.close()
    run(main())


def test_a_held_read_runs_in_the_prepare_thread_and_holds_only_its_own_group(tmp_path, run):
    """run_held (a slot move's pre-copy EXPORT): while its read runs, its group applies nothing
    (the read sees a still state), and the node's other group still commits."""
    gate = threading.Event()

    async def main():
        c, g1, g2 = await one_node_two_groups(tmp_path, gate)
        try:
            sm = c.sms[(1, 1)]
            seen = []

            def read():
                seen.append(dict(sm.data))
                in_time = gate.wait(GATE_S)
                return threading.current_thread().name, in_time, dict(sm.data)
            held = asyncio.ensure_future(c.g(1, 1).run_held(read))
            await c.wait_for(lambda: seen or held.done(), GATE_S, "the held read to start")
            during = asyncio.ensure_future(g1.propose(b"during=1"))
            for i in range(5):
                await g2.propose(b"other=%d" % i)
            assert c.sms[(1, 2)].data["other"] == "4"
            assert not held.done() and not during.done() and "during" not in sm.data
            gate.set()
            thread, in_time, at_end = await held
            assert thread.startswith("xraft-prepare-") and in_time
            assert at_end == seen[0] and "during" not in at_end
            await during
            assert sm.data["during"] == "1"
        finally:
            gate.set()
            await c.close()
    run(main())
