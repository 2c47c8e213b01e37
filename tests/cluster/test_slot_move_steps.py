"""The data side of an online slot move on real node processes (node/server/slot_move_steps.py,
docs/slot-move-steps.md): a 3-node `--groups 2` cluster (group 1 owns slots 0-8191 and prefers
node 1, group 2 owns 8192-16383 and prefers node 2) and MoveSteps called directly, without a
metadata group. The slot map stays the static epoch-1 map, so RESP keeps routing the moved
slots to group 1: A's side is checked through RESP (TRYAGAIN while sealed, MOVED once
released), B's through the digest of what it serves (the same sha256 over the same dump
records as A's manifest: streams with groups, PELs, consumers, lists, strings)."""
import asyncio
import threading

import pytest
from redis.exceptions import MovedError, TryAgainError

from tests.cluster.conftest import wait_until
from tests.cluster.harness import rclient
from tests.fsm.test_slot_moves import keys_in
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import NodeSpec
from xraft.node.engine.slots import key_slot
from xraft.node.fsm.slot_moves import END, MoveId, encode_cursor
from xraft.node.server.slot_move_steps import MoveStepRefused, MoveSteps

GROUPS = 2
A, B = 1, 2


def led(node) -> list:
    inf = rclient(node).info("raft")
    return sorted(g for g in range(1, GROUPS + 1)
                  if inf.get("raft_group%d" % g, {}).get("role") == "leader"
                  and inf["raft_group%d" % g].get("writable") == 1)


def leader_of(cluster, group: int):
    def find():
        for n in cluster.nodes.values():
            if n.running() and group in led(n):
                return n
        return None
    return wait_until(find, 30, "a leader of group %d" % group)


@pytest.fixture(scope="module")
def two_groups(cluster_factory):
    c = cluster_factory(3)
    for node in c.nodes.values():
        node.extra_args = ["--groups", str(GROUPS)]
    c.start()
    wait_until(lambda: led(c.nodes[1]) == [1] and led(c.nodes[2]) == [2], 30, "groups led by preferred nodes")
    return c


def steps_for(cluster) -> MoveSteps:
    nodes = {i: NodeSpec(i, n.grpc, n.resp) for i, n in cluster.nodes.items()}
    return MoveSteps.from_slot_map(initial_layout(nodes, GROUPS, 3), step_timeout_s=60)


def fill(r, keys):
    """A stream with two consumer groups, pending entries of two consumers (one claimed, one
    acked), a deleted entry; a list; a string."""
    s, lst, st = keys
    for i in range(1, 41):
        r.xadd(s, {"f": "v%d" % i}, id="%d-1" % i)
    r.xgroup_create(s, "g", id="0")
    r.xreadgroup("g", "alice", {s: ">"}, count=10)
    r.xreadgroup("g", "bob", {s: ">"}, count=5)
    r.xack(s, "g", "1-1", "2-1")
    r.xclaim(s, "g", "bob", 0, ["3-1"])
    r.xgroup_create(s, "g2", id="$")
    r.xdel(s, "40-1")
    r.rpush(lst, *["e%d" % i for i in range(100)])
    r.set(st, "x" * 3000)


_CLOCK_FIELDS = ("idle", "inactive", "time_since_delivered")      # they grow with the wall clock


def _timeless(v):
    if isinstance(v, dict):
        return {k: _timeless(x) for k, x in v.items() if k not in _CLOCK_FIELDS}
    if isinstance(v, list):
        return [_timeless(x) for x in v]
    return v


def filled(c, first: int, last: int, prefix: str):
    """Three keys of slots first..last, filled at group 1 (fill), and a RESP client of node 1."""
    keys = keys_in(first, last, 3, prefix)
    r = rclient(c.nodes[1], 10)
    fill(r, keys)
    return keys, r


def views(r, s):
    """What RESP shows of a stream and its consumer groups (absolute times included)."""
    return _timeless([r.xinfo_stream(s, full=True), r.xinfo_groups(s), r.xinfo_consumers(s, "g"),
                      r.xpending(s, "g"), r.xpending_range(s, "g", "-", "+", 100)])


async def finish(ms, first: int, last: int, epoch: int, copied=None, restart=None) -> None:
    """After a copy that returned `copied` (it must have staged the 3 keys): start `restart`
    again, then verify, activate at B (which then serves exactly A's manifest), release at A."""
    if copied is not None:
        assert copied == (END, 3)
    if restart is not None:
        restart.start()
    digest = await ms.verify(A, B, first, last, epoch)
    await ms.activate(B, first, last, epoch, digest)
    assert await ms.live_digest(B, first, last, epoch) == digest
    await ms.release(A, first, last, epoch)


def run(coro):
    return asyncio.run(coro)


