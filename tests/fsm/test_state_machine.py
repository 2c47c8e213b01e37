"""StateMachine: apply, errors as results, MULTI/EXEC, at-most-once, reads, snapshots."""
import struct
import zlib

import pytest

from xraft.node.engine.errors import EngineError
from xraft.node.engine.replies import NULL_ARRAY, OK
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.errors import (BlockingFormInLog, CorruptEntry, CorruptSnapshot, ExecAbort,
                                   NotARead, StaleRequest)
from xraft.node.fsm.sessions import ResultNotKept
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.invariant import InvariantViolation
from xraft.node.raft.types import Entry, EntryType

NOW = 1_700_000_000_000


def argv(s: str):
    return [a.encode() for a in s.split()]


class Log:
    """Applies records to a StateMachine at consecutive indexes. A client id
    is registered (a REGISTER record of its own) the first time it is used."""

    def __init__(self, sm=None, **kw):
        self.sm = sm or StateMachine(**kw)
        self.seen = set()

    def register(self, cid, now=NOW):
        self.seen.add(cid)
        return self.sm.apply(self.sm.applied_index + 1, encode_record(now, [Request.register(cid)]))[0]

    def run(self, *reqs, now=NOW):
        for r in reqs:
            if r.client_id and r.client_id not in self.seen:
                self.register(r.client_id, now)
        return self.sm.apply(self.sm.applied_index + 1, encode_record(now, reqs))

    def cmd(self, s, cid=0, seq=0, now=NOW):
        return self.run(Request.command(cid, seq, argv(s)), now=now)[0]

    def multi(self, *cmds, cid=0, seq=0):
        return self.run(Request.multi(cid, seq, [argv(c) for c in cmds]))[0]

    def read(self, s, now=NOW):
        return self.sm.read(argv(s), now)


def test_results_and_bookkeeping():
    log = Log()
    assert log.run(Request.command(0, 0, argv("XADD s * f v")), Request.command(0, 0, argv("RPUSH l a")),
                   Request.noop()) == [b"%d-0" % NOW, 1, None]
    assert log.sm.applied_index == 1 and log.sm.last_now_ms == NOW
    assert log.sm.last_ready_keys == {b"s", b"l"}
    assert log.cmd("LLEN l") == 1                  # a read in the log is harmless
    assert log.sm.last_ready_keys == frozenset()


def test_a_failing_command_changes_nothing_and_is_a_result():
    log = Log()
    log.cmd("XADD s 5-0 f v")
    before = log.sm.snapshot()
    for bad in ["XADD s 4-0 f v", "LPUSH s x", "XGROUP CREATE s g 9-9 FOO", "NOSUCH", "XADD s"]:
        res = log.cmd(bad)
        assert isinstance(res, EngineError)
    # Only applied_index moved: same state otherwise.
    fresh = StateMachine()
    fresh.restore(before)
    assert _state(fresh) == _state(log.sm)
    assert fresh.applied_index == 1 and log.sm.applied_index == 6


def _state(sm):
    """Snapshot bytes without the header's applied index and time (bytes 6..22) and the CRC."""
    snap = sm.snapshot()
    return snap[:6] + snap[22:-4]


def test_blocking_forms_are_refused_outside_multi():
    log = Log()
    log.cmd("RPUSH l a")
    before = _state(log.sm)
    for cmd in ["BLPOP l 0", "BRPOPLPUSH l m 0", "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
                "XREAD BLOCK 0 STREAMS s 0"]:
        res = log.cmd(cmd)
        assert isinstance(res, BlockingFormInLog) and res.code == "ERR"
    assert _state(log.sm) == before


def test_multi_runs_in_order_with_runtime_errors_per_command():
    log = Log()
    res = log.multi("RPUSH l a b", "SET k v", "LPUSH k x", "LPOP l", "BLPOP none 0",
                    "XREAD BLOCK 0 STREAMS s $", "GET k", "CONFIG SET list-compress-depth 3",
                    "CONFIG SET list-compress-depth 3 x")
    assert res[:2] == [2, OK]
    assert res[2].code == "WRONGTYPE"
    assert res[3:7] == [b"a", NULL_ARRAY, NULL_ARRAY, b"v"]     # blocking forms do not block in MULTI
    assert res[7] == OK and res[8].message == "ERR syntax error"
    assert log.sm.keyspace.config.list_compress_depth == 3
    assert log.multi() == []


def test_multi_queue_error_aborts_everything():
    log = Log()
    before = _state(log.sm)
    for cmds in [("SET a 1", "NOSUCH x"), ("SET a 1", "XADD s"), ("SET a 1", "CONFIG SET x"),
                 ("SET a 1", "CONFIG")]:
        res = log.multi(*cmds)
        assert isinstance(res, ExecAbort)
        assert res.message == "EXECABORT Transaction discarded because of previous errors."
    assert _state(log.sm) == before


