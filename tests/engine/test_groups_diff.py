"""Consumer groups, differentially: random command sequences run on a real
redis-server 7.0 and on an xraft Keyspace must give identical replies.

Clock: before every command the test reads redis's TIME and passes it (in ms)
as `now_ms`. The only fields allowed to differ are those computed from the
wall clock at execution time (XPENDING idle, XINFO CONSUMERS idle, XINFO
STREAM FULL seen-time and delivery times): they are compared within
TIME_TOLERANCE_MS, everything else byte for byte. Idle thresholds in the
commands (min-idle-time, XPENDING IDLE, XCLAIM IDLE/TIME) are 0 or far from
any boundary, so which entries they select never depends on the clock.

XRAFT_DIFF_EXAMPLES=<n> raises the number of random sequences (soaks).
"""
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_oracle import RedisReplyError, engine_call
from xraft.node.engine import groups as g
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.replies import NULL_ARRAY, WouldBlock
from xraft.node.engine.stream import Stream
from xraft.node.engine.stream_codec import dump_stream

EXAMPLES = int(os.environ.get("XRAFT_DIFF_EXAMPLES", "150"))
STEPS = 70
TIME_TOLERANCE_MS = 2000

KEYS = [b"s1", b"s2"]
ODD_KEYS = [b"str", b"missing"]          # a string (WRONGTYPE) and nothing (no such key)
GROUPS = [b"g1", b"g2"]
CONSUMERS = [b"c1", b"c2", b"c3"]
FAR_IDLE = 5_000_000                     # an idle time no test run gets near
FAR_MIN_IDLE = 1_000_000                 # a min-idle only FAR_IDLE entries pass
GARBAGE = [b"abc", b"-1", b"", b"$", b">", b"+", b"-", b"(1-1", b"1-", b"18446744073709551616",
           b"9223372036854775808", b"0x10", b"COUNT", b"FORCE", b"MKSTREAM",
           b"18446744073709551615-18446744073709551615"]


def redis_now_ms(redis) -> int:
    sec, usec = redis.call("TIME")
    return int(sec) * 1000 + int(usec) // 1000


# -- comparing replies -----------------------------------------------------------

class _TimeMask:
    """Replaces clock-dependent numbers with a marker and remembers them."""

    MARK = "<time>"

    def __init__(self):
        self.times = []

    def take(self, value):
        if isinstance(value, int) and not isinstance(value, bool):
            self.times.append(value)
            return self.MARK
        return value


def _pairs(flat):
    """A RESP2-flattened map as a list of [key, value] (or None if not one)."""
    if not isinstance(flat, list) or len(flat) % 2:
        return None
    return [[flat[i], flat[i + 1]] for i in range(0, len(flat), 2)]


def _mask_map(flat, mask, handlers):
    pairs = _pairs(flat)
    if pairs is None:
        return flat
    out = []
    for k, v in pairs:
        h = handlers.get(k)
        out.extend([k, h(v, mask) if h else v])
    return out


def _mask_rows(rows, mask, index):
    if not isinstance(rows, list):
        return rows
    out = []
    for row in rows:
        if isinstance(row, list) and len(row) > index:
            row = list(row)
            row[index] = mask.take(row[index])
        out.append(row)
    return out


def _mask_each_map(items, mask, handlers):
    if not isinstance(items, list):
        return items
    return [_mask_map(x, mask, handlers) for x in items]


def mask_times(argv, reply):
    """(reply with clock-dependent numbers masked, [those numbers])."""
    mask = _TimeMask()
    if isinstance(reply, RedisReplyError) or not argv:
        return reply, []
    name = argv[0].lower()
    sub = argv[1].lower() if len(argv) > 1 else b""
    if name == b"xpending" and len(argv) > 3:
        reply = _mask_rows(reply, mask, 2)
    elif name == b"xinfo" and sub == b"consumers":
        reply = _mask_each_map(reply, mask, {b"idle": lambda v, m: m.take(v)})
    elif name == b"xinfo" and sub == b"stream" and len(argv) > 3:
        consumer = {b"seen-time": lambda v, m: m.take(v),
                    b"pending": lambda v, m: _mask_rows(v, m, 1)}
        group = {b"pending": lambda v, m: _mask_rows(v, m, 2),
                 b"consumers": lambda v, m: _mask_each_map(v, m, consumer)}
        reply = _mask_map(reply, mask, {b"groups": lambda v, m: _mask_each_map(v, m, group)})
    return reply, mask.times


