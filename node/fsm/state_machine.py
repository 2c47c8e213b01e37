"""The replicated state machine: applies committed log records to the stream engine.

    StateMachine
    +-- keyspace         engine Keyspace (data + EngineConfig): the replicated data
    +-- sessions         client sessions and the at-most-once table (sessions.py):
                         replicated, in snapshots; expired by replicated time
    +-- versions         per-key last-modified log index for WATCH (watch.py):
                         replicated, in snapshots
    +-- owned            the slots this group owns (slot_owner.py): a keyed request
                         for another slot is refused at apply; replicated, in snapshots
    +-- moves            online slot moves (slot_moves.py): sealed slots (a keyed request
                         for one gets SlotFrozen, read or write), staging areas, per-slot
                         move epochs; replicated, in snapshots
    +-- applied_index    last log index applied. Invariant: advances by exactly 1 per apply/skip
    +-- last_now_ms      largest time applied. Invariant: never decreases
    +-- last_ready_keys  keys signalled ready by the last apply (for the server to
                         wake blocked clients); local, not in snapshots

Determinism: apply reads nothing but (state, record). The time is the
record's stamp, clamped to last_now_ms (the leader bounds how far ahead it
stamps: resolve.TimeStamper); no clock, no randomness, no iteration over
unordered containers reaches the state. Sessions expire at the start of a
record, by that record's time: at the same log position on every replica. Two replicas that apply the same
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
    | ver_len u32 | versions (watch.py; version >= 3)   | own_len u32 | owned slots       |
    +-------------+--------------------------------------+-------------+ (version >= 4)    |
    | mv_len u32 | slot moves (slot_moves.py; version >= 5; empty: no move ever)           |
    +------------+-------------------------------------------------------------------------+
    | ks_len u64 | keyspace (engine dump.py, own CRCs)   | crc32 u32 of all before          |
    +------------+---------------------------------------+----------------------------------+
      version < 5 has no mv_len/moves: it restores with no move.
      version < 4 has no own_len/owned: it restores as owning every slot
      (slot_owner.py: own_len 0 = every slot, else the 2048-byte bitmap).
      version 1 (before WATCH) has no ver_len/versions: it restores with no
      versions and floor = applied (watch.py).
      applied <= 2**63-1; now_ms <= 2**63-1; all lengths exactly fit the bytes
      that follow; restore checks the CRC first, then every field, then builds
      the whole new state before replacing the old one (all or nothing).
      ver 2: sessions in their version 2 form (with session times). ver 1 (before
      sessions expired) still restores: its sessions count as active at now_ms.
      A node that only knows ver 1 refuses a ver 2 snapshot by its version.
"""
import dataclasses
import struct
import zlib
from typing import Optional

from ..engine.cmd_groups import xreadgroup, xreadgroup_unobserved, xreadgroup_woken, xreadgroup_woken_unobserved
from ..engine.commands import lookup
from ..engine.dump import CorruptDump, dump_keyspace, load_keyspace
from ..engine.errors import EngineError
from ..engine.keyspace import EngineConfig, Keyspace
from ..engine.slots import key_slot
from ..engine.replies import NULL_ARRAY, OK, WouldBlock
from ..invariant import invariant
from ..raft.types import EntryType
from .blocking import is_blocking_form, may_run_again, reply_in_multi
from .config_set import apply_config_set
from .entry import MAX_NOW_MS, Kind, Record, decode_record
from .errors import BlockingFormInLog, CorruptEntry, CorruptSnapshot, ExecAbort, NotARead
from .gc_pause import gc_paused
from .resolve import is_config_set, queue_check
from .sessions import MAGIC as SESSIONS_MAGIC
from .sessions import (DEFAULT_MAX_CLIENTS, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RESULTS_PER_CLIENT,
                       DEFAULT_SESSION_TIMEOUT_MS, CorruptSessions, Sessions)
from .slot_move_apply import apply_move, prepare_move
from .slot_moves import CorruptMoves, SlotMoves
from .slot_owner import CorruptOwnedSlots, OwnedSlots, SlotNotOwned, spec_keys
from .watch import CorruptVersions, KeyVersions, present_before
from .xadd_batch import apply_xadd_batch

