"""The fsm's log record: what the leader proposes for client commands.

One Raft entry's `data` is one record. A record carries the leader-stamped
time and one or more requests (a batch: group commit), each with its own
request id and its own result. All integers are big-endian.

    record
    +------+---------+----------+-----------+----------+------------------+-----------+
    | "XE" | ver u8  | flags u8 | now_ms u64| nreq u32 | nreq x request   | crc32 u32 |
    +------+---------+----------+-----------+----------+------------------+-----------+
      0      2         3          4           12         16                 len-4

    request
    +---------------+---------+---------+-----------+---------------------------------+
    | client_id u64 | seq u64 | kind u8 | ncmd u32  | ncmd x command, or, for kind    |
    |               |         |         |           | XADD_BATCH, one xadd batch      |
    +---------------+---------+---------+-----------+---------------------------------+

    command (one argv)
    +----------+-----------------------------------+
    | argc u32 | argc x ( len u32 | len bytes )    |
    +----------+-----------------------------------+

    xadd batch: N XADDs to one key with the same options (ncmd = N entries)
    +---------+-----------+-----------+-----------+----------+-----------+---------------+
    | opts u8 | thr_a u64 | thr_b u64 | limit u64 | klen u32 | key bytes | N x xentry    |
    +---------+-----------+-----------+-----------+----------+-----------+---------------+
    xentry (the ID part is 1, 9 or 17 bytes, by idkind)
    +-----------+--------------------+-------------+-----------+------------------+-------------+
    | idkind u8 | ms u64 (AUTO_SEQ,  | seq u64     | npair u32 | 2*npair x len u32| the 2*npair |
    |           | EXPLICIT only)     | (EXPLICIT)  |           | (f1 v1 f2 v2 ..) | bytes       |
    +-----------+--------------------+-------------+-----------+------------------+-------------+
    It means exactly `XADD key [NOMKSTREAM] [MAXLEN|MINID [~] thr [LIMIT limit]] <id> f1 v1 ..`
    once per xentry, in order, in one MULTI: one result per entry (fsm/xadd_batch.py).
    With opts IDMP (0x20; added within version 1 like kind 5: a node without it
    refuses the record, so upgrade every node before clients send IDMP batches)
    the key is followed by | plen u32 | pid bytes | and every xentry starts with
    | ilen u32 | iid bytes |: `XADD key ... IDMP pid iid * f1 v1 ..`, or, for
    ilen == 0, `XADD key ... IDMPAUTO pid * f1 v1 ..` (engine/idmp.py).
    With opts IDMP and IDMP_SEQ (0x40; added within version 1 the same way) the
    pid is followed by | first u64 | and the xentries carry no iid: entry i's
    iid is the lowercase hex of first + i, without leading zeros (the SDK
    producer's consecutive ids, client/commands.py): one word for N ids in the
    request, the record, the WAL and the decode.

Field invariants (decode checks every one; encode refuses to write a violation):

    "XE"       magic; anything else is not a record
    ver        == VERSION; a new layout gets a new version, old ones stay readable
    flags      == 0; reserved, so a future flag is never silently ignored
    now_ms     <= 2**63-1 (redis's mstime is a signed long long); the leader's
               stamped clock, monotonic over the log (resolve.TimeStamper)
    nreq       1 <= nreq <= MAX_REQUESTS
    client_id  0 = anonymous (no at-most-once record); otherwise the client's id
    seq        == 0 iff client_id == 0 (REGISTER: client_id > 0, seq == 0); a
               client's request number otherwise
    kind       COMMAND: ncmd == 1
               MULTI:   0 <= ncmd <= MAX_TXN_COMMANDS (EXEC of an empty MULTI is legal)
               CONFIG:  ncmd == 1, argv[0] is CONFIG and argv[1] is SET (any case)
               NOOP:    ncmd == 0 and anonymous
               XADD_BATCH: 1 <= ncmd <= MAX_TXN_COMMANDS entries (kind 5: added
                        within version 1, which no record before it used)
               REGISTER: ncmd == 0, client_id > 0, seq == 0: open (or refresh)
                        the client's session (sessions.py). Kind 6, added within
                        version 1 the same way: a node without it refuses the
                        record (CorruptEntry), so upgrade every node before
                        clients register.
               WATCHED_MULTI: 1 <= ncmd <= MAX_TXN_COMMANDS + 1; the first command is
                        the watch list ("WATCH", key1, W1, key2, W2, ...): 1 to
                        MAX_WATCHED_KEYS keys, each W the canonical decimal of a log
                        index <= 2**63-1; the rest is a MULTI's commands (kind 7:
                        added within version 1, fsm/watch.py)
               SLOT_MOVE: ncmd == 1, anonymous: [op, first, last, started_epoch, args..]
                        (kind 8, added within version 1 the same way; fsm/slot_moves.py)
    argc       1 <= argc <= MAX_ARGC (an empty argv is no command)
    len        <= MAX_ARG_BYTES (redis proto-max-bulk-len)
    opts       bits NOMKSTREAM 0x01, MAXLEN 0x02, MINID 0x04, APPROX 0x08 ("~"),
               LIMIT 0x10, IDMP 0x20, IDMP_SEQ 0x40; no other bit; not MAXLEN and MINID
               both; APPROX and LIMIT only with MAXLEN or MINID; IDMP_SEQ only with IDMP. ("=" is no APPROX: redis reads
               them alike.)
    thr_a,     MAXLEN: thr_a = the count (any u64: above 2**63-1 apply answers
    thr_b      redis's "not an integer" error, as XADD would), thr_b == 0.
               MINID: the ID thr_a-thr_b. Neither: both 0.
    limit      LIMIT: any u64 (checked at apply, as redis does); otherwise 0.
               (LIMIT without APPROX is representable: redis refuses it per entry.)
    klen       <= MAX_ARG_BYTES; the key may be empty, as in redis
    plen       1 <= plen <= MAX_ARG_BYTES (IDMP only)
    ilen       <= MAX_ARG_BYTES (IDMP only); idkind == AUTO after it (IDMP needs "*")
    first      first + N - 1 <= 2**64-1 (IDMP_SEQ only); every idkind == AUTO
    idkind     AUTO 0 ("*"), AUTO_SEQ 1 ("<ms>-*"), EXPLICIT 2 ("<ms>-<seq>"); no other
    npair      1 <= npair <= MAX_ARGC // 2 (XADD needs a field; an entry without
               fields never reaches the log: the leader answers it alone)
    len (xe)   each <= MAX_ARG_BYTES; together they fit the bytes left
    crc32      zlib.crc32 of every byte before it: any bit flip or truncation
               is caught before a single field is trusted
    total      len(record) <= MAX_RECORD_BYTES (the Raft codec's entry limit)
"""
import enum
import functools
import operator
import struct
import zlib
from dataclasses import dataclass, field

