"""WATCH at apply time (fsm/watch.py): key versions are replicated state.

A WATCHED_MULTI request carries (key, W) pairs; apply aborts it (null array)
iff a watched key was modified by an entry after index W. Versions survive
snapshot/restore byte for byte, bound their tombstones deterministically, and
a version-1 snapshot restores conservatively.
"""
import struct
import zlib

import pytest

from xraft.node.engine.replies import NULL_ARRAY, OK
from xraft.node.fsm import state_machine as smod
from xraft.node.fsm import watch
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.errors import CorruptSnapshot
from xraft.node.fsm.state_machine import StateMachine

T = 1_700_000_000_000


def _cmd(*words):
    return tuple(w.encode() if isinstance(w, str) else w for w in words)


class Log:
    def __init__(self, sm=None):
        self.sm = sm or StateMachine()

    def apply(self, *requests):
        return self.sm.apply(self.sm.applied_index + 1, encode_record(T, requests))

    def run(self, *words):
        return self.apply(Request.command(0, 0, _cmd(*words)))[0]

    def exec_watched(self, watched, *commands):
        req = Request.watched_multi(0, 0, [(k.encode(), w) for k, w in watched], [_cmd(*c) for c in commands])
        return self.apply(req)[0]


def test_exec_aborts_iff_a_watched_key_changed_after_the_watch():
    log = Log()
    log.run("SET", "k", "1")
    w = log.sm.applied_index                         # the WATCH happens here
    log.run("SET", "other", "x")
    assert log.exec_watched([("k", w)], ("SET", "k", "2")) == [OK]
    assert log.exec_watched([("k", w)], ("SET", "k", "3")) is NULL_ARRAY     # our own EXEC changed it
    assert log.run("GET", "k") == b"2"
    w = log.sm.applied_index
    log.run("DEL", "k")
    assert log.exec_watched([("nosuch", w), ("k", w)]) is NULL_ARRAY
    # Changes that are no modification in redis do not abort.
    log.run("RPUSH", "l", "a")
    w = log.sm.applied_index
    for words in [("LREM", "l", "0", "zz"), ("DEL", "nosuch"), ("SET", "l2", "x", "XX"), ("LPOP", "nol"),
                  ("LINSERT", "l", "BEFORE", "zz", "q"),
                  ("XADD", "s", "NOMKSTREAM", "*", "f", "v"), ("RENAME", "l", "l"), ("LPUSH", "k9", "x")]:
        log.run(*words)
    assert log.exec_watched([("l", w), ("s", w)]) == []
    # Multi-key writes touch only the keys they changed (redis signals those alone).
    log.run("SET", "{a}1", "x")
    log.run("RPUSH", "{a}3", "x", "y")
    log.run("SET", "{a}5", "x")
    w = log.sm.applied_index
    for words in [("DEL", "{a}1", "{a}2"), ("UNLINK", "{a}2", "{a}1"), ("LMPOP", "2", "{a}4", "{a}3", "LEFT"),
                  ("RENAMENX", "{a}5", "{a}3")]:
        log.run(*words)
    assert log.exec_watched([("{a}2", w), ("{a}4", w), ("{a}5", w)]) == []
    for key in ("{a}1", "{a}3"):
        assert log.exec_watched([(key, w)]) is NULL_ARRAY, key


def test_flush_touches_the_keys_that_existed():
    log = Log()
    log.run("RPUSH", "l", "a")
    w = log.sm.applied_index
    log.run("FLUSHALL")
    assert log.exec_watched([("nosuch", w)]) == []
    assert log.exec_watched([("l", w)]) is NULL_ARRAY


def test_a_served_blocked_client_modifies_what_it_popped():
    """A blocked client woken by a push pops through its plan's internal retry
    (fsm/blocking.py): that pop modifies the key it served from (redis signals
    it), however the retry is spelled; a key it did not serve from is not touched.
    A WATCH between the push and the pop must see the pop."""
    from xraft.node.fsm.blocking import plan_blocking
    cases = [(("BLMPOP", "0", "2", "{a}0", "{a}1", "LEFT"), ["{a}1"], ["{a}0"]),
             (("BLPOP", "{a}0", "{a}1", "0"), ["{a}1"], ["{a}0"]),
             (("BRPOP", "{a}1", "0"), ["{a}1"], []),
             (("BLMOVE", "{a}1", "{a}2", "LEFT", "RIGHT", "0"), ["{a}1", "{a}2"], []),
             (("BRPOPLPUSH", "{a}1", "{a}2", "0"), ["{a}1", "{a}2"], [])]
    for blocking, touched, untouched in cases:
        log = Log()
        retry = plan_blocking(_cmd(*blocking)).retry_argv
        assert retry[0].endswith(b"-woken"), retry
        log.run("RPUSH", "{a}1", "x")                 # the push that wakes the client
        w = log.sm.applied_index                      # a WATCH answered here
        result = log.apply(Request.command(0, 0, retry))[0]
        assert result not in (None, NULL_ARRAY), (blocking, result)
        for key in touched:
            assert log.exec_watched([(key, w)]) is NULL_ARRAY, (blocking, key)
        assert log.exec_watched([(k, w) for k in untouched + ["{a}9"]]) == [], blocking


