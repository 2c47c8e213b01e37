"""The stream commands without consumer groups: XADD, XRANGE, XREVRANGE, XLEN,
XDEL, XTRIM, XREAD and XSETID, with redis 7.0's arguments, replies and errors.

Every handler parses and checks all of its arguments (and the types of the
keys it touches) before it changes anything, so an error leaves the keyspace
as it was. Where redis checks things in a particular order (which error wins
when several apply) the order below is redis's.

Time: XADD `*` and `<ms>-*` are the only time-dependent forms; the time is the
`now_ms` the leader stamped on the command, never a clock.
"""
from dataclasses import dataclass

from .commands import BLOCKING, READONLY, WRITE, command
from .errors import NO_SUCH_KEY, CommandError, WrongTypeError, not_integer, syntax_error, wrong_arity
from .refs import KEEPREF, parse_policy, trim_with_policy
from .idmp import (ERR_AUTO_ID_ONLY, ERR_IDMP_EMPTY_IID, ERR_TWICE, SHORT_IID, IdmpState, auto_iid, check_producer,
                   idmp_of, manual_iid)
from .idmp import SHORT_IID_PADS as _IID_PADS
from ..invariant import invariant
from .replies import NULL_ARRAY, OK, PairMap, WouldBlock
from .stream import Stream
from .stream_args import (
    XREAD_BLOCKED_DEFAULT_COUNT, entries_reply, last_valid_id, lookup_stream, parse_count,
    parse_int, parse_interval, parse_xread_args, take,
)
from .streamid import MAX_ID, MIN_ID, UINT64_MAX, StreamID, format_id, parse_id, parse_strict_id

# redis refuses an entry whose fields and values add up to more than this
# (STREAM_LISTPACK_MAX_SIZE: a listpack must stay addressable with 32 bits).
ENTRY_MAX_BYTES = 1 << 30

MAXLEN = "maxlen"
MINID = "minid"

_ERR_BOTH_STRATEGIES = "ERR syntax error, MAXLEN and MINID options at the same time are not compatible"
_ERR_ID_ZERO = "ERR The ID specified in XADD must be greater than 0-0"
_ERR_ID_TOO_SMALL = "ERR The ID specified in XADD is equal or smaller than the target stream top item"
_ERR_EXHAUSTED = "ERR The stream has exhausted the last possible ID, unable to add more items"
_ERR_TOO_LARGE = "ERR Elements are too large to be stored"


# -- XADD / XTRIM options -----------------------------------------------------

@dataclass
class AddTrimArgs:
    """What redis streamParseAddOrTrimArgsOrReply extracts from XADD/XTRIM."""
    strategy: str | None = None     # MAXLEN, MINID or None
    maxlen: int = 0
    minid: StreamID = MIN_ID
    approx: bool = False
    limit: int = 0                  # most entries one trim may remove; 0 = no limit
    no_mkstream: bool = False
    id: StreamID | None = None      # XADD's explicit ID, None for `*`
    seq_given: bool = True          # False for `<ms>-*`
    id_pos: int = 0                 # argv index of XADD's ID argument
    idmp_pid: bytes | None = None   # XADD IDMP/IDMPAUTO's producer id (idmp.py)
    idmp_iid: bytes | None = None   # IDMP's idempotent id; None with IDMPAUTO
    policy: str | None = None       # KEEPREF / DELREF / ACKED (Redis 8.2, refs.py); None: KEEPREF

    @property
    def threshold(self):
        return self.maxlen if self.strategy == MAXLEN else self.minid


def _approx_marker(arg: bytes) -> str | None:
    """'~' or '=' when the argument is exactly one of them."""
    if arg == b"~":
        return "~"
    if arg == b"=":
        return "="
    return None


