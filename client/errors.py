"""Typed errors of the xraft client, modelled on aiokafka's errors.py.

Every failure the SDK raises is an `XRaftError` subclass carrying what the
server said (`ErrorDetail`): `reason`, the redis-style `message`, whether the
same request may be sent again (`retriable`), and the redirect data
(`leader_address`, `leader_id`, `slot`, `group_id`, `retry_after_ms`).

The class for a reason comes from `REASONS`, a table. The client may not
import the node (import-linter), so the reason strings and `retriable` flags
are a copy of `node/server/wire_errors.py`; tests/client compares the two.

Errors that never reached a server's error table are classified here too:
a gRPC deadline is a `DeadlineExceededError` (also a builtin `TimeoutError`),
and a write that was sent but not answered (deadline, broken connection)
is an `UnknownOutcomeError`: it may or may not have been applied.
"""
import builtins
import re

import grpc
from google.rpc import status_pb2

from xraft.proto.v1 import client_pb2 as pb

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class XRaftError(Exception):
    """Base of every client error. Class attributes are the defaults of the
    reason; instances carry what the server sent."""

    reason = "UNKNOWN_ERROR"
    retriable = False

    def __init__(self, message: str = "", *, reason: str | None = None, retriable: bool | None = None,
                 leader_address: str | None = None, leader_id: int = 0, slot: int | None = None,
                 group_id: int = 0, retry_after_ms: int = 0, grpc_code: grpc.StatusCode | None = None):
        super().__init__(message or self.reason)
        self.message = message or self.reason
        if reason is not None:
            self.reason = reason
        if retriable is not None:
            self.retriable = retriable
        self.leader_address = leader_address or None
        self.leader_id = leader_id
        self.slot = slot
        self.group_id = group_id
        self.retry_after_ms = retry_after_ms
        self.grpc_code = grpc_code

    def __repr__(self):
        return f"{type(self).__name__}({self.message!r})"


# -- engine errors: deterministic, never worth retrying ----------------------------

class CommandError(XRaftError):
    """redis "ERR ...": syntax, arity, ranges, bad IDs, unknown command."""
    reason = "COMMAND_ERROR"


class WrongTypeError(XRaftError):
    reason = "WRONG_TYPE"


class NoGroupError(XRaftError):
    reason = "NO_GROUP"


class BusyGroupError(XRaftError):
    reason = "BUSY_GROUP"


class ExecAbortError(XRaftError):
    reason = "EXEC_ABORT"


class NoScriptError(XRaftError):
    reason = "NO_SCRIPT"


class NoProtoError(XRaftError):
    reason = "NO_PROTO"


class UnblockedError(XRaftError):
    reason = "UNBLOCKED"


class OutOfMemoryError(XRaftError):
    reason = "OUT_OF_MEMORY"


# -- authentication ---------------------------------------------------------------

class NoAuthError(XRaftError):
    reason = "NO_AUTH"


class WrongPassError(XRaftError):
    reason = "WRONG_PASS"


class NoPermError(XRaftError):
    reason = "NO_PERM"


# -- routing: retriable at the address they name ------------------------------------

class MovedError(XRaftError):
    reason = "MOVED"
    retriable = True


class AskError(XRaftError):
    reason = "ASK"
    retriable = True


class CrossSlotError(XRaftError):
    reason = "CROSS_SLOT"


class NotLeaderError(XRaftError):
    """The node is not the leader; `leader_address` names the leader when known."""
    reason = "NOT_LEADER"
    retriable = True


# -- transient: nothing happened, try again later ------------------------------------

class TryAgainError(XRaftError):
    reason = "TRY_AGAIN"
    retriable = True


class ClusterDownError(XRaftError):
    reason = "CLUSTER_DOWN"
    retriable = True


class BusyError(XRaftError):
    reason = "BUSY"
    retriable = True


class LoadingError(XRaftError):
    reason = "LOADING"
    retriable = True


class UnavailableError(XRaftError):
    """No leader, no quorum, shutting down, or no server reachable: nothing was applied."""
    reason = "UNAVAILABLE"
    retriable = True


class DeadlineExceededError(XRaftError, builtins.TimeoutError):
    """Time ran out before the request was proposed (server TIMEOUT), or a
    read's deadline passed. Nothing was changed."""
    reason = "TIMEOUT"
    retriable = True


# -- the one that must never be retried blindly --------------------------------------

class UnknownOutcomeError(XRaftError):
    """A write was sent (or proposed) but its fate is unknown: it may or may
    not have been applied. The SDK retries it only when it carried a request
    id the server deduplicates; otherwise the caller decides."""
    reason = "UNKNOWN_OUTCOME"


class StaleRequestError(UnknownOutcomeError):
    """The server refused a resend because its request id fell out of the
    client's at-most-once window: it can no longer tell whether the first
    attempt was applied. Final: no resend can change that answer, so the SDK
    raises it at once (never retried)."""
    reason = "UNKNOWN_OUTCOME"
    retriable = False


class ReplyNotKeptError(UnknownOutcomeError):
    """The request *was* applied, but its reply was too large for the server
    to keep for resends (or was demoted to save space): the outcome is
    "applied, reply lost". Final, never retried."""
    reason = "UNKNOWN_OUTCOME"
    retriable = False
    applied = True


