"""The client SDK (async and sync) against real gRPC servers over LocalBackends:
every command family gives what the engine gives for the same command, the
streaming calls, leader following, retries and their limits, typed errors."""
import ast
import asyncio
from pathlib import Path

import pytest

from tests.client import ThreadServer, run, serving
from xraft.client import errors, sync
from xraft.client.aio import MAX_TRACKED_WRITES, Client
from xraft.client.types import (AutoClaimResult, ClaimResult, ConsumerInfo, GroupInfo, PendingEntry,
                                PendingSummary, StreamEntry, StreamID)
from xraft.node.engine.commands import execute
from xraft.node.engine.errors import EngineError
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.replies import NULL_ARRAY
from xraft.node.fsm.entry import Kind
from xraft.node.fsm.sessions import DEFAULT_RESULTS_PER_CLIENT
from xraft.node.server import wire_errors
from xraft.node.server.backend import LocalBackend, UnknownOutcome

NOW = 1_700_000_000_000        # every backend and the reference engine run at this time


def _backend(**kw):
    return LocalBackend(clock=lambda: NOW, **kw)


def _sid(raw):
    return StreamID.parse(raw)


def _entries(reply):
    return [] if reply is NULL_ARRAY else [StreamEntry(_sid(i), tuple(zip(f[::2], f[1::2]))) for i, f in reply]


def _streams(reply):
    return {} if reply is NULL_ARRAY else {k: _entries(e) for k, e in reply}


def _pending(r):
    return PendingSummary(r[0], r[1] and _sid(r[1]), r[2] and _sid(r[2]),
                          {} if r[3] is NULL_ARRAY else {c: int(n) for c, n in r[3]})


def _groups(r):
    return [GroupInfo(g[b"name"], g[b"consumers"], g[b"pending"], _sid(g[b"last-delivered-id"]),
                      g[b"entries-read"], g[b"lag"]) for g in r]


_same = lambda r: r  # noqa: E731

