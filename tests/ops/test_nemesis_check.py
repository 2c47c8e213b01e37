"""The nemesis checkers on hand-made histories: a clean one passes, and each anomaly is found
by its checker (and only counted there). No cluster, no root: these run everywhere."""
import random

import pytest

from xraft.ops import nemesis_check as nc

from . import lin_histories


class H:
    """Builds a history: op(...) adds an invocation and its completion at the given times."""

    def __init__(self):
        self.records = []
        self.n = 0

    def op(self, f, key, value, t0, t1, type_="ok", result=None, process="p", **extra):
        self.n += 1
        self.records.append({"op": self.n, "time": t0, "process": process, "type": "invoke", "f": f,
                             "key": key, "value": value, **extra})
        if type_ is not None:
            self.records.append({"op": self.n, "time": t1, "process": process, "type": type_, "f": f,
                                 "key": key, "value": value, "result": result})
        return self

    def final(self, **value):
        base = {"streams": {}, "pel": {}, "lists": {}, "replicas": {"1": {"applied": 5, "state": "x"},
                                                                    "2": {"applied": 5, "state": "x"}}}
        base.update(value)
        self.records.append({"op": None, "time": 99.0, "process": "final", "type": "ok", "f": "final",
                             "value": base})
        return self.records


def clean():
    h = H()
    h.op("xadd", "s", "v1", 0.0, 0.1, result="1-0")
    h.op("xadd", "s", "v2", 0.2, 0.3, result="2-0")
    h.op("xadd", "s", "v3", 0.25, 0.5, type_="info")            # unknown: present or not
    h.op("xreadgroup", "s", None, 0.4, 0.6, result=["1-0", "2-0"], consumer="c1")
    h.op("xack", "s", ["1-0"], 0.7, 0.8, result=1)
    h.op("xpending", "s", None, 0.9, 1.0, result=[["2-0", "c1", 1]])
    h.op("xautoclaim", "s", None, 3.0, 3.1, result=["2-0"], consumer="c2", min_idle_ms=1000)
    h.op("lpush", "l", "a", 0.0, 0.1, result=1)
    h.op("lpush", "l", "b", 0.2, 0.3, result=2)
    h.op("lpush", "l", "c", 0.2, 0.3, type_="fail")
    h.op("blpop", "l", None, 0.4, 0.5, result="a")
    h.op("reg-write", "r", "x1", 0.0, 0.1, result="1-0")
    h.op("reg-read", "r", None, 0.2, 0.3, result="x1")
    h.op("reg-write", "r", "x2", 0.4, 0.5, result="2-0")
    h.op("reg-read", "r", None, 0.45, 0.55, result="x1")       # concurrent with x2: either is fine
    return h


CLEAN_FINAL = dict(streams={"s": [["1-0", "v1"], ["2-0", "v2"]]}, pel={"s": [["2-0", "c2", 2]]},
                   lists={"l": ["b"]})


def counts(history):
    return nc.check(history)["anomalies"]


def test_a_clean_history_has_no_anomaly():
    result = nc.check(clean().final(**CLEAN_FINAL))
    assert result["anomalies"] == {name: 0 for name in nc.CHECKERS}, result["details"]


def test_summary_counts_and_unavailability():
    h = clean()
    h.op("xadd", "s", "late", 5.0, 5.1, result="3-0")   # 4.5 s without a successful write before it
    s = nc.summary(h.final(**CLEAN_FINAL))
    assert (s["ops"], s["ok"], s["fail"], s["info"]) == (16, 14, 1, 1)
    assert [(round(a, 1), round(b, 1)) for a, b in s["unavailable"]] == [(0.5, 5.1)]


@pytest.mark.parametrize("name,final,kind", [
    ("lost", dict(CLEAN_FINAL, streams={"s": [["2-0", "v2"]]}), "lost"),
    ("duplicated", dict(CLEAN_FINAL, streams={"s": [["1-0", "v1"], ["2-0", "v2"], ["3-0", "v1"]]}), "duplicated"),
    ("info twice", dict(CLEAN_FINAL, streams={"s": [["1-0", "v1"], ["2-0", "v2"], ["3-0", "v3"], ["4-0", "v3"]]}),
     "duplicated"),
    ("invented", dict(CLEAN_FINAL, streams={"s": [["1-0", "v1"], ["2-0", "v2"], ["3-0", "nobody"]]}), "invented"),
    ("wrong id", dict(CLEAN_FINAL, streams={"s": [["1-0", "v1"], ["2-5", "v2"]]}), "wrong-id"),
])
def test_streams_anomalies(name, final, kind):
    details = nc.check(clean().final(**final))["details"]
    assert kind in [a["kind"] for a in details["streams"]], details


