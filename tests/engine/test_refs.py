"""KEEPREF | DELREF | ACKED on XADD/XTRIM, XDELEX and XACKDEL (Redis 8.2), as
redis 8.2's tests/unit/type/stream.tcl and stream-cgroups.tcl check them (no
redis-server 8.2 here: their expected values are written out), and xraft's
ACKED retention (XCFGSET key RETENTION ACKED)."""
import pytest

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.stream_codec import dump_stream, load_stream

SYNTAX = "ERR syntax error"


def call(db, *argv):
    return engine_call(db, *argv, now_ms=1000)


def err(text):
    return RedisReplyError(text)


def stream_of(*ids, groups=()):
    db = Keyspace()
    for sid in ids:
        call(db, "XADD", "s", sid, "f", "v")
    for name in groups:
        call(db, "XGROUP", "CREATE", "s", name, "0")
    return db


def ids_of(db, key="s"):
    return [e[0].decode() for e in call(db, "XRANGE", key, "-", "+")]


def pending(db, group, key="s"):
    return call(db, "XPENDING", key, group)[0]


def both_groups_read_both():
    """Entries 1-0 and 2-0, both pending in group1 and in group2."""
    db = stream_of("1-0", "2-0", groups=["group1", "group2"])
    read_all(db, "group1", "consumer1")
    read_all(db, "group2", "consumer2")
    return db


def read_all(db, group, consumer="c", count=None):
    extra = ["COUNT", count] if count else []
    return call(db, "XREADGROUP", "GROUP", group, consumer, *extra, "STREAMS", "s", ">")


# -- XADD / XTRIM with a policy ("XADD with MAXLEN option and ACKED option", ...) -------------------

def test_xadd_maxlen_acked_keeps_what_a_group_needs():
    db = stream_of("1-0", "2-0", "3-0", "4-0", "5-0", groups=["mygroup"])
    call(db, "XADD", "s", "MAXLEN", "=", "1", "ACKED", "6-0", "f", "v")
    assert call(db, "XLEN", "s") == 6                    # nothing read: all still needed
    read_all(db, "mygroup", count=1)
    call(db, "XACK", "s", "mygroup", "1-0")
    call(db, "XADD", "s", "MAXLEN", "=", "1", "ACKED", "7-0", "f", "v")
    assert call(db, "XLEN", "s") == 6                    # 6 - 1 acked + 1 new
    got = read_all(db, "mygroup")
    call(db, "XACK", "s", "mygroup", *[e[0] for e in got[0][1]])
    call(db, "XADD", "s", "MAXLEN", "=", "1", "ACKED", "*", "f", "v")
    assert call(db, "XLEN", "s") == 1


def test_xadd_maxlen_delref_cleans_the_pels():
    db = stream_of("1-0", "2-0", "3-0", "4-0", "5-0", groups=["mygroup"])
    read_all(db, "mygroup", count=1)
    call(db, "XADD", "s", "MAXLEN", "=", "1", "DELREF", "*", "f", "v")
    assert call(db, "XLEN", "s") == 1 and pending(db, "mygroup") == 0


def test_xadd_keepref_is_the_old_behaviour():
    db = stream_of("1-0", "2-0", groups=["g"])
    read_all(db, "g")
    call(db, "XADD", "s", "KEEPREF", "MAXLEN", "1", "3-0", "f", "v")
    assert ids_of(db) == ["3-0"] and pending(db, "g") == 2


def test_policy_twice_is_a_syntax_error():
    db = stream_of("1-0")
    assert call(db, "XADD", "s", "KEEPREF", "DELREF", "*", "f", "v") == err(SYNTAX)
    assert call(db, "XTRIM", "s", "MAXLEN", "0", "ACKED", "ACKED") == err(SYNTAX)


def _two_per_node_all_read(n):
    """Entries 1-0 .. n-0, two per node, all read (pending) by group mygroup."""
    db = stream_of()
    call(db, "CONFIG", "SET", "stream-node-max-entries", "2")
    for i in range(1, n + 1):
        call(db, "XADD", "s", "%d-0" % i, "f", "v")
    call(db, "XGROUP", "CREATE", "s", "mygroup", "0")
    read_all(db, "mygroup")
    return db


def test_xtrim_approx_acked_deletes_single_entries_of_any_node():
    db = _two_per_node_all_read(5)
    call(db, "XACK", "s", "mygroup", "1-0", "2-0", "4-0")
    assert call(db, "XTRIM", "s", "MINID", "~", "6-0", "ACKED") == 3
    assert ids_of(db) == ["3-0", "5-0"]


def test_xtrim_approx_delref():
    db = _two_per_node_all_read(4)
    assert call(db, "XTRIM", "s", "MINID", "~", "5-0", "DELREF") == 4
    assert call(db, "XLEN", "s") == 0 and pending(db, "mygroup") == 0