# (SDK method, args, kwargs, the redis argv, engine reply -> the SDK's typed result)
SCRIPT = [
    ("xadd", ("s", {"f": "1"}, "1-1"), {}, "XADD s 1-1 f 1", _sid),
    ("xadd", ("s", [("f", "2"), ("f", "dup")], "1-*"), {}, "XADD s 1-* f 2 f dup", _sid),
    ("xadd", ("s", {"f": "3"}), {"maxlen": 10, "approximate": True}, "XADD s MAXLEN ~ 10 * f 3", _sid),
    ("xadd", ("missing", {"f": "x"}), {"nomkstream": True}, "XADD missing NOMKSTREAM * f x", _same),
    ("xlen", ("s",), {}, "XLEN s", _same),
    ("xrange", ("s",), {}, "XRANGE s - +", _entries),
    ("xrange", ("s", "(1-1", "+", 1), {}, "XRANGE s (1-1 + COUNT 1", _entries),
    ("xrevrange", ("s", "+", "1"), {}, "XREVRANGE s + 1", _entries),
    ("xread", ({"s": "1-1", "{s}other": "0-0"},), {"count": 5}, "XREAD COUNT 5 STREAMS s {s}other 1-1 0-0",
     _streams),                                                   # the keys of one request share a slot
    ("xgroup_create", ("s", "g", "0"), {}, "XGROUP CREATE s g 0", lambda r: None),
    ("xgroup_create", ("t", "g2", "$"), {"mkstream": True}, "XGROUP CREATE t g2 $ MKSTREAM", lambda r: None),
    ("xgroup_createconsumer", ("s", "g", "c0"), {}, "XGROUP CREATECONSUMER s g c0", bool),
    ("xreadgroup", ("g", "c1", {"s": ">"}), {"count": 2}, "XREADGROUP GROUP g c1 COUNT 2 STREAMS s >", _streams),
    ("xreadgroup", ("g", "c1", {"s": "0"}), {}, "XREADGROUP GROUP g c1 STREAMS s 0", _streams),
    ("xpending", ("s", "g"), {}, "XPENDING s g", _pending),
    ("xpending_range", ("s", "g", "-", "+", 10), {}, "XPENDING s g - + 10",
     lambda r: [PendingEntry(_sid(i), c, idle, n) for i, c, idle, n in r]),
    ("xclaim", ("s", "g", "c2", 0, ["1-1"]), {}, "XCLAIM s g c2 0 1-1", lambda r: ClaimResult(_entries(r), [])),
    ("xclaim", ("s", "g", "c2", 0, ["1-2"]), {"justid": True}, "XCLAIM s g c2 0 1-2 JUSTID",
     lambda r: ClaimResult([], [_sid(i) for i in r])),
    ("xautoclaim", ("s", "g", "c3", 0, "0-0"), {"count": 1}, "XAUTOCLAIM s g c3 0 0-0 COUNT 1",
     lambda r: AutoClaimResult(_sid(r[0]), _entries(r[1]), [], [_sid(i) for i in r[2]])),
    ("xack", ("s", "g", "1-1", "1-2"), {}, "XACK s g 1-1 1-2", _same),
    ("xinfo_groups", ("s",), {}, "XINFO GROUPS s", _groups),
    ("xinfo_consumers", ("s", "g"), {}, "XINFO CONSUMERS s g",
     lambda r: [ConsumerInfo(c[b"name"], c[b"pending"], c[b"idle"]) for c in r]),
    ("xgroup_delconsumer", ("s", "g", "c3"), {}, "XGROUP DELCONSUMER s g c3", _same),
    ("xgroup_setid", ("s", "g", "$"), {}, "XGROUP SETID s g $", lambda r: None),
    ("xgroup_destroy", ("t", "g2"), {}, "XGROUP DESTROY t g2", bool),
    ("xdel", ("s", "1-1", "9-9"), {}, "XDEL s 1-1 9-9", _same),
    ("xtrim", ("s",), {"maxlen": 1}, "XTRIM s MAXLEN 1", _same),
    ("xsetid", ("s", f"{NOW}-5"), {}, f"XSETID s {NOW}-5", lambda r: None),
    ("rpush", ("l", "a", "b", "c", "b"), {}, "RPUSH l a b c b", _same),
    ("lpush", ("l", "z"), {}, "LPUSH l z", _same),
    ("lpushx", ("{l}nol", "z"), {}, "LPUSHX {l}nol z", _same),
    ("lrange", ("l", 0, -1), {}, "LRANGE l 0 -1", _same),
    ("lindex", ("l", 1), {}, "LINDEX l 1", _same),
    ("lindex", ("l", 99), {}, "LINDEX l 99", _same),
    ("linsert", ("l", "BEFORE", "c", "y"), {}, "LINSERT l BEFORE c y", _same),
    ("lpos", ("l", "b"), {}, "LPOS l b", _same),
    ("lpos", ("l", "b"), {"count": 0}, "LPOS l b COUNT 0", _same),
    ("lset", ("l", 0, "first"), {}, "LSET l 0 first", lambda r: None),
    ("lrem", ("l", 1, "b"), {}, "LREM l 1 b", _same),
    ("lmove", ("l", "{l}2", "LEFT", "RIGHT"), {}, "LMOVE l {l}2 LEFT RIGHT", _same),    # keys in one slot
    ("lmpop", (["{l}nol", "l"], "RIGHT", 2), {}, "LMPOP 2 {l}nol l RIGHT COUNT 2", lambda r: (r[0], r[1])),
    ("rpop", ("l",), {}, "RPOP l", _same),
    ("lpop", ("{l}2", 5), {}, "LPOP {l}2 5", _same),
    ("ltrim", ("l", 0, 0), {}, "LTRIM l 0 0", lambda r: None),
    ("llen", ("l",), {}, "LLEN l", _same),
    ("execute", ("XINFO", "STREAM", "s"), {}, "XINFO STREAM s", lambda r: _execute_value(r)),
]


def _execute_value(r):
    """What Execute returns for an engine reply: statuses as str, maps as dicts."""
    if r is NULL_ARRAY:
        return None
    if isinstance(r, dict):
        return {_execute_value(k): _execute_value(v) for k, v in r.items()}
    if isinstance(r, list):
        return [_execute_value(x) for x in r]
    return r


def _expected():
    """The script's results from the engine itself, at the same time."""
    db = Keyspace()
    out = []
    for *_, argv, convert in SCRIPT:
        reply = execute(db, [a.encode() for a in argv.split()], NOW)
        assert not isinstance(reply, EngineError)
        out.append(convert(reply))
    return out


