"""Client sessions (fsm/sessions.py): registered explicitly, expired by replicated time,
never a second apply - not after more clients than the table holds, not after expiry."""
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine.dump import dump_keyspace
from xraft.node.engine.replies import OK
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.errors import SessionExpired, SessionsFull, StaleRequest
from xraft.node.fsm.resolve import resolve_command
from xraft.node.fsm.sessions import DEFAULT_MAX_CLIENTS, DEFAULT_SESSION_TIMEOUT_MS, Sessions
from xraft.node.fsm.state_machine import StateMachine
from xraft.node.server.wire_errors import wire_for_message

NOW = 1_700_000_000_000
HOUR = DEFAULT_SESSION_TIMEOUT_MS


class Log:
    def __init__(self, **kw):
        self.sm = StateMachine(**kw)

    def run(self, *reqs, now=NOW):
        return self.sm.apply(self.sm.applied_index + 1, encode_record(now, reqs))

    def register(self, cid, now=NOW):
        return self.run(Request.register(cid), now=now)[0]

    def cmd(self, s, cid=0, seq=0, now=NOW):
        return self.run(Request.command(cid, seq, s.encode().split()), now=now)[0]

    def read(self, s):
        return self.sm.read(s.encode().split(), NOW)


def test_a_retry_after_more_clients_than_the_table_holds_is_not_applied_twice():
    # main: client 1 was evicted as least recently used by 1024 newer clients,
    # and its retry was applied again (XLEN 2).
    log = Log()
    assert log.register(1) == OK
    first = log.cmd("XADD s * f v", cid=1, seq=1)
    refused = 0
    for cid in range(2, DEFAULT_MAX_CLIENTS + 201):
        reply = log.register(cid, now=NOW + cid)
        if isinstance(reply, SessionsFull):
            refused += 1                               # full of live sessions: client 1's among them
            assert log.cmd("XADD other * f v", cid=cid, seq=1, now=NOW + cid) == SessionExpired(cid, 1)
        else:
            assert reply == OK
            log.cmd("XADD other * f v", cid=cid, seq=1, now=NOW + cid)
    assert refused == 200 and len(log.sm.sessions) == DEFAULT_MAX_CLIENTS
    assert log.cmd("XADD s * f v", cid=1, seq=1, now=NOW + 5000) == first
    assert log.read("XLEN s") == 1
    # An hour of replicated time without client 1: its session expires, and a
    # retry is refused, still never applied again.
    later = NOW + 5000 + HOUR + 1
    expired = log.cmd("XADD s * f v", cid=1, seq=1, now=later)
    assert expired == SessionExpired(1, 1) and log.read("XLEN s") == 1
    assert len(log.sm.sessions) == 0                   # everyone was idle for the hour
    assert log.register(DEFAULT_MAX_CLIENTS + 500, now=later) == OK     # room again


def test_session_expired_is_one_wire_error_that_is_not_retriable():
    err = SessionExpired(7, 3)
    assert err.code == "SESSIONEXPIRED"
    row = wire_for_message(err.message)
    assert (row.reason, row.grpc_status, row.retriable) == ("SESSION_EXPIRED", "FAILED_PRECONDITION", False)
    row = wire_for_message(SessionsFull(2).message)
    assert (row.reason, row.grpc_status, row.retriable) == ("SESSIONS_FULL", "RESOURCE_EXHAUSTED", True)


def test_unregistered_ids_are_refused_and_register_is_idempotent():
    log = Log()
    assert log.cmd("RPUSH l a", cid=5, seq=1) == SessionExpired(5, 1)
    assert log.read("EXISTS l") == 0
    assert log.register(5) == OK
    assert log.cmd("RPUSH l a", cid=5, seq=1) == 1
    assert log.register(5, now=NOW + 10) == OK         # a resent REGISTER: same session, same results
    assert log.cmd("RPUSH l a", cid=5, seq=1) == 1
    assert log.read("LLEN l") == 1


def test_activity_keeps_a_session_and_expiry_follows_replicated_time():
    log = Log(session_timeout_ms=1000)
    log.register(1)
    log.register(2)
    for t in range(0, 5000, 900):                      # client 1 active every 900 ms
        log.cmd("RPUSH l x", cid=1, seq=t + 1, now=NOW + t)
    assert list(log.sm.sessions.clients) == [1]        # client 2 idle past 1000 ms: gone
    assert log.cmd("RPUSH l x", cid=2, seq=1, now=NOW + 5000) == SessionExpired(2, 1)
    # A record stamped in the past does not move time back (apply clamps), so
    # nothing revives: expiry is monotone in the log position.
    assert log.cmd("RPUSH l x", cid=2, seq=1, now=NOW) == SessionExpired(2, 1)
    # Exactly at the timeout the session is still there; one ms later it is not.
    log.run(Request.noop(), now=NOW + 4500 + 1000)
    assert 1 in log.sm.sessions.clients
    log.run(Request.noop(), now=NOW + 4500 + 1001)
    assert 1 not in log.sm.sessions.clients


