"""The SDK's Redis 8.x stream calls against a real gRPC server (in-process,
LocalBackend): the IDMP producer (default on: a resend of the same request
adds nothing; two clients with the same producer id and message ids dedup),
xcfgset, xdelex and xackdel."""
from tests.client import run, serving
from xraft.client.aio import Client
from xraft.client.types import StreamID
from xraft.node.server.backend import LocalBackend

NOW = 1_700_000_000_000


def test_idmp_producer_and_ack_aware_deletion():
    async def body():
        async with serving(LocalBackend(clock=lambda: NOW)) as (addr, _, _s):
            async with Client([addr], timeout=5, producer_id="checkout-7") as a, \
                    Client([addr], timeout=5, producer_id="checkout-7") as b:
                first = await a.xadd_batch("s", [{"n": 1}, {"n": 2}], idempotent_ids=["m1", "m2"])
                again = await b.xadd_batch("s", [{"n": 1}, {"n": 2}], idempotent_ids=["m1", "m2"])
                assert first == again and await a.xlen("s") == 2
                own = await a.xadd("s", {"n": 3})          # fresh idempotent id per entry
                assert own not in first and await a.xlen("s") == 3
                plain = await a.xadd_batch("s", [{"n": 3}], idempotent=False)
                assert plain[0] != own
                info = await a.execute("XINFO", "STREAM", "s")
                assert (info[b"iids-added"], info[b"iids-duplicates"]) == (3, 2)

                await a.xgroup_create("s", "g", "0")
                await a.xcfgset("s", idmp_duration=300, retention="ACKED")
                got = await a.xreadgroup("g", "c", {"s": ">"}, count=2)
                ids = [e.id for e in got[b"s"]]
                assert await a.xackdel("s", "g", ids[1], policy="ACKED") == [1]
                assert await a.xlen("s") == 3                   # ids[0] pending: retention keeps the head
                assert await a.xdelex("s", ids[0], StreamID(1, 1), policy="DELREF") == [1, -1]
                assert (await a.execute("XPENDING", "s", "g"))[0] == 0
    run(body)


def test_idmp_fresh_ids_per_entry_and_none_with_an_explicit_id():
    """xadd_batch sets each "*" entry's fresh id as it builds it: same fields
    never dedup each other, across calls too; a batch with an explicit ID
    carries no IDMP at all (no producer, no ids), as before."""
    async def body():
        async with serving(LocalBackend(clock=lambda: NOW)) as (addr, _, _s):
            async with Client([addr], timeout=5) as a:
                same = [{"f": "v"}] * 3
                ids = await a.xadd_batch("s", same) + await a.xadd_batch("s", iter(same))
                assert len(set(ids)) == 6 and await a.xlen("s") == 6
                info = await a.execute("XINFO", "STREAM", "s")
                assert (info[b"iids-added"], info[b"iids-duplicates"]) == (6, 0)
                mixed = await a.xadd_batch("s", [{"f": "v"}, (StreamID(NOW + 10, 0), {"f": "v"})])
                assert mixed[1] == StreamID(NOW + 10, 0) and await a.xlen("s") == 8
                info = await a.execute("XINFO", "STREAM", "s")
                assert info[b"iids-added"] == 6
    run(body)


def test_fresh_ids_go_as_one_number_once_the_server_reads_it():
    """The first XAdd carries its fresh ids per entry; its response says the server
    reads XAddRequest.idempotent_id_first, so the next ones carry first + count
    (observed on the requests sent). The ids are the same either way: another client
    of the same producer resending them as explicit per-entry ids adds nothing."""
    async def body():
        async with serving(LocalBackend(clock=lambda: NOW)) as (addr, _, _s):
            async with Client([addr], timeout=5, producer_id="p1") as a, \
                    Client([addr], timeout=5, producer_id="p1") as b:
                sent = []
                unary = a._unary

                async def observed(rpc, request, **kw):
                    if rpc == "XAdd":
                        sent.append((request.HasField("idempotent_id_first") and request.idempotent_id_first,
                                     [e.idempotent_id for e in request.entries]))
                    return await unary(rpc, request, **kw)
                a._unary = observed
                first = await a.xadd_batch("s", [{"n": i} for i in range(2)])
                second = await a.xadd_batch("s", [{"n": i} for i in range(20)])
                assert sent == [(False, [b"0", b"1"]), (2, [b""] * 20)]
                again = await b.xadd_batch("s", [{"n": i} for i in range(20)],
                                           idempotent_ids=[b"%x" % v for v in range(2, 22)])
                assert again == second and len(set(first + second)) == 22 and await a.xlen("s") == 22
                info = await a.execute("XINFO", "STREAM", "s")
                assert (info[b"iids-added"], info[b"iids-duplicates"]) == (22, 20)
    run(body)