def test_every_family_through_the_async_sdk_matches_the_engine():
    async def body():
        async with serving(_backend()) as (addr, _, _s):
            # Plain XADDs, as the script's argvs (the IDMP producer: test_sdk_idmp.py).
            async with Client([addr], timeout=5, idempotent_producer=False) as c:
                got = [await getattr(c, m)(*a, **k) for m, a, k, *_ in SCRIPT]
        assert got == _expected()
        info = got[-1]
        assert info[b"length"] == 1 and info[b"last-generated-id"] == b"%d-5" % NOW
    run(body)


def test_every_family_through_the_sync_sdk_matches_the_engine():
    with ThreadServer(_backend()) as (addr, _):
        with sync.Client([addr], timeout=5, idempotent_producer=False) as c:
            got = [getattr(c, m)(*a, **k) for m, a, k, *_ in SCRIPT]
            assert c.xinfo_stream("s").last_generated_id == StreamID(NOW, 5)
    assert got == _expected()


def test_xinfo_stream_full_and_history_of_deleted_entries():
    async def body():
        async with serving(_backend()) as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                await c.xadd_batch("s", [("1-1", {"a": "1"}), ("1-2", {"a": "2"})])
                await c.xgroup_create("s", "g", "0")
                await c.xreadgroup("g", "c", {"s": ">"})
                await c.xdel("s", "1-1")
                hist = await c.xreadgroup("g", "c", {"s": "0"})
                assert hist[b"s"][0] == StreamEntry(StreamID(1, 1), (), deleted=True)
                full = await c.xinfo_stream("s", full=True)
                [g] = full.groups_full
                assert (g.name, g.pel_count, [p.id for p in g.pel]) == (b"g", 2, [StreamID(1, 1), StreamID(1, 2)])
                assert g.consumers[0].name == b"c" and g.consumers[0].pel_count == 2
                assert [e.id for e in full.entries] == [StreamID(1, 2)]
    run(body)


def test_batch_xadd_of_100_entries_is_one_record():
    async def body():
        async with serving() as (addr, backend, _s):
            async with Client([addr], timeout=5) as c:
                await c.rpush("warm", "x")                  # the session's REGISTER is a record of its own
                before = backend.records
                ids = await c.xadd_batch("s", [{"n": i} for i in range(100)])
                assert backend.records == before + 1 and len(ids) == 100
                assert ids == sorted(ids) and len(set(ids)) == 100
                entries = await c.xrange("s")
                assert [e.id for e in entries] == ids and entries[42].fields == ((b"n", b"42"),)
    run(body)


def test_subscribe_receives_entries_added_later_by_another_client():
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as reader, Client([addr], timeout=5) as writer:
                await writer.xadd("s", {"old": "1"}, "1-1")
                got = []

                async def tail():
                    async for key, entries in reader.subscribe({"s": "$", "{s}t": "0-0"}, max_batch=3):
                        got.extend((key, e.id) for e in entries)
                        if len(got) == 7:
                            return
                task = asyncio.ensure_future(tail())
                await asyncio.sleep(0.2)          # subscribed ("$" resolved) before the writes
                await writer.xadd_batch("s", [("2-%d" % i, {"n": i}) for i in range(1, 6)])
                await writer.xadd("{s}t", {"x": "y"}, "3-1")   # the slot of "s"
                await writer.xadd("s", {"n": "6"}, "4-1")
                await asyncio.wait_for(task, 5)
                assert [i for k, i in got if k == b"s"] == [StreamID(2, i) for i in range(1, 6)] + [StreamID(4, 1)]
                assert [i for k, i in got if k == b"{s}t"] == [StreamID(3, 1)]
    run(body)


def test_subscribe_resumes_at_the_new_leader_after_the_last_id():
    async def body():
        async with serving() as (addr_a, a, _s), serving() as (addr_b, b, _s2):
            async with Client([addr_a], timeout=5) as ca, Client([addr_b], timeout=5) as cb:
                await ca.xadd("s", {"n": "1"}, "1-1")
                await cb.xadd_batch("s", [("1-%d" % i, {"n": i}) for i in (1, 2, 3)])
                got = []
                async with Client([addr_a], timeout=5) as reader:
                    async for key, entries in reader.subscribe({"s": "0-0"}):
                        got += [e.id.seq for e in entries]
                        if got == [1]:
                            a.set_role(False, addr_b)      # deposed mid-stream: NOT_LEADER names B
                        if len(got) >= 3:
                            break
                    assert reader.leader == addr_b
                assert got == [1, 2, 3]
    run(body)


