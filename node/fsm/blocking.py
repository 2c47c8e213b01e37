"""Blocking forms and their non-blocking equivalents.

Blocking happens in the server, never in the log. When a client sends a
blocking write (BLPOP, BLMOVE, XREADGROUP ... BLOCK ...), the server proposes
its non-blocking form; if that form served nothing, the server parks the
client on `plan.keys` and proposes `plan.retry_argv` each time one of them is
signalled ready (StateMachine.last_ready_keys), until `plan.timeout_ms`
passes and it replies `plan.timeout_reply`. `plan.translate(result)` turns
the non-blocking form's result into the blocking command's reply, or
NOT_SERVED.

    blocking form                          proposed form                 served reply from
    BLPOP k timeout                        LPOP k                        ele -> [k, ele]
    BLPOP k1 k2 .. timeout                 LMPOP n k1 k2 .. LEFT         [k, [ele]] -> [k, ele]
    BRPOP ...                              RPOP / LMPOP ... RIGHT        same
    BLMOVE src dst wf wt timeout           LMOVE src dst wf wt           as is
    BRPOPLPUSH src dst timeout             RPOPLPUSH src dst             as is
    BLMPOP timeout n keys .. dir [COUNT c] LMPOP n keys .. dir [COUNT c] as is
      (retries: the internal woken forms lpop-woken, rpop-woken, lmpop-woken,
      lmove-woken: the same, except that a key which stopped being a list
      while the client waited is skipped rather than WRONGTYPE, as redis
      serves woken list waiters from lists only)
    XREADGROUP .. BLOCK ms .. STREAMS ..   the same without BLOCK ms     as is
      (retry: named xreadgroup-woken, an internal command that fails with
      redis's -UNBLOCKED / NOGROUP texts when the key was deleted, changed type
      or lost its group while the client waited (cmd_groups.xreadgroup_woken);
      + COUNT 1000 when no COUNT was given, as redis serves a woken reader)

Not served = the non-blocking form's empty reply: None for LPOP/RPOP/LMOVE/
RPOPLPUSH, NULL_ARRAY for LMPOP/XREADGROUP. An error is a served reply (e.g.
WRONGTYPE, or NOGROUP after the group was destroyed while the client waited).

Why LMPOP for several keys and not LPOP of "the" non-empty key: which key
serves must be decided at apply time, against the state the entry meets, so
that the pop is exactly redis's (first non-empty key, in argument order).

XREAD BLOCK is read-only: it is served by the read path (StateMachine.read
returns the engine's WouldBlock), not planned here.
"""
from dataclasses import dataclass

from ..engine.cmd_groups import WOKEN_XREADGROUP
from ..engine.commands import execute
from ..engine.errors import EngineError
from ..engine.keyspace import Keyspace
from ..engine.replies import NULL_ARRAY, WouldBlock
from ..engine.stream_args import XREAD_BLOCKED_DEFAULT_COUNT, parse_xread_args
from ..invariant import invariant
from .entry import Request, request_size

_LIST_BLOCKING = frozenset((b"blpop", b"brpop", b"blmove", b"brpoplpush", b"blmpop"))
_STREAM_READS = frozenset((b"xread", b"xreadgroup"))


class _NotServed:
    __slots__ = ()

    def __repr__(self):
        return "NOT_SERVED"


NOT_SERVED = _NotServed()


def is_blocking_form(argv) -> bool:
    """True if executing argv could block: a B* list command, or XREAD/XREADGROUP
    with a BLOCK option. A stream read whose options do not parse is not one
    (the engine fails it before it could block)."""
    name = bytes(argv[0]).lower() if argv else b""
    if name in _LIST_BLOCKING:
        return True
    if name in _STREAM_READS:
        try:
            return parse_xread_args(argv, name == b"xreadgroup").timeout_ms != -1
        except EngineError:
            return False
    return False