SNAP_MAGIC = b"XFSM"
# Version 2: sessions in their timed form (sessions.py v2). Version 3 adds the WATCH key
# versions (the versions section is present iff version >= 3). Version 4 adds the owned
# slots (present iff version >= 4; older ones own every slot). Version 5 adds the slot moves.
SNAP_VERSION = 5
_SNAP_VERSIONS = (1, 2, 3, 4, 5)             # restorable; 1 = sessions without times, < 3 = no versions
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
                 max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                 session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
                 owned: OwnedSlots | None = None):
        # The initial config is part of the initial state: every replica must
        # start from the same one. Copied, so the caller's object is not shared.
        config = dataclasses.replace(config) if config is not None else EngineConfig()
        self.keyspace = Keyspace(config=config)
        self.sessions = Sessions(max_clients, results_per_client, max_result_bytes, session_timeout_ms)
        self.versions = KeyVersions()
        # Part of the initial state too: every replica of a group starts from the slot map's
        # ranges for it (the founding nodes all compute the same map).
        self.owned = owned if owned is not None else OwnedSlots()
        self.moves = SlotMoves()
        self.applied_index = 0
        self.last_now_ms = 0
        self.last_ready_keys = frozenset()
        self._index = 0           # the entry being applied (the version its writes give keys)
        # index -> decodes prepare() made for that entry's apply (slot_move_apply.prepare_move);
        # not state: emptied after each apply and on restore.
        self.prepared: dict = {}
        self._prepared_record: Optional[tuple] = None   # (index, data, its Record) prepare() decoded

    # -- apply -------------------------------------------------------------------

    def apply(self, entry_index: int, data: bytes, want_results: bool = True,
              record: Optional[Record] = None) -> list:
        """Apply the record at `entry_index`; one result per request of the record.

        `data == b""` is Raft's own empty entry (a new leader's first entry):
        it only advances applied_index. Raises CorruptEntry, changing nothing,
        when `data` is not a record.

        `want_results=False`: nobody waits for this entry's results (a
        follower, or a leader applying an entry it did not propose). The state
        changes are exactly the same; only the results of anonymous requests
        (client_id 0) may then be left unbuilt (None): a request with a
        client_id records its result in the sessions, on every replica alike.

        `record`: `data` already decoded, when the caller built `data` from it
        (the leader applying its own proposal): it must be what
        decode_record(data) returns, type for type (tests/fsm/test_leader_record.py),
        so the state is the same bytes as a follower's that decodes."""
        invariant(entry_index == self.applied_index + 1,
                  "apply index %d after %d" % (entry_index, self.applied_index))
        if not data:
            self.skip(entry_index)
            return []
        if record is None:
            ahead = self._prepared_record
            if ahead is not None and ahead[0] == entry_index and ahead[1] is data:
                record = ahead[2]                 # prepare() decoded these very bytes
            else:
                record = decode_record(data)      # raises before anything changes
        self._prepared_record = None
        self.keyspace.pop_ready_keys()            # leftovers are not this entry's
        now = max(record.now_ms, self.last_now_ms)
        self.sessions.expire(now)                 # by replicated time, before this record's requests
        self._index = entry_index
        results = [self._apply_request(req, now, want_results) for req in record.requests]
        self.versions.bound(self.keyspace.data, entry_index)
        self.last_now_ms = max(now, self.last_now_ms)   # a STAGE may raise it (a move's time floor)
        self.applied_index = entry_index
        self.last_ready_keys = frozenset(self.keyspace.pop_ready_keys())
        if self.prepared:
            self.prepared.clear()
        return results

    def prepare(self, entry_index: int, data: bytes, record: Optional[Record] = None):
        """A callable doing the costly, pure part of applying the record `data` at entry_index
        (a big slot-move chunk's decode: slot_move_apply.prepare_move), for the caller to run
        in another thread right before apply(entry_index, ...); None when there is none. The
        apply's result and the state are the same whether it ran or not."""
        if not data:
            return None
        if record is None:
            try:
                record = decode_record(data)
            except CorruptEntry:
                return None                       # the apply says so
            self._prepared_record = (entry_index, data, record)   # not decoded twice
        fns = [fn for fn in (prepare_move(self, req.argv, entry_index) for req in record.requests
                             if req.kind == Kind.SLOT_MOVE) if fn is not None]
        if len(fns) <= 1:
            return fns[0] if fns else None
        return lambda: [fn() for fn in fns]

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
        if req.kind == Kind.REGISTER:
            err = self.sessions.register(req.client_id, now)
            return OK if err is None else err
        if req.client_id:
            seen, result = self.sessions.lookup(req.client_id, req.seq, now)
            if seen and not (req.kind == Kind.COMMAND and may_run_again(req.argv, result)):
                return result                     # a retry: the first attempt's result
            want_results = True                   # the sessions keep it
        if req.kind == Kind.SLOT_MOVE:
            return apply_move(self, req.argv, self._index, now)
        refused = self.owned.refusal(req) if self.owned.bitmap is not None else None
        if refused is None and self.moves.any_sealed:
            refused = self.moves.frozen_refusal(req)
        if refused is not None:
            # A slot another group owns, or one frozen by a move: nothing changes, and the
            # refusal is not recorded in the session, so a retry with the same id runs once
            # this group serves the slot (an unsealed slot, or one a move brought here).
            return refused
        if req.kind == Kind.COMMAND:
            result = self._apply_command(req.argv, now, want_results)
        elif req.kind == Kind.XADD_BATCH:
            result = apply_xadd_batch(self.keyspace, req.xadd, now)
            if any(r is not None and not isinstance(r, EngineError) for r in result):
                self.versions.touch(req.xadd.key, self._index)
        elif req.kind == Kind.MULTI:
            result = self._apply_multi(req.commands, now)
        elif req.kind == Kind.WATCHED_MULTI:
            # redis execCommand: CLIENT_DIRTY_CAS -> a null array, nothing runs.
            if self.versions.any_changed_since(req.watched):
                result = NULL_ARRAY
            else:
                result = self._apply_multi(req.transaction, now)
        elif req.kind == Kind.CONFIG:
            err = apply_config_set(self.keyspace.config, req.argv)
            result = OK if err is None else err
        else:
            invariant(req.kind == Kind.NOOP, "unknown request kind")
            return None
        if req.client_id:
            self.sessions.record(req.client_id, req.seq, result, again=seen)
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
        reply = self._run(spec, handler, argv, now)
        invariant(not isinstance(reply, WouldBlock), "a non-blocking form returned WouldBlock")
        return reply

    def _run(self, spec, handler, argv, now: int):
        """One command against the keyspace; its reply or EngineError. Writes
        update the WATCH versions (watch.py) from (argv, reply) alone."""
        name = spec.name
        removed = present_before(spec, argv, self.keyspace.data)
        absent = name == "xgroup" and len(argv) > 2 and not self.keyspace.exists(argv[2])
        try:
            reply = handler(self.keyspace, argv, now)
        except EngineError as e:
            return e
        if spec.is_write:
            created = argv[2] if absent and self.keyspace.exists(argv[2]) else None
            self.versions.after_command(spec, argv, reply, self._index, removed, created)
            if self.keyspace.side_writes:       # dead letters: keys the command does not name
                for key in self.keyspace.pop_side_writes():
                    self.versions.touch(bytes(key), self._index)
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
            reply = self._run(spec, spec.handler, argv, now)
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
            # Internal reads (engine/cmd_slots.py) are the server's own: clients
            # cannot reach them, since both front ends look commands up first.
            spec = lookup(argv, internal=True)
        except EngineError as e:
            return e
        if spec.is_write:
            raise NotARead(argv)
        refused = self._key_refusal(spec, argv)
        if refused is not None:
            return refused
        # Local clock, clamped: a read must not see time before what was applied
        # (negative idle times in XINFO/XPENDING).
        now = max(now_ms, self.last_now_ms)
        try:
            return spec.handler(self.keyspace, argv, now)
        except EngineError as e:
            return e

    def _key_refusal(self, spec, argv):
        """SlotNotOwned / SlotFrozen for a read naming a key of a slot not served here."""
        if self.owned.bitmap is None and not self.moves.any_sealed:
            return None
        keys = spec_keys(spec, argv)
        if self.owned.bitmap is not None:
            for key in keys:
                if not self.owned.owns(key_slot(bytes(key))):
                    return SlotNotOwned(key_slot(bytes(key)))
        return self.moves.frozen_keys(keys)

    # -- snapshots ---------------------------------------------------------------

    def snapshot(self) -> bytes:
        sessions = self.sessions.encode()
        versions = self.versions.encode()
        owned = self.owned.encode()
        moves = self.moves.encode()
        keyspace = dump_keyspace(self.keyspace)
        invariant(len(sessions) < 1 << 32, "sessions too large for the snapshot")
        invariant(len(versions) < 1 << 32, "versions too large for the snapshot")
        invariant(0 <= self.applied_index <= MAX_INDEX and 0 <= self.last_now_ms <= MAX_NOW_MS,
                  "snapshot meta out of range")
        parts = [
            _SNAP_HEAD.pack(SNAP_MAGIC, SNAP_VERSION, self.applied_index, self.last_now_ms, len(sessions)),
            sessions, _U32.pack(len(versions)), versions, _U32.pack(len(owned)), owned,
            _U32.pack(len(moves)), moves, _U64.pack(len(keyspace)), keyspace]
        # The checksum runs over the parts and the image is joined once: `body + crc` copied the
        # whole (keyspace-sized) image a second time and held both copies at once.
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        parts.append(_U32.pack(crc))
        return b"".join(parts)

    @staticmethod
    def parse_snapshot(buf) -> tuple:
        """The pure, costly part of restore(buf): the image decoded and checked into new
        objects (nothing of this machine is touched), for a caller to run in another thread
        and hand to restore(buf, parsed). CorruptSnapshot if the bytes are not one."""
        with gc_paused():
            return (buf, _parse_snapshot(buf))

    def restore(self, buf, parsed: Optional[tuple] = None) -> None:
        """Replace the whole state with a snapshot's; CorruptSnapshot (and no
        change at all) if the bytes are not one. `parsed`: parse_snapshot(buf) of these
        very bytes (taken only if it is: the state never depends on whether it ran)."""
        if parsed is not None and parsed[0] is buf:
            applied, now_ms, sessions, versions, owned, moves, keyspace = parsed[1]
        else:
            with gc_paused():
                applied, now_ms, sessions, versions, owned, moves, keyspace = _parse_snapshot(buf)
        self.keyspace = keyspace
        self.sessions = sessions
        self.versions = versions
        self.owned = owned
        self.moves = moves
        self.applied_index = applied
        self.last_now_ms = now_ms
        self.last_ready_keys = frozenset()
        self.prepared.clear()
        self._prepared_record = None


