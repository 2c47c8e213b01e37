"""Leader-side resolution: client commands -> log requests, before proposing.

The leader does three things here, and the fsm itself none of them:

1. Time. `TimeStamper.stamp(clock_ms, mono_ms)` turns the leader's clock
   (passed in: the fsm never reads a clock) into the record's `now_ms`, never
   below the largest `now_ms` already proposed or applied, and never more
   than MAX_CLOCK_LEAD_MS ahead of what its monotonic clock says since the
   last trusted reading (a wall clock that jumps ahead is not followed). A new leader whose clock is
   behind its predecessor's thus still stamps increasing times, so XADD `*`
   IDs keep their ms part and consumer idle times never go negative. The
   leader must `observe` every record in its log, not only the applied ones:
   its log may hold its predecessor's unapplied records, stamped later than
   anything applied. (apply also clamps `now_ms` to the last applied time, so
   a stamper bug can slow time down but never make it run backwards.)

2. Refusals. Unknown commands and arity errors get the engine's redis errors
   (`commands.lookup`); commands that change nothing raise NotAWrite and are
   served by the read path; records too large raise EntryTooLarge. Nothing
   refused is proposed.

3. Blocking. A blocking write is proposed as its non-blocking form
   (blocking.py); the returned plan tells the server how to park and retry.

Design choice: stamp the time, do not rewrite XADD `*` into an explicit ID.

Apply is a pure function of (state, argv, now_ms): XADD `*` and `<ms>-*` pick
max(now_ms, last_id.ms) and the next sequence from the stream's last ID, and
delivery times, idle times and delivery counts come from the same now_ms.
Every replica applies the same records in the same order from the same state,
so every replica picks the same IDs. Rewriting `*` to an explicit ID on the
leader adds nothing to determinism, and it cannot be done correctly with
pipelined proposals:

  * the ID depends on the stream's last ID when the entry is applied, which
    depends on every entry still in flight before it: XADDs that may fail
    (WRONGTYPE, NOMKSTREAM, size limits), DEL/RENAME/FLUSHALL of the key,
    XSETID raising the last ID, MULTI blocks, records of the previous leader.
    A correct shadow of last IDs is a speculative execution of the whole
    pipeline, i.e. a second state machine on the leader, thrown away on every
    leadership change or log truncation;
  * a wrong guess is not a different ID but a different outcome: an explicit
    ID at or below the real last ID fails ("The ID specified in XADD is equal
    or smaller than the target stream top item") where `*` would succeed.

Stamping gives the same guarantees with no shadow: the only input apply
needs from the leader's clock is in the record.
"""
from dataclasses import dataclass

from ..engine.commands import lookup
from ..engine.errors import CommandError, EngineError, wrong_arity
from ..engine.slots import SLOT_COUNT
from ..invariant import invariant
from .blocking import BlockingPlan, plan_blocking
from .config_set import parse_config_set
from .entry import MAX_NOW_MS, MAX_U64, Kind, Request, XAddBatch, encode_record, peek_now_ms, request_size
from .errors import ExecAbort, NotAWrite


MAX_CLOCK_LEAD_MS = 1_000     # how far a stamp may run ahead of the node's monotonic estimate
MAX_GROUP_CLOCKS = 1_024      # peer clock readings cap_by_group takes (one per peer)


