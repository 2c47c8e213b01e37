"""The replicated state machine: applies committed log records to the stream engine.

    StateMachine
    +-- keyspace         engine Keyspace (data + EngineConfig): the replicated data
    +-- sessions         at-most-once table (sessions.py): replicated, in snapshots
    +-- applied_index    last log index applied. Invariant: advances by exactly 1 per apply/skip
    +-- last_now_ms      largest time applied. Invariant: never decreases
    +-- last_ready_keys  keys signalled ready by the last apply (for the server to
                         wake blocked clients); local, not in snapshots

Determinism: apply reads nothing but (state, record). The time is the
record's stamp, clamped to last_now_ms; no clock, no randomness, no iteration
over unordered containers reaches the state. Two replicas that apply the same
records from the same snapshot hold byte-identical snapshots.

Errors are results. A command that fails returns its EngineError as its
result: it changed nothing, and every replica fails it the same way. Only
two things raise out of apply: CorruptEntry (the bytes are not a record;
nothing changed, not even applied_index) and InvariantViolation / unexpected
exceptions (bugs, which must stop the node rather than be hidden).

Snapshot layout (big-endian):

    +--------+---------+-------------+------------+--------------+----------------------+
    | "XFSM" | ver u16 | applied u64 | now_ms u64 | sess_len u32 | sessions (sessions.py)|
    +--------+---------+-------------+------------+--------------+----------------------+
    | ks_len u64 | keyspace (engine dump.py, its own CRCs) | crc32 u32 of all before     |
    +------------+------------------------------------------+-----------------------------+
      applied <= 2**63-1; now_ms <= 2**63-1; both lengths exactly fit the bytes
      that follow; restore checks the CRC first, then every field, then builds
      the whole new state before replacing the old one (all or nothing).
"""
import dataclasses
import struct
import zlib

from ..engine.cmd_groups import xreadgroup, xreadgroup_unobserved, xreadgroup_woken, xreadgroup_woken_unobserved
from ..engine.commands import lookup
from ..engine.dump import CorruptDump, dump_keyspace, load_keyspace
from ..engine.errors import EngineError
from ..engine.keyspace import EngineConfig, Keyspace
from ..engine.replies import OK, WouldBlock
from ..invariant import invariant
from ..raft.types import EntryType
from .blocking import is_blocking_form, reply_in_multi
from .config_set import apply_config_set
from .entry import MAX_NOW_MS, Kind, decode_record
from .errors import BlockingFormInLog, CorruptSnapshot, ExecAbort, NotARead
from .resolve import is_config_set, queue_check
from .sessions import (DEFAULT_MAX_CLIENTS, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESULTS_PER_CLIENT,
                       CorruptSessions, Sessions)
from .xadd_batch import apply_xadd_batch

SNAP_MAGIC = b"XFSM"
SNAP_VERSION = 1
MAX_INDEX = (1 << 63) - 1

_SNAP_HEAD = struct.Struct(">4sHQQI")      # magic, version, applied, now_ms, sess_len
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


# Handlers with a variant that makes the same state changes without building
# the reply (engine: same state, result None), for results nobody wants.
_UNOBSERVED = {xreadgroup: xreadgroup_unobserved, xreadgroup_woken: xreadgroup_woken_unobserved}


