"""Poison messages (dead_letters.py, cmd_dead_letters.py): XRAFT.GROUPCFG's
replies and errors, and dead-lettering on each delivery path that counts a
delivery again (XREADGROUP history, XCLAIM, XAUTOCLAIM), against the engine."""
import pytest

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine import groups as g
from xraft.node.engine.command_keys import command_keys
from xraft.node.engine.commands import lookup
from xraft.node.engine.keyspace import Keyspace

S, DLQ = "{s}src", "{s}dlq"


def call(db, *argv, now_ms=1000):
    return engine_call(db, *argv, now_ms=now_ms)


def setup(max_deliveries=2, entries=3):
    db = Keyspace()
    for i in range(1, entries + 1):
        call(db, "XADD", S, f"{i}-0", "n", str(i))
    assert call(db, "XGROUP", "CREATE", S, "g", "0") == "OK"
    assert call(db, "XRAFT.GROUPCFG", S, "g", "MAXDELIVERIES", max_deliveries, "DEADLETTER", DLQ) == "OK"
    return db


def letters(db):
    """[(id, stream, group, consumer, deliveries, payload)] of the dead-letter stream."""
    out = []
    for _, fields in call(db, "XRANGE", DLQ, "-", "+"):
        meta = fields[:10]
        assert meta[0::2] == [b"id", b"stream", b"group", b"consumer", b"deliveries"]
        out.append((*meta[1::2], fields[10:]))
    return out


def group_of(db):
    return g.lookup_group(db.data[S.encode()], b"g")


def test_groupcfg_errors_in_order():
    db = Keyspace()
    call(db, "SET", "{s}str", "x")
    err = lambda *a: call(db, "XRAFT.GROUPCFG", *a).message      # noqa: E731
    assert err(S, "g", "MAXDELIVERIES") == "ERR wrong number of arguments for 'xraft.groupcfg' command"
    assert err(S, "g", "MAXDELIVERIES", "2") == "ERR syntax error"              # n > 0 needs DEADLETTER
    assert err(S, "g", "DEADLETTER", DLQ) == "ERR syntax error"                 # MAXDELIVERIES missing
    assert err(S, "g", "BOGUS", "1") == "ERR syntax error"
    assert err(S, "g", "MAXDELIVERIES", "-1", "DEADLETTER", DLQ) == "ERR value is not an integer or out of range"
    assert err(S, "g", "MAXDELIVERIES", "x", "DEADLETTER", DLQ) == "ERR value is not an integer or out of range"
    assert err("{s}str", "g", "MAXDELIVERIES", "2", "DEADLETTER", DLQ).startswith("WRONGTYPE")
    assert err(S, "g", "MAXDELIVERIES", "2", "DEADLETTER", DLQ) == "NOGROUP No such key '{s}src' or consumer group 'g'"
    call(db, "XGROUP", "CREATE", S, "g", "0", "MKSTREAM")
    assert err(S, "g", "MAXDELIVERIES", "2", "DEADLETTER", "other") == "CROSSSLOT Keys in request don't hash to the same slot"
    assert err(S, "g", "MAXDELIVERIES", "2", "DEADLETTER", S) == "ERR the dead-letter key must not be the stream itself"
    assert err(S, "g", "MAXDELIVERIES", "2", "DEADLETTER", "{s}str").startswith("WRONGTYPE")
    assert call(db, "xraft.groupcfg", S, "g", "maxdeliveries", "0") == "OK"     # clears; any case
    assert group_of(db).max_deliveries == 0


def test_groupcfg_keys_include_the_dead_letter_key():
    argv = [b"XRAFT.GROUPCFG", b"k", b"g", b"MAXDELIVERIES", b"2", b"DEADLETTER", b"d"]
    assert command_keys(lookup(argv), argv) == [b"k", b"d"]
    argv = [b"XRAFT.GROUPCFG", b"k", b"g", b"MAXDELIVERIES", b"0"]
    assert command_keys(lookup(argv), argv) == [b"k"]