def test_consume_delivers_to_the_group_within_the_unacked_window():
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                await c.xgroup_create("s", "g", "0", mkstream=True)
                await c.xadd_batch("s", [("1-%d" % i, {"n": i}) for i in range(1, 11)])
                seen = []
                async with c.consume(["s"], "g", "w1", max_unacked=3) as session:
                    it = session.__aiter__()
                    for _ in range(3):
                        seen.append(await asyncio.wait_for(it.__anext__(), 5))
                    fourth = asyncio.ensure_future(it.__anext__())
                    done, _ = await asyncio.wait([fourth], timeout=0.3)
                    assert not done                                   # the window is full
                    assert [d.id for d in seen] == [StreamID(1, i) for i in (1, 2, 3)]
                    assert (await c.xpending("s", "g")).count == 3
                    assert [await d.ack() for d in seen] == [1, 1, 1]
                    seen.append(await asyncio.wait_for(fourth, 5))     # acks opened it
                    assert await seen[-1].ack() == 1
                    while len(seen) < 10:
                        d = await asyncio.wait_for(it.__anext__(), 5)
                        seen.append(d)
                        assert await d.ack() == 1
                    await c.xadd("s", {"late": "1"}, "2-1")       # wakes the waiting session
                    d = await asyncio.wait_for(it.__anext__(), 5)
                    assert d.id == StreamID(2, 1) and d.entry.fields == ((b"late", b"1"),)
                    await d.ack()
                assert [d.entry.fields_dict[b"n"] for d in seen] == [b"%d" % i for i in range(1, 11)]
                assert (await c.xpending("s", "g")).count == 0
    run(body)


def test_consume_over_two_keys_yields_every_entry_of_a_message_in_order():
    """Deliveries come a message at a time (several entries, several streams each);
    the session yields them one by one in the message's order, keys included, and
    acks sent without waiting (all overlapping) confirm every one."""
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                for key in ("a", "b"):
                    await c.xgroup_create(key, "g", "0", mkstream=True)
                    await c.xadd_batch(key, [("1-%d" % i, {"k": key, "n": i}) for i in range(1, 26)])
                seen = []
                async with c.consume(["a", "b"], "g", "w", max_batch=10, max_unacked=100) as session:
                    acks = []
                    async for d in session:
                        seen.append((d.key, d.id.seq, d.entry.fields_dict[b"n"]))
                        acks.append(asyncio.ensure_future(d.ack()))
                        if len(seen) == 50:
                            break
                    assert await asyncio.wait_for(asyncio.gather(*acks), 5) == [1] * 50
                for key in (b"a", b"b"):
                    mine = [(seq, n) for k, seq, n in seen if k == key]
                    assert mine == [(i, b"%d" % i) for i in range(1, 26)]
                    assert (await c.xpending(key.decode(), "g")).count == 0
    run(body)


def test_sync_subscribe_and_consume():
    with ThreadServer() as (addr, _):
        with sync.Client([addr], timeout=5) as c:
            c.xadd_batch("s", [("1-%d" % i, {"n": i}) for i in range(1, 4)])
            it = c.subscribe({"s": "0-0"})
            key, entries = next(it)
            assert key == b"s" and [e.id.seq for e in entries] == [1, 2, 3]
            it.close()
            c.xgroup_create("s", "g", "0")
            with c.consume(["s"], "g", "w") as session:
                for n, d in enumerate(session, 1):
                    assert d.ack() == 1
                    if n == 3:
                        break
            assert c.xpending("s", "g").count == 0


def test_errors_arrive_typed():
    async def body():
        async with serving() as (addr, _, _s):
            async with Client([addr], timeout=5) as c:
                await c.lpush("l", "x")
                with pytest.raises(errors.WrongTypeError) as e:
                    await c.xadd("l", {"f": "v"})
                assert e.value.reason == "WRONG_TYPE" and not e.value.retriable
                with pytest.raises(errors.NoGroupError):
                    await c.xreadgroup("nog", "c", {"s": ">"})
                with pytest.raises(errors.BusyGroupError):
                    await c.xgroup_create("s2", "g", "$", mkstream=True)
                    await c.xgroup_create("s2", "g", "$")
                with pytest.raises(errors.CommandError):
                    await c.xadd("s2", {"f": "v"}, "0-0")
                await c.xadd("s2", {"f": "v"}, "5-0")
                [bad] = await c.xadd_batch("s2", [("0-1", {"f": "v"})])
                assert isinstance(bad, errors.CommandError) and "smaller" in bad.message
    run(body)


