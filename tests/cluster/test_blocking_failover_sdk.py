"""ISSUE9 C2 with real node processes: SDK clients blocked in BLPOP, BLMOVE and
XREADGROUP BLOCK while a producer pushes, and the leader is killed with
SIGKILL (then restarted). Every element pushed is received by exactly one
client, or is accounted for by an outcome the SDK reported as unknown (an
UnknownOutcomeError); none is lost silently (popped, moved or left in the
PEL for nobody) and none is received twice.

The wake-up retries used to be anonymous: a retry in flight when the leader
died could be committed by its successor while the SDK's resend (same
request id as the first, empty attempt) found "nothing served" and blocked
again, so the element was popped for nobody. The deterministic version of
that race is tests/client/test_blocking_dedup.py.

CI: one kill (about 20 s with the cluster's start). The soak variant kills the
leader every few seconds for longer."""
import asyncio
import random
import signal
import time

import pytest
import uvloop

from tests.cluster import harness as h
from xraft.client.aio import Client
from xraft.client.errors import DeadlineExceededError, UnknownOutcomeError, XRaftError

BLOCK_MS = 300
CALL_TIMEOUT_S = 20.0          # the SDK resends until a definite answer (or this passes)
CONSUMERS = 3                  # per kind
XREAD_COUNT = 5
DRAIN_S = 15.0
KILL_DELAYS_S = (0.002, 0.005, 0.001, 0.008)   # after an ack: retries reach the followers


class Tally:
    def __init__(self):
        self.got = []             # what the clients received, in order
        self.unknown = 0          # calls that ended with an unknown outcome


async def _consume(seeds, stop, tally, call):
    async with Client(seeds, timeout=CALL_TIMEOUT_S) as c:
        while not stop.is_set():
            try:
                got = await call(c)
            except UnknownOutcomeError:
                tally.unknown += 1
                continue
            except DeadlineExceededError:
                continue                          # nothing was applied: ask again
            tally.got.extend(got)


async def _blpop(c):
    r = await c.blpop(["q"], block_ms=BLOCK_MS, timeout=CALL_TIMEOUT_S)
    return [] if r is None else [r[1].decode()]


async def _blmove(c):
    r = await c.lmove("m", "{m}dst", block_ms=BLOCK_MS, timeout=CALL_TIMEOUT_S)    # one slot
    return [] if r is None else [r.decode()]


def _xreadgroup(name):
    async def call(c):
        r = await c.xreadgroup(h.GROUP, name, {"s": ">"}, count=XREAD_COUNT, block_ms=BLOCK_MS,
                               timeout=CALL_TIMEOUT_S)
        return [str(e.id) for e in r.get(b"s", [])]
    return call


class Killer:
    """Kills `node` with SIGKILL right after the producer's next acknowledged
    push: the moment the blocked clients' wake-up retries are being proposed,
    which is the window the old anonymous retries lost elements in."""

    def __init__(self):
        self.node = None
        self.kills = 0
        self.done = asyncio.Event()

    def arm(self, node):
        self.done.clear()
        self.node = node

    def after_ack(self):
        if self.node is not None:
            node, self.node = self.node, None
            # A few ms later: the retries have reached the followers, not yet come back applied.
            delay = KILL_DELAYS_S[self.kills % len(KILL_DELAYS_S)]
            self.kills += 1
            asyncio.get_running_loop().call_later(delay, self._kill, node)

    def _kill(self, node):
        node.signal(signal.SIGKILL)
        self.done.set()


async def _produce(seeds, stop, acked, maybe, killer):
    async with Client(seeds, timeout=CALL_TIMEOUT_S) as c:
        n = 0
        while not stop.is_set():
            n += 1
            for kind, write in (("q", lambda v: c.rpush("q", v)), ("m", lambda v: c.rpush("m", v)),
                                ("s", lambda v: c.xadd("s", {"v": v}))):
                value = "%s-%d" % (kind, n)
                try:
                    r = await write(value)
                except UnknownOutcomeError:
                    maybe[kind].add(value)
                    continue
                except XRaftError:
                    continue                      # refused: not written
                acked[kind].add(str(r) if kind == "s" else value)
                killer.after_ack()
            await asyncio.sleep(0.005)