class TimeStamper:
    """The leader's `now_ms`: monotonic, and bounded against clock jumps.
    Not replicated: each node keeps its own, seeded on becoming leader with
    the largest time in its log.

    Bound (the rule, also in docs/architecture.md "Sessions and replicated
    time"): the stamper keeps `offset`, the largest (wall - monotonic)
    difference it trusts, and never stamps beyond

        limit = offset + monotonic_now + max_lead_ms

    A wall reading within the limit is trusted (offset follows it: slow
    drift and small NTP steps pass); one beyond it is a forward jump of this
    node's wall clock, and the stamp is the limit instead. So a leader whose
    clock jumps ahead by an hour moves replicated time at the speed of its
    monotonic clock, not an hour at once; the stamp never goes below the
    floor either (time never runs backwards). Sources of trust:
      * the node's own clock when it started (`anchor`);
      * the times of records other leaders stamped (`observe` with the
        monotonic time they were applied here): if the group's clock is
        ahead of ours, we follow it rather than hold time back. Old records
        (a log replayed at start) give smaller offsets and change nothing.
    And one ceiling, the only way offset goes down (`cap_by_group`): the
    group's clocks as read in the peer handshake (runtime/peer_auth.py). Our
    clock counts as one vote and each peer's as one; when a strict majority
    of them says time is more than max_lead_ms behind what we trust, we trust
    the majority's (the upper median) instead. This catches a node that
    started with its clock already ahead (anchor trusted it) and a group
    whose previous leader was ahead (observe trusted it); one skewed peer,
    ahead or behind, is outvoted by the others. The floor stays: time that
    already ran ahead stands still (stamps = floor, XADD `*` IDs only raise
    their sequence) until the capped limit passes it.
    What it does not cover: a node that becomes leader with no anchor
    (anchor() never called) trusts its wall clock, as before; with no peer
    reading (a single node) there is no group to vote."""

    def __init__(self, floor_ms: int = 0, max_lead_ms: int = MAX_CLOCK_LEAD_MS):
        invariant(type(floor_ms) is int and 0 <= floor_ms <= MAX_NOW_MS, "floor out of range")
        invariant(type(max_lead_ms) is int and max_lead_ms >= 0, "max_lead_ms out of range")
        self._floor = floor_ms      # Invariant: >= every now_ms proposed or observed; never decreases
        self.max_lead_ms = max_lead_ms
        self._offset = None         # Invariant: None, or the largest trusted (time - monotonic ms)
        #                             since the last cap_by_group that lowered it
        self._own_max = 0           # Invariant: the largest now_ms this stamper returned
        self.clamped = 0            # stamps the bound held back (INFO, tests)
        self.capped = 0             # times the group's clocks lowered offset (INFO, tests)

    @property
    def floor_ms(self) -> int:
        return self._floor

    def anchor(self, clock_ms: int, mono_ms: int) -> None:
        """Trust this reading of the wall clock (the node's clock at start)."""
        self._trust(clock_ms - mono_ms)

    def _trust(self, offset: int) -> None:
        # Only raises offset: see cap_by_group for the one way down.
        if self._offset is None or offset > self._offset:
            self._offset = offset

    def cap_by_group(self, skews_ms, clock_ms: int, mono_ms: int) -> bool:
        """Lower the trusted offset to the group's when a majority of clocks is
        behind it (class doc). `skews_ms`: each peer's clock minus our wall
        clock `clock_ms`, now (at monotonic `mono_ms`). True if it lowered."""
        skews = list(skews_ms)
        invariant(len(skews) <= MAX_GROUP_CLOCKS, "a bounded number of peer clocks")
        invariant(all(type(d) is int for d in skews) and type(clock_ms) is int and type(mono_ms) is int,
                  "clock readings are ints")
        if not skews or self._offset is None:
            return False                         # no group to vote, or no bound to lower
        votes = sorted(skews + [0])              # 0: our own clock's vote
        # votes[n // 2]: the smallest skew a strict majority is at or below (a median that,
        # with an even count, needs more than half: two nodes never outvote each other).
        group_offset = clock_ms - mono_ms + votes[len(votes) // 2]
        if self._offset - group_offset <= self.max_lead_ms:
            return False
        # The one place offset goes down: a majority of clocks says ours (or the one we
        # trusted from a record) is ahead. The floor is untouched: time never runs back.
        self._offset = group_offset
        self.capped += 1
        return True

    def limit(self, mono_ms: int):
        """The largest time a stamp may take at monotonic `mono_ms` (None: no bound)."""
        return None if self._offset is None else self._offset + mono_ms + self.max_lead_ms

    def observe(self, now_ms: int, mono_ms: int | None = None) -> None:
        """A time already in the log (applied, or appended by any leader);
        with `mono_ms`, the monotonic time it is seen at (see the class doc)."""
        invariant(type(now_ms) is int and 0 <= now_ms <= MAX_NOW_MS, "now_ms out of range")
        if now_ms > self._floor:
            self._floor = now_ms
        if mono_ms is not None and now_ms > self._own_max:
            self._trust(now_ms - mono_ms)      # not one of ours: another leader's clock

    def observe_record(self, data: bytes) -> None:
        """observe() the stamp of an encoded record (raft's own empty entries
        have none). Raises CorruptEntry on bytes that are not a record."""
        if data:
            self.observe(peek_now_ms(data))

    def clock(self, clock_ms: int, mono_ms: int | None = None) -> int:
        """The wall clock held to the bound, changing nothing: the time reads
        use (idle times in XPENDING / XINFO), so a jumped clock does not
        inflate them either."""
        lim = None if mono_ms is None else self.limit(mono_ms)
        return clock_ms if lim is None else min(clock_ms, lim)

    def stamp(self, clock_ms: int, mono_ms: int | None = None) -> int:
        """The `now_ms` for the next record: the clock, unless it is behind
        the floor or (given `mono_ms`) ahead of the limit."""
        invariant(type(clock_ms) is int, "clock_ms is an int")
        t = clock_ms
        if mono_ms is not None:
            lim = self.limit(mono_ms)
            if lim is None or clock_ms <= lim:
                self._trust(clock_ms - mono_ms)
            else:
                t = lim
                self.clamped += 1
        now = min(max(t, self._floor), MAX_NOW_MS)
        self._floor = now
        if now > self._own_max:
            self._own_max = now
        return now


@dataclass(frozen=True)
class Resolved:
    request: Request
    plan: BlockingPlan | None       # set when the client sent a blocking form


REGISTER_COMMAND = b"xraft.register"     # XRAFT.REGISTER <client id> [SLOT <slot>]: open a session


def resolve_register(argv) -> Request:
    """XRAFT.REGISTER <client id> [SLOT <slot>]: the REGISTER request for that id
    (1..2**64-1). Sessions are per data group (each group's fsm has its own table):
    SLOT names the group (the one owning that slot; without it, slot 0's)."""
    if len(argv) not in (2, 4):
        raise wrong_arity("xraft.register")
    raw = bytes(argv[1])
    cid = int(raw) if raw.isdigit() and len(raw) <= 20 else 0
    if not 0 < cid <= MAX_U64:
        raise CommandError("ERR xraft: client id must be an integer in 1..%d" % MAX_U64)
    slot = None
    if len(argv) == 4:
        if bytes(argv[2]).lower() != b"slot":
            raise CommandError("ERR syntax error")
        raw = bytes(argv[3])
        slot = int(raw) if raw.isdigit() and len(raw) <= 5 else -1
        if not 0 <= slot < SLOT_COUNT:
            raise CommandError("ERR xraft: slot must be an integer in 0..%d" % (SLOT_COUNT - 1))
    return Request.register(cid, slot)


def resolve_command(client_id: int, seq: int, argv) -> Resolved:
    """The request to propose for one client command (outside MULTI).

    Raises the engine's EngineError (unknown command, arity, a blocking form's
    bad timeout ...), NotAWrite for a read, EntryTooLarge for oversize."""
    argv = tuple(map(bytes, argv))
    if argv and argv[0].lower() == REGISTER_COMMAND:
        # Not an engine command: a session of the at-most-once table, through the log.
        return Resolved(resolve_register(argv), None)
    queue_check(argv)                         # the same checks, CONFIG SET's arity included
    if is_config_set(argv):
        return Resolved(resolve_config_set(client_id, seq, argv), None)
    spec = lookup(argv)                       # unknown command / arity, redis's text
    if not spec.is_write:
        raise NotAWrite(argv)
    plan = plan_blocking(argv)
    request = Request.command(client_id, seq, plan.argv if plan is not None else argv)
    request_size(request)
    return Resolved(request, plan)


def retry_request(plan: BlockingPlan, client_id: int, seq: int) -> Request:
    """The request a parked client proposes when one of its keys is ready,
    under the blocked call's own request id (0, 0 for an anonymous call):
    the earlier attempts served nothing, so the id runs again
    (blocking.may_run_again), and the attempt that serves is deduplicated."""
    request = Request.command(client_id, seq, plan.retry_argv)
    request_size(request)
    return request


def resolve_config_set(client_id: int, seq: int, argv) -> Request:
    """CONFIG SET, validated now (the check is pure), applied through the log."""
    argv = tuple(bytes(a) for a in argv)
    invariant(is_config_set(argv), "resolve_config_set of something else")
    parse_config_set(argv)
    request = Request.config(client_id, seq, argv)
    request_size(request)
    return request


def resolve_transaction(client_id: int, seq: int, argvs, watched=()) -> Request:
    """EXEC of the queued commands. Any queue-time error (unknown command,
    arity) discards the transaction with EXECABORT, as redis does; the server
    has already replied that error when the command was queued. Reads and
    blocking forms are allowed: inside MULTI redis runs them without blocking.
    `watched`: [(key, W)] from the client's WATCHes; then apply checks them
    (watch.py) and the request is a WATCHED_MULTI."""
    argvs = tuple(tuple(map(bytes, argv)) for argv in argvs)
    passed = set()            # (name, argc) of non-CONFIG commands that passed: same name and
    for argv in argvs:        # argument count, same verdict (lookup reads nothing else)
        key = (argv[0], len(argv)) if argv else None
        if key in passed:
            continue
        try:
            queue_check(argv)
        except EngineError:
            raise ExecAbort() from None
        if key is not None and argv[0].lower() != b"config":
            passed.add(key)
    if watched:
        request = Request.watched_multi(client_id, seq, watched, argvs)
    else:
        request = Request(client_id, seq, Kind.MULTI, argvs)
    request_size(request)
    return request


def resolve_xadd_batch(client_id: int, seq: int, batch: XAddBatch) -> Request:
    """N XADDs to one key with the same options (fsm/xadd_batch.py) as one
    request. Every entry has fields, so each is an XADD that MULTI queues:
    nothing to refuse but the size (EntryTooLarge)."""
    request = Request.xadd_batch(client_id, seq, batch)
    request_size(request)
    return request


def queue_check(argv) -> None:
    """The checks redis makes when MULTI queues a command: raises its error."""
    if is_config_set(argv):
        return
    if argv and bytes(argv[0]).lower() == b"config":
        # CONFIG and its other subcommands are not served by the fsm.
        if len(argv) == 1:
            raise wrong_arity("config")
        if bytes(argv[1]).lower() == b"set":
            raise wrong_arity("config|set")
    lookup(argv)


def is_config_set(argv) -> bool:
    return (len(argv) >= 4 and bytes(argv[0]).lower() == b"config"
            and bytes(argv[1]).lower() == b"set")


def propose(stamper: TimeStamper, clock_ms: int, requests) -> bytes:
    """The record for a batch of resolved requests (group commit), stamped now."""
    requests = tuple(requests)
    invariant(requests, "propose at least one request")
    return encode_record(stamper.stamp(clock_ms), requests)