# Attempts that may run again under the same request id. A blocked client's
# attempts (the first, every wake-up retry, and the SDK's resend of the whole
# call after a failover) all carry the call's one request id, so the attempt
# that serves is deduplicated like any write: a later attempt gets the element
# it popped instead of popping another (or popping one nobody is told about).
# An attempt that served nothing recorded the proposed form's empty reply, and
# such an attempt changed no data (LPOP/RPOP/LMPOP/LMOVE/RPOPLPUSH of nothing;
# XREADGROUP ">" that delivered nothing), so running it again under that id is
# as if the empty attempt had never happened: the call's one effect is the
# attempt that serves. Applies to the plain forms with a request id too, for
# the same reason. Decided from the log alone (the request's argv and the
# recorded result): every replica decides alike.
_RERUNNABLE = frozenset((b"lpop", b"rpop", b"lmpop", b"lmove", b"rpoplpush", b"xreadgroup",
                         # the woken forms a blocked client's retries are proposed as (below)
                         b"lpop-woken", b"rpop-woken", b"lmpop-woken", b"lmove-woken",
                         b"xreadgroup-woken"))


def may_run_again(argv, recorded) -> bool:
    """Whether a request whose id already recorded `recorded` runs again (see above)."""
    return ((recorded is None or recorded is NULL_ARRAY) and bool(argv)
            and bytes(argv[0]).lower() in _RERUNNABLE)


# Inside MULTI nothing blocks: redis replies at once, and for BLMOVE/BRPOPLPUSH
# with a null bulk (addReplyNull in blmoveGenericCommand), not with the null
# array a timed-out blocked client gets. Checked against redis 7.0.15.
_MULTI_NULL_BULK = frozenset((b"blmove", b"brpoplpush"))


def reply_in_multi(argv, wb: WouldBlock):
    """The reply of a blocking form that has nothing to serve inside MULTI."""
    return None if bytes(argv[0]).lower() in _MULTI_NULL_BULK else wb.timeout_reply


# Shapes: how the proposed form's reply maps to the blocking command's reply.
_POP_ONE = "pop-one"          # LPOP k: ele -> [k, ele]
_MPOP_ONE = "mpop-one"        # LMPOP: [k, [ele]] -> [k, ele]
_NONE_EMPTY = "none-empty"    # LMOVE, RPOPLPUSH: None = not served
_NULL_EMPTY = "null-empty"    # LMPOP (from BLMPOP), XREADGROUP: NULL_ARRAY = not served


@dataclass(frozen=True)
class BlockingPlan:
    argv: tuple               # the non-blocking form to propose now
    retry_argv: tuple         # the non-blocking form to propose when woken
    keys: tuple               # park on these (unique, argument order)
    timeout_ms: int           # 0 = forever (the engine's parse of the timeout)
    timeout_reply: object     # the reply when the timeout passes
    shape: str

    def translate(self, result):
        """The blocking command's reply for `result` (the proposed form's), or NOT_SERVED."""
        if isinstance(result, EngineError):
            return result
        if self.shape == _POP_ONE:
            return NOT_SERVED if result is None else [self.argv[1], result]
        if self.shape == _MPOP_ONE:
            if result is NULL_ARRAY:
                return NOT_SERVED
            invariant(isinstance(result, list) and len(result) == 2 and len(result[1]) == 1,
                      "LMPOP COUNT 1 reply shape")
            return [result[0], result[1][0]]
        if self.shape == _NONE_EMPTY:
            return NOT_SERVED if result is None else result
        invariant(self.shape == _NULL_EMPTY, "unknown plan shape")
        return NOT_SERVED if result is NULL_ARRAY else result


def plan_blocking(argv):
    """The BlockingPlan of a blocking write form, or None if argv is not one.

    Raises the EngineError redis would reply for the blocking form's own
    arguments (bad timeout, bad LEFT/RIGHT, bad numkeys ...), so the client
    gets it before anything is proposed. Those are exactly the errors redis
    raises before it looks at any key, so no state-dependent error is
    reported out of order. (XREADGROUP's option errors are raised even
    without BLOCK, for the same reason.)"""
    argv = tuple(bytes(a) for a in argv)
    name = argv[0].lower() if argv else b""
    if name in _LIST_BLOCKING:
        return _plan_list(name, argv)
    if name == b"xreadgroup":
        # Its option errors (BLOCK's included) are raised before any key is
        # looked up, so they are raised here too, blocking form or not.
        if parse_xread_args(argv, True).timeout_ms != -1:
            return _plan_xreadgroup(argv)
    return None