def parse_add_or_trim_args(argv, xadd: bool, node_max_entries: int) -> AddTrimArgs:
    """Options of XADD (up to its ID) or XTRIM, checked in redis's order."""
    args = AddTrimArgs()
    n = len(argv)
    limit_given = False
    i = 2
    while i < n:
        more = n - 1 - i
        opt = argv[i]
        low = opt.lower()
        if xadd and opt == b"*":
            break                                   # auto ID: the options end here
        if low in (b"maxlen", b"minid") and more:
            if args.strategy is not None:
                raise CommandError(_ERR_BOTH_STRATEGIES)
            args.approx = False
            marker = _approx_marker(argv[i + 1]) if more >= 2 else None
            if marker is not None:
                args.approx = marker == "~"
                i += 1
            if low == b"maxlen":
                args.maxlen = parse_int(argv[i + 1])
                if args.maxlen < 0:
                    raise CommandError("ERR The MAXLEN argument must be >= 0.")
                args.strategy = MAXLEN
            else:
                args.minid = parse_strict_id(argv[i + 1])
                args.strategy = MINID
            i += 1
        elif low == b"limit" and more:
            args.limit = parse_int(argv[i + 1])
            if args.limit < 0:
                raise CommandError("ERR The LIMIT argument must be >= 0.")
            limit_given = True
            i += 1
        elif xadd and low == b"nomkstream":
            args.no_mkstream = True
        elif parse_policy(low) is not None:
            if args.policy is not None:             # one of the three, once
                raise syntax_error()
            args.policy = parse_policy(low)
        elif xadd and ((low == b"idmp" and more >= 2) or (low == b"idmpauto" and more)):
            _parse_idmp(args, argv, i, low == b"idmpauto")
            i += 1 if low == b"idmpauto" else 2
        elif xadd:
            # Not an option, so it must be the ID (or a syntax error reported as a bad ID).
            sid, seq_given = parse_id(opt, 0, strict=True, allow_seq_star=True)
            args.id, args.seq_given = sid, seq_given
            break
        else:
            raise syntax_error()
        i += 1
    args.id_pos = i
    if args.idmp_pid is not None and args.id is not None:
        raise CommandError(ERR_AUTO_ID_ONLY)

    if args.limit and args.strategy is None:
        raise CommandError("ERR syntax error, LIMIT cannot be used without specifying a trimming strategy")
    if not xadd and args.strategy is None:
        raise CommandError("ERR syntax error, XTRIM must be called with a trimming strategy")
    if limit_given:
        if not args.approx:
            raise CommandError("ERR syntax error, LIMIT cannot be used without the special ~ option")
    elif args.approx:
        args.limit = _default_approx_limit(node_max_entries)
    else:
        args.limit = 0                              # exact trims are never limited
    return args


def _parse_idmp(args: AddTrimArgs, argv, i: int, auto: bool) -> None:
    """`IDMP pid iid` / `IDMPAUTO pid` at argv[i] (Redis 8.6; idmp.py)."""
    if args.idmp_pid is not None:
        raise CommandError(ERR_TWICE)
    pid = argv[i + 1]
    check_producer(pid, auto)
    if not auto:
        if not argv[i + 2]:
            raise CommandError(ERR_IDMP_EMPTY_IID)
        args.idmp_iid = argv[i + 2]
    args.idmp_pid = pid


def _default_approx_limit(node_max_entries: int) -> int:
    """An approximate trim without LIMIT: about 100 nodes of work (redis's default)."""
    return min(100 * node_max_entries if node_max_entries > 0 else 10000, 1000000)


def _trim(stream, args: AddTrimArgs) -> int:
    if args.strategy is None:
        return 0
    if args.policy is None or args.policy == KEEPREF:
        return stream.trim(args.strategy, args.threshold, args.approx, args.limit)
    return trim_with_policy(stream, args.strategy, args.threshold, args.approx, args.limit, args.policy)


# -- XADD ---------------------------------------------------------------------

# The ID argument of one XADD.
ID_AUTO = 0                                         # "*"
ID_AUTO_SEQ = 1                                     # "<ms>-*" (ms given, seq 0)
ID_EXPLICIT = 2                                     # "<ms>-<seq>"


