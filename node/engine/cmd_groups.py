"""Consumer-group commands: XGROUP, XREADGROUP, XACK, XPENDING, XCLAIM and
XAUTOCLAIM, with redis 7.0's arguments, replies, error texts and error order.

Every handler checks all of its arguments, and the types of the keys it
touches, before it changes anything: an error leaves the keyspace as it was.
Time: delivery times, seen-times and idle times use the command's stamped
`now_ms` only.
"""
from itertools import islice

from ..invariant import invariant
from . import groups as g
from .commands import BLOCKING, INTERNAL, READONLY, WRITE, command, unknown_subcommand
from .dead_letters import dead_letter_target, over_limit
from .errors import CommandError, NoGroupError, syntax_error, wrong_arity
from .refs import apply_retention
from .replies import NULL_ARRAY, OK, PairMap, Status, WouldBlock
from .stream import Stream
from .stream_args import (
    XREAD_BLOCKED_DEFAULT_COUNT, entry_reply, lookup_stream, parse_count, parse_int,
    parse_interval, parse_range_id, parse_xread_args,
)
from .streamid import MAX_ID, MIN_ID, UINT64_MAX, StreamID, format_id, parse_id, parse_strict_id, parse_strict_ids

# XAUTOCLAIM COUNT upper bound (redis: LONG_MAX / max(sizeof(streamID), 10)).
XAUTOCLAIM_MAX_COUNT = ((1 << 63) - 1) // 16
# XAUTOCLAIM looks at no more than COUNT * this many PEL entries per call.
XAUTOCLAIM_ATTEMPTS_FACTOR = 10


# -- error texts ---------------------------------------------------------------

def err_arg(arg: bytes) -> str:
    """An argument as redis's addReplyErrorFormat prints it with %s: cut at the
    first NUL byte (C string), and CR/LF turned into blanks (protocol safety)."""
    text = arg.split(b"\0", 1)[0].decode("utf-8", "replace")
    return text.replace("\r", " ").replace("\n", " ")


def subcommand_syntax_error(argv) -> CommandError:
    """redis addReplySubcommandSyntaxError."""
    sub = err_arg(argv[1][:128])
    cmd = argv[0].decode("utf-8", "replace").upper()
    return CommandError(f"ERR unknown subcommand or wrong number of arguments for '{sub}'. Try {cmd} HELP.")


def help_reply(argv, lines) -> list:
    """redis addReplyHelp: a header, the lines, and the HELP entry, as statuses."""
    cmd = argv[0].decode("utf-8", "replace").upper()
    out = [Status(f"{cmd} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:")]
    out.extend(Status(line) for line in lines)
    out.extend([Status("HELP"), Status("    Prints this help.")])
    return out


def check_subcommand(argv, arities: dict) -> bytes:
    """A container command's subcommand (lower case) after redis's lookup and
    arity checks: unknown -> "unknown subcommand"; wrong count -> 'cmd|sub'."""
    sub = argv[1].lower()
    arity = arities.get(sub)
    if arity is None:
        raise unknown_subcommand(argv)
    n = len(argv)
    if (arity > 0 and n != arity) or (arity < 0 and n < -arity):
        raise wrong_arity(argv[0].decode("latin-1").lower() + "|" + sub.decode("latin-1"))
    return sub


def no_such_key_or_group(key: bytes, group: bytes, where: str = "") -> NoGroupError:
    return NoGroupError(f"NOGROUP No such key '{err_arg(key)}' or consumer group '{err_arg(group)}'{where}")


def no_such_group(group: bytes, key: bytes) -> NoGroupError:
    return NoGroupError(f"NOGROUP No such consumer group '{err_arg(group)}' for key name '{err_arg(key)}'")


def lookup_stream_group(db, key: bytes, group_name: bytes):
    """(stream, group) for the commands that need both: WRONGTYPE first, then
    NOGROUP with the XPENDING/XCLAIM/XAUTOCLAIM text."""
    stream = lookup_stream(db, key)
    group = None if stream is None else g.lookup_group(stream, group_name)
    if group is None:
        raise no_such_key_or_group(key, group_name)
    return stream, group