def moved(r, *cmd) -> bool:
    """The command is answered with -MOVED <its slot> ..."""
    try:
        r.execute_command(*cmd)
    except MovedError as e:
        return e.slot_id == key_slot(cmd[2 if cmd[0] == "XINFO" else 1].encode())
    return False


def test_a_whole_move_then_a_moves_and_b_serves_the_same_data(two_groups):
    c = two_groups
    first, last, epoch = 100, 199, 2
    keys, r = filled(c, first, last, "mv")
    other = keys_in(200, 300, 1, "stay")[0]
    r.set(other, "stays")

    async def go():
        ms = steps_for(c)
        try:
            await ms.seal(A, first, last, epoch)
            await ms.seal(A, first, last, epoch)                      # idempotent
            # "-TRYAGAIN slot N is being moved" (redis-py strips the TRYAGAIN prefix)
            with pytest.raises(TryAgainError, match="^slot %d is being moved" % key_slot(keys[0].encode())):
                r.xadd(keys[0], {"f": "late"})
            with pytest.raises(TryAgainError):
                r.xlen(keys[0])
            seen = []
            cursor, staged = await ms.copy(A, B, first, last, epoch, max_bytes=1500,
                                           progress=lambda cur, n: seen.append(n))
            assert (cursor, staged) == (END, 3) and len(seen) >= 3      # several chunks
            digest = await ms.verify(A, B, first, last, epoch)
            await ms.activate(B, first, last, epoch, digest)
            await ms.activate(B, first, last, epoch, digest)          # idempotent
            assert await ms.live_digest(B, first, last, epoch) == digest
            await ms.release(A, first, last, epoch)
            await ms.release(A, first, last, epoch)
            with pytest.raises(MoveStepRefused, match="does not own"):
                await ms.live_digest(A, first, last, epoch)
            return digest
        finally:
            await ms.close()
    run(go())
    assert moved(r, "XINFO", "STREAM", keys[0]) and moved(r, "XADD", keys[0], "*", "f", "v")
    assert moved(r, "LLEN", keys[1]) and moved(r, "GET", keys[2])
    assert r.get(other) == "stays" and r.set(other, "again") and r.get(other) == "again"


def test_abort_leaves_a_serving_and_b_without_staging(two_groups):
    c = two_groups
    first, last, epoch = 400, 450, 3
    keys, r = filled(c, first, last, "ab")
    before = views(r, keys[0])
    woken = []

    def blocked_read():
        try:
            woken.append(rclient(c.nodes[1], 60).xread({keys[0]: "$"}, block=0))
        except TryAgainError as e:
            woken.append(e)
    reader = threading.Thread(target=blocked_read, daemon=True)
    reader.start()
    wait_until(lambda: r.info("clients")["blocked_clients"] >= 1, 30, "the reader blocked")

    async def go():
        ms = steps_for(c)
        try:
            await ms.seal(A, first, last, epoch)
            reader.join(30)                                             # woken by the seal
            assert len(woken) == 1 and isinstance(woken[0], TryAgainError), woken
            calls = []

            def stop_after_one(cur, n):
                calls.append(n)
                raise RuntimeError("stop the copy")
            with pytest.raises(RuntimeError):
                await ms.copy(A, B, first, last, epoch, max_bytes=1500, progress=stop_after_one)
            assert (await ms.staging(B, first, last, epoch))[0] == "STAGING"
            await ms.abort(A, B, first, last, epoch)
            await ms.abort(A, B, first, last, epoch)
            phase, cursor, n, _ = await ms.staging(B, first, last, epoch)
            assert (phase, cursor, n) == ("DROPPED", b"", 0)
            with pytest.raises(MoveStepRefused, match="aborted"):
                await ms.seal(A, first, last, epoch)                  # a late seal of the aborted move
        finally:
            await ms.close()
    run(go())
    assert views(r, keys[0]) == before
    assert r.xadd(keys[0], {"f": "after"}, id="100-1") == "100-1"


def test_kill_9_of_the_source_and_target_leaders_between_steps(two_groups):
    c = two_groups
    first, last, epoch = 600, 700, 4
    keys, r = filled(c, first, last, "kl")

    async def go():
        ms = steps_for(c)
        try:
            await ms.seal(A, first, last, epoch)
            src = leader_of(c, A)
            src.proc.kill()                                             # kill -9 of A's leader
            src.proc.wait()
            stopped = []

            def stop_after_two(cur, n):
                stopped.append(n)
                if len(stopped) == 2:
                    raise RuntimeError("between chunks")
            with pytest.raises(RuntimeError):
                await ms.copy(A, B, first, last, epoch, max_bytes=1500, progress=stop_after_two)
            src.start()                                                 # back, from its disk
            src.wait_ready()
            tgt = leader_of(c, B)
            phase, cursor, staged, _ = await ms.staging(B, first, last, epoch)
            assert phase == "STAGING" and cursor > encode_cursor(first, 0)      # two chunks staged
            tgt.proc.kill()                                             # kill -9 of B's leader
            tgt.proc.wait()
            copied = await ms.copy(A, B, first, last, epoch, max_bytes=1500)      # resumes
            await finish(ms, first, last, epoch, copied, restart=tgt)
        finally:
            await ms.close()
    run(go())
    for n in c.nodes.values():
        n.wait_ready()
    assert moved(rclient(c.nodes[1], 10), "XLEN", keys[0])


