"""Dead-lettering conserves entries (issue 13, the storm test's invariant at fsm level):
under any sequence of XREADGROUP (new and history), XCLAIM (no FORCE), XAUTOCLAIM (with and
without JUSTID / RETRYCOUNT) and XACK on a group with a max-deliveries policy, every
entry of the source stream is in exactly one of

    unread (after the group's last-delivered ID) | pending (in the PEL)
    | acked by an XACK that replied 1 | dead-lettered (exactly one letter)

and every letter names an entry, with the delivery count the policy allows. A
replica that applies the same log without replies (want_results=False) ends in
the same state byte for byte.

The cluster test (tests/cluster/test_crossshard_dlq.py) checks the same thing
across a kill -9 with real nodes; this one walks the command space, where the
cluster test's three fixed consumers cannot reach every interleaving."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.state_machine import StateMachine

T = 1_700_000_000_000
S, DLQ = b"{q}src", b"{q}dlq"
ENTRIES = 6
IDS = [b"%d-0" % (i + 1) for i in range(ENTRIES)]
CONSUMERS = [b"c1", b"c2", b"c3"]

consumer = st.sampled_from(CONSUMERS)
entry_id = st.sampled_from(IDS)
count = st.integers(1, 4)
ops = st.one_of(
    st.tuples(st.just("read_new"), consumer, count),
    st.tuples(st.just("read_history"), consumer, count),
    st.tuples(st.just("claim"), consumer, st.lists(entry_id, min_size=1, max_size=3),
              st.sampled_from([(), (b"JUSTID",), (b"RETRYCOUNT", b"0")])),
    st.tuples(st.just("autoclaim"), consumer, entry_id, count, st.sampled_from([(), (b"JUSTID",)])),
    st.tuples(st.just("ack"), entry_id),
)


def _argv(op) -> tuple:
    kind = op[0]
    if kind == "read_new":
        return (b"XREADGROUP", b"GROUP", b"g", op[1], b"COUNT", b"%d" % op[2], b"STREAMS", S, b">")
    if kind == "read_history":
        return (b"XREADGROUP", b"GROUP", b"g", op[1], b"COUNT", b"%d" % op[2], b"STREAMS", S, b"0")
    if kind == "claim":
        return (b"XCLAIM", S, b"g", op[1], b"0", *op[2], *op[3])
    if kind == "autoclaim":
        return (b"XAUTOCLAIM", S, b"g", op[1], b"0", op[2], b"COUNT", b"%d" % op[3], *op[4])
    return (b"XACK", S, b"g", op[1])


def _setup(max_deliveries: int) -> list:
    cmds = [(b"XADD", S, i, b"f", i) for i in IDS]
    cmds += [(b"XGROUP", b"CREATE", S, b"g", b"0"),
             (b"XRAFT.GROUPCFG", S, b"g", b"MAXDELIVERIES", b"%d" % max_deliveries, b"DEADLETTER", DLQ)]
    return cmds


def _check(sm: StateMachine, now: int, acked: set, max_deliveries: int) -> None:
    def read(*argv):
        return sm.read(list(argv), now)
    pending = {bytes(row[0]) for row in read(b"XPENDING", S, b"g", b"-", b"+", b"100")}
    letters = read(b"XRANGE", DLQ, b"-", b"+") if read(b"EXISTS", DLQ) else []
    dead = [bytes(fields[1]) for _, fields in letters]
    info = read(b"XINFO", b"GROUPS", S)[0]
    last = info[b"last-delivered-id"]
    unread = {i for i in IDS if int(i.split(b"-")[0]) > int(bytes(last).split(b"-")[0])}
    assert len(dead) == len(set(dead)), ("an entry dead-lettered twice", dead)
    parts = [unread, pending, acked, set(dead)]
    assert sum(map(len, parts)) == ENTRIES, ("an entry in two states, or in none", parts)
    assert set().union(*parts) == set(IDS), parts
    for _, fields in letters:
        meta = dict(zip(fields[0:10:2], fields[1:10:2]))
        assert meta[b"stream"] == S and meta[b"group"] == b"g"
        assert int(meta[b"deliveries"]) >= max_deliveries
        assert list(fields[10:]) == [b"f", meta[b"id"]]                  # the entry's own payload
    assert (info[b"dead-lettered"], info[b"pending"]) == (len(dead), len(pending))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.lists(ops, min_size=1, max_size=40))
def test_dead_lettering_conserves_every_entry(max_deliveries, steps):
    leader, replica = StateMachine(), StateMachine()
    records = [encode_record(T + i, [Request.command(0, 0, c)]) for i, c in enumerate(_setup(max_deliveries))]
    for index, record in enumerate(records, 1):
        leader.apply(index, record)
    acked = set()
    for step in steps:
        records.append(encode_record(T + len(records), [Request.command(0, 0, _argv(step))]))
        index = len(records)
        reply = leader.apply(index, records[-1])[0]
        if step[0] == "ack" and reply == 1:
            assert step[1] not in acked, "XACK acknowledged an entry twice"
            acked.add(step[1])
        _check(leader, T + index, acked, max_deliveries)
    for index, record in enumerate(records, 1):
        replica.apply(index, record, False)
    assert replica.snapshot() == leader.snapshot()