def _entry_id(last_id, kind: int, ms: int, seq: int, now_ms: int) -> tuple:
    """(ms, seq) XADD gives a new entry of a stream whose last ID is `last_id`,
    or the redis error raised (streamAppendItem's rules, in its order). The one
    copy of these rules: `xadd` and `xadd_many` both ask it."""
    lms, lseq = last_id
    if lms == UINT64_MAX and lseq == UINT64_MAX:
        raise CommandError(_ERR_EXHAUSTED)
    if kind == ID_AUTO:                             # streamNextID: always above last_id
        if now_ms > lms:
            return now_ms, 0
        if lseq < UINT64_MAX:
            return lms, lseq + 1
        return lms + 1, 0
    if kind == ID_AUTO_SEQ:
        if ms != lms:
            seq = 0
        elif lseq == UINT64_MAX:
            # redis fails here without setting errno to EDOM, so its
            # client sees the "too large" text, not the ID one.
            raise CommandError(_ERR_TOO_LARGE)
        else:
            seq = lseq + 1
    else:
        invariant(kind == ID_EXPLICIT, "unknown ID kind %r" % (kind,))
    if ms < lms or (ms == lms and seq <= lseq):
        raise CommandError(_ERR_ID_TOO_SMALL)
    return ms, seq


@command("xadd", -5, (WRITE,), 1, 1, 1)
def xadd(db, argv, now_ms):
    """XADD key [NOMKSTREAM] [KEEPREF|DELREF|ACKED] [MAXLEN|MINID [=|~] threshold [LIMIT count]]
    [IDMPAUTO pid | IDMP pid iid] *|id field value [...]

    With IDMP/IDMPAUTO (Redis 8.6, idmp.py) a pair the stream still tracks
    answers the ID it added and changes nothing but the duplicate counter."""
    args = parse_add_or_trim_args(argv, True, db.config.stream_node_max_entries)
    field_pos = args.id_pos + 1
    nfields = len(argv) - field_pos
    if nfields < 2 or nfields % 2:
        raise wrong_arity("xadd")
    if args.id is not None and args.seq_given and args.id == MIN_ID:
        raise CommandError(_ERR_ID_ZERO)

    key = argv[1]
    stream = lookup_stream(db, key)
    if stream is None and args.no_mkstream:
        return None
    fields = argv[field_pos:]
    iid = None
    if args.idmp_pid is not None:
        iid = manual_iid(args.idmp_iid) if args.idmp_iid is not None else auto_iid(fields)
        dup = _idmp_duplicate(stream, args.idmp_pid, args.idmp_iid, iid, now_ms)
        if dup is not None:
            return dup
    # A new stream is built aside and stored only once nothing can fail.
    target = stream if stream is not None else Stream()
    invariant(0 <= now_ms <= UINT64_MAX, "now_ms is a uint64 millisecond time")
    if args.id is None:
        kind, ms, seq = ID_AUTO, 0, 0
    else:
        kind = ID_EXPLICIT if args.seq_given else ID_AUTO_SEQ
        ms, seq = args.id
    sid = StreamID(*_entry_id(target.last_id, kind, ms, seq, now_ms))
    if sum(map(len, fields)) > ENTRY_MAX_BYTES:
        raise CommandError(_ERR_TOO_LARGE)

    # Everything is checked: from here on the command succeeds.
    if stream is None:
        db.set(key, target)
    target.append(sid, list(fields), db.config.stream_node_max_bytes, db.config.stream_node_max_entries)
    if iid is not None:
        idmp_of(target, True).record(args.idmp_pid, iid, sid, now_ms)
    _trim(target, args)
    db.signal_ready(key)
    return format_id(sid)


def _idmp_duplicate(stream, pid: bytes, raw_iid, iid: bytes, now_ms: int):
    """The reply of an IDMP XADD whose pair the stream still tracks (counted
    as a duplicate), else None. Expiry runs first, at the record's time.
    raw_iid: IDMP's id as sent (None for IDMPAUTO), iid: its key."""
    state = None if stream is None else stream.idmp
    if state is None:
        return None
    state.expire(now_ms)
    ids = state.ids_of(pid)
    if ids is None:
        return None
    value = ids.get(iid) if raw_iid is None else state.find_manual(ids, raw_iid, iid)
    if value is None:
        return None
    state.iids_duplicates += 1
    return format_id(value[0])


# -- XADD of many entries -----------------------------------------------------

_INT64_MAX = (1 << 63) - 1
_new_sid = tuple.__new__                            # StreamID(ms, seq) without the __new__ frame