def test_a_woken_xreadgroup_is_group_bookkeeping():
    from xraft.node.fsm.blocking import woken_xreadgroup_request
    log = Log()
    log.run("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    log.run("XADD", "s", "1-1", "f", "v")
    w = log.sm.applied_index
    log.apply(woken_xreadgroup_request(0, 0, _cmd("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">")))
    assert log.sm.read(_cmd("XPENDING", "s", "g"), T)[0] == 1      # it did read
    assert log.exec_watched([("s", w)]) == []


def test_versions_survive_snapshot_and_restore():
    log = Log()
    log.run("SET", "a", "1")
    log.run("XADD", "s", "1-1", "f", "v")
    w = log.sm.applied_index
    log.run("SET", "b", "2")
    log.run("DEL", "a")                              # a tombstone: a deleted key keeps its version
    snap = log.sm.snapshot()
    replica = Log(StateMachine())
    replica.sm.restore(snap)
    assert replica.sm.snapshot() == snap
    for target in (log, replica):
        assert target.exec_watched([("a", w)]) is NULL_ARRAY
        assert target.exec_watched([("s", w)]) == []
        assert target.exec_watched([("b", w)]) is NULL_ARRAY
    assert replica.sm.snapshot() == log.sm.snapshot()


def test_unobserved_replica_keeps_the_same_versions():
    """A follower applies without wanting results (XREADGROUP's cheap variant
    replies None): its versions, and so its EXEC verdicts, must not differ."""
    leader, follower = StateMachine(), StateMachine()
    records = [
        [Request.command(0, 0, _cmd("XADD", "s", "1-1", "f", "v"))],
        [Request.command(0, 0, _cmd("XGROUP", "CREATE", "s", "g", "0"))],
        [Request.command(0, 0, _cmd("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"))],
        [Request.watched_multi(0, 0, [(b"s", 2)], [_cmd("XLEN", "s")])],
    ]
    for i, reqs in enumerate(records, 1):
        data = encode_record(T, reqs)
        res = leader.apply(i, data)
        follower.apply(i, data, want_results=False)
        assert leader.snapshot() == follower.snapshot()
    assert res == [[1]]                              # XREADGROUP is not a modification


def test_tombstones_are_bounded_deterministically(monkeypatch):
    monkeypatch.setattr(watch, "MAX_TOMBSTONES", 3)
    log = Log()
    log.run("SET", "keep", "1")
    w0 = log.sm.applied_index
    for i in range(4):
        log.run("SET", "t%d" % i, "x")
        log.run("DEL", "t%d" % i)
    versions = log.sm.versions
    assert set(versions.changed) == {b"keep"} and versions.floor == log.sm.applied_index
    # Absent keys are now conservatively "changed at the floor"; present ones keep theirs.
    assert log.exec_watched([("t0", w0)]) is NULL_ARRAY
    assert log.exec_watched([("never", log.sm.applied_index)]) == []
    assert log.exec_watched([("keep", w0)]) == []


def _pre_watch_snapshot(sm) -> bytes:
    """What a version-2 snapshot (timed sessions, before WATCH) of this state looked like."""
    body = sm.snapshot()[:-4]
    head = smod._SNAP_HEAD.size
    sess_len = struct.unpack_from(">I", body, head - 4)[0]
    ver_at = head + sess_len
    ver_len = struct.unpack_from(">I", body, ver_at)[0]
    own_at = ver_at + 4 + ver_len             # version 4's owned slots: empty (every slot) here
    # version 5's slot moves follow: empty (no move) here too
    assert body[own_at:own_at + 8] == b"\x00" * 8
    body = body[:4] + b"\x00\x02" + body[6:ver_at] + body[own_at + 8:]
    return body + struct.pack(">I", zlib.crc32(body))


def test_a_snapshot_from_before_watch_restores_conservatively():
    log = Log()
    log.run("SET", "a", "1")
    log.run("SET", "b", "1")
    replica = Log(StateMachine())
    replica.sm.restore(_pre_watch_snapshot(log.sm))
    assert replica.run("GET", "a") == b"1"
    assert replica.sm.versions.floor == 2 and not replica.sm.versions.changed
    assert replica.exec_watched([("a", 1)]) is NULL_ARRAY        # not known: abort
    assert replica.exec_watched([("a", 2)]) == []


@pytest.mark.parametrize("edit,why", [
    (lambda v: v[:8] + struct.pack(">I", 5) + v[12:], "runs past the end"),
    (lambda v: struct.pack(">Q", 99) + v[8:], "floor"),
    (lambda v: v + b"x", "trailing"),
    (lambda v: v[:-8] + struct.pack(">Q", 99), "beyond applied"),
])
def test_corrupt_versions_are_refused(edit, why):
    log = Log()
    log.run("SET", "a", "1")
    log.run("SET", "b", "1")
    body = log.sm.snapshot()[:-4]
    head = smod._SNAP_HEAD.size
    sess_len = struct.unpack_from(">I", body, head - 4)[0]
    at = head + sess_len
    ver_len = struct.unpack_from(">I", body, at)[0]
    versions = edit(body[at + 4:at + 4 + ver_len])
    body = body[:at] + struct.pack(">I", len(versions)) + versions + body[at + 4 + ver_len:]
    with pytest.raises(CorruptSnapshot, match=why):
        StateMachine().restore(body + struct.pack(">I", zlib.crc32(body)))