def _plan_list(name: bytes, argv: tuple) -> BlockingPlan:
    # Every list blocking form parses all of its arguments before it looks up
    # a key (t_list.c), so running it against an empty keyspace raises exactly
    # the argument errors, and otherwise returns the WouldBlock with the
    # engine's own parse of the keys and the timeout.
    wb = execute(Keyspace(), list(argv), 0)
    invariant(isinstance(wb, WouldBlock), "a blocking list form on an empty keyspace must block")
    keys = tuple(dict.fromkeys(wb.keys))
    # The retry is the woken form (engine cmd_lists, "a blocked client, woken"):
    # same reply, but keys that are no longer lists are skipped, not WRONGTYPE.
    if name in (b"blpop", b"brpop"):
        where = b"LEFT" if name == b"blpop" else b"RIGHT"
        popkeys = argv[1:-1]
        if len(popkeys) == 1:
            pop = b"LPOP" if name == b"blpop" else b"RPOP"
            form, retry, shape = (pop, popkeys[0]), (pop.lower() + b"-woken", popkeys[0]), _POP_ONE
        else:
            form, shape = (b"LMPOP", b"%d" % len(popkeys)) + popkeys + (where,), _MPOP_ONE
            retry = (b"lmpop-woken",) + form[1:]
    elif name == b"blmove":
        form, shape = (b"LMOVE",) + argv[1:5], _NONE_EMPTY
        retry = (b"lmove-woken",) + form[1:]
    elif name == b"brpoplpush":
        form, shape = (b"RPOPLPUSH",) + argv[1:3], _NONE_EMPTY
        retry = (b"lmove-woken",) + argv[1:3] + (b"RIGHT", b"LEFT")
    else:
        form, shape = (b"LMPOP",) + argv[2:], _NULL_EMPTY
        retry = (b"lmpop-woken",) + form[1:]
    return BlockingPlan(form, retry, keys, wb.timeout_ms, wb.timeout_reply, shape)


def _plan_xreadgroup(argv: tuple) -> BlockingPlan:
    args = parse_xread_args(argv, True)           # raises the option errors, BLOCK's included
    form = _strip_block(argv)
    stripped = parse_xread_args(form, True)
    invariant(stripped.timeout_ms == -1 and stripped.keys == args.keys, "BLOCK stripped cleanly")
    retry = form
    if stripped.count == 0:
        # As the engine's own retry argv: just before STREAMS, so it overrides a COUNT 0.
        kw = stripped.streams_pos - 1
        retry = form[:kw] + (b"COUNT", b"%d" % XREAD_BLOCKED_DEFAULT_COUNT) + form[kw:]
    retry = (WOKEN_XREADGROUP,) + retry[1:]
    return BlockingPlan(form, retry, tuple(dict.fromkeys(args.keys)), args.timeout_ms, NULL_ARRAY, _NULL_EMPTY)


def woken_xreadgroup_request(client_id: int, seq: int, argv) -> Request:
    """The request of a non-blocking XREADGROUP from a reader that has waited
    on its keys (gRPC Consume after its first read): its woken form, which
    fails as a woken redis reader does if the key or group went away."""
    argv = tuple(bytes(a) for a in argv)
    invariant(argv[0].lower() == b"xreadgroup" and parse_xread_args(argv, True).timeout_ms == -1,
              "a non-blocking XREADGROUP")
    request = Request.command(client_id, seq, (WOKEN_XREADGROUP,) + argv[1:])
    request_size(request)
    return request


def _strip_block(argv: tuple) -> tuple:
    """argv without its `BLOCK ms` option pairs. Walks the options exactly as
    stream_args.parse_xread_args does (which has accepted argv), so a key or
    ID spelled "block" after STREAMS is never touched."""
    out = [argv[0]]
    i, n = 1, len(argv)
    while i < n:
        more = n - i - 1
        opt = argv[i].lower()
        if opt == b"block" and more:
            i += 2
        elif opt == b"count" and more:
            out += argv[i:i + 2]
            i += 2
        elif opt == b"streams" and more:
            out += argv[i:]
            break
        elif opt == b"group" and more >= 2:
            out += argv[i:i + 3]
            i += 3
        else:
            invariant(opt == b"noack", "option walk disagrees with parse_xread_args")
            out.append(argv[i])
            i += 1
    return tuple(out)