def test_failed_xadd_present_is_an_anomaly():
    h = clean().op("xadd", "s", "v9", 1.0, 1.1, type_="fail")
    final = dict(CLEAN_FINAL, streams={"s": [["1-0", "v1"], ["2-0", "v2"], ["9-0", "v9"]]})
    assert [a["kind"] for a in nc.check(h.final(**final))["details"]["streams"]] == ["failed-but-present"]


def test_ids_must_follow_real_time_order():
    h = clean().op("xadd", "s", "v4", 1.0, 1.1, result="0-5")   # invoked after 2-0 was acked, smaller id
    final = dict(CLEAN_FINAL, streams={"s": [["0-5", "v4"], ["1-0", "v1"], ["2-0", "v2"]]})
    c = counts(h.final(**final))
    assert c["id-order"] == 1 and c["streams"] == 0


def test_concurrent_adds_may_take_ids_in_any_order():
    h = H().op("xadd", "s", "a", 0.0, 1.0, result="2-0").op("xadd", "s", "b", 0.5, 1.5, result="1-0")
    assert counts(h.final(streams={"s": [["1-0", "b"], ["2-0", "a"]]}))["id-order"] == 0


def test_stale_read_is_not_linearizable():
    h = clean().op("reg-read", "r", None, 0.6, 0.7, result="x1")   # x2 completed at 0.5
    assert counts(h.final(**CLEAN_FINAL))["linearizable"] == 1


def test_read_of_an_unknown_write_is_linearizable():
    h = clean().op("reg-write", "r", "x3", 0.6, None, type_="info").op("reg-read", "r", None, 2.0, 2.1, result="x3")
    assert counts(h.final(**CLEAN_FINAL))["linearizable"] == 0


def soak_register(violation=None) -> H:
    """A soak-shaped register key (tests/ops/lin_histories.py: 3,000 ops, 59 info writes, the
    plain search's 2,000,000 steps are not enough) as the workload records it."""
    ops = lin_histories.simulate(lin_histories.soak_steps(random.Random(11)))
    if violation:
        ops = lin_histories.plant(ops, violation, ops[1500].call + 0.0005)
    h = H()
    for o in ops:
        if o.kind == "put":
            h.op("reg-write", "r", o.value, o.call, o.ret, type_="info" if o.indeterminate else "ok")
        else:
            h.op("reg-read", "r", None, o.call, o.ret, type_="info" if o.indeterminate else "ok", result=o.output)
    return h


def test_a_soak_shaped_register_key_is_decided():
    result = nc.check(soak_register().final(**CLEAN_FINAL))
    assert result["anomalies"]["linearizable"] == 0 and result["notes"] == []
    bad = nc.check(soak_register("stale-read").final(**CLEAN_FINAL))
    assert bad["anomalies"]["linearizable"] == 1 and bad["notes"] == []
    assert bad["details"]["linearizable"][0]["detail"]["until"] > 40    # the planted read, mid-run


def test_linearizability_over_budget_is_a_note_not_an_anomaly():
    result = nc.check(clean().final(**CLEAN_FINAL), lin_max_steps=1)
    assert result["anomalies"]["linearizable"] == 0 and "not decided" in result["notes"][0]


def group_kinds(h, final=CLEAN_FINAL):
    return [a["kind"] for a in nc.check(h.final(**final))["details"].get("groups", [])]


def test_new_delivery_twice_is_an_anomaly():
    h = clean().op("xreadgroup", "s", None, 1.0, 1.1, result=["1-0"], consumer="c3")
    assert group_kinds(h) == ["delivered-twice"]


def test_pending_entry_never_delivered_to_its_owner():
    final = dict(CLEAN_FINAL, pel={"s": [["2-0", "c9", 1]]})
    assert group_kinds(clean(), final) == ["pending-never-delivered"]


def test_pending_entry_of_a_consumer_with_an_unknown_read_is_fine():
    h = clean().op("xreadgroup", "s", None, 1.0, None, type_="info", consumer="c9")
    assert group_kinds(h, dict(CLEAN_FINAL, pel={"s": [["2-0", "c9", 1]]})) == []