# -- XGROUP --------------------------------------------------------------------

_XGROUP_ARITY = {b"create": -5, b"setid": -5, b"destroy": 4, b"createconsumer": 5,
                 b"delconsumer": 5, b"help": 2}

_XGROUP_HELP = [
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Create the empty stream if it does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Set the group's entries_read counter (internal use).",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Set the current group ID and entries_read counter.",
]

_ERR_XGROUP_NO_KEY = ("ERR The XGROUP subcommand requires the key to exist. Note that for CREATE "
                      "you may want to use the MKSTREAM option to create an empty stream automatically.")


@command("xgroup", -2, (WRITE,), 2, 2, 1)
def xgroup(db, argv, now_ms):
    """XGROUP CREATE|SETID|DESTROY|CREATECONSUMER|DELCONSUMER|HELP ...

    A container command: redis checks the subcommand's own arity first. The
    steps below keep redis xgroupCommand's order: options, key type, key
    existence, group existence, then the subcommand itself."""
    sub = check_subcommand(argv, _XGROUP_ARITY)
    if sub == b"help":
        return help_reply(argv, _XGROUP_HELP)
    n = len(argv)
    mkstream = False
    entries_read = g.ENTRIES_READ_UNKNOWN
    i = 5
    while i < n:
        opt = argv[i].lower()
        if sub == b"create" and opt == b"mkstream":
            mkstream = True
            i += 1
        elif sub in (b"create", b"setid") and opt == b"entriesread" and i + 1 < n:
            entries_read = parse_int(argv[i + 1])
            if entries_read < 0 and entries_read != g.ENTRIES_READ_UNKNOWN:
                raise CommandError("ERR value for ENTRIESREAD must be positive or -1")
            i += 2
        else:
            raise subcommand_syntax_error(argv)

    key, name = argv[2], argv[3]
    stream = lookup_stream(db, key)
    group = None
    if not mkstream:
        if stream is None:
            raise CommandError(_ERR_XGROUP_NO_KEY)
        group = g.lookup_group(stream, name)
        if group is None and sub in (b"setid", b"createconsumer", b"delconsumer"):
            raise no_such_group(name, key)

    if sub == b"create" and n <= 8:
        if argv[4] == b"$":
            last_id = stream.last_id if stream is not None else MIN_ID
        else:
            last_id = parse_strict_id(argv[4])
        if stream is None:                  # MKSTREAM; nothing can fail any more
            stream = Stream()
            db.set(key, stream)
        if g.create_group(stream, name, last_id, entries_read) is None:
            raise CommandError("BUSYGROUP Consumer Group name already exists")
        return OK
    if sub == b"setid" and n in (5, 7):
        if argv[4] == b"$":
            last_id = stream.last_id
        else:
            last_id = parse_id(argv[4], 0)[0]
        group.last_id = last_id
        group.entries_read = entries_read
        return OK
    if sub == b"destroy":
        if group is None:
            return 0
        g.destroy_group(stream, name)
        db.signal_ready(key)                # blocked XREADGROUPs on it must fail now
        return 1
    if sub == b"createconsumer":
        return 0 if g.create_consumer(group, argv[4], now_ms) is None else 1
    if sub == b"delconsumer":
        consumer = g.lookup_consumer(group, argv[4], None)
        return 0 if consumer is None else g.delete_consumer(group, consumer)
    raise subcommand_syntax_error(argv)


# -- XREADGROUP ----------------------------------------------------------------

_NEW_ONLY = object()    # the `>` ID: entries never delivered to the group

_ERR_DOLLAR = ("ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the "
               "history of this consumer by specifying a proper ID, or use the > ID to get new "
               "messages. The $ ID would just return an empty result set.")


@command("xreadgroup", -7, (WRITE, BLOCKING), 0, 0, 0)
def xreadgroup(db, argv, now_ms):
    """XREADGROUP GROUP group consumer [COUNT count] [BLOCK ms] [NOACK] STREAMS key [key ...] id [id ...]

    Keys follow STREAMS (movable keys, as redis's 0 0 0). `>` serves entries
    never delivered to the group and may block; any other ID serves the
    consumer's own pending entries after it, and never blocks."""
    return _xreadgroup(db, argv, now_ms, True)