def test_xtrim_delref_keeps_refs_outside_the_trimmed_range():
    db = stream_of("1-0", "2-0", "3-0", groups=["g"])
    read_all(db, "g")
    assert call(db, "XTRIM", "s", "MAXLEN", "2", "DELREF") == 1
    assert [p[0] for p in call(db, "XPENDING", "s", "g", "-", "+", "10")] == [b"2-0", b"3-0"]


# -- XDELEX -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, error", [
    (("DELREF",), "ERR wrong number of arguments for 'xdelex' command"),
    (("IDS", "abc", "1-1"), "ERR Number of IDs must be a positive integer"),
    (("IDS", "0", "1-1"), "ERR Number of IDs must be a positive integer"),
    (("IDS", "-5", "1-1"), "ERR Number of IDs must be a positive integer"),
    (("IDS", "3", "1-1", "2-2"), "ERR The `numids` parameter must match the number of arguments"),
    (("IDS", "1", "1-1", "2-2"), SYNTAX),
    (("KEEPREF", "DELREF", "IDS", "1", "1-1"), SYNTAX),
    (("KEEPREF", "ACKED", "IDS", "1", "1-1"), SYNTAX),
    (("ACKED", "DELREF", "IDS", "1", "1-1"), SYNTAX),
    (("KEEPREF", "1", "1-1", "x"), SYNTAX),
    (("IDS", "1", "bad"), "ERR Invalid stream ID specified as stream command argument"),
])
def test_xdelex_errors(args, error):
    db = stream_of("1-0", groups=["g"])
    assert call(db, "XDELEX", "s", *args) == err(error)


def test_xdelex_missing_key_and_missing_ids():
    db = Keyspace()
    assert call(db, "XDELEX", "nonexist", "IDS", "2", "1-1", "2-2") == [-1, -1]
    db = stream_of("1-0", groups=["g"])
    assert call(db, "XDELEX", "s", "IDS", "2", "1-1", "2-2") == [-1, -1]
    call(db, "SET", "k", "v")
    assert call(db, "XDELEX", "k", "IDS", "1", "1-1") == err(
        "WRONGTYPE Operation against a key holding the wrong kind of value")


def test_xdelex_delref_removes_from_all_pels():
    db = both_groups_read_both()
    assert call(db, "XDELEX", "s", "DELREF", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert call(db, "XLEN", "s") == 0 and pending(db, "group1") == 0 and pending(db, "group2") == 0


def test_xdelex_acked_only_when_every_group_is_done():
    db = stream_of("1-0", "2-0", groups=["group1", "group2", "group3"])
    read_all(db, "group1")
    read_all(db, "group2")
    call(db, "XACK", "s", "group1", "1-0", "2-0")
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "2", "1-0", "2-0") == [2, 2]
    call(db, "XACK", "s", "group2", "1-0", "2-0")
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "2", "1-0", "2-0") == [2, 2]   # group3 has not read them
    read_all(db, "group3")
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "2", "1-0", "2-0") == [2, 2]
    call(db, "XACK", "s", "group3", "1-0", "2-0")
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert call(db, "XLEN", "s") == 0


def test_xdelex_acked_and_group_last_ids():
    db = stream_of("1-0", "2-0", "3-0", "4-0", "5-0")
    call(db, "XGROUP", "CREATE", "s", "group1", "1-0")
    call(db, "XGROUP", "CREATE", "s", "group2", "3-0")
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "1", "1-0") == [1]
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "1", "2-0") == [2]
    call(db, "XGROUP", "DESTROY", "s", "group1")
    assert call(db, "XDELEX", "s", "ACKED", "IDS", "1", "2-0") == [1]