class WriteDeadlineError(UnknownOutcomeError, DeadlineExceededError):
    """A write's deadline passed after it was sent: a timeout *and* an unknown
    outcome (catch either)."""
    reason = "UNKNOWN_OUTCOME"
    retriable = False


class SessionExpiredError(UnknownOutcomeError):
    """The server has no session for this client id (it expired after the
    server's session timeout without requests, or was never registered). This
    attempt changed nothing; an earlier attempt of the same request may have
    been applied, so its outcome is unknown unless this was its first
    attempt. Final for this request id: the SDK starts a new client id."""
    reason = "SESSION_EXPIRED"
    retriable = False


class SessionsFullError(XRaftError):
    """The server's session table is full of live sessions: a new client id
    cannot be registered yet. Nothing changed; retriable."""
    reason = "SESSIONS_FULL"
    retriable = True


class UnknownError(XRaftError):
    """A reason this client does not know (a newer server), or a bare gRPC
    failure with no detail. `retriable` is whatever the server said."""


# The reason -> class table. Keep it identical to node/server/wire_errors.py
# (reasons and retriable flags); tests/client/test_sdk.py checks that.
REASONS: dict[str, type[XRaftError]] = {cls.reason: cls for cls in (
    CommandError, WrongTypeError, NoGroupError, BusyGroupError, ExecAbortError, NoScriptError, NoProtoError,
    UnblockedError, OutOfMemoryError, NoAuthError, WrongPassError, NoPermError, MovedError, AskError,
    CrossSlotError, TryAgainError, ClusterDownError, BusyError, LoadingError, NotLeaderError,
    UnknownOutcomeError, DeadlineExceededError, UnavailableError, SessionExpiredError, SessionsFullError,
)}


# The server's two final UNKNOWN_OUTCOME refusals (node/fsm: StaleRequest,
# ResultNotKept), told apart by their text; tests/client compares these with
# the node's messages.
_STALE = re.compile(r"request \d+ of client \d+ is too old to tell whether it was applied")
_NOT_KEPT = re.compile(r"request \d+ of client \d+ was already applied")


def classify_unknown_outcome(message: str) -> type[UnknownOutcomeError]:
    """The class of an UNKNOWN_OUTCOME by its message: the final refusals
    (stale request id, reply not kept) or the plain, resendable kind."""
    if _STALE.search(message):
        return StaleRequestError
    if _NOT_KEPT.search(message):
        return ReplyNotKeptError
    return UnknownOutcomeError


def from_detail(detail: pb.ErrorDetail, grpc_code: grpc.StatusCode | None = None) -> XRaftError:
    """The typed error for an ErrorDetail (from a status or an XAdd result)."""
    cls = REASONS.get(detail.reason, UnknownError)
    if cls is UnknownOutcomeError:
        cls = classify_unknown_outcome(detail.message)
    return cls(detail.message, reason=detail.reason, retriable=detail.retriable,
               leader_address=detail.leader_address, leader_id=detail.leader_id,
               slot=detail.slot if detail.HasField("slot") else None, group_id=detail.group_id,
               retry_after_ms=detail.retry_after_ms, grpc_code=grpc_code)


def detail_of(err: grpc.aio.AioRpcError) -> pb.ErrorDetail | None:
    """The ErrorDetail packed in the status details trailer, if any."""
    for key, value in err.trailing_metadata() or ():
        if key == _STATUS_DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            for anything in status.details:
                detail = pb.ErrorDetail()
                if anything.Unpack(detail):
                    return detail
    return None


# Texts grpc-core uses when it never got a connection, so nothing was sent.
_NOT_CONNECTED = ("failed to connect", "connection refused", "connections to all backends failing",
                  "dns resolution failed", "name resolution")


def from_rpc_error(err: grpc.aio.AioRpcError, *, write: bool) -> XRaftError:
    """Classify a failed call. `write`: the request changes state, so a
    failure after it may have reached the server is an unknown outcome."""
    code = err.code()
    detail = detail_of(err)
    if detail is not None:
        return from_detail(detail, code)
    text = err.details() or code.name
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        cls = WriteDeadlineError if write else DeadlineExceededError
        return cls(f"deadline exceeded: {text}", grpc_code=code, retriable=False)
    if code == grpc.StatusCode.UNAVAILABLE:
        lowered = text.lower()
        if not write or any(s in lowered for s in _NOT_CONNECTED):
            return UnavailableError(text, grpc_code=code)
        # The connection broke after the request may have been sent.
        return UnknownOutcomeError(f"connection lost: {text}", grpc_code=code)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return NoAuthError(text, grpc_code=code)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Message size limits (client or server side): deterministic, not retriable.
        return CommandError(text, reason="RESOURCE_EXHAUSTED", grpc_code=code)
    if write and code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED):
        return UnknownOutcomeError(f"{code.name}: {text}", grpc_code=code)
    return UnknownError(f"{code.name}: {text}", grpc_code=code)


class NotSupportedError(XRaftError):
    """The server does not implement the RPC (gRPC UNIMPLEMENTED), e.g.
    ClusterLayout on a node from before sharding. Not a server error reason
    (not in REASONS): it is what the client concludes from the status."""
    reason = "UNIMPLEMENTED"