def xreadgroup_unobserved(db, argv, now_ms):
    """XREADGROUP for a caller that throws the reply away (a replica applying
    a log entry nobody waits for): exactly the state changes of xreadgroup()
    (group last ID and read counter, PEL and consumer NACKs, consumer
    seen-time; the same errors, raised before any change), but the `>`
    deliveries build no reply. Returns None instead of the entries served;
    errors and a read with nothing to serve still return what xreadgroup does."""
    return _xreadgroup(db, argv, now_ms, False)


def _xreadgroup(db, argv, now_ms, want_reply: bool):
    args = parse_xread_args(argv, True)
    targets = []                            # (key, serve IDs after this StreamID, or _NEW_ONLY)
    dead_letters = {}                       # key -> the group's DeadLetterTarget (history reads)
    for key, id_arg in zip(args.keys, args.id_args):
        stream = lookup_stream(db, key)
        group = None if stream is None else g.lookup_group(stream, args.group)
        if group is None:
            raise no_such_key_or_group(key, args.group, " in XREADGROUP with GROUP option")
        if id_arg == b"$":
            raise CommandError(_ERR_DOLLAR)
        if id_arg == b">":
            targets.append((key, _NEW_ONLY))
        else:
            sid = parse_strict_id(id_arg)
            # redis marks `>` with the largest ID, so that ID given explicitly means `>` too.
            targets.append((key, _NEW_ONLY if sid == MAX_ID else sid))
            if sid != MAX_ID:               # a history read counts deliveries: may dead-letter
                dead_letters[key] = dead_letter_target(db, key, args.group, group)

    # All checked. Serve stream by stream: an earlier stream's delivery can
    # change what a later one (the same key named twice) has to serve.
    reply = PairMap()  # RESP3: a map of key -> entries; RESP2: [key, entries] pairs
    served_any = False      # a `>` delivery left out of the reply (want_reply False)
    for key, after in targets:
        stream = lookup_stream(db, key)
        group = g.lookup_group(stream, args.group)
        if after is _NEW_ONLY:
            # redis serves (and only then creates the consumer) when the last
            # live entry is past the group's last ID, i.e. when reading from
            # just after that ID finds anything; that read is the delivery.
            start = group.last_id.incr()    # None: last ID is the largest, nothing is past it
            if start is None:
                continue
            if want_reply:
                served = list(islice(stream.iter_range(start, MAX_ID), args.count or None))
            else:
                served = g.new_entry_ids(stream, start, args.count)     # the same IDs, no fields
            if not served:
                continue
            consumer = g.lookup_or_create_consumer(group, args.consumer, now_ms)
            g.deliver_new(stream, group, consumer, start, args.count, args.noack, now_ms, served)
            if not want_reply:
                served_any = True
                continue
            # entry_reply without its copy: these field lists were decoded for this reply alone.
            reply.append([key, [[b"%d-%d" % sid, fields] for sid, fields in served]])
        else:
            start = after.incr()            # after < MAX_ID: never None
            consumer = g.lookup_or_create_consumer(group, args.consumer, now_ms)
            served = g.deliver_history(stream, consumer, start, args.count, now_ms, dead_letters.get(key))
            reply.append([key, [entry_reply(sid, fields) if fields is not None else [format_id(sid), NULL_ARRAY]
                                for sid, fields in served]])
    for target in dead_letters.values():    # after every key is served: the same key may come twice
        if target is not None:
            target.apply_source_retention()
    if served_any:
        return None
    if reply:
        return reply
    if args.timeout_ms == -1:
        return NULL_ARRAY
    return WouldBlock(list(dict.fromkeys(args.keys)), args.timeout_ms, _xreadgroup_retry_argv(argv, args))


def _xreadgroup_retry_argv(argv, args) -> list:
    """The argv a woken client re-runs: only `>` IDs can block, and `>` needs
    no resolving; without a COUNT, COUNT 1000 (redis serves a woken reader at
    most that many entries per stream). Inserted just before STREAMS so that it
    overrides an earlier COUNT 0."""
    retry = list(argv)
    if args.count == 0:
        streams_kw = args.streams_pos - 1
        retry[streams_kw:streams_kw] = [b"COUNT", b"%d" % XREAD_BLOCKED_DEFAULT_COUNT]
    return retry


