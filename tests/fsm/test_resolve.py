"""Leader-side resolution: monotonic stamps, refusals, blocking -> non-blocking forms."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node.engine.commands import execute
from xraft.node.engine.errors import EngineError
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.replies import NULL_ARRAY, OK
from xraft.node.fsm.blocking import NOT_SERVED, is_blocking_form, plan_blocking
from xraft.node.fsm.entry import Kind, decode_record, encode_record, Request
from xraft.node.fsm.errors import EntryTooLarge, ExecAbort, NotAWrite
from xraft.node.fsm.resolve import (TimeStamper, propose, resolve_command, resolve_config_set,
                                    resolve_transaction, retry_request)
from xraft.node.fsm.state_machine import StateMachine

def argv(s: str):
    return [a.encode() for a in s.split()]


# -- time -------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["stamp", "observe"]), st.integers(0, 10**6)), max_size=40))
def test_stamps_never_go_below_anything_proposed_or_observed(ops):
    ts = TimeStamper()
    high = 0
    for op, t in ops:
        if op == "observe":
            ts.observe(t)
            high = max(high, t)
        else:
            got = ts.stamp(t)
            assert got == max(t, high)            # the clock, unless it is behind
            high = got
        assert ts.floor_ms == high


def test_new_leader_with_a_slow_clock_keeps_ids_increasing():
    old = TimeStamper()
    sm = StateMachine()
    log = [propose(old, 5_000, [Request.register(1), Request.register(2),
                                resolve_command(1, 1, argv("XADD s * f 1")).request])]
    log.append(propose(old, 6_000, [resolve_command(1, 2, argv("XADD s * f 2")).request]))
    # The new leader applied only the first record; the second is in its log, unapplied.
    assert sm.apply(1, log[0]) == [OK, OK, b"5000-0"]
    new = TimeStamper(sm.last_now_ms)
    for data in log:
        new.observe_record(data)
    new.observe_record(b"")                       # raft's own empty entry carries no time
    log.append(propose(new, 1_000, [resolve_command(2, 1, argv("XADD s * f 3")).request]))
    assert decode_record(log[-1]).now_ms == 6_000
    assert sm.apply(2, log[1]) == [b"6000-0"]
    assert sm.apply(3, log[2]) == [b"6000-1"]


def test_apply_clamps_a_time_that_runs_backwards():
    sm = StateMachine()
    sm.apply(1, encode_record(9_000, [Request.command(0, 0, argv("XADD s * f 1"))]))
    assert sm.apply(2, encode_record(10, [Request.command(0, 0, argv("XADD s * f 1"))])) == [b"9000-1"]
    assert sm.last_now_ms == 9_000
    assert sm.apply(3, encode_record(10, [Request.command(0, 0, argv("XADD t * f 1"))])) == [b"9000-0"]


# -- refusals ---------------------------------------------------------------------

@pytest.mark.parametrize("cmd,text", [
    ("NOSUCH a b", "ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' "),
    ("XADD s *", "ERR wrong number of arguments for 'xadd' command"),
    ("LPUSH", "ERR wrong number of arguments for 'lpush' command"),
    ("CONFIG", "ERR wrong number of arguments for 'config' command"),
    ("CONFIG SET x", "ERR wrong number of arguments for 'config|set' command"),
    ("CONFIG SET nosuch 1", "ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'"),
    ("BLPOP l x", "ERR timeout is not a float or out of range"),
    ("BLPOP l -1", "ERR timeout is negative"),
    ("BLMOVE a b UP LEFT 0", "ERR syntax error"),
    ("BLMPOP 0 0 l LEFT", "ERR numkeys should be greater than 0"),
    ("XREADGROUP GROUP g c BLOCK -1 STREAMS s >", "ERR timeout is negative"),
    ("XREADGROUP GROUP g c BLOCK x STREAMS s >", "ERR timeout is not an integer or out of range"),
])
def test_errors_before_proposing(cmd, text):
    with pytest.raises(EngineError) as e:
        resolve_command(1, 1, argv(cmd))
    assert e.value.message == text


@pytest.mark.parametrize("cmd", ["GET k", "XRANGE s - +", "XREAD BLOCK 0 STREAMS s $", "PING",
                                 "XINFO STREAM s", "LRANGE l 0 -1", "XPENDING s g"])
def test_reads_are_not_proposed(cmd):
    with pytest.raises(NotAWrite):
        resolve_command(1, 1, argv(cmd))


def test_writes_pass_unchanged():
    for cmd in ["XADD s * f v", "XREADGROUP GROUP g c STREAMS s >", "LPOP l", "DEL a b", "SET k v"]:
        r = resolve_command(3, 4, argv(cmd))
        assert r.plan is None
        assert r.request == Request(3, 4, Kind.COMMAND, (tuple(argv(cmd)),))


def test_config_set_is_a_config_request():
    r = resolve_command(1, 2, argv("config SET stream-node-max-entries 5"))
    assert r.request.kind == Kind.CONFIG and r.plan is None
    with pytest.raises(EngineError, match="duplicate parameter"):
        resolve_config_set(1, 2, argv("CONFIG SET list-compress-depth 1 LIST-COMPRESS-DEPTH 2"))


def test_transaction_queue_errors_discard_it():
    ok = resolve_transaction(1, 1, [argv("SET a 1"), argv("GET a"), argv("BLPOP l 0"),
                                    argv("CONFIG SET list-compress-depth 1")])
    assert ok.kind == Kind.MULTI and len(ok.commands) == 4
    for bad in ([argv("SET a 1"), argv("NOSUCH")], [argv("XADD s")], [argv("CONFIG SET x")],
                [argv("MULTI")], [argv("CONFIG GET x")]):
        with pytest.raises(ExecAbort) as e:
            resolve_transaction(1, 1, bad)
        assert e.value.message == "EXECABORT Transaction discarded because of previous errors."


def test_oversized_request_is_refused(monkeypatch):
    from xraft.node.fsm import entry
    monkeypatch.setattr(entry, "MAX_ARG_BYTES", 4)
    with pytest.raises(EntryTooLarge):
        resolve_command(1, 1, argv("SET k 12345"))


# -- blocking forms -----------------------------------------------------------------

@pytest.mark.parametrize("cmd,form,keys,timeout", [
    ("BLPOP k 0", "LPOP k", ["k"], 0),
    ("BRPOP k 1.5", "RPOP k", ["k"], 1500),
    ("BLPOP a b a 2", "LMPOP 3 a b a LEFT", ["a", "b"], 2000),
    ("BRPOP a b 0", "LMPOP 2 a b RIGHT", ["a", "b"], 0),
    ("BLMOVE a b LEFT RIGHT 0", "LMOVE a b LEFT RIGHT", ["a"], 0),
    ("BRPOPLPUSH a b 0.01", "RPOPLPUSH a b", ["a"], 10),
    ("BLMPOP 0 2 a b RIGHT COUNT 3", "LMPOP 2 a b RIGHT COUNT 3", ["a", "b"], 0),
    ("XREADGROUP BLOCK 5 GROUP g c STREAMS s >", "XREADGROUP GROUP g c STREAMS s >", ["s"], 5),
    ("XREADGROUP GROUP g c block 1 COUNT 2 BLOCK 7 NOACK STREAMS block s > >",
     "XREADGROUP GROUP g c COUNT 2 NOACK STREAMS block s > >", ["block", "s"], 7),
])
def test_blocking_forms_become_non_blocking(cmd, form, keys, timeout):
    r = resolve_command(1, 1, argv(cmd))
    assert r.request.argv == tuple(argv(form))
    assert not is_blocking_form(r.request.argv)
    assert is_blocking_form(argv(cmd))
    assert r.plan.keys == tuple(argv(" ".join(keys)))
    assert r.plan.timeout_ms == timeout and r.plan.timeout_reply is NULL_ARRAY


def test_xreadgroup_retry_adds_redis_woken_count():
    plan = resolve_command(1, 1, argv("XREADGROUP GROUP g c COUNT 0 BLOCK 0 STREAMS s >")).plan
    assert plan.retry_argv == tuple(argv("xreadgroup-woken GROUP g c COUNT 0 COUNT 1000 STREAMS s >"))
    assert retry_request(plan, 1, 2) == Request.command(1, 2, plan.retry_argv)
    plan = resolve_command(1, 1, argv("XREADGROUP GROUP g c COUNT 3 BLOCK 0 STREAMS s >")).plan
    assert plan.retry_argv == (b"xreadgroup-woken",) + plan.argv[1:]


@pytest.mark.parametrize("cmd", ["xreadgroup-woken GROUP g c STREAMS s >", "lpop-woken l", "rpop-woken l",
                                 "lmpop-woken 1 l LEFT", "lmove-woken l m LEFT RIGHT"])
def test_the_woken_retries_are_refused_from_clients(cmd):
    """Only the server proposes them: a client sending one gets redis's unknown command."""
    with pytest.raises(EngineError, match="unknown command '%s'" % cmd.split()[0]):
        resolve_command(1, 1, argv(cmd))
    with pytest.raises(ExecAbort):
        resolve_transaction(1, 1, [argv(cmd)])