from ..accel import compiled
from ..invariant import invariant
from ..raft.codec import MAX_ENTRY_DATA_BYTES
from .errors import CorruptEntry, EntryTooLarge

MAGIC = b"XE"
VERSION = 1

MAX_RECORD_BYTES = MAX_ENTRY_DATA_BYTES    # a record always fits one Raft entry
MAX_REQUESTS = 65536                       # group commit batch
MAX_TXN_COMMANDS = 65536                   # commands in one MULTI/EXEC
MAX_ARGC = 1 << 20                         # arguments in one command
MAX_ARG_BYTES = 512 << 20                  # redis proto-max-bulk-len (bounded by the record anyway)
MAX_NOW_MS = (1 << 63) - 1
MAX_U64 = (1 << 64) - 1

_HEAD = struct.Struct(">2sBBQI")           # magic, version, flags, now_ms, nreq
_REQ = struct.Struct(">QQBI")              # client_id, seq, kind, ncmd
_U32 = struct.Struct(">I")
_CRC = 4
_MIN_COMMAND = 4 + 4                       # argc=1 and one empty argument
_XB_HEAD = struct.Struct(">BQQQI")         # opts, thr_a, thr_b, limit, klen
_XE_AUTO_SEQ = struct.Struct(">BQ")        # idkind, ms
_XE_EXPLICIT = struct.Struct(">BQQ")       # idkind, ms, seq
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
_MIN_XENTRY = 1 + 4 + 2 * 4                # AUTO, npair=1, two empty strings


@functools.lru_cache(maxsize=256)
def _lens_struct_of(n: int) -> struct.Struct:
    return struct.Struct(">%dI" % n)


_LENS_STRUCTS = tuple(_lens_struct_of(n) for n in range(64))


def _lens_struct(n: int) -> struct.Struct:
    """n big-endian u32s (an xentry's npair and lengths); the usual counts from a table."""
    return _LENS_STRUCTS[n] if n < 64 else _lens_struct_of(n)


class Kind(enum.IntEnum):
    COMMAND = 1     # one client command
    MULTI = 2       # MULTI/EXEC: several commands applied in order, atomically, in this entry
    CONFIG = 3      # CONFIG SET of engine limits (stream/list node sizes)
    NOOP = 4        # nothing; advances the applied index and the time
    XADD_BATCH = 5  # N XADDs to one key with the same options (XAddBatch), as one MULTI
    REGISTER = 6    # open or refresh the session of client_id (sessions.py)
    WATCHED_MULTI = 7   # MULTI/EXEC after WATCH: aborted at apply if a watched key changed
    SLOT_MOVE = 8   # one step of an online slot move (fsm/slot_moves.py), anonymous, one argv