# -- a blocked XREADGROUP, woken -----------------------------------------------

# The server's retry of a blocked XREADGROUP (fsm/blocking.py proposes it, no
# client can send it: commands.INTERNAL). redis 7.0 serves a woken reader
# differently from a fresh XREADGROUP (blocked.c): if the key is gone or no
# longer a stream, the reader is unblocked with -UNBLOCKED
# (unblockDeletedStreamReadgroupClients); if its group was destroyed, with
# this NOGROUP (serveClientsBlockedOnStreamKey). Checked against redis 7.0.15.
WOKEN_XREADGROUP = b"xreadgroup-woken"
UNBLOCKED_KEY_GONE = "UNBLOCKED the stream key no longer exists"
NOGROUP_WHILE_BLOCKED = "NOGROUP the consumer group this client was blocked on no longer exists"


@command(WOKEN_XREADGROUP.decode(), -7, (WRITE, INTERNAL), 0, 0, 0)
def xreadgroup_woken(db, argv, now_ms):
    """XREADGROUP (same arguments, no BLOCK) for a reader that was blocked on
    these keys: the key and group checks of a woken reader, then a plain read
    (NULL_ARRAY = still nothing new: the server parks it again)."""
    _check_woken(db, argv)
    return _xreadgroup(db, argv, now_ms, True)


def xreadgroup_woken_unobserved(db, argv, now_ms):
    """xreadgroup_woken for a caller that throws the reply away (as xreadgroup_unobserved)."""
    _check_woken(db, argv)
    return _xreadgroup(db, argv, now_ms, False)


def _check_woken(db, argv) -> None:
    args = parse_xread_args(argv, True)
    for key in args.keys:
        stream = db.get(key)
        if type(stream) is not Stream:
            raise CommandError(UNBLOCKED_KEY_GONE)
        if g.lookup_group(stream, args.group) is None:
            raise NoGroupError(NOGROUP_WHILE_BLOCKED)


# -- XACK ----------------------------------------------------------------------

@command("xack", -4, (WRITE,), 1, 1, 1)
def xack(db, argv, now_ms):
    """XACK key group id [id ...]: how many IDs were pending and now are not."""
    stream = lookup_stream(db, argv[1])
    group = None if stream is None else g.lookup_group(stream, argv[2])
    if group is None:
        return 0                            # redis answers before looking at the IDs
    ids = _parse_ack_ids(argv[3:])          # all valid, or nothing is acked
    # g.drop_pending inlined: this loop is half of the consume hot path.
    remove = group.pel.remove
    acked = 0
    for sid in ids:
        removed, nack = remove(sid)
        if removed:
            owner_removed, _ = nack.consumer.pel.remove(sid)
            invariant(owner_removed, "a pending entry is in its owner's PEL")
            acked += 1
    if acked and stream.retention is not None:
        apply_retention(stream)             # XCFGSET RETENTION ACKED (refs.py)
    return acked


def _parse_ack_ids(args) -> list:
    """parse_strict_ids(args), with the usual `<ms>-<seq>` IDs made without
    StreamID's Python-level __new__ (XACK of a consumer's batch: every replica
    parses every acked ID). Any other form, or an error, goes to
    parse_strict_ids for all of them (same result, same error)."""
    out = []
    append = out.append
    new_id, sid_cls, limit = tuple.__new__, StreamID, UINT64_MAX
    for arg in args:
        ms_part, dash, seq_part = arg.partition(b"-")
        if dash and ms_part.isdigit() and seq_part.isdigit() and len(arg) <= 127:
            ms = int(ms_part)
            seq = int(seq_part)
            if ms <= limit and seq <= limit:
                append(new_id(sid_cls, (ms, seq)))
                continue
        return parse_strict_ids(args)
    return out


# -- XPENDING ------------------------------------------------------------------