def assert_same(argv, mine, theirs):
    if isinstance(mine, WouldBlock):
        # redis blocked for the (tiny) timeout and then replied the timeout reply.
        assert theirs == mine.timeout_reply, (argv, mine, theirs)
        return
    m_masked, m_times = mask_times(argv, mine)
    r_masked, r_times = mask_times(argv, theirs)
    assert m_masked == r_masked, f"\ncommand: {argv}\n xraft: {mine!r}\n redis: {theirs!r}"
    for a, b in zip(m_times, r_times):
        assert abs(a - b) <= TIME_TOLERANCE_MS, f"{argv}: time {a} vs {b}\n{mine!r}\n{theirs!r}"


def run_both(redis, db, argv):
    argv = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
    now = redis_now_ms(redis)
    mine = engine_call(db, *argv, now_ms=now)
    theirs = redis.call(*argv)
    assert_same(argv, mine, theirs)
    return theirs


def engine_state(db):
    """Every key's value, streams as their snapshot bytes (groups included)."""
    return {k: dump_stream(v) if isinstance(v, Stream) else v for k, v in db.data.items()}


def check_engine_state(db):
    for value in db.data.values():
        if isinstance(value, Stream):
            g.check_groups(value)


# -- generating commands ---------------------------------------------------------

class Gen:
    """Draws commands that mostly make sense for the current state (known
    entry IDs per key), with a share of bad arguments."""

    def __init__(self, data, now_ms):
        self.data = data
        self.now_ms = now_ms
        self.ids = {k: [] for k in KEYS}       # every ID ever added per key (deleted ones too)
        self.last_ms = {k: 0 for k in KEYS}

    def draw(self, strategy):
        return self.data.draw(strategy)

    def pick(self, seq):
        return self.draw(st.sampled_from(seq))

    def key(self):
        return self.draw(st.sampled_from(KEYS * 12 + ODD_KEYS))

    def group(self):
        return self.draw(st.sampled_from(GROUPS * 10 + [b"nogroup"]))

    def consumer(self):
        return self.pick(CONSUMERS)

    def some_id(self, key):
        known = self.ids.get(key) or []
        choices = [b"0", b"0-0", b"1-1", b"%d-0" % (self.last_ms.get(key, 0) + 1)]
        if known and self.draw(st.integers(0, 3)):
            return self.pick(known)
        return self.pick(choices)

    def ids_for(self, key, lo=1, hi=4):
        return [self.some_id(key) for _ in range(self.draw(st.integers(lo, hi)))]

    def range_id(self, key, end=False):
        return self.draw(st.one_of(st.just(b"+" if end else b"-"), st.just(self.some_id(key)),
                                   st.just(b"(" + self.some_id(key))))

    def count(self):
        return self.draw(st.sampled_from([b"0", b"1", b"2", b"3", b"10", b"-1"]))

    # one command of each kind
    def xadd(self):
        key = self.pick(KEYS)
        ms = self.last_ms[key] + self.draw(st.integers(0, 2))
        if self.draw(st.integers(0, 9)) == 0:
            sid = b"%d-*" % ms
        else:
            sid = b"%d-%d" % (ms, self.draw(st.integers(0, 2)))
        fields = [b"f", self.pick([b"v", b"1", b"x" * 3])]
        if self.draw(st.booleans()):
            fields += [b"g", b"w"]
        return [b"XADD", key, sid] + fields

    def xdel(self):
        key = self.key()
        return [b"XDEL", key] + self.ids_for(key, 1, 3)

    def xtrim(self):
        key = self.key()
        if self.draw(st.booleans()):
            return [b"XTRIM", key, b"MAXLEN", b"%d" % self.draw(st.integers(0, 6))]
        return [b"XTRIM", key, b"MINID", self.some_id(key)]

    def xsetid(self):
        key = self.pick(KEYS)
        argv = [b"XSETID", key, b"%d-5" % (self.last_ms[key] + self.draw(st.integers(0, 1)))]
        if self.draw(st.booleans()):
            argv += [b"ENTRIESADDED", b"%d" % self.draw(st.integers(0, 200))]
        if self.draw(st.booleans()):
            argv += [b"MAXDELETEDID", self.some_id(key)]
        return argv

    def xgroup_create(self):
        key = self.key()
        argv = [b"XGROUP", b"CREATE", key, self.group(), self.pick([b"$", b"0", self.some_id(key)])]
        if self.draw(st.integers(0, 3)) == 0:
            argv.append(b"MKSTREAM")
        if self.draw(st.integers(0, 3)) == 0:
            argv += [b"ENTRIESREAD", self.pick([b"-1", b"0", b"2", b"5"])]
        return argv

    def xgroup_other(self):
        key = self.key()
        sub = self.pick([b"SETID", b"SETID", b"DESTROY", b"CREATECONSUMER", b"DELCONSUMER", b"CREATECONSUMER"])
        argv = [b"XGROUP", sub, key, self.group()]
        if sub == b"SETID":
            argv.append(self.pick([b"$", b"0", b"-", b"+", self.some_id(key)]))
            if self.draw(st.booleans()):
                argv += [b"ENTRIESREAD", self.pick([b"-1", b"0", b"1", b"3"])]
        elif sub != b"DESTROY":
            argv.append(self.consumer())
        return argv

    def xreadgroup(self):
        argv = [b"XREADGROUP", b"GROUP", self.group(), self.consumer()]
        if self.draw(st.booleans()):
            argv += [b"COUNT", self.count()]
        if self.draw(st.integers(0, 3)) == 0:
            argv.append(b"NOACK")
        keys = [self.key()]
        if self.draw(st.integers(0, 3)) == 0:
            keys.append(self.key())
        ids = [self.draw(st.sampled_from([b">", b">", b">", b"0", self.some_id(k)])) for k in keys]
        if self.draw(st.integers(0, 9)) == 0:
            argv += [b"BLOCK", b"1"]       # redis waits 1 ms; xraft answers WouldBlock
        return argv + [b"STREAMS"] + keys + ids

    def xack(self):
        key = self.key()
        return [b"XACK", key, self.group()] + self.ids_for(key)

    def xpending(self):
        key = self.key()
        argv = [b"XPENDING", key, self.group()]
        if self.draw(st.integers(0, 2)) == 0:
            return argv
        if self.draw(st.integers(0, 2)) == 0:
            argv += [b"IDLE", self.pick([b"0", b"%d" % FAR_MIN_IDLE, b"-5"])]
        argv += [self.range_id(key), self.range_id(key, True), self.count()]
        if self.draw(st.booleans()):
            argv.append(self.consumer())
        return argv

    def xclaim(self):
        key = self.key()
        argv = [b"XCLAIM", key, self.group(), self.consumer(), self.pick([b"0", b"%d" % FAR_MIN_IDLE, b"-3"])]
        argv += self.ids_for(key)
        for _ in range(self.draw(st.integers(0, 3))):
            opt = self.pick([b"IDLE", b"TIME", b"RETRYCOUNT", b"FORCE", b"JUSTID", b"LASTID"])
            if opt == b"IDLE":
                argv += [opt, self.pick([b"0", b"%d" % FAR_IDLE, b"-7"])]
            elif opt == b"TIME":
                argv += [opt, self.pick([b"0", b"%d" % (self.now_ms - FAR_IDLE), b"%d" % (self.now_ms + FAR_IDLE)])]
            elif opt == b"RETRYCOUNT":
                argv += [opt, self.pick([b"0", b"5", b"-1"])]
            elif opt == b"LASTID":
                argv += [opt, self.some_id(key)]
            else:
                argv.append(opt)
        return argv

    def xautoclaim(self):
        key = self.key()
        argv = [b"XAUTOCLAIM", key, self.group(), self.consumer(),
                self.pick([b"0", b"%d" % FAR_MIN_IDLE]), self.range_id(key)]
        if self.draw(st.booleans()):
            argv += [b"COUNT", self.pick([b"1", b"2", b"3", b"100"])]
        if self.draw(st.booleans()):
            argv.append(b"JUSTID")
        return argv

    def xinfo(self):
        key = self.key()
        sub = self.pick([b"GROUPS", b"CONSUMERS", b"STREAM", b"STREAM"])
        if sub == b"GROUPS":
            return [b"XINFO", sub, key]
        if sub == b"CONSUMERS":
            return [b"XINFO", sub, key, self.group()]
        argv = [b"XINFO", sub, key]
        if self.draw(st.booleans()):
            argv.append(b"FULL")
            if self.draw(st.booleans()):
                argv += [b"COUNT", self.pick([b"0", b"1", b"2", b"-1"])]
        return argv

    def mutate(self, argv):
        """Bad arguments: replace, drop or add one argument."""
        argv = list(argv)
        how = self.draw(st.integers(0, 2))
        if how == 0 and len(argv) > 1:
            argv[self.draw(st.integers(1, len(argv) - 1))] = self.pick(GARBAGE)
        elif how == 1 and len(argv) > 1:
            del argv[self.draw(st.integers(1, len(argv) - 1))]
        else:
            argv.insert(self.draw(st.integers(1, len(argv))), self.pick(GARBAGE))
        return argv

    def command(self):
        kind = self.draw(st.sampled_from(
            ["xadd"] * 6 + ["xreadgroup"] * 5 + ["xgroup_create"] * 2 + ["xgroup_other"] * 2 +
            ["xack"] * 2 + ["xpending"] * 2 + ["xclaim"] * 3 + ["xautoclaim"] * 2 + ["xdel"] * 2 +
            ["xtrim", "xinfo", "xinfo", "xsetid", "bad"]))
        if kind == "bad":
            inner = self.draw(st.sampled_from(["xgroup_create", "xgroup_other", "xreadgroup", "xack",
                                               "xpending", "xclaim", "xautoclaim", "xinfo"]))
            return self.mutate(getattr(self, inner)())
        return getattr(self, kind)()

    def saw(self, argv, reply):
        if argv[0] == b"XSETID" and not isinstance(reply, RedisReplyError):
            self.last_ms[argv[1]] = int(argv[2].split(b"-")[0])
        if argv[0] == b"XADD" and isinstance(reply, bytes):
            key = argv[1]
            self.ids[key].append(reply)
            self.last_ms[key] = int(reply.split(b"-")[0])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_groups_match_redis(redis_oracle, data):
    redis = redis_oracle
    redis.flush()
    db = Keyspace()
    run_both(redis, db, [b"SET", b"str", b"x"])
    gen = Gen(data, redis_now_ms(redis))
    # A common start (entries and groups on both streams), then random steps.
    for key in KEYS:
        for i in range(1, 5):
            argv = [b"XADD", key, b"%d-%d" % (i, i % 2), b"f", b"v%d" % i]
            gen.saw(argv, run_both(redis, db, argv))
        for group in GROUPS:
            run_both(redis, db, [b"XGROUP", b"CREATE", key, group, b"0"])
    for _ in range(STEPS):
        argv = gen.command()
        before = engine_state(db)
        reply = run_both(redis, db, argv)
        if isinstance(reply, RedisReplyError):
            assert engine_state(db) == before, f"{argv} failed but changed the keyspace"
        gen.saw(argv, reply)
        check_engine_state(db)
    # A final full comparison of every key's group state.
    for key in KEYS:
        run_both(redis, db, [b"XINFO", b"STREAM", key, b"FULL", b"COUNT", b"0"])
        run_both(redis, db, [b"XINFO", b"GROUPS", key])