class IdKind(enum.IntEnum):
    """The ID argument of one XADD_BATCH entry (the byte on the wire)."""
    AUTO = 0        # "*"
    AUTO_SEQ = 1    # "<ms>-*"
    EXPLICIT = 2    # "<ms>-<seq>"


# XADD_BATCH opts bits.
_ID_AUTO, _ID_AUTO_SEQ, _ID_EXPLICIT = IdKind.AUTO.value, IdKind.AUTO_SEQ.value, IdKind.EXPLICIT.value

OPT_NOMKSTREAM = 0x01
OPT_MAXLEN = 0x02
OPT_MINID = 0x04
OPT_APPROX = 0x08
OPT_LIMIT = 0x10
OPT_IDMP = 0x20
OPT_IDMP_SEQ = 0x40
_OPTS_ALL = 0x7F

MAXLEN = "maxlen"                          # XAddBatch.strategy values (the engine's names)
MINID = "minid"


@dataclass(frozen=True, slots=True)
class XAddBatch:
    """The payload of an XADD_BATCH request. Build it with `XAddBatch.build`
    (which checks and encodes it once); decode_record makes the same object."""
    key: bytes
    no_mkstream: bool
    strategy: str | None           # MAXLEN, MINID or None (no trimming)
    approx: bool                   # "~"; only with a strategy
    threshold: object              # MAXLEN: int count; MINID: (ms, seq); None: 0
    limit: int | None              # LIMIT's value; None = no LIMIT given
    entries: tuple                 # ((id_kind int, ms, seq, fields tuple of bytes f1 v1 ..), ...)
    # Invariant: raw is the encoded form of everything above: the layout's
    # "xadd batch", from opts to the last xentry. Encoded once (build) or
    # sliced from the record (decode); sizing and encoding a record read it
    # instead of walking the entries again.
    raw: bytes = field(default=b"", compare=False, repr=False)
    idmp_pid: bytes | None = None  # IDMP's producer id for every entry; None: no IDMP
    idmp_iids: tuple | None = None  # per entry: the iid (bytes), or None for IDMPAUTO
    # None, or the IDMP_SEQ form's first id: then idmp_iids[i] == hex_iids(idmp_first, N)[i],
    # and the encoded form carries this number instead of the N ids.
    idmp_first: int | None = None

    @classmethod
    def build(cls, key, entries, *, no_mkstream: bool = False, strategy: str | None = None,
              approx: bool = False, threshold=0, limit: int | None = None, idmp_pid: bytes | None = None,
              idmp_iids=None, idmp_first: int | None = None) -> "XAddBatch":
        """A batch of `entries` ((id_kind, ms, seq, fields), fields a flat
        sequence of bytes f1 v1 ...). A malformed batch is a caller bug
        (invariant). Of the limits a client can reach, an entry with more
        pairs than MAX_ARGC allows raises EntryTooLarge here; the entry count
        and the size are request_size's business, as for any request."""
        key = bytes(key)
        opts = OPT_NOMKSTREAM if no_mkstream else 0
        if strategy is None:
            invariant(not approx and limit is None and threshold == 0, "trim details without a strategy")
            a = b = 0
        elif strategy == MAXLEN:
            invariant(type(threshold) is int and 0 <= threshold <= MAX_U64, "MAXLEN out of range")
            opts |= OPT_MAXLEN
            a, b = threshold, 0
        else:
            invariant(strategy == MINID, "unknown trim strategy %r" % (strategy,))
            a, b = threshold
            invariant(0 <= a <= MAX_U64 and 0 <= b <= MAX_U64, "MINID out of range")
            threshold = (a, b)
            opts |= OPT_MINID
        if approx:
            opts |= OPT_APPROX
        if limit is not None:
            invariant(type(limit) is int and 0 <= limit <= MAX_U64, "LIMIT out of range")
            opts |= OPT_LIMIT
        if idmp_first is not None:
            # The IDMP_SEQ form: ids first, first + 1, .. in hex (module doc).
            invariant(idmp_pid is not None and idmp_iids is None, "IDMP_SEQ needs a producer and no iids")
            invariant(type(idmp_first) is int and 0 <= idmp_first <= MAX_U64 - max(0, len(entries) - 1),
                      "IDMP_SEQ ids out of range")
            opts |= OPT_IDMP_SEQ
        if idmp_pid is not None:
            idmp_pid = bytes(idmp_pid)
            if idmp_first is None:
                idmp_iids = tuple(idmp_iids)
                invariant(idmp_pid and len(idmp_iids) == len(entries), "IDMP needs a producer and an iid per entry")
            else:
                invariant(idmp_pid, "IDMP needs a producer")
            opts |= OPT_IDMP
        else:
            invariant(idmp_iids is None, "idempotent ids without a producer")
        out = [_XB_HEAD.pack(opts, a, b, limit or 0, len(key)), key]
        if idmp_pid is not None:
            out.append(_U32.pack(len(idmp_pid)))
            out.append(idmp_pid)
        if idmp_first is None:
            body, items = _encode_xentries(entries, idmp_iids)
        else:
            out.append(_U64.pack(idmp_first))
            body, items = _encode_xentries(entries, None)
            # (one C-level pass: the entries' ID kinds, all AUTO as IDMP needs)
            invariant(not any(map(_first_item, items)), "IDMP needs '*' IDs")
            idmp_iids = _hex_iids(idmp_first, len(items))
        out.append(body)
        return cls(key, bool(no_mkstream), strategy, bool(approx), threshold, limit, items,
                   b"".join(out), idmp_pid, idmp_iids, idmp_first)