@command("xpending", -3, (READONLY,), 1, 1, 1)
def xpending(db, argv, now_ms):
    """XPENDING key group [[IDLE min-idle-time] start end count [consumer]]"""
    n = len(argv)
    if n != 3 and not 6 <= n <= 9:
        raise syntax_error()
    min_idle = 0
    consumer_name = None
    if n >= 6:
        pos = 3
        if argv[3].lower() == b"idle":
            min_idle = parse_int(argv[4])
            if n < 8:
                raise syntax_error()
            pos = 5
        count = parse_count(argv[pos + 2])
        start, end = parse_interval(argv[pos], argv[pos + 1])
        if pos + 3 < n:
            consumer_name = argv[pos + 3]   # redis ignores anything after it
    stream, group = lookup_stream_group(db, argv[1], argv[2])

    if n == 3:
        if not group.pel.numele:
            return [0, None, None, NULL_ARRAY]
        first_sid, _ = group.pel.first()
        last_sid, _ = group.pel.last()
        owners = [[name, b"%d" % consumer.pel.numele]
                  for name, consumer in group.consumers.items() if consumer.pel.numele]
        return [group.pel.numele, format_id(first_sid), format_id(last_sid), owners]

    pel = group.pel
    if consumer_name is not None:
        consumer = g.lookup_consumer(group, consumer_name, None)
        if consumer is None:
            return []
        pel = consumer.pel
    out = []
    if not count:
        return out
    for sid, nack in pel.items(start):
        if sid > end:
            break
        idle = now_ms - nack.delivery_time
        if min_idle and idle < min_idle:
            continue
        out.append([format_id(sid), nack.consumer.name, max(idle, 0), nack.delivery_count])
        if len(out) == count:
            break
    return out


# -- XCLAIM --------------------------------------------------------------------

@command("xclaim", -6, (WRITE,), 1, 1, 1)
def xclaim(db, argv, now_ms):
    """XCLAIM key group consumer min-idle-time id [id ...] [IDLE ms] [TIME ms]
    [RETRYCOUNT count] [FORCE] [JUSTID] [LASTID id]"""
    stream, group = lookup_stream_group(db, argv[1], argv[2])
    min_idle = max(parse_int(argv[4], "ERR Invalid min-idle-time argument for XCLAIM"), 0)
    n = len(argv)
    ids = []
    j = 5
    while j < n:                            # IDs until the first thing that is not one
        try:
            ids.append(parse_strict_id(argv[j]))
        except CommandError:
            break
        j += 1
    retry_count = -1                        # -1: not given
    delivery_time = None                    # None: neither IDLE nor TIME given
    force = justid = False
    last_id = MIN_ID
    while j < n:
        more = n - 1 - j
        opt = argv[j].lower()
        if opt == b"force":
            force = True
        elif opt == b"justid":
            justid = True
        elif opt == b"idle" and more:
            j += 1
            delivery_time = now_ms - parse_int(argv[j], "ERR Invalid IDLE option argument for XCLAIM")
        elif opt == b"time" and more:
            j += 1
            delivery_time = parse_int(argv[j], "ERR Invalid TIME option argument for XCLAIM")
        elif opt == b"retrycount" and more:
            j += 1
            retry_count = parse_int(argv[j], "ERR Invalid RETRYCOUNT option argument for XCLAIM")
        elif opt == b"lastid" and more:
            j += 1
            last_id = parse_strict_id(argv[j])
        else:
            raise CommandError(f"ERR Unrecognized XCLAIM option '{err_arg(argv[j])}'")
        j += 1

    counts = retry_count < 0 and not justid     # this claim counts a delivery: may dead-letter
    dead_letters = dead_letter_target(db, argv[1], argv[2], group) if counts else None

    # All checked: from here on the command succeeds.
    if last_id > group.last_id:
        group.last_id = last_id
    # A bogus time (before the epoch, or in the future) means now: clients
    # compute it from their own clocks, which is no reason to fail.
    if delivery_time is None or delivery_time < 0 or delivery_time > now_ms:
        delivery_time = now_ms

    consumer = None
    out = []
    last_node = [None, None]                # stream.get's node cache: the stream does not change here
    for sid in ids:
        nack = group.pel.find(sid, None)
        fields = stream.get(sid, last_node)
        if fields is None:                  # deleted from the stream: forget it
            if nack is not None:
                g.drop_pending(group, sid)
            continue
        if nack is None:
            if not force:
                continue
            nack = g.NACK(now_ms, 1, None)  # owner set below (idle check does not apply)
            group.pel.insert(sid, nack)
        if nack.consumer is not None and min_idle and now_ms - nack.delivery_time < min_idle:
            continue
        if dead_letters is not None and over_limit(group, nack) and dead_letters.move(
                sid, nack, fields, now_ms, argv[3]):
            continue
        if consumer is None:
            consumer = g.lookup_or_create_consumer(group, argv[3], now_ms)
        g.transfer(group, nack, sid, consumer)
        nack.delivery_time = delivery_time
        if retry_count >= 0:
            nack.delivery_count = retry_count
        elif not justid:
            g.count_delivery(nack)
        out.append(format_id(sid) if justid else entry_reply(sid, fields))
    if dead_letters is not None:
        dead_letters.apply_source_retention()
    return out


