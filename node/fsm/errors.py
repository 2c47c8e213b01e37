"""Typed errors of the fsm layer.

Two families, and the difference matters:

* Exceptions (`CorruptEntry`, `CorruptSnapshot`, `NotAWrite`, `NotARead`):
  something is wrong with the bytes handed in or with how the caller routes a
  command. They are raised, and nothing was changed.

* Results (`EngineError` subclasses: `ExecAbort`, `BlockingFormInLog`,
  `StaleRequest`, `SessionExpired`, `SessionsFull`, `EntryTooLarge`): a command's deterministic outcome. Every
  replica computes the same one from the same log, so it is returned as the
  command's reply (the client sees it), never raised out of `apply` — raising
  on a committed entry would stop every replica on the same index forever.
"""
from ..engine.errors import CommandError, EngineError


class CorruptEntry(ValueError):
    """The bytes are not a log record this code wrote (checksum, layout or limits)."""


class CorruptSnapshot(ValueError):
    """The bytes are not an fsm snapshot this code wrote."""


class NotAWrite(Exception):
    """resolve: the command changes nothing, so it is served by the read path
    (ReadIndex + `StateMachine.read`), never proposed. Not a client error: the
    server routes it."""

    def __init__(self, argv):
        super().__init__("not a write command: %r" % (bytes(argv[0])[:64] if argv else b""))
        self.argv = list(argv)


class NotARead(Exception):
    """read: the command writes, so it must go through the log. A server bug if seen."""

    def __init__(self, argv):
        super().__init__("not a read-only command: %r" % (bytes(argv[0])[:64] if argv else b""))
        self.argv = list(argv)


EXECABORT_TEXT = "EXECABORT Transaction discarded because of previous errors."


class ExecAbort(EngineError):
    """EXEC of a transaction with a queue-time error (unknown command, arity)."""

    def __init__(self):
        super().__init__(EXECABORT_TEXT)


class BlockingFormInLog(CommandError):
    """A blocking form (BLPOP, XREADGROUP ... BLOCK) reached apply outside MULTI.

    The leader must propose the non-blocking form (resolve.resolve_command); a
    blocking form in the log is a leader bug. It is a result, not a raised
    invariant, because the entry is committed: every replica refuses it the
    same way, changes nothing and moves on."""

    def __init__(self, name: str):
        super().__init__("ERR xraft: blocking form of '%s' cannot be applied from the log" % name)


class StaleRequest(CommandError):
    """A retried request older than the at-most-once window of its client: it
    may or may not have been applied, and applying it again could apply it twice."""

    def __init__(self, client_id: int, seq: int):
        super().__init__("ERR xraft: request %d of client %d is too old to tell whether it "
                         "was applied" % (seq, client_id))


SESSION_EXPIRED_CODE = "SESSIONEXPIRED"    # server/wire_errors.py rows (RESP prefixes)
SESSIONS_FULL_CODE = "SESSIONSFULL"


class SessionExpired(EngineError):
    """A request whose client id has no session (sessions.py): it expired
    after session_timeout_ms of replicated time without activity, or was never
    registered. Nothing was applied by this attempt; whether an earlier
    attempt of the same request was applied can no longer be told."""

    def __init__(self, client_id: int, seq: int):
        super().__init__("%s request %d of client %d: the client's session expired or was never "
                         "registered; register a new client id" % (SESSION_EXPIRED_CODE, seq, client_id))


class SessionsFull(EngineError):
    """REGISTER of a new client id while max_clients sessions are open and none
    has been idle past the timeout. Nothing changed; retry later."""

    def __init__(self, max_clients: int):
        super().__init__("%s xraft: %d client sessions are open (the limit); retry later"
                         % (SESSIONS_FULL_CODE, max_clients))


class EntryTooLarge(CommandError):
    """A request does not fit the record limits (entry.py): refused before proposing."""