@pytest.mark.parametrize("cmd, retry", [
    ("BLPOP l 0", "lpop-woken l"),
    ("BRPOP l 0", "rpop-woken l"),
    ("BLPOP a b 0", "lmpop-woken 2 a b LEFT"),
    ("BLMOVE l m LEFT RIGHT 0", "lmove-woken l m LEFT RIGHT"),
    ("BRPOPLPUSH l m 0", "lmove-woken l m RIGHT LEFT"),
    ("BLMPOP 0 2 a b RIGHT COUNT 3", "lmpop-woken 2 a b RIGHT COUNT 3"),
])
def test_list_retries_are_the_woken_forms(cmd, retry):
    assert resolve_command(1, 1, argv(cmd)).plan.retry_argv == tuple(argv(retry))


def test_xreadgroup_option_errors_come_before_proposing_even_without_block():
    with pytest.raises(EngineError, match="syntax error"):
        resolve_command(1, 1, argv("XREADGROUP GROUP g c FOO STREAMS s >"))


def test_not_blocking_forms():
    for cmd in ["XREADGROUP GROUP g c STREAMS s >", "XREAD STREAMS s 0", "LPOP l", "XREAD BLOCK", "GET k"]:
        assert not is_blocking_form(argv(cmd))
        assert plan_blocking(argv(cmd)) is None