def test_follower_redirects_the_sdk_to_the_leader():
    async def body():
        async with serving() as (leader_addr, _, _s):
            follower = LocalBackend(leader=False, leader_address=leader_addr)
            async with serving(follower) as (follower_addr, _, _s2):
                async with Client([follower_addr], timeout=5) as c:
                    sid = await c.xadd("s", {"f": "v"})
                    assert c.leader == leader_addr
                    assert [e.id for e in await c.xrange("s")] == [sid]
                    # A follower with no known leader: retried until the deadline, then a timeout.
                    follower.set_role(False, None)
                async with Client([follower_addr], timeout=0.5) as c:
                    with pytest.raises(errors.DeadlineExceededError) as e:
                        await c.xlen("s")
                    assert isinstance(e.value, TimeoutError) and isinstance(e.value.__cause__, errors.NotLeaderError)
    run(body)


class _LosesFirst(LocalBackend):
    """Applies every write, but the first `n` submits end in an unknown outcome."""

    def __init__(self, n, **kw):
        super().__init__(**kw)
        self.left = n

    async def submit(self, requests):
        results = await super().submit(requests)
        if self.left:
            self.left -= 1
            raise UnknownOutcome()
        return results


def test_unknown_outcome_is_retried_only_with_a_request_id():
    async def body():
        async with serving(_LosesFirst(2)) as (addr, backend, _s):
            async with Client([addr], timeout=5, request_ids=False, idempotent_producer=False) as c:
                with pytest.raises(errors.UnknownOutcomeError):
                    await c.xadd("a", {"f": "v"})
                assert await c.xlen("a") == 1           # it was applied: the caller must decide
            async with Client([addr], timeout=5, request_ids=False) as c:   # IDMP: resent, deduplicated
                backend.left = 2
                sid = await c.xadd("i", {"f": "v"})
                assert [e.id for e in await c.xrange("i")] == [sid]
                backend.left = 1
                ids = await c.xadd_batch("i", [{"n": i} for i in range(50)])
                assert await c.xlen("i") == 51 and [e.id for e in await c.xrange("i")][1:] == ids
            async with Client([addr], timeout=5) as c:  # request ids: resent, deduplicated
                sid = await c.xadd("b", {"f": "v"})
                assert [e.id for e in await c.xrange("b")] == [sid]
                backend.left = 1
                ids = await c.xadd_batch("b", [{"n": i} for i in range(50)])
                assert await c.xlen("b") == 51 and [e.id for e in await c.xrange("b")][1:] == ids
    run(body)


class _Slow(LocalBackend):
    async def submit(self, requests):
        if any(r.kind != Kind.REGISTER for r in requests):      # (the SDK's session is opened at once)
            await asyncio.sleep(3)
        return await super().submit(requests)

    async def read(self, argv, linearizable=True):
        await asyncio.sleep(3)
        return await super().read(argv, linearizable)


def test_deadlines_expire_as_typed_timeouts():
    async def body():
        async with serving(_Slow()) as (addr, _, _s):
            async with Client([addr], timeout=1.0) as c:
                with pytest.raises(errors.DeadlineExceededError) as e:
                    await c.xlen("s")
                assert isinstance(e.value, TimeoutError)
                with pytest.raises(errors.WriteDeadlineError) as e:
                    await c.xadd("s", {"f": "v"})
                assert isinstance(e.value, TimeoutError) and isinstance(e.value, errors.UnknownOutcomeError)
    run(body)


def test_bearer_token_and_unreachable_seeds():
    async def body():
        async with serving(token="t0k") as (addr, _, _s):
            async with Client([addr], timeout=2) as c:
                with pytest.raises(errors.NoAuthError):
                    await c.xlen("s")
            async with Client(["127.0.0.1:1", addr], timeout=5, token="t0k") as c:   # first seed is dead
                assert await c.xlen("s") == 0
    run(body)


def test_client_reason_table_is_the_servers():
    """The client keeps its own copy of the reasons (it may not import the
    node); it must match wire_errors exactly, retriable flags included."""
    server = {row.reason: row.retriable for row in wire_errors.TABLE.values()}
    client = {reason: cls.retriable for reason, cls in errors.REASONS.items()}
    assert client == server
    assert MAX_TRACKED_WRITES < DEFAULT_RESULTS_PER_CLIENT


def test_client_never_imports_the_node():
    for path in Path(errors.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not any(n.startswith("xraft.node") for n in names), path