def test_retry_returns_the_first_result_and_applies_once():
    log = Log()
    first = log.cmd("XADD s * f v", cid=7, seq=1)
    assert log.cmd("XADD s * f v", cid=7, seq=1, now=NOW + 5) == first
    assert log.read("XLEN s") == 1
    # A retry batched with its original: still applied once.
    res = log.run(Request.command(7, 2, argv("INCR x")), Request.command(7, 2, argv("RPUSH l a")),
                  Request.command(8, 2, argv("RPUSH l a")))
    assert res[0] == res[1] and res[0].code == "ERR" and res[2] == 1
    # Errors and transactions are remembered too.
    assert log.cmd("LPUSH s x", cid=7, seq=3).code == "WRONGTYPE"
    log.cmd("DEL s")
    assert log.cmd("LPUSH s x", cid=7, seq=3).code == "WRONGTYPE"
    txn = log.multi("RPUSH m a", "RPUSH m b", cid=9, seq=1)
    assert log.multi("RPUSH m a", "RPUSH m b", cid=9, seq=1) == txn == [1, 2]
    assert log.read("LLEN m") == 2


def test_window_eviction_gives_stale_requests_never_double_applies():
    log = Log(results_per_client=2)
    for seq in (1, 2, 3):
        log.cmd("RPUSH l x", cid=5, seq=seq)
    res = log.cmd("RPUSH l x", cid=5, seq=1)
    assert isinstance(res, StaleRequest)
    assert log.read("LLEN l") == 3
    assert log.cmd("RPUSH l x", cid=5, seq=3) == 3        # still in the window
    assert log.cmd("RPUSH l x", cid=5, seq=9) == 4        # new


def test_large_results_are_kept_as_a_marker():
    log = Log(max_result_bytes=256)
    log.cmd("RPUSH l " + "x" * 300)
    big = log.cmd("LPOP l", cid=4, seq=1)
    assert big == b"x" * 300
    again = log.cmd("LPOP l", cid=4, seq=1)
    assert again == ResultNotKept(4, 1) and "already applied" in again.message
    assert log.read("LLEN l") == 0


def test_sessions_survive_snapshots():
    log = Log()
    first = log.cmd("XADD s * f v", cid=7, seq=1)
    log.multi("XADD s * a b", "XINFO STREAM s", cid=7, seq=2)
    other = Log(StateMachine())
    other.sm.restore(log.sm.snapshot())
    assert other.cmd("XADD s * f v", cid=7, seq=1) == first
    assert other.multi("XADD s * a b", "XINFO STREAM s", cid=7, seq=2) == \
        log.multi("XADD s * a b", "XINFO STREAM s", cid=7, seq=2)
    assert other.read("XLEN s") == 2
    assert _state(other.sm) == _state(log.sm)


def test_corrupt_entry_raises_and_changes_nothing():
    log = Log()
    log.cmd("RPUSH l a")
    snap = log.sm.snapshot()
    good = encode_record(NOW, [Request.command(0, 0, argv("RPUSH l b"))])
    for bad in (good[:-1], good[:10], b"garbage!" * 3, bytes([good[0] ^ 1]) + good[1:]):
        with pytest.raises(CorruptEntry):
            log.sm.apply(2, bad)
        assert log.sm.applied_index == 1 and log.sm.snapshot() == snap
    assert log.sm.apply(2, good) == [2]


def test_indexes_must_be_consecutive():
    sm = StateMachine()
    with pytest.raises(InvariantViolation):
        sm.apply(2, encode_record(0, [Request.noop()]))
    assert sm.apply(1, b"") == []
    sm.skip(2)
    assert sm.apply_raft_entry(Entry(1, 3, EntryType.CONF_CHANGE, b"\x01\x02")) == []
    assert sm.apply_raft_entry(Entry(1, 4, EntryType.NORMAL, b"")) == []
    res = sm.apply_raft_entry(Entry(1, 5, EntryType.NORMAL, encode_record(1, [Request.command(0, 0, argv("SET a b"))])))
    assert res == [OK] and sm.applied_index == 5
    with pytest.raises(InvariantViolation):
        sm.apply(5, b"")