class StateMachine:
    def __init__(self, config: EngineConfig | None = None, *,
                 max_clients: int = DEFAULT_MAX_CLIENTS,
                 results_per_client: int = DEFAULT_RESULTS_PER_CLIENT,
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES):
        # The initial config is part of the initial state: every replica must
        # start from the same one. Copied, so the caller's object is not shared.
        config = dataclasses.replace(config) if config is not None else EngineConfig()
        self.keyspace = Keyspace(config=config)
        self.sessions = Sessions(max_clients, results_per_client, max_result_bytes)
        self.applied_index = 0
        self.last_now_ms = 0
        self.last_ready_keys = frozenset()

    # -- apply -------------------------------------------------------------------

    def apply(self, entry_index: int, data: bytes, want_results: bool = True) -> list:
        """Apply the record at `entry_index`; one result per request of the record.

        `data == b""` is Raft's own empty entry (a new leader's first entry):
        it only advances applied_index. Raises CorruptEntry, changing nothing,
        when `data` is not a record.

        `want_results=False`: nobody waits for this entry's results (a
        follower, or a leader applying an entry it did not propose). The state
        changes are exactly the same; only the results of anonymous requests
        (client_id 0) may then be left unbuilt (None): a request with a
        client_id records its result in the sessions, on every replica alike."""
        invariant(entry_index == self.applied_index + 1,
                  "apply index %d after %d" % (entry_index, self.applied_index))
        if not data:
            self.skip(entry_index)
            return []
        record = decode_record(data)              # raises before anything changes
        self.keyspace.pop_ready_keys()            # leftovers are not this entry's
        now = max(record.now_ms, self.last_now_ms)
        results = [self._apply_request(req, now, want_results) for req in record.requests]
        self.last_now_ms = now
        self.applied_index = entry_index
        self.last_ready_keys = frozenset(self.keyspace.pop_ready_keys())
        return results

    def skip(self, entry_index: int) -> None:
        """Advance over an entry that is not the fsm's (Raft's empty entries,
        membership changes): they are in the index sequence but change no data."""
        invariant(entry_index == self.applied_index + 1,
                  "skip index %d after %d" % (entry_index, self.applied_index))
        self.applied_index = entry_index
        self.last_ready_keys = frozenset()

    def apply_raft_entry(self, entry) -> list:
        """apply() or skip() a raft `types.Entry` by its type."""
        if entry.type == EntryType.NORMAL:
            return self.apply(entry.index, entry.data)
        self.skip(entry.index)
        return []

    def _apply_request(self, req, now: int, want_results: bool = True):
        if req.client_id:
            seen, result = self.sessions.lookup(req.client_id, req.seq)
            if seen:
                return result                     # a retry: the first attempt's result
            want_results = True                   # the sessions keep it
        if req.kind == Kind.COMMAND:
            result = self._apply_command(req.argv, now, want_results)
        elif req.kind == Kind.XADD_BATCH:
            result = apply_xadd_batch(self.keyspace, req.xadd, now)
        elif req.kind == Kind.MULTI:
            result = self._apply_multi(req.commands, now)
        elif req.kind == Kind.CONFIG:
            err = apply_config_set(self.keyspace.config, req.argv)
            result = OK if err is None else err
        else:
            invariant(req.kind == Kind.NOOP, "unknown request kind")
            return None
        if req.client_id:
            self.sessions.record(req.client_id, req.seq, result)
        return result

    def _apply_command(self, argv, now: int, want_result: bool = True):
        argv = list(argv)
        try:
            spec = lookup(argv, internal=True)     # a woken client's retry may be internal
        except EngineError as e:
            return e
        if is_blocking_form(argv):
            return BlockingFormInLog(spec.name)
        handler = spec.handler
        if not want_result:
            handler = _UNOBSERVED.get(handler, handler)
        try:
            reply = handler(self.keyspace, argv, now)
        except EngineError as e:
            return e
        invariant(not isinstance(reply, WouldBlock), "a non-blocking form returned WouldBlock")
        return reply

    def _apply_multi(self, commands, now: int):
        """EXEC: queue-time errors discard it all (EXECABORT); otherwise every
        command runs, in order, in this one entry (nothing interleaves), and a
        runtime error is that command's element of the reply, as in redis.
        Blocking forms do not block inside MULTI: they reply at once when they
        have nothing to serve (redis CLIENT_DENY_BLOCKING; blocking.reply_in_multi)."""
        specs = []
        known = {}          # (name, argc) -> spec of a non-CONFIG command that passed queue_check:
        for argv in commands:   # its verdict and spec depend on nothing else (commands.lookup)
            key = (argv[0], len(argv)) if argv else None
            spec = known.get(key)
            if spec is None:
                try:
                    queue_check(argv)
                except EngineError:
                    return ExecAbort()
                if not is_config_set(argv):
                    spec = lookup(argv)
                    if argv[0].lower() != b"config":
                        known[key] = spec
            specs.append(spec)
        replies = []
        for spec, argv in zip(specs, commands):
            argv = list(argv)
            if spec is None:
                err = apply_config_set(self.keyspace.config, argv)
                replies.append(OK if err is None else err)
                continue
            try:
                reply = spec.handler(self.keyspace, argv, now)
            except EngineError as e:
                reply = e
            if isinstance(reply, WouldBlock):
                reply = reply_in_multi(argv, reply)
            replies.append(reply)
        return replies

    # -- reads -------------------------------------------------------------------

    def read(self, argv, now_ms: int):
        """Run a command that changes nothing against the current state (a
        ReadIndex read, once applied_index has reached the read index).
        Returns its reply or its EngineError; XREAD BLOCK with nothing to serve
        returns the engine's WouldBlock for the server to park. Raises NotARead
        for a write: writes go through the log."""
        argv = [bytes(a) for a in argv]
        try:
            spec = lookup(argv)
        except EngineError as e:
            return e
        if spec.is_write:
            raise NotARead(argv)
        # Local clock, clamped: a read must not see time before what was applied
        # (negative idle times in XINFO/XPENDING).
        now = max(now_ms, self.last_now_ms)
        try:
            return spec.handler(self.keyspace, argv, now)
        except EngineError as e:
            return e

    # -- snapshots ---------------------------------------------------------------

    def snapshot(self) -> bytes:
        sessions = self.sessions.encode()
        keyspace = dump_keyspace(self.keyspace)
        invariant(len(sessions) < 1 << 32, "sessions too large for the snapshot")
        invariant(0 <= self.applied_index <= MAX_INDEX and 0 <= self.last_now_ms <= MAX_NOW_MS,
                  "snapshot meta out of range")
        body = b"".join((
            _SNAP_HEAD.pack(SNAP_MAGIC, SNAP_VERSION, self.applied_index, self.last_now_ms, len(sessions)),
            sessions, _U64.pack(len(keyspace)), keyspace))
        return body + _U32.pack(zlib.crc32(body))

    def restore(self, buf) -> None:
        """Replace the whole state with a snapshot's; CorruptSnapshot (and no
        change at all) if the bytes are not one."""
        applied, now_ms, sessions, keyspace = _parse_snapshot(buf)
        self.keyspace = keyspace
        self.sessions = sessions
        self.applied_index = applied
        self.last_now_ms = now_ms
        self.last_ready_keys = frozenset()


