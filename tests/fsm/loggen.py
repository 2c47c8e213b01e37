"""Random logs of fsm records: lists, keys, streams, groups, MULTI (WATCHed too), CONFIG, retries, time jumps.

`gen_log(picker, steps)` returns record bytes (b"" = Raft's empty entry). The
picker is either a hypothesis `st.data()` (shrinkable) or a `random.Random`,
so the same generator feeds in-process property tests and a replica run in
another process.
"""
import re

from xraft.node.fsm.entry import Request, encode_record
from xraft.node.fsm.sessions import DEFAULT_SESSION_TIMEOUT_MS

T0 = 1_700_000_000_000

LISTS = ["l1", "l2"]
STREAMS = ["s1", "s2"]
GROUPS = ["g1", "g1", "g2"]          # g1 twice: groups that exist get more traffic
CONSUMERS = ["c1", "c2", "c3"]

TEMPLATES = [
    # lists and keys
    "RPUSH {l} a b c", "LPUSH {l} x", "LPOP {l}", "RPOP {l} 2", "LMOVE l1 l2 LEFT RIGHT",
    "LMPOP 2 l1 l2 RIGHT COUNT 2", "LINSERT {l} BEFORE b z", "LSET {l} 0 q", "LREM {l} 0 a",
    "LTRIM {l} 1 -1", "SET k1 v", "DEL {l} {s}", "RENAME {l} {l}", "LPUSH k1 x", "GET k1",
    # streams
    "XADD {s} * f {n}", "XADD {s} * f {n} g {n}", "XADD {s} MAXLEN ~ 3 * f v", "XADD {s} {ms}-* f v",
    "XADD {s} {id} f v", "XADD {s} NOMKSTREAM * a b", "XDEL {s} {id}", "XTRIM {s} MAXLEN 2",
    "XTRIM {s} MINID {id}", "XSETID {s} {id}", "XLEN {s}", "XRANGE {s} - + COUNT 2",
    # groups
    "XGROUP CREATE {s} {g} 0 MKSTREAM", "XGROUP CREATE {s} {g} $", "XGROUP DESTROY {s} {g}",
    "XGROUP CREATECONSUMER {s} {g} {c}", "XGROUP DELCONSUMER {s} {g} {c}", "XGROUP SETID {s} {g} 0",
    "XREADGROUP GROUP {g} {c} COUNT 2 STREAMS {s} >", "XREADGROUP GROUP {g} {c} STREAMS {s} 0",
    "XREADGROUP GROUP {g} {c} NOACK STREAMS {s} >", "XACK {s} {g} {id} {id}",
    "XCLAIM {s} {g} {c} 0 {id}", "XCLAIM {s} {g} {c} 0 {id} JUSTID", "XAUTOCLAIM {s} {g} {c} 0 0 COUNT 2",
    "XPENDING {s} {g}", "XPENDING {s} {g} - + 5 {c}", "XINFO STREAM {s} FULL", "XINFO CONSUMERS {s} {g}",
    # errors
    "XADD {s} 0-0 f v", "NOSUCH {s}", "XREADGROUP GROUP {g} {c} STREAMS {s} $",
]
# Weight the commands that build state, so that groups and pending entries exist.
TEMPLATES += ["XADD {s} * f {n}", "XGROUP CREATE {s} {g} 0 MKSTREAM",
              "XREADGROUP GROUP {g} {c} COUNT 2 STREAMS {s} >", "RPUSH {l} a b c"] * 3
CONFIGS = ["CONFIG SET stream-node-max-entries 2", "CONFIG SET stream-node-max-entries 100",
           "CONFIG SET list-max-listpack-size 1 stream-node-max-bytes 64",
           "CONFIG SET list-max-listpack-size -2", "CONFIG SET list-compress-depth x"]


class RandomPicker:
    def __init__(self, rng):
        self.rng = rng

    def pick(self, options):
        return self.rng.choice(options)

    def int(self, lo, hi):
        return self.rng.randint(lo, hi)


class DataPicker:
    def __init__(self, data):
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def pick(self, options):
        return self.data.draw(self.st.sampled_from(options))

    def int(self, lo, hi):
        return self.data.draw(self.st.integers(lo, hi))


def _command(p, now: int):
    """One argv from a template; every placeholder is drawn afresh (XACK's two IDs may differ)."""
    text = re.sub(r"\{(\w+)\}", lambda m: _fresh(p, m.group(1), now), p.pick(TEMPLATES))
    return [w.encode() for w in text.split()]


def _fresh(p, key: str, now: int) -> str:
    if key == "ms":                                   # a recent time: hits existing entries
        return str(T0 + p.int(0, now - T0))
    if key == "id":
        return "%d-%d" % (T0 + p.int(0, now - T0), p.int(0, 2))
    if key == "n":
        return str(p.int(0, 9))
    return p.pick({"l": LISTS, "s": STREAMS, "g": GROUPS, "c": CONSUMERS}[key])


SESSION_TIMEOUT_MS = DEFAULT_SESSION_TIMEOUT_MS    # the state machines' (StateMachine() default)


def gen_log(p, steps: int) -> list:
    """`steps` records; clients 1..3 register (sometimes again, sometimes
    never), number their requests, retry some; time sometimes jumps by more
    than SESSION_TIMEOUT_MS, so sessions expire mid-log."""
    now = T0
    seqs = {1: 0, 2: 0, 3: 0}
    sent = []
    log = [encode_record(T0, [Request.register(1), Request.register(2)])]    # client 3: never, at first
    for _ in range(steps):
        now = max(T0, now + p.int(-3, 3))                # the clock may run backwards
        if p.int(0, 29) == 0:
            now += SESSION_TIMEOUT_MS // 2 * p.int(1, 3)  # idle: sessions may expire
        if p.int(0, 19) == 0:
            log.append(b"")
            continue
        batch = []
        for _ in range(p.int(1, 3)):
            kind = p.int(0, 19)
            if kind == 0 and sent:
                batch.append(p.pick(sent))              # a retry of an earlier request
                continue
            cid = p.int(0, 3)
            if kind == 5 and cid:
                batch.append(Request.register(cid))     # new, refreshed, or after expiry
                continue
            seq = 0
            if cid:
                seqs[cid] += 1
                seq = seqs[cid]
            if kind == 1:
                req = Request.config(cid, seq, p.pick(CONFIGS).encode().split())
            elif kind in (2, 3):
                req = Request.multi(cid, seq, [_command(p, now) for _ in range(p.int(0, 3))])
            elif kind == 5:                              # EXEC after WATCH, at some earlier index
                watched = [(p.pick(LISTS + STREAMS + ["k1"]).encode(), p.int(0, len(log)))
                           for _ in range(p.int(1, 2))]
                req = Request.watched_multi(cid, seq, watched, [_command(p, now) for _ in range(p.int(0, 2))])
            elif kind == 4:
                req = Request.noop()
            else:
                req = Request.command(cid, seq, _command(p, now))
            if req.client_id:
                sent.append(req)
            batch.append(req)
        log.append(encode_record(now, batch))
    return log


def run_log(sm, log, start_index: int = 1):
    """Apply `log` from `start_index`; returns per-record (results, snapshot)."""
    out = []
    for i, data in enumerate(log, start_index):
        results = sm.apply(i, data)
        out.append((results, sm.snapshot()))
    return out