def test_history_read_dead_letters_past_the_limit():
    db = setup(max_deliveries=2)
    assert len(call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, ">")[0][1]) == 3      # delivery 1
    assert len(call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, "0")[0][1]) == 3      # delivery 2
    assert call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, "0") == [[S.encode(), []]]  # the 3rd: moved
    assert letters(db) == [(b"%d-0" % i, S.encode(), b"g", b"c", b"2", [b"n", b"%d" % i]) for i in (1, 2, 3)]
    assert call(db, "XPENDING", S, "g")[0] == 0
    assert len(call(db, "XRANGE", S, "-", "+")) == 3            # the source stream keeps its entries
    g.check_group(group_of(db))


def test_history_read_count_bounds_the_moves():
    db = setup(max_deliveries=1)
    call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, ">")
    assert call(db, "XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "STREAMS", S, "0") == [[S.encode(), []]]
    assert len(letters(db)) == 2 and call(db, "XPENDING", S, "g")[0] == 1


def test_xclaim_dead_letters_and_keeps_the_rest():
    db = setup(max_deliveries=2, entries=2)
    call(db, "XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">")                 # both: count 1
    assert [e[0] for e in call(db, "XCLAIM", S, "g", "c2", "0", "1-0")] == [b"1-0"]   # count 2
    assert call(db, "XCLAIM", S, "g", "c3", "0", "1-0", "2-0") == [[b"2-0", [b"n", b"2"]]]
    assert letters(db) == [(b"1-0", S.encode(), b"g", b"c2", b"2", [b"n", b"1"])]
    # JUSTID and RETRYCOUNT do not count a delivery: they never dead-letter.
    assert call(db, "XCLAIM", S, "g", "c4", "0", "2-0", "JUSTID") == [b"2-0"]
    assert call(db, "XCLAIM", S, "g", "c4", "0", "2-0", "RETRYCOUNT", "5") != []
    assert len(letters(db)) == 1
    g.check_group(group_of(db))


def test_xautoclaim_dead_letters_and_counts_them():
    db = setup(max_deliveries=1)
    call(db, "XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">")
    cursor, claimed, deleted = call(db, "XAUTOCLAIM", S, "g", "c2", "0", "0", "COUNT", "2")
    assert (cursor, claimed, deleted) == (b"3-0", [], [])
    assert [d[0] for d in letters(db)] == [b"1-0", b"2-0"]
    assert call(db, "XAUTOCLAIM", S, "g", "c2", "0", "0", "JUSTID") == [b"0-0", [b"3-0"], []]
    assert len(letters(db)) == 2


def test_xinfo_groups_shows_policy_only_when_set():
    db = setup(max_deliveries=1, entries=1)
    info = dict(zip(*[iter(call(db, "XINFO", "GROUPS", S)[0])] * 2))
    assert (info[b"max-deliveries"], info[b"dead-letter-key"], info[b"dead-lettered"]) == (1, DLQ.encode(), 0)
    call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, ">")
    call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, "0")
    call(db, "XRAFT.GROUPCFG", S, "g", "MAXDELIVERIES", "0")
    info = dict(zip(*[iter(call(db, "XINFO", "GROUPS", S)[0])] * 2))
    assert (info[b"max-deliveries"], info[b"dead-letter-key"], info[b"dead-lettered"]) == (0, None, 1)
    call(db, "XGROUP", "CREATE", S, "plain", "0")
    assert len(call(db, "XINFO", "GROUPS", S)[1]) == 12           # redis 7.0's six fields


def test_wrong_type_dead_letter_key_fails_before_any_change():
    db = setup(max_deliveries=1, entries=1)
    call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, ">")
    call(db, "SET", DLQ, "taken")
    for argv in (("XREADGROUP", "GROUP", "g", "c", "STREAMS", S, "0"), ("XCLAIM", S, "g", "c", "0", "1-0"),
                 ("XAUTOCLAIM", S, "g", "c", "0", "0")):
        assert isinstance(call(db, *argv), RedisReplyError)
    assert call(db, "XPENDING", S, "g", "-", "+", "10") == [[b"1-0", b"c", 0, 1]]
    # a plain `>` read never dead-letters, so it does not look at the key
    call(db, "XADD", S, "9-0", "n", "9")
    assert call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, ">")[0][1][0][0] == b"9-0"


