"""The one table from error kinds to their wire forms.

Every error a client can see has one row: its RESP prefix (the first word of
the `-` reply, which is also `EngineError.code`), the gRPC status code (the
`grpc.StatusCode` member name, so this module does not import grpc), a
machine-readable reason for gRPC error details, and whether a client may
retry the same request unchanged and expect it to succeed eventually.

`retriable` is about safety as well as hope: UNKNOWN_OUTCOME is not retriable
because the write may already have been applied, and a blind retry of XADD
would add the entry twice. Redirects (MOVED, ASK, NOTLEADER) are retriable at
the address the message names.

Raft and cluster rows have no redis equivalent except MOVED/ASK/TRYAGAIN/
CLUSTERDOWN; their RESP prefixes follow redis's style (one upper-case word)
and their message texts are built by the helpers below, so the text exists
once.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class WireError:
    code: str  # RESP prefix, e.g. "WRONGTYPE"
    grpc_status: str  # grpc.StatusCode member name, e.g. "FAILED_PRECONDITION"
    reason: str  # machine-readable, e.g. "WRONG_TYPE"
    retriable: bool


_ROWS = (
    # Command errors from the engine: deterministic, never worth retrying.
    WireError("ERR", "INVALID_ARGUMENT", "COMMAND_ERROR", False),
    WireError("WRONGTYPE", "FAILED_PRECONDITION", "WRONG_TYPE", False),
    WireError("NOGROUP", "NOT_FOUND", "NO_GROUP", False),
    WireError("BUSYGROUP", "ALREADY_EXISTS", "BUSY_GROUP", False),
    WireError("EXECABORT", "ABORTED", "EXEC_ABORT", False),
    WireError("NOSCRIPT", "NOT_FOUND", "NO_SCRIPT", False),
    WireError("NOPROTO", "INVALID_ARGUMENT", "NO_PROTO", False),
    WireError("UNBLOCKED", "ABORTED", "UNBLOCKED", False),
    WireError("OOM", "RESOURCE_EXHAUSTED", "OUT_OF_MEMORY", False),
    # Authentication and ACLs.
    WireError("NOAUTH", "UNAUTHENTICATED", "NO_AUTH", False),
    WireError("WRONGPASS", "UNAUTHENTICATED", "WRONG_PASS", False),
    WireError("NOPERM", "PERMISSION_DENIED", "NO_PERM", False),
    # Cluster: redis's own prefixes, so redis cluster clients follow them.
    WireError("MOVED", "FAILED_PRECONDITION", "MOVED", True),
    WireError("ASK", "FAILED_PRECONDITION", "ASK", True),
    WireError("CROSSSLOT", "INVALID_ARGUMENT", "CROSS_SLOT", False),
    WireError("TRYAGAIN", "UNAVAILABLE", "TRY_AGAIN", True),
    WireError("CLUSTERDOWN", "UNAVAILABLE", "CLUSTER_DOWN", True),
    # Transient server states redis also has.
    WireError("BUSY", "UNAVAILABLE", "BUSY", True),
    WireError("LOADING", "UNAVAILABLE", "LOADING", True),
    # Raft: this node is not the leader (the message names the leader when known).
    WireError("NOTLEADER", "FAILED_PRECONDITION", "NOT_LEADER", True),
    # Raft: the write was proposed but its fate is unknown (leadership lost and the
    # deposed leader did not learn the fate within its wait, deadline passed after
    # proposing). Retrying blindly may apply it twice.
    WireError("UNKNOWNOUTCOME", "UNKNOWN", "UNKNOWN_OUTCOME", False),
    # Sessions (fsm/sessions.py): the client id has no session (expired after
    # its timeout of replicated time, or never registered). The attempt changed
    # nothing, but an earlier attempt of the same request may have been applied:
    # not retriable with this id; the client registers a new one.
    WireError("SESSIONEXPIRED", "FAILED_PRECONDITION", "SESSION_EXPIRED", False),
    # Sessions: the table is full of live sessions; a registration may succeed later.
    WireError("SESSIONSFULL", "RESOURCE_EXHAUSTED", "SESSIONS_FULL", True),
    # Raft: the request timed out before it was proposed: nothing happened.
    WireError("TIMEOUT", "DEADLINE_EXCEEDED", "TIMEOUT", True),
    # Raft: no leader / no quorum / shutting down: nothing happened.
    WireError("UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE", True),
)

TABLE = {row.code: row for row in _ROWS}
_BY_REASON = {row.reason: row for row in _ROWS}
assert len(TABLE) == len(_ROWS) and len(_BY_REASON) == len(_ROWS), "codes and reasons must be unique"

# Unknown codes keep their own prefix on the RESP wire (the message is sent
# unchanged) and map to gRPC UNKNOWN; an unknown error is never assumed safe
# to retry.
DEFAULT_GRPC_STATUS = "UNKNOWN"
DEFAULT_REASON = "UNKNOWN_ERROR"


def wire_for(code: str) -> WireError:
    """The wire forms for an error code: a RESP prefix ("WRONGTYPE", or the
    first word of any error message) or a reason ("WRONG_TYPE")."""
    row = TABLE.get(code)
    if row is None:
        row = _BY_REASON.get(code)
    if row is None:
        return WireError(code or "ERR", DEFAULT_GRPC_STATUS, DEFAULT_REASON, False)
    return row


def wire_for_message(message: str) -> WireError:
    """The wire forms for a complete error text ("NOGROUP No such key ...")."""
    return wire_for(message.split(" ", 1)[0])


# -- message texts for the errors the node (not the engine) raises -----------
def moved_message(slot: int, address: str) -> str:
    """Redis cluster's redirect, understood by cluster clients: MOVED <slot> <host:port>."""
    return f"MOVED {slot} {address}"


def ask_message(slot: int, address: str) -> str:
    return f"ASK {slot} {address}"


def not_leader_message(leader_address) -> str:
    """NOTLEADER <host:port>, or without an address while no leader is known."""
    if leader_address:
        return f"NOTLEADER {leader_address}"
    return "NOTLEADER no leader known"


def unknown_outcome_message() -> str:
    return "UNKNOWNOUTCOME the write may or may not have been applied"


def timeout_message() -> str:
    return "TIMEOUT the request was not proposed before its deadline"


def unavailable_message(detail: str = "no quorum") -> str:
    return f"UNAVAILABLE {detail}"


def try_again_message() -> str:
    return "TRYAGAIN Multiple keys request during rehashing of slot"


def cluster_down_message() -> str:
    return "CLUSTERDOWN The cluster is down"


def cross_slot_message() -> str:
    return "CROSSSLOT Keys in request don't hash to the same slot"


def noauth_message() -> str:
    return "NOAUTH Authentication required."


def leader_from_message(message: str):
    """The leader address a NOTLEADER or MOVED/ASK message names, or None."""
    parts = message.split(" ")
    if parts[0] == "NOTLEADER" and len(parts) == 2:
        return parts[1]
    if parts[0] in ("MOVED", "ASK") and len(parts) == 3:
        return parts[2]
    return None