# -- XAUTOCLAIM ----------------------------------------------------------------

@command("xautoclaim", -6, (WRITE,), 1, 1, 1)
def xautoclaim(db, argv, now_ms):
    """XAUTOCLAIM key group consumer min-idle-time start [COUNT count] [JUSTID]

    Reply: [next cursor, claimed entries (or IDs), IDs found deleted from the
    stream (and dropped from the PEL)]."""
    min_idle = max(parse_int(argv[4], "ERR Invalid min-idle-time argument for XAUTOCLAIM"), 0)
    start, exclusive = parse_range_id(argv[5], 0)
    if exclusive:
        start = start.incr()
        if start is None:
            raise CommandError("ERR invalid start ID for the interval")
    count = 100
    justid = False
    n = len(argv)
    j = 6
    while j < n:
        more = n - 1 - j
        opt = argv[j].lower()
        if opt == b"count" and more:
            count = parse_int(argv[j + 1], "ERR COUNT must be > 0")
            if not 1 <= count <= XAUTOCLAIM_MAX_COUNT:
                raise CommandError("ERR COUNT must be > 0")
            j += 1
        elif opt == b"justid":
            justid = True
        else:
            raise syntax_error()
        j += 1
    stream, group = lookup_stream_group(db, argv[1], argv[2])
    dead_letters = None if justid else dead_letter_target(db, argv[1], argv[2], group)

    consumer = None
    claimed, deleted = [], []
    attempts = count * XAUTOCLAIM_ATTEMPTS_FACTOR
    cursor = start                          # the next PEL ID to look at is >= cursor
    last_node = [None, None]                # stream.get's node cache: the stream does not change here
    while attempts and count:
        attempts -= 1
        item = g.pel_next(group.pel, cursor)
        if item is None:
            cursor = None
            break
        sid, nack = item
        cursor = sid.incr()                 # None past the largest ID: nothing can follow
        fields = stream.get(sid, last_node)
        if fields is None:                  # deleted from the stream: report and forget it
            g.drop_pending(group, sid)
            deleted.append(format_id(sid))
            count -= 1
        elif min_idle and now_ms - nack.delivery_time < min_idle:
            pass
        elif dead_letters is not None and over_limit(group, nack) and dead_letters.move(
                sid, nack, fields, now_ms, argv[3]):
            count -= 1                      # dead-lettered: left out of the reply, but work done
        else:
            if consumer is None:
                consumer = g.lookup_or_create_consumer(group, argv[3], now_ms)
            g.transfer(group, nack, sid, consumer)
            nack.delivery_time = now_ms
            if not justid:
                g.count_delivery(nack)
            claimed.append(format_id(sid) if justid else entry_reply(sid, fields))
            count -= 1
        if cursor is None:
            break
    if dead_letters is not None:
        dead_letters.apply_source_retention()
    nxt = None if cursor is None else g.pel_next(group.pel, cursor)
    next_id = MIN_ID if nxt is None else nxt[0]
    return [format_id(next_id), claimed, deleted]