_first_item = operator.itemgetter(0)


def _hex_iids(first: int, n: int) -> tuple:
    """The IDMP_SEQ form's n ids from `first`: lowercase hex, no leading zeros (module
    doc). Has a compiled twin (_entry_c); this is the reference."""
    return tuple([b"%x" % v for v in range(first, first + n)])


def _encode_xentries(entries, idmp_iids) -> tuple:
    """(the encoded xentries, the entries as XAddBatch.entries holds them) of
    XAddBatch.build: its checks, in its order (idmp_iids: None, or one iid or None per
    entry). Has a compiled twin (_entry_c); this is the reference."""
    out = []
    append, extend = out.append, out.extend
    items = []
    max_pairs = MAX_ARGC // 2
    for i, (kind, ms, seq, fields) in enumerate(entries):
        if idmp_iids is not None:
            iid = idmp_iids[i]
            if kind != _ID_AUTO:
                invariant(False, "IDMP needs '*' IDs")
            if iid is None:
                append(b"\x00\x00\x00\x00")          # IDMPAUTO
            else:
                invariant(type(iid) is bytes and iid, "an IDMP iid is non-empty bytes")
                append(_U32.pack(len(iid)))
                append(iid)
        fields = tuple(fields)
        nf = len(fields)
        npair = nf >> 1
        if not npair or nf & 1:
            invariant(False, "an XADD entry needs field/value pairs")
        if npair > max_pairs:
            raise EntryTooLarge("ERR xraft: XADD entry with %d field/value pairs (limit %d)"
                                % (npair, max_pairs))
        # (Checks written as `if`: invariant() is a call per entry even when it holds.)
        if kind == _ID_AUTO:
            if ms or seq:
                invariant(False, "an AUTO ID carries no numbers")
            append(b"\x00")
        elif kind == _ID_AUTO_SEQ:
            if seq or not 0 <= ms <= MAX_U64:
                invariant(False, "AUTO_SEQ ID out of range")
            append(_XE_AUTO_SEQ.pack(_ID_AUTO_SEQ, ms))
        else:
            if kind != _ID_EXPLICIT or not (0 <= ms <= MAX_U64 and 0 <= seq <= MAX_U64):
                invariant(False, "bad entry ID %r %r-%r" % (kind, ms, seq))
            append(_XE_EXPLICIT.pack(_ID_EXPLICIT, ms, seq))
        lens = _lens_struct(nf + 1)
        append(lens.pack(npair, *map(len, fields)))
        extend(fields)
        items.append((int(kind), ms, seq, fields))
    invariant(items, "an XADD batch holds at least one entry")
    # `out` holds the fields and bytes we packed: one C-level pass checks them all.
    invariant(set(map(type, out)) == {bytes}, "fields are bytes")
    return b"".join(out), tuple(items)


