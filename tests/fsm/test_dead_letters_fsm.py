"""Dead letters through the state machine: the move is part of the one log
entry that applies the XREADGROUP/XCLAIM/XAUTOCLAIM (replicas and a restored
snapshot agree byte for byte), it counts as a modification of the
dead-letter key for WATCH, and a replica that throws replies away
(want_results=False) makes the same move."""
from xraft.node.engine.replies import NULL_ARRAY
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.state_machine import StateMachine

T = 1_700_000_000_000
S, DLQ = b"{q}src", b"{q}dlq"


def _cmd(*words):
    return tuple(w.encode() if isinstance(w, str) else w for w in words)


def _records():
    cmds = [("XADD", S, "1-0", "f", "a"), ("XADD", S, "2-0", "f", "b"), ("XGROUP", "CREATE", S, "g", "0"),
            ("XRAFT.GROUPCFG", S, "g", "MAXDELIVERIES", "2", "DEADLETTER", DLQ),
            ("XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">"),
            ("XCLAIM", S, "g", "c2", "0", "1-0"),
            ("XAUTOCLAIM", S, "g", "c3", "0", "0"),               # 1-0 is at 2: dead; 2-0 claimed
            ("XREADGROUP", "GROUP", "g", "c3", "STREAMS", S, "0")]  # 2-0 at 2: dead
    return [encode_record(T + i, [Request.command(0, 0, _cmd(*c))]) for i, c in enumerate(cmds)]


def _replay(want_results: bool) -> StateMachine:
    sm = StateMachine()
    for i, rec in enumerate(_records(), 1):
        sm.apply(i, rec, want_results)
    return sm


def test_replicas_and_snapshots_agree():
    leader, follower = _replay(True), _replay(False)
    assert leader.snapshot() == follower.snapshot()
    restored = StateMachine()
    restored.restore(leader.snapshot())
    assert restored.snapshot() == leader.snapshot()
    dead = leader.read([b"XRANGE", DLQ, b"-", b"+"], T + 100)
    assert [fields[1] for _, fields in dead] == [b"1-0", b"2-0"]
    info = restored.read([b"XINFO", b"GROUPS", S], T + 100)[0]
    assert (info[b"dead-lettered"], info[b"max-deliveries"], info[b"pending"]) == (2, 2, 0)


def test_dead_letter_aborts_a_watch_on_the_dead_letter_key():
    sm = StateMachine()
    records = _records()
    for i, rec in enumerate(records[:-1], 1):
        sm.apply(i, rec)
    watched_at = sm.applied_index
    sm.apply(sm.applied_index + 1, records[-1])                 # dead-letters 2-0 into DLQ
    exec_req = Request.watched_multi(0, 0, [(DLQ, watched_at)], [_cmd("XLEN", DLQ)])
    assert sm.apply(sm.applied_index + 1, encode_record(T + 50, [exec_req]))[0] is NULL_ARRAY
    exec_req = Request.watched_multi(0, 0, [(DLQ, sm.applied_index)], [_cmd("XLEN", DLQ)])
    assert sm.apply(sm.applied_index + 1, encode_record(T + 51, [exec_req]))[0] == [2]