def xadd_trim_args(strategy, approx: bool, threshold, limit, node_max_entries: int) -> AddTrimArgs:
    """What parse_add_or_trim_args gives (or raises) for XADD's options written
    out as `[MAXLEN|MINID [~] <threshold> [LIMIT <limit>]]`: strategy None,
    MAXLEN or MINID; threshold a uint64 count or a (ms, seq) pair; limit None
    when not given. The checks, their texts and their order are redis's."""
    args = AddTrimArgs()
    if strategy is None:
        invariant(not approx and limit is None, "trim details without a strategy")
        return args
    invariant(strategy in (MAXLEN, MINID), "unknown trim strategy %r" % (strategy,))
    args.strategy = strategy
    args.approx = bool(approx)
    if strategy == MAXLEN:
        if threshold > _INT64_MAX:                  # parse_int of its decimal text
            raise not_integer()
        args.maxlen = threshold
    else:
        args.minid = StreamID(*threshold)
    if limit is not None:
        if limit > _INT64_MAX:
            raise not_integer()
        if not args.approx:
            raise CommandError("ERR syntax error, LIMIT cannot be used without the special ~ option")
        args.limit = limit
    elif args.approx:
        args.limit = _default_approx_limit(node_max_entries)
    return args


def xadd_many(db, key: bytes, entries, now_ms: int, *, no_mkstream: bool = False, strategy=None,
              approx: bool = False, threshold=0, limit=None, idmp_pid: bytes | None = None,
              idmp_iids=None, idmp_first: int | None = None) -> list:
    """`XADD key [NOMKSTREAM] [trim options] <id> <fields>` for each of `entries`
    ((id_kind, ms, seq, fields): ID_AUTO with ms = seq = 0, ID_AUTO_SEQ with
    seq = 0, ID_EXPLICIT; fields a flat f1 v1 ... of at least one pair), in
    order, as in one MULTI: one result per entry, the XADD reply or that
    entry's EngineError. Same checks in the same order as `xadd`, same state
    afterwards, byte for byte (trimmed after each append); the options are
    parsed, and the key looked up, once.

    `idmp_pid`: `IDMP idmp_pid <iid>` on every entry, iid = idmp_iids[i]
    (bytes), or IDMPAUTO for an entry whose idmp_iids[i] is None. `idmp_first`: None, or
    the number whose lowercase hex is idmp_iids[0], the next ones following (the IDMP_SEQ
    form): then the pairs may be recorded as runs (idmp.py IdmpState.run_target)."""
    n = len(entries)
    idmp = idmp_pid is not None
    if idmp:
        invariant(len(idmp_iids) == n, "one idempotent id per entry")
        try:
            check_producer(idmp_pid, False)
        except CommandError as e:
            return [e] * n
    try:
        args = xadd_trim_args(strategy, approx, threshold, limit, db.config.stream_node_max_entries)
    except CommandError as e:
        return [e] * n                              # every XADD fails its option parse alike
    try:
        stream = lookup_stream(db, key)
        wrong_type = None
    except WrongTypeError as e:
        stream, wrong_type = None, e                # nothing below changes the key's type
    # Per entry, the checks of `xadd` in its order: 0-0, WRONGTYPE, NOMKSTREAM,
    # exhausted, the ID rules, the size. A new stream is stored with its first entry.
    skip = wrong_type if wrong_type is not None else (None if stream is None and no_mkstream else False)
    target = stream if stream is not None else Stream()
    stored = stream is not None
    cfg = db.config
    node_bytes, node_entries = cfg.stream_node_max_bytes, cfg.stream_node_max_entries
    trim = target.trim if args.strategy is not None else None
    trim_args = (args.strategy, args.threshold, args.approx, args.limit)
    sid_cls, new_sid, append_entry, entry_id = StreamID, _new_sid, target.append, _entry_id
    invariant(0 <= now_ms <= UINT64_MAX, "now_ms is a uint64 millisecond time")
    added_before = target.entries_added
    out = []
    add = out.append
    expired = False
    state = chunk = recorded = None                 # IDMP: the table, this batch's chunk, the producer's dict
    inline = False                                  # IDMP: record pairs inline (idmp.py begin_batch)
    n_recorded = n_evicted = 0                      # IDMP: pairs recorded and evicted inline
    pads, short_iid, legacy = _IID_PADS, SHORT_IID, 0
    runs = None                                     # IDMP_SEQ in run form: the producer's _Runs
    if idmp_first is not None and idmp and skip is False and n:
        # Every entry of this form passes the checks before the table's (AUTO IDs, ids not
        # empty): the first one expires it, here as in the loop.
        state = target.idmp
        if state is not None:
            state.expire(now_ms)
            expired = True
            legacy = state.legacy_until_ms
            runs = state.run_target(idmp_pid, idmp_first, n)
            if runs is None:
                recorded = state.ids_of(idmp_pid)
        else:
            runs = IdmpState().run_target(idmp_pid, idmp_first, n)     # as a table without pairs answers
    pieces = []                                     # run form: (first number, count, ms, seq)
    piece_i = piece_n = piece_ms = piece_seq = -1   # the run being extended: its entry index, count, ID
    for i, (kind, ms, seq, fields) in enumerate(entries):
        if idmp:
            iid = idmp_iids[i]
            if kind != ID_AUTO or (iid is not None and not iid):
                add(CommandError(ERR_AUTO_ID_ONLY if kind != ID_AUTO else ERR_IDMP_EMPTY_IID))
                continue
        elif kind == ID_EXPLICIT and not ms and not seq:
            add(CommandError(_ERR_ID_ZERO))
            continue
        if skip is not False:
            add(skip)                               # WRONGTYPE, or None (NOMKSTREAM, no stream)
            continue
        if idmp and runs is None:
            # xadd's _idmp_duplicate, with expiry once (every entry has the same
            # now_ms) and the producer's dict looked up once.
            raw_iid = iid
            if iid is None:
                iid = auto_iid(fields)
            elif (iid_len := len(iid)) < short_iid:
                iid = iid + pads[iid_len]           # manual_iid inlined (runs per entry)
            else:
                iid = manual_iid(iid)
            if state is None:
                state = target.idmp
            if state is not None:
                if not expired:
                    state.expire(now_ms)
                    expired = True
                    recorded = state.ids_of(idmp_pid)   # recording makes it if None
                    legacy = state.legacy_until_ms  # only expire() changes it
                if recorded is not None:
                    dup = recorded.get(iid)
                    if dup is None and legacy and raw_iid is not None:
                        dup = state.find_manual(recorded, raw_iid, iid)
                    if dup is not None:
                        state.iids_duplicates += 1
                        add(format_id(dup[0]))
                        continue
        try:
            ms, seq = entry_id(target.last_id, kind, ms, seq, now_ms)
        except CommandError as e:
            add(e)
            continue
        if fields.__class__ is not list:
            fields = list(fields)                   # Stream.append compares field names as lists
        if sum(map(len, fields)) > ENTRY_MAX_BYTES:
            add(CommandError(_ERR_TOO_LARGE))
            continue
        # Everything is checked: from here on this XADD succeeds.
        if not stored:
            db.set(key, target)
            stored = True
        sid = new_sid(sid_cls, (ms, seq))
        append_entry(sid, fields, node_bytes, node_entries)
        if runs is not None:
            # No id of the batch is tracked (run_target): each entry extends the run or,
            # after a failed entry or where the ID's sequence wrapped (ms + 1), starts the
            # next one. (Same ms and the next entry: the sequence is the next one.)
            if i == piece_i + piece_n and ms == piece_ms:
                piece_n += 1
            else:
                if piece_n > 0:
                    pieces.append((idmp_first + piece_i, piece_n, piece_ms, piece_seq))
                piece_i, piece_n, piece_ms, piece_seq = i, 1, ms, seq
        elif idmp:
            if chunk is None:                       # one queue chunk for the batch's pairs
                if state is None:
                    state = idmp_of(target, True)
                    expired = True                  # nothing to expire in a new table
                chunk, recorded, inline = state.begin_batch(idmp_pid, now_ms, n - i)
                chunk_keys, maxsize, pop_oldest = chunk.keys, state.maxsize, recorded.popitem
            if inline:
                # state.record_in inlined (idmp.py begin_batch): this runs per entry;
                # the table's counters are settled once, after the loop.
                recorded[iid] = (sid, chunk, len(chunk_keys))
                chunk_keys.append(iid)
                chunk.live += 1
                n_recorded += 1
                if len(recorded) > maxsize:         # the producer's oldest goes (its chunk's count)
                    n_evicted += 1
                    evicted = pop_oldest(False)[1][1]
                    evicted.live -= 1
                    if not evicted.live and evicted is state.queue[0]:
                        state.drop_dead_head()
            else:
                state.record_in(chunk, recorded, iid, sid)
        if trim is not None:
            trim(*trim_args)
        add(b"%d-%d" % (ms, seq))
    if n_recorded:
        state.end_batch(n_recorded, n_evicted)
    if piece_n > 0:
        pieces.append((idmp_first + piece_i, piece_n, piece_ms, piece_seq))
        idmp_of(target, True).end_run_batch(idmp_pid, runs, now_ms, pieces)
    if target.entries_added != added_before:
        db.signal_ready(key)
    return out