def test_xdelex_keepref_keeps_pels():
    db = both_groups_read_both()
    assert call(db, "XDELEX", "s", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert pending(db, "group1") == 2 and pending(db, "group2") == 2
    assert call(db, "XDELEX", "s", "IDS", "2", "1-0", "2-0") == [-1, -1]


# -- XACKDEL ------------------------------------------------------------------------------

def test_xackdel_arity_and_missing_key_or_group():
    db = Keyspace()
    for argv in (("XACKDEL",), ("XACKDEL", "s"), ("XACKDEL", "s", "g")):
        assert call(db, *argv) == err("ERR wrong number of arguments for 'xackdel' command")
    assert call(db, "XACKDEL", "s", "g", "IDS", "2", "1-1", "2-2") == [-1, -1]
    call(db, "XADD", "s", "1-0", "f", "v")
    assert call(db, "XACKDEL", "s", "g", "IDS", "2", "1-1", "2-2") == [-1, -1]
    call(db, "XGROUP", "CREATE", "s", "g", "0")
    assert call(db, "XACKDEL", "s", "g", "IDS", "abc", "1-1") == err("ERR Number of IDs must be a positive integer")
    assert call(db, "XACKDEL", "s", "g", "DELREF", "ACKED", "IDS", "1", "1-1") == err(SYNTAX)
    assert call(db, "XACKDEL", "s", "g", "IDS", "3", "1-1", "2-2") == err(
        "ERR The `numids` parameter must match the number of arguments")


def test_xackdel_delref():
    db = both_groups_read_both()
    assert call(db, "XACKDEL", "s", "group1", "DELREF", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert call(db, "XLEN", "s") == 0 and pending(db, "group1") == 0 and pending(db, "group2") == 0
    assert call(db, "XACKDEL", "s", "group2", "DELREF", "IDS", "2", "1-0", "2-0") == [-1, -1]


def test_xackdel_acked():
    db = both_groups_read_both()
    assert call(db, "XACKDEL", "s", "group1", "ACKED", "IDS", "2", "1-0", "2-0") == [2, 2]
    assert call(db, "XLEN", "s") == 2 and pending(db, "group1") == 0 and pending(db, "group2") == 2
    assert call(db, "XACKDEL", "s", "group2", "ACKED", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert call(db, "XLEN", "s") == 0 and pending(db, "group2") == 0


def test_xackdel_keepref():
    db = both_groups_read_both()
    assert call(db, "XACKDEL", "s", "group1", "KEEPREF", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert call(db, "XLEN", "s") == 0 and pending(db, "group1") == 0 and pending(db, "group2") == 2
    assert call(db, "XACKDEL", "s", "group2", "KEEPREF", "IDS", "2", "1-0", "2-0") == [1, 1]
    assert pending(db, "group2") == 0


# -- ACKED retention ----------------------------------------------------------------------

def test_retention_trims_the_acknowledged_head_on_every_xack():
    db = stream_of("1-0", "2-0", "3-0", "4-0", "5-0", groups=["fast", "slow"])
    assert call(db, "XCFGSET", "s", "RETENTION", "ACKED") == "OK"
    assert call(db, "XLEN", "s") == 5                    # nobody read anything yet
    read_all(db, "fast")
    call(db, "XACK", "s", "fast", "1-0", "2-0", "3-0", "4-0", "5-0")
    assert call(db, "XLEN", "s") == 5                    # the slow group has not read them
    read_all(db, "slow", count=3)                        # 1-0 2-0 3-0 pending in slow
    call(db, "XACK", "s", "slow", "2-0")
    assert ids_of(db) == ["1-0", "2-0", "3-0", "4-0", "5-0"]   # 1-0 still pending: the head stays
    call(db, "XACK", "s", "slow", "1-0")
    assert ids_of(db) == ["3-0", "4-0", "5-0"]
    call(db, "XACKDEL", "s", "slow", "IDS", "1", "3-0")
    assert ids_of(db) == ["4-0", "5-0"]                  # 4-0 not delivered to slow yet
    read_all(db, "slow")
    call(db, "XACK", "s", "slow", "4-0", "5-0")
    assert call(db, "XLEN", "s") == 0


def test_retention_never_drops_a_pending_entry_and_can_be_turned_off():
    db = stream_of("1-0", "2-0", "3-0", groups=["g"])
    read_all(db, "g")
    call(db, "XCFGSET", "s", "RETENTION", "ACKED")
    call(db, "XACK", "s", "g", "2-0", "3-0")
    assert ids_of(db) == ["1-0", "2-0", "3-0"]
    assert call(db, "XCFGSET", "s", "RETENTION", "NONE") == "OK"
    call(db, "XACK", "s", "g", "1-0")
    assert ids_of(db) == ["1-0", "2-0", "3-0"]
    call(db, "XCFGSET", "s", "RETENTION", "ACKED")       # set again: trims at once
    assert call(db, "XLEN", "s") == 0


def test_retention_option_errors_and_idmp_kept():
    db = stream_of("1-0", groups=["g"])
    call(db, "XADD", "s", "IDMP", "p", "i", "*", "f", "v")
    assert call(db, "XCFGSET", "s", "RETENTION") == err(SYNTAX)
    assert call(db, "XCFGSET", "s", "RETENTION", "SOMETIMES") == err(SYNTAX)
    call(db, "XCFGSET", "s", "RETENTION", "ACKED")
    info = call(db, "XINFO", "STREAM", "s")
    assert dict(zip(info[0::2], info[1::2]))[b"iids-tracked"] == 1     # not an IDMP change


def test_retention_in_the_snapshot():
    db = stream_of("1-0", "2-0", groups=["g"])
    call(db, "XCFGSET", "s", "RETENTION", "ACKED")
    loaded = load_stream(dump_stream(db.get(b"s")))
    assert loaded.retention == "acked"
    db2 = Keyspace()
    db2.set(b"s", loaded)
    read_all(db2, "g")
    call(db2, "XACK", "s", "g", "1-0")
    assert ids_of(db2) == ["2-0"]