def _restart_with_failpoint(c, node, failpoint: str, group: int):
    """kill -9 `node`, start it again with XRAFT_FAILPOINT set, and wait until it leads `group`
    again (the leader balancer hands a group back to its preferred node)."""
    node.proc.kill()
    node.proc.wait()
    c.env["XRAFT_FAILPOINT"] = failpoint
    try:
        node.start()
    finally:
        del c.env["XRAFT_FAILPOINT"]
    node.wait_ready()
    wait_until(lambda: group in led(node), 30, "node %d leading group %d again" % (node.id, group))


def test_leaders_killed_by_failpoints_inside_a_step_and_the_step_still_completes(two_groups):
    """Node 1 dies right after applying the SEAL it leads (before answering), node 2 right
    after its 3rd STAGE: MoveSteps retries at the new leaders, and the idempotent records
    make the retries harmless. Same final state as a move without crashes."""
    c = two_groups
    first, last, epoch = 900, 1000, 5
    keys, _ = filled(c, first, last, "fp")
    src, tgt = c.nodes[1], c.nodes[2]
    _restart_with_failpoint(c, src, "after_seal_1", A)
    _restart_with_failpoint(c, tgt, "after_stage_3", B)

    async def go():
        ms = steps_for(c)
        try:
            await ms.seal(A, first, last, epoch)
            assert src.proc.wait(30) == -9                             # it died inside the step
            src.start()                                                 # without the failpoint
            src.wait_ready()
            chunks = []
            copied = await ms.copy(A, B, first, last, epoch, max_bytes=1500,
                                   progress=lambda cur, n: chunks.append(n))
            assert tgt.proc.wait(30) == -9 and len(chunks) > 3          # it died inside the copy
            await finish(ms, first, last, epoch, copied, restart=tgt)
        finally:
            await ms.close()
    run(go())
    tgt.wait_ready()
    assert moved(rclient(c.nodes[3], 10), "XLEN", keys[0])


def test_a_pre_copy_while_a_serves_then_a_delta_copy_with_the_target_leader_killed_in_prestage(two_groups):
    """The pre-copy (PRESTAGE while A serves) with B's leader dying right after applying its
    first PRESTAGE (XRAFT_FAILPOINT=after_prestage_1): MoveSteps.precopy resumes at the new
    leader from B's pre-copy cursor. A keeps serving writes; after the seal the copy sends
    the big stream as a delta, and B ends with exactly A's manifest."""
    c = two_groups
    first, last, epoch = 1100, 1200, 6
    keys, r = filled(c, first, last, "pc")
    big = keys_in(first, last, 1, "pcbig")[0]
    pipe = r.pipeline(transaction=False)
    for i in range(1, 3001):
        pipe.xadd(big, {"f": "value-%06d" % i}, id="%d-1" % i)
    pipe.execute()
    r.xgroup_create(big, "g", id="0")
    r.xreadgroup("g", "alice", {big: ">"}, count=500)
    tgt = c.nodes[2]
    _restart_with_failpoint(c, tgt, "after_prestage_1", B)

    async def go():
        ms = steps_for(c)
        try:
            seen = []
            n = await ms.precopy(A, B, first, last, epoch, progress=lambda cur, k: seen.append(k), max_bytes=1500)
            assert tgt.proc.wait(30) == -9 and n == 4                   # it died inside the pre-copy
            tgt.start()
            tgt.wait_ready()
            assert await ms.precopy(A, B, first, last, epoch) == 4      # done: nothing more to do
            for i in range(3001, 3051):                                 # A serves on
                r.xadd(big, {"f": "late-%d" % i}, id="%d-1" % i)
            r.xreadgroup("g", "bob", {big: ">"}, count=20)
            before = views(r, big)
            have = (await ms._call("HAVE", B, MoveId(first, last, epoch))).have
            assert big.encode() in have
            await ms.seal(A, first, last, epoch)
            assert await ms.copy(A, B, first, last, epoch, max_bytes=1500) == (END, 4)
            await finish(ms, first, last, epoch)
            return before
        finally:
            await ms.close()
    before = run(go())
    tgt.wait_ready()
    assert moved(rclient(c.nodes[1], 10), "XLEN", big)
    assert before[0]["length"] == 3050
