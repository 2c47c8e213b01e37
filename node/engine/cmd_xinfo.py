"""XINFO STREAM [FULL [COUNT n]] / GROUPS / CONSUMERS / HELP, as redis 7.0.

Replies are maps (dicts, insertion order = wire order); RESP2 flattens them.
Idle times are `now_ms` minus the stored time, never below 0.
"""
from . import groups as g
from .cmd_groups import check_subcommand, help_reply, no_such_group, subcommand_syntax_error
from .commands import READONLY, command
from .errors import NO_SUCH_KEY, CommandError
from .stream_args import entry_reply, lookup_stream, parse_int, take
from .streamid import MAX_ID, MIN_ID, format_id

# XINFO STREAM FULL shows this many entries and PEL items when COUNT is not
# given, or given negative (COUNT 0 means all of them).
FULL_DEFAULT_COUNT = 10

_XINFO_ARITY = {b"stream": -3, b"groups": 3, b"consumers": 4, b"help": 2}

_XINFO_HELP = [
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
]


@command("xinfo", -2, (READONLY,), 2, 2, 1)
def xinfo(db, argv, now_ms):
    """XINFO STREAM|GROUPS|CONSUMERS|HELP ...: a container command (redis
    checks the subcommand's arity), then the key, then the options."""
    sub = check_subcommand(argv, _XINFO_ARITY)
    if sub == b"help":
        return help_reply(argv, _XINFO_HELP)
    stream = lookup_stream(db, argv[2])
    if stream is None:
        raise CommandError(NO_SUCH_KEY)
    if sub == b"consumers":
        return _consumers(stream, argv, now_ms)
    if sub == b"groups":
        return [_group_summary(stream, name, group) for name, group in _groups(stream)]
    return _stream_info(stream, argv)


def _groups(stream):
    return [] if stream.cgroups is None else stream.cgroups.items()


def _consumers(stream, argv, now_ms):
    group = g.lookup_group(stream, argv[3])
    if group is None:
        raise no_such_group(argv[3], argv[2])
    return [{b"name": consumer.name,
             b"pending": consumer.pel.numele,
             b"idle": max(now_ms - consumer.seen_time, 0)}
            for _, consumer in group.consumers.items()]


def _entries_read(group):
    return None if group.entries_read == g.ENTRIES_READ_UNKNOWN else group.entries_read


def _group_summary(stream, name, group) -> dict:
    return {b"name": name,
            b"consumers": group.consumers.numele,
            b"pending": group.pel.numele,
            b"last-delivered-id": format_id(group.last_id),
            b"entries-read": _entries_read(group),
            b"lag": g.group_lag(stream, group)}


def _stream_info(stream, argv):
    options = argv[3:]
    full = bool(options)
    count = FULL_DEFAULT_COUNT
    if full:
        if len(options) not in (1, 3) or options[0].lower() != b"full":
            raise subcommand_syntax_error(argv)
        if len(options) == 3:
            if options[1].lower() != b"count":
                raise subcommand_syntax_error(argv)
            count = parse_int(options[2])
            if count < 0:
                count = FULL_DEFAULT_COUNT
    info = {b"length": stream.length,
            b"radix-tree-keys": stream.rax.numele,
            b"radix-tree-nodes": stream.rax.numnodes,
            b"last-generated-id": format_id(stream.last_id),
            b"max-deleted-entry-id": format_id(stream.max_deleted_entry_id),
            b"entries-added": stream.entries_added,
            b"recorded-first-entry-id": format_id(stream.first_id)}
    if stream.idmp is not None:
        # Redis 8.6 always lists these; xraft only for a stream that used IDMP
        # or XCFGSET, so every other stream answers exactly as redis 7.0.
        info.update(stream.idmp.info_fields())
    if not full:
        info[b"groups"] = 0 if stream.cgroups is None else stream.cgroups.numele
        first = take(stream.iter_range(MIN_ID, MAX_ID), 1)
        last = take(stream.iter_range(MIN_ID, MAX_ID, reverse=True), 1)
        info[b"first-entry"] = entry_reply(*first[0]) if first else None
        info[b"last-entry"] = entry_reply(*last[0]) if last else None
        return info
    info[b"entries"] = [entry_reply(sid, fields) for sid, fields in take(stream.iter_range(MIN_ID, MAX_ID), count)]
    info[b"groups"] = [_group_full(stream, name, group, count) for name, group in _groups(stream)]
    return info


def _group_full(stream, name, group, count: int) -> dict:
    pending = [[format_id(sid), nack.consumer.name, nack.delivery_time, nack.delivery_count]
               for sid, nack in take(group.pel.items(), count)]
    consumers = []
    for _, consumer in group.consumers.items():
        cpel = [[format_id(sid), nack.delivery_time, nack.delivery_count]
                for sid, nack in take(consumer.pel.items(), count)]
        consumers.append({b"name": consumer.name,
                          b"seen-time": consumer.seen_time,
                          b"pel-count": consumer.pel.numele,
                          b"pending": cpel})
    return {b"name": name,
            b"last-delivered-id": format_id(group.last_id),
            b"entries-read": _entries_read(group),
            b"lag": g.group_lag(stream, group),
            b"pel-count": group.pel.numele,
            b"pending": pending,
            b"consumers": consumers}