def test_pending_to_a_consume_session_that_never_yielded_it_is_fine():
    """A Consume session's entries pushed by the server but still buffered when the session
    ended (the run's end, a failover) are pending to its consumer with no recorded delivery
    (seen in a --power-cut run, seed 5). XREADGROUP gets no such excuse."""
    h = clean().op("consume", "s", None, 1.0, 1.1, result=[], consumer="k")
    assert group_kinds(h, dict(CLEAN_FINAL, pel={"s": [["2-0", "k", 1]]})) == []
    h = clean().op("xreadgroup", "s", None, 1.0, 1.1, result=[], consumer="k")
    assert group_kinds(h, dict(CLEAN_FINAL, pel={"s": [["2-0", "k", 1]]})) == ["pending-never-delivered"]


def test_ok_add_neither_acked_nor_pending():
    final = dict(CLEAN_FINAL, pel={"s": []})
    assert group_kinds(clean(), final) == ["neither-acked-nor-pending"]


def test_delivery_count_shrinking():
    h = clean().op("xpending", "s", None, 3.5, 3.6, result=[["2-0", "c2", 3]])
    assert group_kinds(h) == ["delivery-count-shrank"]   # the final PEL says 2


def claim_history(delivery_f="xreadgroup", lead_ms=0, stall_s=0.0, claim_at=3.0, **delivery_extra):
    """An entry added at replicated 10_000 ms (real 0.0 s), delivered at real 1.0 s, claimed
    (min-idle 2 s) at real `claim_at`; XADDs every 0.1 s sample replicated time, which from
    real 1.5 s on leads real time by `lead_ms` (a clock fault's leader, trusted), or stands
    still for `stall_s` (a leader whose clock is behind stamps the floor)."""
    h = H().op("xadd", "s", "v0", 0.0, 0.01, result="10000-0")
    for k in range(1, 60):
        t = round(k * 0.1, 3)
        ms = 10_000 + round(1000 * (t if t < 1.5 else max(1.5, t - stall_s))) + (lead_ms if t >= 1.5 else 0)
        h.op("xadd", "r", f"x{k}", t, t + 0.01, result=f"{ms}-0")
    h.op(delivery_f, "s", None, 1.0, 1.01, result=["10000-0"], consumer="k", **delivery_extra)
    h.op("xautoclaim", "s", None, claim_at, claim_at + 0.01, result=["10000-0"], consumer="c2", min_idle_ms=2000)
    return h.final(streams={"s": [["10000-0", "v0"]]},
                   pel={"s": [["10000-0", "c2", 2]]}, lists={})


def claim_kinds(history):
    return [a["kind"] for a in nc.check(history)["details"].get("groups", [])]


def test_claim_before_min_idle_by_replicated_time():
    assert claim_kinds(claim_history(claim_at=1.5)) == ["claimed-before-min-idle"]
    assert claim_kinds(claim_history(claim_at=3.2)) == []
    # Without an add after the claim there is no upper bound on its stamp: nothing decided.
    h = H().op("xadd", "s", "v0", 0.0, 0.01, result="10000-0")
    h.op("xreadgroup", "s", None, 1.0, 1.01, result=["10000-0"], consumer="k")
    h.op("xautoclaim", "s", None, 1.5, 1.51, result=["10000-0"], consumer="c2", min_idle_ms=2000)
    assert claim_kinds(h.final(streams={"s": [["10000-0", "v0"]]}, pel={"s": [["10000-0", "c2", 2]]}, lists={})) == []


def test_claim_judged_by_replicated_time_not_the_runners_clock():
    """CI seed 12 (session 6): claims 1.6 s and 1.8 s of real time after the delivery, min-idle
    2 s, in a run with a clock fault. A leader whose clock is ahead stamps up to
    MAX_CLOCK_LEAD_MS (1 s) past its monotonic estimate, so replicated time ran ahead of
    real time and the claims were legal by the time the server judges them by. The XADD IDs
    show the lead; the same real timing without a lead is an anomaly."""
    assert claim_kinds(claim_history(lead_ms=1000, claim_at=2.6)) == []        # real idle 1.6 s
    assert claim_kinds(claim_history(lead_ms=1000, claim_at=2.8)) == []        # real idle 1.8 s
    assert claim_kinds(claim_history(claim_at=2.6)) == ["claimed-before-min-idle"]   # no lead: too early
    # Replicated time held back: 2.2 s of real time is not 2 s of replicated time when the IDs say so.
    assert claim_kinds(claim_history(stall_s=1.0, claim_at=3.2)) == ["claimed-before-min-idle"]
    assert claim_kinds(claim_history(claim_at=3.2)) == []