def _u32_section(buf: bytes, pos: int, end: int, what: str):
    """(the u32-length-prefixed section at pos, the position after it); it must leave room
    for the keyspace length that follows every section."""
    if end - pos < _U32.size:
        raise CorruptSnapshot("%s length runs past the end" % what)
    n = _U32.unpack_from(buf, pos)[0]
    pos += _U32.size
    if n > end - pos - _U64.size:
        raise CorruptSnapshot("%s of %d bytes run past the end" % (what, n))
    return buf[pos:pos + n], pos + n


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
    if version not in _SNAP_VERSIONS:
        raise CorruptSnapshot("unsupported snapshot version %d" % version)
    if applied > MAX_INDEX or now_ms > MAX_NOW_MS:
        raise CorruptSnapshot("applied index or time out of range")
    pos = _SNAP_HEAD.size
    if sess_len > end - pos - _U64.size:
        raise CorruptSnapshot("sessions of %d bytes run past the end" % sess_len)
    sessions_raw = buf[pos:pos + sess_len]
    if (version >= 2) != (sessions_raw[:2] == SESSIONS_MAGIC):
        raise CorruptSnapshot("sessions in a form that snapshot version %d does not hold" % version)
    try:
        sessions = Sessions.decode(sessions_raw, now_ms)
    except CorruptSessions as e:
        raise CorruptSnapshot("sessions: %s" % e) from None
    pos += sess_len
    if version < 3:
        versions = KeyVersions(floor=applied)
    else:
        raw, pos = _u32_section(buf, pos, end, "versions")
        try:
            versions = KeyVersions.decode(raw, applied)
        except CorruptVersions as e:
            raise CorruptSnapshot("versions: %s" % e) from None
    owned = OwnedSlots()
    if version >= 4:
        raw, pos = _u32_section(buf, pos, end, "owned slots")
        try:
            owned = OwnedSlots.decode(raw)
        except CorruptOwnedSlots as e:
            raise CorruptSnapshot("owned slots: %s" % e) from None
    moves = SlotMoves()
    if version >= 5:
        raw, pos = _u32_section(buf, pos, end, "slot moves")
        try:
            moves = SlotMoves.decode(raw, now_ms)
        except CorruptMoves as e:
            raise CorruptSnapshot("slot moves: %s" % e) from None
    if end - pos < _U64.size:
        raise CorruptSnapshot("keyspace length runs past the end")
    ks_len = _U64.unpack_from(buf, pos)[0]
    pos += _U64.size
    if ks_len != end - pos:
        raise CorruptSnapshot("keyspace length %d, %d bytes left" % (ks_len, end - pos))
    try:
        keyspace = load_keyspace(buf[pos:end])
    except CorruptDump as e:
        raise CorruptSnapshot("keyspace: %s" % e) from None
    return applied, now_ms, sessions, versions, owned, moves, keyspace