@dataclass(frozen=True, slots=True)
class Request:
    client_id: int                 # 0 = anonymous
    seq: int                       # 0 iff anonymous
    kind: Kind
    commands: tuple                # tuple of argv tuples of bytes; () for XADD_BATCH
    xadd: XAddBatch | None = None  # Invariant: set iff kind == XADD_BATCH
    # Where a node routes a keyless REGISTER (XRAFT.REGISTER ... SLOT s): the group owning
    # this slot. Not part of the record (never encoded, not compared); None = slot 0.
    route_slot: int | None = field(default=None, compare=False)

    @classmethod
    def command(cls, client_id: int, seq: int, argv) -> "Request":
        return cls(client_id, seq, Kind.COMMAND, (tuple(argv),))

    @classmethod
    def multi(cls, client_id: int, seq: int, argvs) -> "Request":
        return cls(client_id, seq, Kind.MULTI, tuple(tuple(a) for a in argvs))

    @classmethod
    def config(cls, client_id: int, seq: int, argv) -> "Request":
        return cls(client_id, seq, Kind.CONFIG, (tuple(argv),))

    @classmethod
    def watched_multi(cls, client_id: int, seq: int, watched, argvs) -> "Request":
        """watched: [(key, W)], W the applied index the client's WATCH saw."""
        head = [WATCH_HEAD]
        for key, w in watched:
            head += [bytes(key), b"%d" % w]
        return cls(client_id, seq, Kind.WATCHED_MULTI, (tuple(head),) + tuple(tuple(a) for a in argvs))

    @property
    def watched(self) -> list:
        """[(key, W)] of a WATCHED_MULTI request."""
        head = self.commands[0]
        return [(head[i], int(head[i + 1])) for i in range(1, len(head), 2)]

    @property
    def transaction(self) -> tuple:
        """The queued commands of a MULTI or WATCHED_MULTI request."""
        return self.commands[1:] if self.kind == Kind.WATCHED_MULTI else self.commands

    @classmethod
    def noop(cls) -> "Request":
        return cls(0, 0, Kind.NOOP, ())

    @classmethod
    def register(cls, client_id: int, route_slot: int | None = None) -> "Request":
        return cls(client_id, 0, Kind.REGISTER, (), None, route_slot)

    @classmethod
    def xadd_batch(cls, client_id: int, seq: int, batch: XAddBatch) -> "Request":
        return cls(client_id, seq, Kind.XADD_BATCH, (), batch)

    @property
    def argv(self) -> tuple:
        """The single argv of a COMMAND or CONFIG request."""
        invariant(len(self.commands) == 1, "argv of a %s request" % self.kind.name)
        return self.commands[0]


@dataclass(frozen=True, slots=True)
class Record:
    now_ms: int
    requests: tuple                # of Request; 1..MAX_REQUESTS


def _shape_error(req: Request):
    """What is wrong with the request's shape (kind, ids, command count), or None."""
    if not isinstance(req.kind, Kind):
        return "unknown kind %r" % (req.kind,)
    if not (0 <= req.client_id <= MAX_U64 and 0 <= req.seq <= MAX_U64):
        return "request id out of range"
    if req.kind == Kind.REGISTER:
        if req.client_id == 0 or req.seq != 0 or req.commands or req.xadd is not None:
            return "REGISTER carries a client_id, seq 0 and nothing else"
        return None
    if (req.client_id == 0) != (req.seq == 0):
        return "seq must be 0 exactly when client_id is 0"
    n = len(req.commands)
    if (req.kind == Kind.XADD_BATCH) != (req.xadd is not None):
        return "an XAddBatch is the payload of XADD_BATCH requests alone"
    if req.kind == Kind.XADD_BATCH:
        if n or not isinstance(req.xadd, XAddBatch) or not req.xadd.entries or not req.xadd.raw:
            return "XADD_BATCH request without a built batch"
        return None
    if req.kind == Kind.SLOT_MOVE and (n != 1 or req.client_id):
        return "SLOT_MOVE must be anonymous with one argv"
    if req.kind in (Kind.COMMAND, Kind.CONFIG) and n != 1:
        return "%s request with %d commands" % (req.kind.name, n)
    if req.kind == Kind.MULTI and n > MAX_TXN_COMMANDS:
        return "transaction of %d commands (limit %d)" % (n, MAX_TXN_COMMANDS)
    if req.kind == Kind.WATCHED_MULTI:
        return _watch_head_error(req.commands, n)
    if req.kind == Kind.NOOP and (n or req.client_id):
        return "NOOP must be anonymous and empty"
    if req.kind == Kind.CONFIG:
        argv = req.commands[0]
        if len(argv) < 2 or bytes(argv[0]).lower() != b"config" or bytes(argv[1]).lower() != b"set":
            return "CONFIG request that is not CONFIG SET"
    return None


WATCH_HEAD = b"WATCH"
MAX_WATCHED_KEYS = 10_000
_MAX_INDEX_DIGITS = 19