def test_delivered_entry_that_does_not_exist():
    h = clean().op("xreadgroup", "s", None, 1.0, 1.1, result=["7-0"], consumer="c1")
    assert group_kinds(h) == ["delivered-unknown-entry"]


@pytest.mark.parametrize("extra_ops,lists,kind", [
    ([("blpop", "a", "ok")], {"l": ["b"]}, "popped-twice"),
    ([], {"l": ["b", "a"]}, "popped-and-remaining"),
    ([], {"l": ["b", "zz"]}, "invented"),
    ([], {"l": ["b", "b"]}, "duplicated"),
    ([], {"l": []}, "lost"),
    ([], {"l": ["b", "c"]}, "failed-but-present"),
])
def test_list_anomalies(extra_ops, lists, kind):
    h = clean()
    for f, result, type_ in extra_ops:
        h.op(f, "l", None, 2.0, 2.1, type_=type_, result=result)
    kinds = [a["kind"] for a in nc.check(h.final(**dict(CLEAN_FINAL, lists=lists)))["details"]["lists"]]
    assert kinds == [kind]


def test_a_lost_push_is_excused_by_a_pop_of_unknown_outcome():
    h = clean().op("blpop", "l", None, 2.0, None, type_="info")
    assert counts(h.final(**dict(CLEAN_FINAL, lists={"l": []})))["lists"] == 0


def test_replicas_differ_or_not_converged():
    diff = {"1": {"applied": 5, "state": "x"}, "2": {"applied": 5, "state": "y"}}
    assert counts(clean().final(**dict(CLEAN_FINAL, replicas=diff)))["replicas"] == 1
    behind = {"1": {"applied": 5, "state": "x"}, "2": {"applied": None, "state": "unreadable: timeout"}}
    details = nc.check(clean().final(**dict(CLEAN_FINAL, replicas=behind)))["details"]["replicas"]
    assert details[0]["kind"] == "not-converged"


def test_malformed_history_is_refused():
    with pytest.raises(nc.HistoryError):
        nc.pair([{"op": 1, "time": 0.0, "process": "p", "type": "ok", "f": "xadd"}])


def test_consume_replay_to_the_same_consumer_is_not_a_second_delivery():
    h = clean().op("consume", "s", None, 1.0, 1.1, result=["1-0"], consumer="c1")
    assert group_kinds(h) == ["delivered-twice"]            # c1 had 1-0 from XREADGROUP >
    h = H().op("xadd", "s", "v1", 0.0, 0.1, result="1-0")
    h.op("consume", "s", None, 0.2, 0.3, result=["1-0"], consumer="k")
    h.op("consume", "s", None, 0.4, 0.5, result=["1-0"], consumer="k")   # replayed after a failover
    assert group_kinds(h, dict(streams={"s": [["1-0", "v1"]]}, pel={"s": [["1-0", "k", 2]]}, lists={})) == []
    h.op("consume", "s", None, 0.6, 0.7, result=["1-0"], consumer="other")
    assert group_kinds(h, dict(streams={"s": [["1-0", "v1"]]}, pel={"s": [["1-0", "k", 2]]}, lists={})) == [
        "delivered-twice"]


def test_a_consume_delivery_may_predate_its_op():
    """Soak seed 301: a Consume session handed out an entry it had buffered (pushed, or
    replayed after a reconnect) 1.3 s before a claim with min-idle 2 s; the server's
    delivery was earlier than the op that yielded it, so this is no early claim: only the
    entry's own ID bounds a Consume delivery. The same timing through XREADGROUP
    (delivered after its invoke) is one."""
    assert claim_kinds(claim_history("consume", claim_at=2.3, session_opened=0.0)) == []
    assert claim_kinds(claim_history("xreadgroup", claim_at=2.3)) == ["claimed-before-min-idle"]
    # An entry added less than min-idle before the claim cannot have been idle long enough.
    assert claim_kinds(claim_history("consume", claim_at=1.5, session_opened=0.0)) == ["claimed-before-min-idle"]
