"""apply(..., want_results=False): a replica that nobody waits on may skip
building anonymous requests' results (XREADGROUP's replies), but its state
must stay byte-identical to the reply-building path at every step."""
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fsm.loggen import DataPicker, gen_log
from xraft.node.engine import cmd_groups
from xraft.node.engine.dump import dump_keyspace
from xraft.node.engine.keyspace import Keyspace
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.results import encode_result
from xraft.node.fsm.state_machine import StateMachine

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000_000

GROUP_TEMPLATES = [
    "XADD {s} * f {n}", "XADD {s} * f {n} g {n}", "XADD {s} * a {n}", "XADD {s} {ms}-* f v",
    "XADD {s} MAXLEN ~ 3 * f v", "XDEL {s} {id}", "XTRIM {s} MAXLEN {n}", "XSETID {s} {id}",
    "XGROUP CREATE {s} {g} 0 MKSTREAM", "XGROUP CREATE {s} {g} $ MKSTREAM ENTRIESREAD {n}",
    "XGROUP SETID {s} {g} 0", "XGROUP SETID {s} {g} {id}", "XGROUP DELCONSUMER {s} {g} {c}",
    "XGROUP CREATECONSUMER {s} {g} {c}", "XGROUP DESTROY {s} {g}",
    "XREADGROUP GROUP {g} {c} COUNT {n} STREAMS {s} >",
    "XREADGROUP GROUP {g} {c} COUNT {n} STREAMS {s} >",
    "XREADGROUP GROUP {g} {c} STREAMS {s} >",
    "XREADGROUP GROUP {g} {c} COUNT {n} NOACK STREAMS {s} >",
    "XREADGROUP GROUP {g} {c} COUNT {n} STREAMS s1 s2 > >",
    "XREADGROUP GROUP {g} {c} COUNT {n} STREAMS {s} {s} > >",
    "XREADGROUP GROUP {g} {c} COUNT {n} STREAMS {s} 0",
    "XREADGROUP GROUP {g} {c} STREAMS s1 s2 0 >",
    "XREADGROUP GROUP {g} {c} STREAMS {s} 18446744073709551615-18446744073709551615",
    "XREADGROUP GROUP {g} {c} STREAMS {s} $", "XREADGROUP GROUP nog {c} STREAMS {s} >",
    "xreadgroup-woken GROUP {g} {c} COUNT {n} STREAMS {s} >", "xreadgroup-woken GROUP {g} {c} STREAMS s1 s2 > >",
    "XACK {s} {g} {id} {id}", "XACK {s} {g} {id}",
    "XCLAIM {s} {g} {c} 0 {id}", "XAUTOCLAIM {s} {g} {c} 0 0 COUNT 2",
    "CONFIG SET stream-node-max-entries 3", "CONFIG SET stream-node-max-entries 100",
]


def _fresh(p, key, now):
    if key == "ms":
        return str(T0 + p.int(0, now - T0))
    if key == "id":
        return "%d-%d" % (T0 + p.int(0, now - T0), p.int(0, 2))
    if key == "n":
        return str(p.int(0, 6))
    return p.pick({"s": ["s1", "s2"], "g": ["g1", "g1", "g2"], "c": ["c1", "c2", "c3"]}[key])


def _group_log(p, steps):
    now, seq, log = T0, 0, [encode_record(T0, [Request.register(1)])]    # client 1's session
    for _ in range(steps):
        now = max(T0, now + p.int(-2, 3))
        batch = []
        for _ in range(p.int(1, 4)):
            text = re.sub(r"\{(\w+)\}", lambda m: _fresh(p, m.group(1), now), p.pick(GROUP_TEMPLATES))
            argv = [w.encode() for w in text.split()]
            if argv[0] == b"CONFIG":
                req = Request.config(0, 0, argv)
            elif p.int(0, 4) == 0:
                seq += 1
                req = Request.command(1, seq, argv)       # with a client_id: results recorded
            elif p.int(0, 6) == 0:
                req = Request.multi(0, 0, [argv])
            else:
                req = Request.command(0, 0, argv)
            batch.append(req)
        log.append(encode_record(now, batch))
    return log


def _compare(log):
    full, bare = StateMachine(), StateMachine()
    for i, data in enumerate(log, 1):
        reqs_results = full.apply(i, data)
        bare_results = bare.apply(i, data, False)
        assert full.snapshot() == bare.snapshot()
        assert full.last_ready_keys == bare.last_ready_keys
        for a, b in zip(reqs_results, bare_results):
            if b is not None:            # a result left unbuilt is None; any other is the same
                assert encode_result(a) == encode_result(b)
    return full


@HYP
@given(st.data())
def test_unwanted_results_leave_the_same_state_on_group_workloads(data):
    _compare(_group_log(DataPicker(data), data.draw(st.integers(1, 60))))


@HYP
@given(st.data())
def test_unwanted_results_leave_the_same_state_on_mixed_logs(data):
    _compare(gen_log(DataPicker(data), data.draw(st.integers(1, 40))))


def test_requests_with_a_client_id_keep_their_results():
    sm_full, sm_bare = StateMachine(), StateMachine()
    log = [encode_record(T0, [Request.register(7), Request.command(0, 0, b"XADD s * f v".split()),
                              Request.command(0, 0, b"XGROUP CREATE s g 0".split())]),
           encode_record(T0 + 1, [Request.command(7, 1, b"XREADGROUP GROUP g c STREAMS s >".split()),
                                  Request.command(0, 0, b"XADD s * f w".split()),
                                  Request.command(0, 0, b"XREADGROUP GROUP g c STREAMS s >".split())])]
    for i, data in enumerate(log, 1):
        full = sm_full.apply(i, data)
        bare = sm_bare.apply(i, data, False)
    assert bare[0] == full[0] and bare[0] is not None      # client 7's reply: built and recorded
    assert bare[2] is None and full[2] is not None          # anonymous: left unbuilt
    assert sm_full.snapshot() == sm_bare.snapshot()
    # A retry of client 7's request returns the recorded reply on both.
    retry = encode_record(T0 + 2, [Request.command(7, 1, b"XREADGROUP GROUP g c STREAMS s >".split())])
    assert sm_bare.apply(3, retry, False) == sm_full.apply(3, retry) == [full[0]]


def test_engine_xreadgroup_unobserved_matches_xreadgroup():
    def build():
        ks = Keyspace()
        from xraft.node.engine.commands import lookup
        for argv in (b"XADD s 1-1 f v", b"XADD s 1-2 f v", b"XADD s 1-3 f v", b"XGROUP CREATE s g 0"):
            argv = argv.split()
            lookup(argv).handler(ks, argv, 5)
        return ks
    a, b = build(), build()
    for argv, now in ((b"XREADGROUP GROUP g c COUNT 2 STREAMS s >", 10),
                      (b"XREADGROUP GROUP g c STREAMS s 0", 11),
                      (b"XREADGROUP GROUP g d STREAMS s >", 12),
                      (b"XREADGROUP GROUP g d STREAMS s >", 13)):
        ra = cmd_groups.xreadgroup(a, argv.split(), now)
        rb = cmd_groups.xreadgroup_unobserved(b, argv.split(), now)
        assert dump_keyspace(a) == dump_keyspace(b)
        if argv.endswith(b">") and now < 13:
            assert rb is None and ra
        else:
            assert rb == ra                  # history reads and empty reads: the same reply