# -- XRANGE / XREVRANGE / XLEN ------------------------------------------------

def _range(db, argv, reverse: bool):
    start_arg, end_arg = (argv[3], argv[2]) if reverse else (argv[2], argv[3])
    start, end = parse_interval(start_arg, end_arg)
    count = -1                                      # -1: no COUNT given
    n = len(argv)
    j = 4
    while j < n:
        if argv[j].lower() == b"count" and n - j - 1 >= 1:
            count = parse_count(argv[j + 1])
            j += 2
        else:
            raise syntax_error()
    stream = lookup_stream(db, argv[1])
    if stream is None:
        return []
    if count == 0:
        return NULL_ARRAY                           # redis: COUNT 0 (or negative) is a null array
    if start > end:
        return []
    return entries_reply(take(stream.iter_range(start, end, reverse=reverse), max(count, 0)))


@command("xrange", -4, (READONLY,), 1, 1, 1)
def xrange(db, argv, now_ms):
    """XRANGE key start end [COUNT count]"""
    return _range(db, argv, False)


@command("xrevrange", -4, (READONLY,), 1, 1, 1)
def xrevrange(db, argv, now_ms):
    """XREVRANGE key end start [COUNT count]"""
    return _range(db, argv, True)


@command("xlen", 2, (READONLY,), 1, 1, 1)
def xlen(db, argv, now_ms):
    """XLEN key"""
    stream = lookup_stream(db, argv[1])
    return 0 if stream is None else stream.length