# -- fixed scenarios, also differential ------------------------------------------

def _script(redis, cmds):
    db = Keyspace()
    replies = []
    for argv in cmds:
        argv = [a.encode() if isinstance(a, str) else a for a in argv]
        replies.append(run_both(redis, db, argv))
    check_engine_state(db)
    return db, replies


def test_errors_and_texts(redis):
    _script(redis, [
        ["SET", "str", "x"],
        ["XGROUP"], ["XGROUP", "FOO"], ["XGROUP", "CREATE", "k"], ["XGROUP", "HELP", "x"],
        ["XGROUP", "help"],
        ["XGROUP", "CREATE", "k", "g", "$"],
        ["XGROUP", "CREATE", "str", "g", "$"],
        ["XGROUP", "CREATE", "k", "g", "$", "MKSTREAM", "MKSTREAM", "MKSTREAM", "MKSTREAM"],
        ["XGROUP", "CREATE", "k", "g", "bad", "MKSTREAM"],
        ["EXISTS", "k"],
        ["XGROUP", "CREATE", "k", "g", "$", "ENTRIESREAD", "-2", "MKSTREAM"],
        ["XGROUP", "CREATE", "k", "g", "$", "ENTRIESREAD", "x"],
        ["XGROUP", "CREATE", "k", "g", "$", "MKSTREAM"],
        ["XGROUP", "CREATE", "k", "g", "$"],
        ["XGROUP", "CREATE", "k", "g2", "-"],
        ["XGROUP", "SETID", "k", "nog", "0"],
        ["XGROUP", "SETID", "k", "g", "0", "MKSTREAM"],
        ["XGROUP", "SETID", "k", "g", "-", "ENTRIESREAD", "3"],
        ["XGROUP", "SETID", "k", "g", "0", "ENTRIESREAD", "3", "ENTRIESREAD", "4"],
        ["XGROUP", "DESTROY", "k", "nog"], ["XGROUP", "DELCONSUMER", "k", "g", "nobody"],
        ["XGROUP", "CREATECONSUMER", "k", "g", "c"], ["XGROUP", "CREATECONSUMER", "k", "g", "c"],
        ["XGROUP", "CREATECONSUMER", "missing", "g", "c"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "k"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "k", "k2", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "k", "$"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "missing", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "str", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "k", "x"],
        ["XREADGROUP", "GROUP", "g", "c", "COUNT", "x", "STREAMS", "k", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "BLOCK", "-1", "STREAMS", "k", ">"],
        ["XREADGROUP", "COUNT", "1", "STREAMS", "k", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "FOO", "STREAMS", "k", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", "k", ">"],
        ["XACK", "missing", "g", "bad"], ["XACK", "k", "nog", "bad"], ["XACK", "k", "g", "bad"],
        ["XACK", "str", "g", "1"],
        ["XPENDING", "k", "g", "-"], ["XPENDING", "k", "g", "IDLE", "x", "-", "+", "1"],
        ["XPENDING", "k", "g", "IDLE", "5", "-", "+"], ["XPENDING", "k", "g", "-", "+", "x"],
        ["XPENDING", "k", "g", "(+", "+", "1"], ["XPENDING", "k", "g", "(18446744073709551615-18446744073709551615", "+", "1"],
        ["XPENDING", "k", "g", "-", "(0-0", "1"], ["XPENDING", "missing", "g"], ["XPENDING", "str", "g"],
        ["XPENDING", "k", "g", "-", "+", "1", "c", "x", "y"], ["XPENDING", "k", "g", "-", "+", "1", "c", "x", "y", "z"],
        ["XCLAIM", "k", "nog", "c", "0", "1-1"], ["XCLAIM", "k", "g", "c", "x", "1-1"],
        ["XCLAIM", "k", "g", "c", "0", "1-1", "FOO"], ["XCLAIM", "k", "g", "c", "0", "1-1", "IDLE", "x"],
        ["XCLAIM", "k", "g", "c", "0", "1-1", "TIME", "x"], ["XCLAIM", "k", "g", "c", "0", "1-1", "RETRYCOUNT", "x"],
        ["XCLAIM", "k", "g", "c", "0", "1-1", "LASTID", "x"], ["XCLAIM", "k", "g", "c", "0", "-"],
        ["XCLAIM", "k", "g", "c", "0", "1-1", "IDLE"], ["XCLAIM", "str", "g", "c", "0", "1-1"],
        ["XAUTOCLAIM", "k", "g", "c", "x", "0"], ["XAUTOCLAIM", "k", "g", "c", "0", "x"],
        ["XAUTOCLAIM", "k", "g", "c", "0", "(18446744073709551615-18446744073709551615"],
        ["XAUTOCLAIM", "k", "g", "c", "0", "0", "COUNT", "0"], ["XAUTOCLAIM", "k", "g", "c", "0", "0", "COUNT", "x"],
        ["XAUTOCLAIM", "k", "g", "c", "0", "0", "COUNT", "576460752303423488"],
        ["XAUTOCLAIM", "k", "g", "c", "0", "0", "FOO"], ["XAUTOCLAIM", "missing", "g", "c", "0", "0"],
        ["XAUTOCLAIM", "k", "nog", "c", "0", "0"], ["XAUTOCLAIM", "str", "g", "c", "0", "0"],
        ["XINFO"], ["XINFO", "FOO"], ["XINFO", "HELP"], ["XINFO", "HELP", "x"], ["XINFO", "STREAM"],
        ["XINFO", "STREAM", "missing"], ["XINFO", "STREAM", "str"], ["XINFO", "STREAM", "k", "FOO"],
        ["XINFO", "STREAM", "k", "FULL", "COUNT"], ["XINFO", "STREAM", "k", "FULL", "LIMIT", "1"],
        ["XINFO", "STREAM", "k", "FULL", "COUNT", "x"], ["XINFO", "CONSUMERS", "k", "nog"],
        ["XINFO", "GROUPS", "k", "x"], ["XINFO", "stream", "k", "full", "count", "-5"],
        ["XGROUP", "DESTROY", "k", "g"], ["XGROUP", "DESTROY", "k", "g"],
        # Names inside error texts: C's %s stops at NUL, CR/LF become blanks.
        ["XPENDING", "we\r\nird", "g\nx"], ["XCLAIM", "a\x00b", "g", "c", "0", "1"],
        ["XINFO", "CONSUMERS", "k", "\r\nlead"], ["XCLAIM", "k", "g2", "c", "0", "1-1", "bad\noption"],
        ["XINFO", "STREAM", "k", "f" * 200],
    ])


def test_read_claim_ack_cycle(redis):
    cmds = [["XADD", "s", "%d-1" % i, "f", "v%d" % i] for i in range(1, 8)]
    cmds += [
        ["XGROUP", "CREATE", "s", "g", "0"],
        ["XREADGROUP", "GROUP", "g", "a", "COUNT", "3", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g", "b", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g", "b", "STREAMS", "s", ">"],
        ["XINFO", "GROUPS", "s"],
        ["XDEL", "s", "2-1", "5-1"],
        ["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", "0"],
        ["XREADGROUP", "GROUP", "g", "b", "COUNT", "2", "STREAMS", "s", "0-0"],
        ["XPENDING", "s", "g"],
        ["XPENDING", "s", "g", "-", "+", "10"],
        ["XPENDING", "s", "g", "IDLE", str(FAR_MIN_IDLE), "-", "+", "10"],
        ["XCLAIM", "s", "g", "c", "0", "1-1", "2-1", "4-1", "IDLE", str(FAR_IDLE)],
        ["XPENDING", "s", "g", "IDLE", str(FAR_MIN_IDLE), "-", "+", "10", "c"],
        ["XAUTOCLAIM", "s", "g", "d", "0", "0", "COUNT", "2"],
        ["XAUTOCLAIM", "s", "g", "d", "0", "0", "COUNT", "2", "JUSTID"],
        ["XAUTOCLAIM", "s", "g", "d", str(FAR_MIN_IDLE), "0"],
        ["XACK", "s", "g", "1-1", "3-1", "3-1", "9-9"],
        ["XCLAIM", "s", "g", "e", "0", "3-1", "FORCE", "JUSTID", "RETRYCOUNT", "7", "LASTID", "9-0"],
        ["XCLAIM", "s", "g", "e", "0", "5-1", "FORCE"],
        ["XINFO", "STREAM", "s", "FULL"],
        ["XINFO", "CONSUMERS", "s", "g"],
        ["XGROUP", "DELCONSUMER", "s", "g", "d"],
        ["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", "18446744073709551615-18446744073709551615"],
        ["XREADGROUP", "GROUP", "g", "a", "NOACK", "COUNT", "1", "STREAMS", "s", "s", "0", "(0"],
        ["XCLAIM", "s", "g", "a", "0", "4-1", "4-1", "6-1", "JUSTID", "LASTID", "1-0"],
        ["XAUTOCLAIM", "s", "g", "a", "0", "+"],
        ["XGROUP", "SETID", "s", "g", "0", "ENTRIESREAD", "0"],
        ["XREADGROUP", "GROUP", "g", "a", "NOACK", "COUNT", "2", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g", "b", "STREAMS", "s", ">"],
        ["XINFO", "STREAM", "s", "FULL", "COUNT", "0"],
        ["XINFO", "STREAM", "s"],
        ["XINFO", "GROUPS", "s"],
        ["XTRIM", "s", "MAXLEN", "1"],
        ["XAUTOCLAIM", "s", "g", "z", "0", "-"],
        ["XINFO", "GROUPS", "s"],
        ["XPENDING", "s", "g"],
    ]
    _script(redis, cmds)


def test_entries_read_and_lag_rules(redis):
    """7.0's counters: tombstones, SETID, ENTRIESREAD, empty streams."""
    _script(redis, [
        ["XGROUP", "CREATE", "s", "g0", "$", "MKSTREAM"],
        ["XINFO", "GROUPS", "s"],
        ["XADD", "s", "1-1", "a", "1"], ["XADD", "s", "2-1", "a", "2"], ["XADD", "s", "3-1", "a", "3"],
        ["XGROUP", "CREATE", "s", "g1", "0"], ["XGROUP", "CREATE", "s", "g2", "0", "ENTRIESREAD", "0"],
        ["XGROUP", "CREATE", "s", "g3", "$"], ["XGROUP", "CREATE", "s", "g4", "1-1"],
        ["XINFO", "GROUPS", "s"],
        ["XREADGROUP", "GROUP", "g1", "c", "COUNT", "1", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g2", "c", "COUNT", "1", "STREAMS", "s", ">"],
        ["XINFO", "GROUPS", "s"],
        ["XDEL", "s", "2-1"],
        ["XINFO", "GROUPS", "s"],
        ["XREADGROUP", "GROUP", "g2", "c", "COUNT", "1", "STREAMS", "s", ">"],
        ["XINFO", "GROUPS", "s"],
        ["XDEL", "s", "1-1"],
        ["XINFO", "GROUPS", "s"],
        ["XADD", "s", "4-1", "a", "4"],
        ["XREADGROUP", "GROUP", "g4", "c", "STREAMS", "s", ">"],
        ["XGROUP", "SETID", "s", "g1", "$"],
        ["XGROUP", "SETID", "s", "g3", "0", "ENTRIESREAD", "-1"],
        ["XINFO", "GROUPS", "s"],
        ["XTRIM", "s", "MAXLEN", "0"],
        ["XINFO", "GROUPS", "s"],
        ["XINFO", "STREAM", "s", "FULL"],
        ["XGROUP", "SETID", "s", "g1", "+"], ["XGROUP", "SETID", "s", "g2", "-", "ENTRIESREAD", "9"],
        ["XGROUP", "CREATE", "s", "g5", "99-0"],
        ["XADD", "s", "5-1", "a", "5"], ["XADD", "s", "6-1", "a", "6"],
        ["XREADGROUP", "GROUP", "g1", "c", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g2", "c", "STREAMS", "s", "s", ">", ">"],
        ["XINFO", "GROUPS", "s"],
        ["XSETID", "s", "6-1", "ENTRIESADDED", "100", "MAXDELETEDID", "6-0"],
        ["XINFO", "GROUPS", "s"],
    ])


def test_xautoclaim_reports_deleted_entries(redis):
    cmds = [["XADD", "s", "%d-0" % i, "f", "v"] for i in range(1, 31)]
    cmds += [
        ["XGROUP", "CREATE", "s", "g", "0"],
        ["XREADGROUP", "GROUP", "g", "a", "STREAMS", "s", ">"],
        ["XDEL", "s"] + ["%d-0" % i for i in range(2, 30, 3)],
        ["XAUTOCLAIM", "s", "g", "b", "0", "0", "COUNT", "4"],
        ["XAUTOCLAIM", "s", "g", "b", "0", "(5-0", "COUNT", "3", "JUSTID"],
        ["XAUTOCLAIM", "s", "g", "b", str(FAR_MIN_IDLE), "0", "COUNT", "1"],
        ["XAUTOCLAIM", "s", "g", "b", str(FAR_MIN_IDLE), "0", "COUNT", "2"],
        ["XAUTOCLAIM", "s", "g", "b", "0", "0", "COUNT", "100"],
        ["XPENDING", "s", "g"],
        ["XCLAIM", "s", "g", "c", "0", "3-0", "4-0", "4-0", "30-0"],
        ["XPENDING", "s", "g", "-", "+", "100"],
    ]
    _script(redis, cmds)


def test_xreadgroup_block_forms(redis):
    db, _ = _script(redis, [
        ["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"],
        ["XREADGROUP", "GROUP", "g", "c", "BLOCK", "1", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g", "c", "BLOCK", "1", "STREAMS", "s", "0"],
        ["XINFO", "CONSUMERS", "s", "g"],
    ])
    blocked = engine_call(db, "XREADGROUP", "GROUP", "g", "c2", "BLOCK", "50", "STREAMS", "s", ">", now_ms=1)
    assert isinstance(blocked, WouldBlock)
    assert blocked.keys == [b"s"] and blocked.timeout_ms == 50 and blocked.timeout_reply is NULL_ARRAY
    assert blocked.retry_argv[-5:] == [b"COUNT", b"1000", b"STREAMS", b"s", b">"]