def _parse_snapshot(buf):
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise CorruptSnapshot("snapshot is not bytes")
    buf = bytes(buf)
    if len(buf) < _SNAP_HEAD.size + _U64.size + 4:
        raise CorruptSnapshot("snapshot too short")
    end = len(buf) - 4
    if zlib.crc32(memoryview(buf)[:end]) != _U32.unpack_from(buf, end)[0]:
        raise CorruptSnapshot("snapshot checksum mismatch")
    magic, version, applied, now_ms, sess_len = _SNAP_HEAD.unpack_from(buf, 0)
    if magic != SNAP_MAGIC:
        raise CorruptSnapshot("not an fsm snapshot (magic %r)" % magic)
    if version != SNAP_VERSION:
        raise CorruptSnapshot("unsupported snapshot version %d" % version)
    if applied > MAX_INDEX or now_ms > MAX_NOW_MS:
        raise CorruptSnapshot("applied index or time out of range")
    pos = _SNAP_HEAD.size
    if sess_len > end - pos - _U64.size:
        raise CorruptSnapshot("sessions of %d bytes run past the end" % sess_len)
    try:
        sessions = Sessions.decode(buf[pos:pos + sess_len])
    except CorruptSessions as e:
        raise CorruptSnapshot("sessions: %s" % e) from None
    pos += sess_len
    ks_len = _U64.unpack_from(buf, pos)[0]
    pos += _U64.size
    if ks_len != end - pos:
        raise CorruptSnapshot("keyspace length %d, %d bytes left" % (ks_len, end - pos))
    try:
        keyspace = load_keyspace(buf[pos:end])
    except CorruptDump as e:
        raise CorruptSnapshot("keyspace: %s" % e) from None
    return applied, now_ms, sessions, keyspace
