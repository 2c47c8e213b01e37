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
    +---------------+---------+---------+-----------+------------------+
    | client_id u64 | seq u64 | kind u8 | ncmd u32  | ncmd x command   |
    +---------------+---------+---------+-----------+------------------+

    command (one argv)
    +----------+-----------------------------------+
    | argc u32 | argc x ( len u32 | len bytes )    |
    +----------+-----------------------------------+

Field invariants (decode checks every one; encode refuses to write a violation):

    "XE"       magic; anything else is not a record
    ver        == VERSION; a new layout gets a new version, old ones stay readable
    flags      == 0; reserved, so a future flag is never silently ignored
    now_ms     <= 2**63-1 (redis's mstime is a signed long long); the leader's
               stamped clock, monotonic over the log (resolve.TimeStamper)
    nreq       1 <= nreq <= MAX_REQUESTS
    client_id  0 = anonymous (no at-most-once record); otherwise the client's id
    seq        == 0 iff client_id == 0; a client's request number otherwise
    kind       COMMAND: ncmd == 1
               MULTI:   0 <= ncmd <= MAX_TXN_COMMANDS (EXEC of an empty MULTI is legal)
               CONFIG:  ncmd == 1, argv[0] is CONFIG and argv[1] is SET (any case)
               NOOP:    ncmd == 0 and anonymous
    argc       1 <= argc <= MAX_ARGC (an empty argv is no command)
    len        <= MAX_ARG_BYTES (redis proto-max-bulk-len)
    crc32      zlib.crc32 of every byte before it: any bit flip or truncation
               is caught before a single field is trusted
    total      len(record) <= MAX_RECORD_BYTES (the Raft codec's entry limit)
"""
import enum
import struct
import zlib
from dataclasses import dataclass

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


class Kind(enum.IntEnum):
    COMMAND = 1     # one client command
    MULTI = 2       # MULTI/EXEC: several commands applied in order, atomically, in this entry
    CONFIG = 3      # CONFIG SET of engine limits (stream/list node sizes)
    NOOP = 4        # nothing; advances the applied index and the time


@dataclass(frozen=True, slots=True)
class Request:
    client_id: int                 # 0 = anonymous
    seq: int                       # 0 iff anonymous
    kind: Kind
    commands: tuple                # tuple of argv tuples of bytes

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
    def noop(cls) -> "Request":
        return cls(0, 0, Kind.NOOP, ())

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
    if (req.client_id == 0) != (req.seq == 0):
        return "seq must be 0 exactly when client_id is 0"
    n = len(req.commands)
    if req.kind in (Kind.COMMAND, Kind.CONFIG) and n != 1:
        return "%s request with %d commands" % (req.kind.name, n)
    if req.kind == Kind.MULTI and n > MAX_TXN_COMMANDS:
        return "transaction of %d commands (limit %d)" % (n, MAX_TXN_COMMANDS)
    if req.kind == Kind.NOOP and (n or req.client_id):
        return "NOOP must be anonymous and empty"
    if req.kind == Kind.CONFIG:
        argv = req.commands[0]
        if len(argv) < 2 or bytes(argv[0]).lower() != b"config" or bytes(argv[1]).lower() != b"set":
            return "CONFIG request that is not CONFIG SET"
    return None


RECORD_OVERHEAD = _HEAD.size + _CRC        # bytes of a record besides its requests


def request_size(req: Request) -> int:
    """The bytes `req` takes in a record. Raises EntryTooLarge for the limits a
    client can hit, so the leader refuses one oversized request before
    batching it with others (a batch must stay <= MAX_RECORD_BYTES)."""
    commands = req.commands
    if len(commands) > MAX_TXN_COMMANDS:
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
        out.append(_REQ.pack(req.client_id, req.seq, req.kind, len(req.commands)))
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