def test_dead_letter_is_a_side_write_and_wakes_readers():
    db = setup(max_deliveries=1, entries=1)
    call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, ">")
    db.pop_ready_keys()
    call(db, "XREADGROUP", "GROUP", "g", "c", "STREAMS", S, "0")
    assert DLQ.encode() in db.pop_ready_keys()
    assert db.pop_side_writes() == [DLQ.encode()]


@pytest.mark.parametrize("limit", [1, 3])
def test_every_entry_ends_acked_or_dead_lettered_once(limit):
    """A storm of claims by many consumers: every entry is either still pending
    with at most `limit` deliveries or dead-lettered exactly once."""
    db = setup(max_deliveries=limit, entries=20)
    call(db, "XREADGROUP", "GROUP", "g", "c0", "STREAMS", S, ">")
    for round_ in range(10):
        call(db, "XAUTOCLAIM", S, "g", f"c{round_ % 3}", "0", "0", "COUNT", "7")
        call(db, "XREADGROUP", "GROUP", "g", f"c{round_ % 3}", "COUNT", "3", "STREAMS", S, "0")
        for _, nack in group_of(db).pel.items():
            assert nack.delivery_count <= limit
    dead = [d[0] for d in letters(db)]
    assert len(dead) == len(set(dead)) == 20
    assert group_of(db).dead_lettered == 20 and group_of(db).pel.numele == 0


# -- a move is an ack: the source stream's ACKED retention runs after it -------------------

_MOVE_FIRST_TWO = {     # max_deliveries=1, all 3 read once by c1: a command that moves 1-0 and 2-0
    "xreadgroup": ("XREADGROUP", "GROUP", "g", "c1", "COUNT", "2", "STREAMS", S, "0"),
    "xclaim": ("XCLAIM", S, "g", "c2", "0", "1-0", "2-0"),
    "xautoclaim": ("XAUTOCLAIM", S, "g", "c2", "0", "0", "COUNT", "2"),
}


@pytest.mark.parametrize("path", sorted(_MOVE_FIRST_TWO))
def test_dead_letter_move_runs_acked_retention(path):
    db = setup(max_deliveries=1)
    assert call(db, "XCFGSET", S, "RETENTION", "ACKED") == "OK"
    call(db, "XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">")
    call(db, *_MOVE_FIRST_TWO[path])
    assert [d[0] for d in letters(db)] == [b"1-0", b"2-0"]
    # Both moved entries were acknowledged by the only group: trimmed; 3-0 is pending, kept.
    assert [e[0] for e in call(db, "XRANGE", S, "-", "+")] == [b"3-0"]
    assert call(db, "XPENDING", S, "g")[0] == 1
    g.check_group(group_of(db))


@pytest.mark.parametrize("path", sorted(_MOVE_FIRST_TWO))
def test_dead_letter_move_keeps_what_another_group_or_no_policy_needs(path):
    db = setup(max_deliveries=1)
    call(db, "XGROUP", "CREATE", S, "slow", "0")                # has read nothing: needs all
    assert call(db, "XCFGSET", S, "RETENTION", "ACKED") == "OK"
    call(db, "XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">")
    call(db, *_MOVE_FIRST_TWO[path])
    assert len(letters(db)) == 2 and len(call(db, "XRANGE", S, "-", "+")) == 3
    # Without the retention policy a move deletes nothing either.
    db = setup(max_deliveries=1)
    call(db, "XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">")
    call(db, *_MOVE_FIRST_TWO[path])
    assert len(letters(db)) == 2 and len(call(db, "XRANGE", S, "-", "+")) == 3