# -- XDEL / XTRIM -------------------------------------------------------------

@command("xdel", -3, (WRITE,), 1, 1, 1)
def xdel(db, argv, now_ms):
    """XDEL key id [id ...]: the number of entries deleted."""
    stream = lookup_stream(db, argv[1])
    if stream is None:
        return 0                                    # redis answers before looking at the IDs
    ids = [parse_strict_id(arg) for arg in argv[2:]]   # all valid, or nothing is deleted
    # The bookkeeping below is redis xdelCommand's. Stream.delete does the same
    # for itself; doing it here too is idempotent and keeps XDEL right whichever
    # layer owns it.
    deleted = 0
    first_deleted = False
    for sid in ids:
        was_first = sid == stream.first_id
        if stream.delete(sid):
            first_deleted = first_deleted or was_first
            if sid > stream.max_deleted_entry_id:
                stream.max_deleted_entry_id = sid
            deleted += 1
    if deleted:
        if stream.length == 0:
            stream.first_id = MIN_ID
        elif first_deleted:
            stream.first_id = stream.first_entry()[0]
    return deleted


@command("xtrim", -4, (WRITE,), 1, 1, 1)
def xtrim(db, argv, now_ms):
    """XTRIM key MAXLEN|MINID [=|~] threshold [LIMIT count] [KEEPREF|DELREF|ACKED]: entries removed."""
    args = parse_add_or_trim_args(argv, False, db.config.stream_node_max_entries)
    stream = lookup_stream(db, argv[1])
    if stream is None:
        return 0
    return _trim(stream, args)


# -- XSETID -------------------------------------------------------------------