def _served(cmd, setup):
    """The blocking command's reply via resolve + apply + translate, and via the engine directly."""
    sm, db = StateMachine(), Keyspace()
    for i, s in enumerate(setup, 1):
        sm.apply(i, encode_record(1000, [Request.command(0, 0, argv(s))]))
        execute(db, argv(s), 1000)
    r = resolve_command(1, 1, argv(cmd))
    [_, result] = sm.apply(len(setup) + 1, encode_record(1000, [Request.register(1), r.request]))
    got = r.plan.translate(result)
    try:
        direct = execute(db, argv(cmd), 1000)
    except EngineError as e:
        direct = e
    return got, direct


@pytest.mark.parametrize("cmd,setup", [
    ("BLPOP k 0", ["RPUSH k a b"]),
    ("BRPOP x k 0", ["RPUSH k a b"]),
    ("BLPOP x y k 0", ["RPUSH y 1", "RPUSH k a b"]),
    ("BLMOVE k d RIGHT LEFT 0", ["RPUSH k a b"]),
    ("BRPOPLPUSH k d 0", ["RPUSH k a b"]),
    ("BLMPOP 0 2 x k LEFT COUNT 5", ["RPUSH k a b"]),
    ("XREADGROUP GROUP g c BLOCK 0 STREAMS s >", ["XADD s 1-1 f v", "XGROUP CREATE s g 0"]),
])
def test_served_reply_equals_the_blocking_commands_reply(cmd, setup):
    got, direct = _served(cmd, setup)
    assert got == direct and got is not NOT_SERVED


@pytest.mark.parametrize("cmd,setup", [
    ("BLPOP k 0", []), ("BRPOP x k 0", []), ("BLMOVE k d RIGHT LEFT 0", []),
    ("BRPOPLPUSH k d 0", []), ("BLMPOP 0 2 x k LEFT", []),
    ("XREADGROUP GROUP g c BLOCK 0 STREAMS s >", ["XADD s 1-1 f v", "XGROUP CREATE s g $"]),
])
def test_nothing_to_serve_is_not_served(cmd, setup):
    got, direct = _served(cmd, setup)
    assert got is NOT_SERVED and type(direct).__name__ == "WouldBlock"


def test_errors_are_served_replies():
    got, direct = _served("BLPOP x k 0", ["SET k v"])
    assert got is not NOT_SERVED and got.code == "WRONGTYPE" and got == direct