def _watch_head_error(commands, n: int):
    if not 1 <= n <= MAX_TXN_COMMANDS + 1:
        return "watched transaction of %d commands" % n
    head = commands[0]
    if head[0] != WATCH_HEAD or len(head) < 3 or not len(head) % 2:
        return "bad watch list"
    if (len(head) - 1) // 2 > MAX_WATCHED_KEYS:
        return "%d watched keys (limit %d)" % ((len(head) - 1) // 2, MAX_WATCHED_KEYS)
    for w in head[2::2]:
        w = bytes(w)
        if not (w.isdigit() and w.isascii() and len(w) <= _MAX_INDEX_DIGITS and (w == b"0" or w[:1] != b"0")
                and int(w) <= MAX_NOW_MS):
            return "bad watched index %r" % w[:24]
    return None


RECORD_OVERHEAD = _HEAD.size + _CRC        # bytes of a record besides its requests


def request_size(req: Request) -> int:
    """The bytes `req` takes in a record. Raises EntryTooLarge for the limits a
    client can hit, so the leader refuses one oversized request before
    batching it with others (a batch must stay <= MAX_RECORD_BYTES)."""
    if req.xadd is not None:
        n = len(req.xadd.entries)
        if n > MAX_TXN_COMMANDS:
            raise EntryTooLarge("ERR xraft: XADD batch of %d entries (limit %d)" % (n, MAX_TXN_COMMANDS))
        size = _REQ.size + len(req.xadd.raw)
        if size + RECORD_OVERHEAD > MAX_RECORD_BYTES:
            raise EntryTooLarge("ERR xraft: request larger than %d bytes" % (MAX_RECORD_BYTES - RECORD_OVERHEAD))
        return size
    commands = req.commands
    if len(commands) > MAX_TXN_COMMANDS + (req.kind == Kind.WATCHED_MULTI):
        raise EntryTooLarge("ERR xraft: transaction of %d commands (limit %d)"
                            % (len(commands), MAX_TXN_COMMANDS))
    size = _REQ.size
    for argv in commands:
        argc = len(argv)
        if not 1 <= argc <= MAX_ARGC:
            raise EntryTooLarge("ERR xraft: command with %d arguments (1..%d)" % (argc, MAX_ARGC))
        total = sum(map(len, argv))
        if total > MAX_ARG_BYTES:
            # Some argument may be over the limit: the first one is named (in order).
            for arg in argv:
                if len(arg) > MAX_ARG_BYTES:
                    raise EntryTooLarge("ERR xraft: argument of %d bytes (limit %d)"
                                        % (len(arg), MAX_ARG_BYTES))
        size += 4 + 4 * argc + total
    if size + RECORD_OVERHEAD > MAX_RECORD_BYTES:
        raise EntryTooLarge("ERR xraft: request larger than %d bytes" % (MAX_RECORD_BYTES - RECORD_OVERHEAD))
    return size


# Length prefixes of the short arguments, packed once (encode_record's hot loop).
_SMALL_LENS = tuple(_U32.pack(n) for n in range(4096))


def encode_record(now_ms: int, requests) -> bytes:
    """The record bytes. Size limits a client can hit raise EntryTooLarge (a
    reply for that client); a malformed request is a caller bug (invariant)."""
    requests = tuple(requests)
    invariant(type(now_ms) is int and 0 <= now_ms <= MAX_NOW_MS, "now_ms out of range")
    invariant(len(requests) >= 1, "a record holds at least one request")
    if len(requests) > MAX_REQUESTS:
        raise EntryTooLarge("ERR xraft: %d requests in one entry (limit %d)" % (len(requests), MAX_REQUESTS))
    out = [_HEAD.pack(MAGIC, VERSION, 0, now_ms, len(requests))]
    append, pack, small = out.append, _U32.pack, _SMALL_LENS
    size = RECORD_OVERHEAD
    for req in requests:
        size += request_size(req)          # limits first: nothing is built for an oversized request
        if size > MAX_RECORD_BYTES:
            raise EntryTooLarge("ERR xraft: entry larger than %d bytes" % MAX_RECORD_BYTES)
        why = _shape_error(req)
        invariant(why is None, "bad request: %s" % why)
        if req.xadd is not None:
            append(_REQ.pack(req.client_id, req.seq, req.kind, len(req.xadd.entries)))
            append(req.xadd.raw)
            continue
        append(_REQ.pack(req.client_id, req.seq, req.kind, len(req.commands)))
        for argv in req.commands:
            append(small[len(argv)] if len(argv) < 4096 else pack(len(argv)))
            for arg in argv:
                t = type(arg)
                if t is not bytes:
                    invariant(t is bytearray or isinstance(arg, (bytes, bytearray)), "arguments are bytes")
                    arg = bytes(arg)
                n = len(arg)
                append(small[n] if n < 4096 else pack(n))
                append(arg)
    body = b"".join(out)
    invariant(len(body) + _CRC == size, "record size bookkeeping")
    return body + _U32.pack(zlib.crc32(body))


def _check_frame(data) -> bytes:
    """`data` as bytes, with its length, magic, version, flags and CRC checked."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptEntry("record is not bytes")
    data = bytes(data)
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptEntry("record of %d bytes (limit %d)" % (len(data), MAX_RECORD_BYTES))
    if len(data) < _HEAD.size + _CRC:
        raise CorruptEntry("record too short (%d bytes)" % len(data))
    body_end = len(data) - _CRC
    if zlib.crc32(memoryview(data)[:body_end]) != _U32.unpack_from(data, body_end)[0]:
        raise CorruptEntry("record checksum mismatch")
    magic, version, flags, _, _ = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptEntry("not an fsm record (magic %r)" % magic)
    if version != VERSION:
        raise CorruptEntry("unsupported record version %d" % version)
    if flags != 0:
        raise CorruptEntry("reserved flags set: %#x" % flags)
    return data


def peek_now_ms(data) -> int:
    """The stamped time of a record, checksum verified, without decoding argv.
    For the leader's TimeStamper, which must see every record in its log."""
    data = _check_frame(data)
    now_ms = _HEAD.unpack_from(data, 0)[3]
    if now_ms > MAX_NOW_MS:
        raise CorruptEntry("now_ms %d out of range" % now_ms)
    return now_ms


def decode_record(data) -> Record:
    """The record `encode_record` wrote; CorruptEntry on anything else."""
    data = _check_frame(data)
    _, _, _, now_ms, nreq = _HEAD.unpack_from(data, 0)
    if now_ms > MAX_NOW_MS:
        raise CorruptEntry("now_ms %d out of range" % now_ms)
    end = len(data) - _CRC
    if not 1 <= nreq <= MAX_REQUESTS or nreq * _REQ.size > end - _HEAD.size:
        raise CorruptEntry("bad request count %d" % nreq)
    pos = _HEAD.size
    requests = []
    for _ in range(nreq):
        if end - pos < _REQ.size:
            raise CorruptEntry("request header runs past the end")
        client_id, seq, kind_raw, ncmd = _REQ.unpack_from(data, pos)
        pos += _REQ.size
        try:
            kind = Kind(kind_raw)
        except ValueError:
            raise CorruptEntry("unknown request kind %d" % kind_raw) from None
        if kind == Kind.XADD_BATCH:
            batch, pos = _decode_xadd_batch(data, pos, end, ncmd)
            req = Request(client_id, seq, kind, (), batch)
        else:
            if ncmd > MAX_TXN_COMMANDS or ncmd * _MIN_COMMAND > end - pos:
                raise CorruptEntry("bad command count %d" % ncmd)
            commands = []
            for _ in range(ncmd):
                argv, pos = _decode_command(data, pos, end)
                commands.append(argv)
            req = Request(client_id, seq, kind, tuple(commands))
        why = _shape_error(req)
        if why is not None:
            raise CorruptEntry(why)
        requests.append(req)
    if pos != end:
        raise CorruptEntry("%d trailing bytes" % (end - pos))
    return Record(now_ms, tuple(requests))


def _decode_command(data: bytes, pos: int, end: int, _unpack=_U32.unpack_from):
    if end - pos < 4:
        raise CorruptEntry("argc runs past the end")
    argc = _unpack(data, pos)[0]
    pos += 4
    if not 1 <= argc <= MAX_ARGC or argc * 4 > end - pos:
        raise CorruptEntry("bad argument count %d" % argc)
    argv = []
    append = argv.append
    for _ in range(argc):
        if end - pos < 4:
            raise CorruptEntry("argument length runs past the end")
        n = _unpack(data, pos)[0]
        pos += 4
        if n > end - pos or n > MAX_ARG_BYTES:
            raise CorruptEntry("argument of %d bytes runs past the end" % n)
        append(data[pos:pos + n])
        pos += n
    return tuple(argv), pos


def _decode_xadd_batch(data: bytes, pos: int, end: int, n: int):
    """The XAddBatch at `pos` (n entries) and the position after it; every
    field checked against the layout's invariants (module doc)."""
    start = pos
    if not 1 <= n <= MAX_TXN_COMMANDS or n * _MIN_XENTRY > end - pos - _XB_HEAD.size:
        raise CorruptEntry("bad XADD batch entry count %d" % n)
    opts, a, b, limit, klen = _XB_HEAD.unpack_from(data, pos)
    pos += _XB_HEAD.size
    if opts & ~_OPTS_ALL:
        raise CorruptEntry("unknown XADD batch option bits %#x" % opts)
    if opts & OPT_MAXLEN and opts & OPT_MINID:
        raise CorruptEntry("XADD batch with both MAXLEN and MINID")
    if opts & OPT_MAXLEN:
        strategy, threshold = MAXLEN, a
        if b:
            raise CorruptEntry("XADD batch MAXLEN with a second threshold word")
    elif opts & OPT_MINID:
        strategy, threshold = MINID, (a, b)
    else:
        strategy, threshold = None, 0
        if opts & (OPT_APPROX | OPT_LIMIT) or a or b:
            raise CorruptEntry("XADD batch trim details without a strategy")
    if not opts & OPT_LIMIT and limit:
        raise CorruptEntry("XADD batch limit without LIMIT")
    if klen > MAX_ARG_BYTES or klen > end - pos:
        raise CorruptEntry("XADD batch key of %d bytes runs past the end" % klen)
    key = data[pos:pos + klen]
    pos += klen
    unpack_u32, unpack_u64, unpack_2u64 = _U32.unpack_from, _U64.unpack_from, _U64X2.unpack_from
    pid = iids = first = None
    if opts & OPT_IDMP:
        pid, pos = _decode_sized(data, pos, end, 1, "IDMP producer")
        if opts & OPT_IDMP_SEQ:
            if end - pos < 8:
                raise CorruptEntry("XADD batch IDMP first id runs past the end")
            first = unpack_u64(data, pos)[0]
            pos += 8
            if first > MAX_U64 - (n - 1):
                raise CorruptEntry("XADD batch IDMP ids from %d past 2**64-1" % first)
        else:
            iids = []
    elif opts & OPT_IDMP_SEQ:
        raise CorruptEntry("XADD batch IDMP_SEQ without IDMP")
    entries = []
    append = entries.append
    lens_struct = _lens_struct
    max_pairs = MAX_ARGC // 2
    for _ in range(n):
        if iids is not None:                # | ilen u32 | iid |, then an AUTO ID (_decode_sized inlined)
            if end - pos < 5:
                raise CorruptEntry("XADD batch IDMP iid runs past the end")
            ilen = unpack_u32(data, pos)[0]
            pos += 4
            if ilen > MAX_ARG_BYTES or ilen >= end - pos or data[pos + ilen] != _ID_AUTO:
                raise CorruptEntry("XADD batch IDMP iid of %d bytes out of bounds or without an auto ID" % ilen)
            iids.append(data[pos:pos + ilen] if ilen else None)
            pos += ilen
        if end - pos < _MIN_XENTRY:
            raise CorruptEntry("XADD batch entry runs past the end")
        kind = data[pos]
        if kind == _ID_AUTO:
            ms = sq = 0
            pos += 1
        elif first is not None:
            raise CorruptEntry("XADD batch IDMP entry without an auto ID")
        elif kind == _ID_AUTO_SEQ:
            if end - pos < 9 + _MIN_XENTRY - 1:
                raise CorruptEntry("XADD batch entry ID runs past the end")
            ms = unpack_u64(data, pos + 1)[0]
            sq = 0
            pos += 9
        elif kind == _ID_EXPLICIT:
            if end - pos < 17 + _MIN_XENTRY - 1:
                raise CorruptEntry("XADD batch entry ID runs past the end")
            ms, sq = unpack_2u64(data, pos + 1)
            pos += 17
        else:
            raise CorruptEntry("unknown XADD batch ID kind %d" % kind)
        npair = unpack_u32(data, pos)[0]
        if not 1 <= npair <= max_pairs or 8 * npair > end - pos - 4:
            raise CorruptEntry("bad XADD batch pair count %d" % npair)
        nf = 2 * npair
        lens = lens_struct(nf).unpack_from(data, pos + 4)
        pos += 4 + 8 * npair
        total = sum(lens)
        if total > end - pos or (total > MAX_ARG_BYTES and max(lens) > MAX_ARG_BYTES):
            raise CorruptEntry("XADD batch fields of %d bytes run past the end" % total)
        if npair == 2:                     # the common shape, without a loop
            l0, l1, l2, l3 = lens
            p1 = pos + l0
            p2 = p1 + l1
            p3 = p2 + l2
            fields = (data[pos:p1], data[p1:p2], data[p2:p3], data[p3:p3 + l3])
        else:
            out = []
            p = pos
            for m in lens:
                out.append(data[p:p + m])
                p += m
            fields = tuple(out)
        pos += total
        append((kind, ms, sq, fields))
    batch = XAddBatch(key, bool(opts & OPT_NOMKSTREAM), strategy, bool(opts & OPT_APPROX), threshold,
                      limit if opts & OPT_LIMIT else None, tuple(entries), data[start:pos], pid,
                      tuple(iids) if first is None and iids is not None else
                      None if first is None else _hex_iids(first, n), first)
    return batch, pos


def _decode_sized(data: bytes, pos: int, end: int, min_len: int, what: str):
    """A u32-length-prefixed string at pos (min_len..MAX_ARG_BYTES bytes) and the position after it."""
    if end - pos < 4:
        raise CorruptEntry("%s runs past the end" % what)
    n = _U32.unpack_from(data, pos)[0]
    pos += 4
    if n < min_len or n > MAX_ARG_BYTES or n > end - pos:
        raise CorruptEntry("%s of %d bytes is out of bounds" % (what, n))
    return data[pos:pos + n], pos + n


# Compiled kernels: _decode_xadd_batch and _encode_xentries above are the reference; their Cython twins
# (node/fsm/_entry_c.pyx, built by `pip install`) replace them unless XRAFT_PURE=1
# or the build had no C compiler. tests/kernels proves them equal.
PURE_KERNELS = {"_decode_xadd_batch": _decode_xadd_batch, "_encode_xentries": _encode_xentries,
                "_hex_iids": _hex_iids}
_compiled = compiled("xraft.node.fsm._entry_c")
if _compiled is not None:
    _decode_xadd_batch = _compiled.decode_xadd_batch
    _encode_xentries = _compiled.encode_xentries
    _hex_iids = _compiled.hex_iids