def test_sessions_full_frees_up_only_by_expiry():
    log = Log(max_clients=2, session_timeout_ms=1000)
    assert log.register(1) == OK and log.register(2, now=NOW + 500) == OK
    assert isinstance(log.register(3, now=NOW + 900), SessionsFull)
    assert log.register(1, now=NOW + 900) == OK        # a live one refreshes: no room needed
    assert log.register(3, now=NOW + 1501) == OK       # client 2 (last seen +500) expired
    assert sorted(log.sm.sessions.clients) == [1, 3]


def test_xraft_register_command_resolves_to_a_register_request():
    assert resolve_command(0, 0, [b"xraft.REGISTER", b"42"]).request == Request.register(42)
    for bad in ([b"XRAFT.REGISTER"], [b"XRAFT.REGISTER", b"0"], [b"XRAFT.REGISTER", b"-1"],
                [b"XRAFT.REGISTER", b"18446744073709551616"], [b"XRAFT.REGISTER", b"x"],
                [b"XRAFT.REGISTER", b"1", b"SLOT"], [b"XRAFT.REGISTER", b"1", b"SLOT", b"16384"],
                [b"XRAFT.REGISTER", b"1", b"SLOTS", b"5"], [b"XRAFT.REGISTER", b"1", b"SLOT", b"-1"]):
        with pytest.raises(Exception) as e:
            resolve_command(0, 0, bad)
        assert e.value.message.startswith("ERR ")


def test_xraft_register_names_the_group_by_a_slot_that_is_not_in_the_record():
    req = resolve_command(0, 0, [b"XRAFT.REGISTER", b"42", b"slot", b"16383"]).request
    assert req == Request.register(42) and req.route_slot == 16383
    assert resolve_command(0, 0, [b"XRAFT.REGISTER", b"42"]).request.route_slot is None
    assert encode_record(1, [req]) == encode_record(1, [Request.register(42)])


def _v1_snapshot(applied, now_ms, clients, keyspace):
    """A StateMachine snapshot as version 1 wrote it (sessions without times)."""
    sess = [struct.pack(">IIII", 1024, 1024, 16 << 10, len(clients))]
    for cid, floor, results in clients:
        sess.append(struct.pack(">QQI", cid, floor, len(results)))
        for seq, raw in results:
            sess += [struct.pack(">QI", seq, len(raw)), raw]
    sess = b"".join(sess)
    body = b"".join([struct.pack(">4sHQQI", b"XFSM", 1, applied, now_ms, len(sess)), sess,
                     struct.pack(">Q", len(keyspace)), keyspace])
    return body + struct.pack(">I", zlib.crc32(body))


def test_a_version_1_snapshot_restores_with_its_clients_active_at_its_time():
    src = Log()
    src.register(77)
    first = src.cmd("RPUSH l a", cid=77, seq=1)
    raw = src.sm.sessions.clients[77].results[1]
    snap = _v1_snapshot(src.sm.applied_index, NOW, [(77, 0, [(1, raw)])], dump_keyspace(src.sm.keyspace))
    sm = StateMachine()
    sm.restore(snap)
    assert sm.sessions.clients[77].last_ms == NOW
    log = Log()
    log.sm = sm
    assert log.cmd("RPUSH l a", cid=77, seq=1, now=NOW + HOUR) == first      # still deduplicated
    assert log.read("LLEN l") == 1
    # Its next snapshot is version 2 and restores to the same bytes.
    again = StateMachine()
    again.restore(sm.snapshot())
    assert again.snapshot() == sm.snapshot()


# -- property: whatever the interleaving, no request is applied twice; replicas agree ----

OPS = st.lists(st.tuples(st.sampled_from(["register", "send", "retry", "idle", "snapshot"]),
                         st.integers(1, 4), st.integers(0, 7)), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_no_request_is_applied_twice_and_replicas_agree(ops):
    a = StateMachine(max_clients=3, session_timeout_ms=1000, results_per_client=4)
    b = StateMachine(max_clients=3, session_timeout_ms=1000, results_per_client=4)
    now, seqs, sent, index = NOW, {}, [], 0
    for op, cid, pick in ops:
        if op == "idle":
            now += 300 * pick
            req = Request.noop()
        elif op == "register" and cid not in seqs:
            # The client contract (sessions.py): an id is registered (perhaps
            # several times) before its first request, never after.
            req = Request.register(cid)
        elif op == "register":
            req = Request.noop()
        elif op == "retry" and sent:
            req = sent[pick % len(sent)]
        else:
            seqs[cid] = seqs.get(cid, 0) + 1
            req = Request.command(cid, seqs[cid], [b"RPUSH", b"log", b"%d:%d" % (cid, seqs[cid])])
            sent.append(req)
        index += 1
        data = encode_record(now, [req])
        ra, rb = a.apply(index, data), b.apply(index, data)
        assert ra == rb
        if op == "snapshot":                           # b continues from a's snapshot
            b = StateMachine()
            b.restore(a.snapshot())
        assert a.snapshot() == b.snapshot()
        assert ra[0] is None or not isinstance(ra[0], StaleRequest) or req in sent
    applied = a.read([b"LRANGE", b"log", b"0", b"-1"], now)
    applied = applied if isinstance(applied, list) else []
    assert len(applied) == len(set(applied))           # at most once, whatever happened
    assert len(a.sessions) <= 3
    Sessions.decode(a.sessions.encode(), a.last_now_ms)     # and its encoding is valid