@command("xsetid", -3, (WRITE,), 1, 1, 1)
def xsetid(db, argv, now_ms):
    """XSETID key last-id [ENTRIESADDED entries-added] [MAXDELETEDID max-deleted-id]"""
    sid = parse_strict_id(argv[2])
    entries_added = -1                              # -1: not given
    max_deleted = MIN_ID                            # 0-0: not given (or given as 0-0)
    n = len(argv)
    i = 3
    while i < n:
        more = n - 1 - i
        opt = argv[i].lower()
        if opt == b"entriesadded" and more:
            entries_added = parse_int(argv[i + 1])
            if entries_added < 0:
                raise CommandError("ERR entries_added must be positive")
        elif opt == b"maxdeletedid" and more:
            max_deleted = parse_strict_id(argv[i + 1])
            if sid < max_deleted:
                raise CommandError("ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id")
        else:
            raise syntax_error()
        i += 2

    stream = lookup_stream(db, argv[1])
    if stream is None:
        raise CommandError(NO_SUCH_KEY)
    if stream.length > 0:
        if sid < last_valid_id(stream):
            raise CommandError("ERR The ID specified in XSETID is smaller than the target stream top item")
        if entries_added != -1 and stream.length > entries_added:
            raise CommandError("ERR The entries_added specified in XSETID is smaller than the target stream length")

    stream.last_id = sid
    if entries_added != -1:
        stream.entries_added = entries_added
    if max_deleted != MIN_ID:
        stream.max_deleted_entry_id = max_deleted
    return OK


# -- XREAD --------------------------------------------------------------------

@command("xread", -4, (READONLY, BLOCKING), 0, 0, 0)
def xread(db, argv, now_ms):
    """XREAD [COUNT count] [BLOCK milliseconds] STREAMS key [key ...] id [id ...]

    Keys are found after the STREAMS keyword (redis: movable keys, 0 0 0)."""
    args = parse_xread_args(argv, False)
    after = []                                      # per stream: serve IDs greater than this
    for key, id_arg in zip(args.keys, args.id_args):
        stream = lookup_stream(db, key)             # WRONGTYPE comes before this ID's own errors
        if id_arg == b"$":
            after.append(stream.last_id if stream is not None else MIN_ID)
        elif id_arg == b">":
            raise CommandError("ERR The > ID can be specified only when calling XREADGROUP "
                               "using the GROUP <group> <consumer> option.")
        else:
            after.append(parse_strict_id(id_arg))

    reply = PairMap()  # RESP3: a map of key -> entries; RESP2: [key, entries] pairs
    for key, gt in zip(args.keys, after):
        stream = lookup_stream(db, key)
        if stream is None or stream.length == 0:
            continue
        # Redis serves the key when its last valid ID is above gt, i.e. when some entry is:
        # asking the range directly skips decoding the whole last node (last_valid_id does)
        # when the reader is already at the tail, which is what a woken or polling reader is.
        start = gt.incr()                           # None: gt is MAX_ID, nothing is above it
        items = take(stream.iter_range(start, MAX_ID), args.count) if start is not None else None
        if items:
            reply.append([key, entries_reply(items)])
    if reply:
        return reply
    if args.timeout_ms == -1:
        return NULL_ARRAY
    return WouldBlock(_unique(args.keys), args.timeout_ms, _xread_retry_argv(argv, args, after))


def _unique(keys) -> list:
    return list(dict.fromkeys(keys))


def _xread_retry_argv(argv, args, after) -> list:
    """argv with each `$` replaced by the ID it stood for now, and, without a
    COUNT, COUNT 1000 (redis serves a woken XREAD at most that many per stream)."""
    retry = list(argv)
    ids_pos = args.streams_pos + len(args.keys)
    for i, id_arg in enumerate(args.id_args):
        if id_arg == b"$":
            retry[ids_pos + i] = format_id(after[i])
    if args.count == 0:
        # Just before STREAMS, so it overrides any COUNT 0 given earlier.
        streams_kw = args.streams_pos - 1
        retry[streams_kw:streams_kw] = [b"COUNT", b"%d" % XREAD_BLOCKED_DEFAULT_COUNT]
    return retry