async def _scenario(cluster, kills: int, phase_s: float):
    seeds = [n.grpc for n in cluster.nodes.values()]
    with h.rclient(cluster.wait_leader()) as r:
        r.xgroup_create("s", h.GROUP, id="$", mkstream=True)
    stop_producer, stop_consumers = asyncio.Event(), asyncio.Event()
    tallies = {"q": Tally(), "m": Tally(), "s": Tally()}
    acked = {k: set() for k in tallies}
    maybe = {k: set() for k in tallies}
    tasks = []
    for i in range(CONSUMERS):
        tasks.append(_consume(seeds, stop_consumers, tallies["q"], _blpop))
        tasks.append(_consume(seeds, stop_consumers, tallies["m"], _blmove))
        tasks.append(_consume(seeds, stop_consumers, tallies["s"], _xreadgroup("c%d" % i)))
    tasks = [asyncio.ensure_future(t) for t in tasks]
    killer = Killer()
    producer = asyncio.ensure_future(_produce(seeds, stop_producer, acked, maybe, killer))
    rng = random.Random(9)
    for _ in range(kills):
        await asyncio.sleep(phase_s * rng.uniform(0.7, 1.3))
        leader = await asyncio.to_thread(cluster.wait_leader)
        killer.arm(leader)
        await killer.done.wait()
        await asyncio.to_thread(leader.wait_exit)
        await asyncio.to_thread(cluster.wait_leader, [n.id for n in cluster.followers(leader)])
        await asyncio.sleep(phase_s / 2)
        await asyncio.to_thread(leader.start)
        await asyncio.to_thread(leader.wait_ready)
    await asyncio.sleep(phase_s / 2)
    stop_producer.set()
    await producer
    # Let the consumers take what is left, then stop them.
    leader = await asyncio.to_thread(cluster.wait_leader)
    deadline = time.monotonic() + DRAIN_S
    with h.rclient(leader) as r:
        while time.monotonic() < deadline and (r.llen("q") or r.llen("m")
                                               or r.xinfo_groups("s")[0]["lag"]):
            await asyncio.sleep(0.1)
    stop_consumers.set()
    await asyncio.gather(*tasks)
    leader = await asyncio.to_thread(cluster.wait_leader)
    with h.rclient(leader) as r:
        left = {"q": r.lrange("q", 0, -1), "m": r.lrange("m", 0, -1)}
        dst = r.lrange("{m}dst", 0, -1)
        left_s = r.xreadgroup(h.GROUP, "drainer", {"s": ">"})
        left["s"] = [eid for _, es in left_s for eid, _ in es]
        pel = {p["message_id"] for p in r.xpending_range("s", h.GROUP, "-", "+", 1 << 20)}
    return tallies, acked, maybe, left, dst, pel


def _check(tallies, acked, maybe, left, dst, pel) -> dict:
    figures = {}
    for kind, per_call in (("q", 1), ("m", 1), ("s", XREAD_COUNT)):
        t = tallies[kind]
        got = t.got
        assert len(got) == len(set(got)), "%s: an element received twice" % kind
        seen = set(got) | set(left[kind])
        assert not (set(got) & set(left[kind])), "%s: received and still there" % kind
        missing = acked[kind] - seen
        if kind == "m":
            # Moved by an attempt whose reply was lost: in dst, and only as unknown outcomes.
            assert set(dst) == set(got) | missing, "m: dst holds exactly what was moved"
        if kind == "s":
            assert missing <= pel, "s: every entry was delivered (in the PEL)"
        assert len(missing) <= per_call * t.unknown, (
            "%s: %d elements lost silently (%d unknown outcomes): %s"
            % (kind, len(missing), t.unknown, sorted(missing)[:10]))
        figures[kind] = dict(acked=len(acked[kind]), received=len(got), unknown=t.unknown,
                             missing=len(missing), maybe_pushed=len(maybe[kind]))
    return figures


def _run(cluster_factory, kills, phase_s):
    cluster = cluster_factory(3)
    cluster.start()
    cluster.wait_leader()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        out = runner.run(asyncio.wait_for(_scenario(cluster, kills, phase_s), 60 + kills * 30))
    figures = _check(*out)
    assert all(f["received"] for f in figures.values()), figures
    print("blocking failover figures:", figures)


@pytest.mark.timeout(120)
def test_sdk_blocking_pops_lose_nothing_across_a_leader_kill(cluster_factory):
    _run(cluster_factory, kills=3, phase_s=1.0)


@pytest.mark.soak
@pytest.mark.timeout(600)
def test_sdk_blocking_pops_lose_nothing_across_repeated_leader_kills(cluster_factory):
    _run(cluster_factory, kills=8, phase_s=3.0)