def test_config_set_is_all_or_nothing():
    log = Log()
    res = log.run(Request.config(1, 1, argv("CONFIG SET list-compress-depth 2 stream-node-max-bytes x")))[0]
    assert res.message == ("ERR CONFIG SET failed (possibly related to argument 'stream-node-max-bytes') "
                           "- argument must be a memory value")
    assert log.sm.keyspace.config.list_compress_depth == 0
    assert log.run(Request.config(1, 2, argv("CONFIG SET list-compress-depth 2 stream-node-max-bytes 1kb")))[0] == OK
    assert (log.sm.keyspace.config.list_compress_depth, log.sm.keyspace.config.stream_node_max_bytes) == (2, 1024)
    other = StateMachine()
    other.restore(log.sm.snapshot())
    assert other.keyspace.config == log.sm.keyspace.config


def test_initial_config_is_copied():
    from xraft.node.engine.keyspace import EngineConfig
    cfg = EngineConfig(stream_node_max_entries=3)
    sm = StateMachine(cfg)
    cfg.stream_node_max_entries = 50
    assert sm.keyspace.config.stream_node_max_entries == 3


def test_reads():
    log = Log()
    log.cmd("XADD s 1-1 f v")
    log.cmd("XGROUP CREATE s g 0")
    log.cmd("XREADGROUP GROUP g c STREAMS s >")
    with pytest.raises(NotARead):
        log.read("XADD s * f v")
    with pytest.raises(NotARead):
        log.read("XREADGROUP GROUP g c STREAMS s >")
    assert log.read("XLEN s") == 1 and log.read("PING") == "PONG"
    assert log.read("NOSUCH").message.startswith("ERR unknown command 'NOSUCH'")
    assert log.read("XRANGE s x +").code == "ERR"
    # A local clock behind the applied time is clamped: no negative idle.
    [consumer] = log.read("XINFO CONSUMERS s g", now=5)
    assert consumer[b"idle"] == 0
    wb = log.read("XREAD BLOCK 0 STREAMS s $")
    assert type(wb).__name__ == "WouldBlock" and wb.keys == [b"s"]


# -- snapshots ----------------------------------------------------------------------

def _small_sm():
    log = Log()
    log.cmd("XADD s 1-1 f v", cid=3, seq=1)
    log.cmd("RPUSH l a b", cid=3, seq=2)
    log.cmd("SET k v")
    return log.sm


def test_snapshot_round_trip():
    sm = _small_sm()
    snap = sm.snapshot()
    other = StateMachine()
    other.restore(snap)
    assert other.snapshot() == snap
    assert (other.applied_index, other.last_now_ms) == (sm.applied_index, sm.last_now_ms)


def test_every_snapshot_truncation_and_bit_flip_is_rejected_and_changes_nothing():
    snap = _small_sm().snapshot()
    target = StateMachine()
    Log(target).cmd("SET keep me")
    keep = target.snapshot()
    for n in range(len(snap)):
        with pytest.raises(CorruptSnapshot):
            target.restore(snap[:n])
    for i in range(len(snap)):
        for bit in range(8):
            bad = bytearray(snap)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptSnapshot):
                target.restore(bytes(bad))
    assert target.snapshot() == keep
    with pytest.raises(CorruptSnapshot):
        target.restore("text")


def _sess_head(version=2, max_clients=1024, per_client=1024, max_bytes=1 << 14, timeout=3_600_000, nclients=1):
    """A version 2 sessions header (sessions.py), 28 bytes."""
    return struct.pack(">2sHIIIQI", b"XS", version, max_clients, per_client, max_bytes, timeout, nclients)


def _reseal(body: bytes) -> bytes:
    return body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize("edit,why", [
    (lambda b: b"XFSN" + b[4:], "magic"),
    (lambda b: b[:4] + b"\x00\x09" + b[6:], "version"),
    (lambda b: b[:6] + struct.pack(">Q", 2**63) + b[14:], "out of range"),
    (lambda b: b[:22] + struct.pack(">I", 2**31) + b[26:], "sessions"),
    (lambda b: b + b"x", "keyspace"),
    (lambda b: b[:26] + _sess_head(max_clients=0) + b[54:], "sessions: session bound"),
    (lambda b: b[:26] + _sess_head(max_bytes=100) + b[54:], "sessions: max_result_bytes"),
    (lambda b: b[:26] + _sess_head(timeout=0) + b[54:], "sessions: session timeout"),
    (lambda b: b[:26] + _sess_head(version=3) + b[54:], "sessions: unsupported sessions version"),
    (lambda b: b[:26] + _sess_head(nclients=1025) + b[54:], "sessions: bad client count"),
    (lambda b: b[:26] + b"\x00\x00" + b[28:], "form that snapshot version 5"),
    (lambda b: b[:4] + b"\x00\x01" + b[6:], "form that snapshot version 1"),
])
def test_checks_behind_the_snapshot_checksum(edit, why):
    body = _small_sm().snapshot()[:-4]
    with pytest.raises(CorruptSnapshot, match=why):
        StateMachine().restore(_reseal(edit(body)))
